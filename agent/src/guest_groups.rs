//! A microVM guest's process groups: there the agent is the whole runtime,
//! so it gives each process it starts a cgroup v2 group of its own,
//! `/sys/fs/cgroup/workload/p<proc>`, as a container's supervisor does on
//! the host. A kill through `cgroup.kill` ends the whole tree (children that
//! called setsid, which a process-group kill misses), and `memory.events`
//! tells an OOM kill inside the guest from any other SIGKILL. The parent
//! `workload` group holds the sandbox's pids limit, over all of them
//! together and not over the agent. A pod container root with limits of
//! its own gets `workload/root-<name>` holding them, and the groups of the
//! processes started in that root go under it. In a container the
//! supervisor hands the agent its groups instead, and this is not set up.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use sandbox_proto::GuestRootLimits;

/// Set once by VM boot; absent in a container.
static GROUPS: OnceLock<GuestGroups> = OnceLock::new();

/// Where the guest's cgroup2 hierarchy is mounted.
pub const MOUNT_POINT: &str = "/sys/fs/cgroup";

/// The group under the hierarchy's root that holds every process group.
const WORKLOAD: &str = "workload";

#[derive(Debug)]
pub struct GuestGroups {
    /// The `workload` group: the process groups are its children.
    workload: PathBuf,
    /// Whether the kernel has the cpu controller (CFS bandwidth).
    cpu: bool,
    /// The limited root each process was started in, where it has one.
    in_root: Mutex<HashMap<u64, String>>,
}

/// The guest's groups, when this agent is a microVM's init.
pub fn get() -> Option<&'static GuestGroups> {
    GROUPS.get()
}

/// Makes `root` (a mounted cgroup2 hierarchy) the home of the process
/// groups, under a `workload` group limited to `pids_max` tasks when given:
/// memory and pids accounting are turned on at both levels.
pub fn install(root: &Path, pids_max: Option<u64>) -> io::Result<()> {
    let groups = GuestGroups::make(root, pids_max)?;
    let _ = GROUPS.set(groups);
    Ok(())
}

impl GuestGroups {
    fn make(root: &Path, pids_max: Option<u64>) -> io::Result<Self> {
        let available = fs::read_to_string(root.join("cgroup.controllers"))?;
        let cpu = available.split_whitespace().any(|c| c == "cpu");
        let workload = root.join(WORKLOAD);
        let groups = Self {
            workload,
            cpu,
            in_root: Mutex::default(),
        };
        fs::write(root.join("cgroup.subtree_control"), groups.controllers())?;
        fs::create_dir(&groups.workload)?;
        if let Some(max) = pids_max {
            groups.limit_pids(max)?;
        }
        fs::write(
            groups.workload.join("cgroup.subtree_control"),
            groups.controllers(),
        )?;
        Ok(groups)
    }

    /// What each level hands down to the next.
    fn controllers(&self) -> &'static str {
        if self.cpu {
            "+cpu +memory +pids"
        } else {
            "+memory +pids"
        }
    }

    fn in_root(&self) -> MutexGuard<'_, HashMap<u64, String>> {
        self.in_root.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn root_dir(&self, name: &str) -> PathBuf {
        self.workload.join(format!("root-{name}"))
    }

    /// Makes the group of container root `name` with its `limits`; the
    /// groups of processes started in that root go under it.
    pub fn create_root_group(&self, name: &str, limits: &GuestRootLimits) -> io::Result<()> {
        if limits.cpu_quota_us.is_some() && !self.cpu {
            return Err(io::Error::other(
                "the guest kernel has no cpu controller (CONFIG_CFS_BANDWIDTH) for a CPU limit",
            ));
        }
        let dir = self.root_dir(name);
        fs::create_dir(&dir)?;
        let set = || -> io::Result<()> {
            if let Some(quota) = limits.cpu_quota_us {
                fs::write(
                    dir.join("cpu.max"),
                    format!("{quota} {}", limits.cpu_period_us),
                )?;
            }
            if let Some(bytes) = limits.memory_bytes {
                fs::write(dir.join("memory.max"), bytes.to_string())?;
            }
            if let Some(max) = limits.pids_max {
                fs::write(dir.join("pids.max"), max.to_string())?;
            }
            fs::write(dir.join("cgroup.subtree_control"), self.controllers())
        };
        set().inspect_err(|_| {
            let _ = fs::remove_dir(&dir);
        })
    }

    /// Whether container root `name` has a group of its own.
    pub fn has_root_group(&self, name: &str) -> bool {
        self.root_dir(name).is_dir()
    }

    /// Kills what runs in container root `name`'s group and removes it once
    /// empty (a group still busy stays for the VM's end).
    pub fn remove_root_group(&self, name: &str) {
        let dir = self.root_dir(name);
        if fs::remove_dir(&dir).is_err() {
            let _ = fs::write(dir.join("cgroup.kill"), "1");
        }
    }

    /// Tasks in all process groups together now (`pids.current`).
    pub fn pids_current(&self) -> io::Result<u64> {
        let text = fs::read_to_string(self.workload.join("pids.current"))?;
        text.trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{text:?}: {e}")))
    }

    fn dir(&self, proc: u64) -> PathBuf {
        let group = format!("p{proc}");
        match self.in_root().get(&proc) {
            Some(root) => self.root_dir(root).join(group),
            None => self.workload.join(group),
        }
    }

    /// At most `max` tasks from forks in all process groups together: a
    /// fork past it fails with EAGAIN, tasks already past it are left to
    /// end. The agent's own moves of a new process into its group are not
    /// counted against it (cgroup v2 limits forks, not migrations), so a
    /// `kill` can still be started while a fork bomb fills the limit. A
    /// limit the kernel cannot hold (its PID_MAX_LIMIT or more) is none.
    pub fn limit_pids(&self, max: u64) -> io::Result<()> {
        const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;
        let value = match max {
            max if max >= PID_MAX_LIMIT => "max".to_string(),
            max => max.to_string(),
        };
        fs::write(self.workload.join("pids.max"), value)
    }

    /// Makes `proc`'s group (under container root `root`'s group, where
    /// that root has one) and opens its `cgroup.procs` for the child to
    /// write itself into before exec (what the launcher does with the groups
    /// a supervisor hands over).
    pub fn create(&self, proc: u64, root: Option<&str>) -> io::Result<OwnedFd> {
        if let Some(root) = root.filter(|r| self.has_root_group(r)) {
            self.in_root().insert(proc, root.to_owned());
        }
        let dir = self.dir(proc);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            // A group left by an earlier process of this id (ids are not
            // reused by the host; a restored snapshot's may be).
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let procs = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))?;
        Ok(procs.into())
    }

    /// SIGKILLs every process in `proc`'s group, however it was started.
    /// `Ok(false)` when the group is gone.
    pub fn kill(&self, proc: u64) -> io::Result<bool> {
        match fs::write(self.dir(proc).join("cgroup.kill"), "1") {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// OOM kills in `proc`'s group so far (`memory.events`' `oom_kill`).
    pub fn oom_kills(&self, proc: u64) -> u64 {
        fs::read_to_string(self.dir(proc).join("memory.events"))
            .map(|events| oom_kill_count(&events))
            .unwrap_or(0)
    }

    /// Removes `proc`'s group once nothing runs in it; a group that
    /// descendants still keep busy stays (as a container's does) and is
    /// retried at the process's next ending or left for the VM's end.
    pub fn remove(&self, proc: u64) {
        if fs::remove_dir(self.dir(proc)).is_ok() {
            self.in_root().remove(&proc);
        }
    }
}

fn oom_kill_count(events: &str) -> u64 {
    events
        .lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(events), 2);
        assert_eq!(oom_kill_count("oom 1\n"), 0);
        assert_eq!(oom_kill_count(""), 0);
    }

    #[test]
    fn a_group_is_made_killed_and_removed_in_its_folder() {
        // A plain folder stands in for cgroupfs: the files are what the
        // kernel would offer.
        let root = std::env::temp_dir().join(format!("guest-groups-{}", std::process::id()));
        fs::create_dir_all(&root).expect("root");
        fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("controllers");
        let groups = GuestGroups::make(&root, Some(16)).expect("groups");
        let workload = root.join(WORKLOAD);
        for (group, controllers) in [
            (&root, "+cpu +memory +pids"),
            (&workload, "+cpu +memory +pids"),
        ] {
            assert_eq!(
                fs::read_to_string(group.join("cgroup.subtree_control")).expect("controllers"),
                controllers
            );
        }
        assert_eq!(
            fs::read_to_string(workload.join("pids.max")).expect("limit"),
            "16",
            "the limit covers every process group together"
        );
        fs::write(workload.join("pids.current"), "5\n").expect("count");
        assert_eq!(groups.pids_current().expect("count"), 5);
        groups.limit_pids(8).expect("lower");
        assert_eq!(
            fs::read_to_string(workload.join("pids.max")).expect("limit"),
            "8"
        );
        groups.limit_pids(1 << 40).expect("unlimited");
        assert_eq!(
            fs::read_to_string(workload.join("pids.max")).expect("limit"),
            "max",
            "past the kernel's PID_MAX_LIMIT is no limit"
        );
        assert!(!groups.kill(4).expect("kill"), "no group yet");
        let dir = workload.join("p4");
        fs::create_dir(&dir).expect("group");
        fs::write(dir.join("cgroup.procs"), "").expect("procs");
        drop(groups.create(4, None).expect("an existing group is reused"));
        assert!(groups.kill(4).expect("kill"));
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.kill")).expect("kill file"),
            "1"
        );
        fs::write(dir.join("memory.events"), "oom 1\noom_kill 1\n").expect("events");
        assert_eq!(groups.oom_kills(4), 1);
        groups.remove(4);
        assert!(
            dir.exists(),
            "a folder with files in it is busy, as a live group is"
        );

        // A container root with limits: its group holds them, and the
        // groups of processes started in it go under it.
        let limits = GuestRootLimits {
            cpu_quota_us: Some(50_000),
            cpu_period_us: 100_000,
            memory_bytes: Some(32 << 20),
            pids_max: Some(10),
        };
        groups
            .create_root_group("web", &limits)
            .expect("root group");
        let web = workload.join("root-web");
        for (file, value) in [
            ("cpu.max", "50000 100000"),
            ("memory.max", "33554432"),
            ("pids.max", "10"),
            ("cgroup.subtree_control", "+cpu +memory +pids"),
        ] {
            assert_eq!(fs::read_to_string(web.join(file)).expect(file), value);
        }
        // The kernel makes a group's files; the folder gets them by hand.
        for group in [web.join("p5"), workload.join("p6")] {
            fs::create_dir(&group).expect("group");
            fs::write(group.join("cgroup.procs"), "").expect("procs");
        }
        drop(
            groups
                .create(5, Some("web"))
                .expect("a group in the root's"),
        );
        drop(
            groups
                .create(6, Some("plain"))
                .expect("a root without limits"),
        );
        assert!(web.join("p5").is_dir());
        assert!(workload.join("p6").is_dir(), "a root without a group");
        assert!(groups.kill(5).expect("kill"));
        assert_eq!(
            fs::read_to_string(web.join("p5/cgroup.kill")).expect("kill file"),
            "1"
        );
        fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn a_cpu_limit_needs_the_cpu_controller() {
        let root = std::env::temp_dir().join(format!("guest-groups-cpu-{}", std::process::id()));
        fs::create_dir_all(&root).expect("root");
        fs::write(root.join("cgroup.controllers"), "memory pids\n").expect("controllers");
        let groups = GuestGroups::make(&root, None).expect("groups");
        assert_eq!(
            fs::read_to_string(root.join("cgroup.subtree_control")).expect("controllers"),
            "+memory +pids"
        );
        let limits = GuestRootLimits {
            cpu_quota_us: Some(50_000),
            cpu_period_us: 100_000,
            memory_bytes: None,
            pids_max: None,
        };
        let err = groups
            .create_root_group("web", &limits)
            .expect_err("no cpu");
        assert!(err.to_string().contains("CONFIG_CFS_BANDWIDTH"), "{err}");
        fs::remove_dir_all(&root).expect("clean up");
    }
}
