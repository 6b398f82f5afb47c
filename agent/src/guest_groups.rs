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

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use sandbox_proto::{GuestRootLimits, GuestRootUsage};

/// Set once by VM boot; absent in a container.
static GROUPS: OnceLock<GuestGroups> = OnceLock::new();

/// Where the guest's cgroup2 hierarchy is mounted.
pub const MOUNT_POINT: &str = "/sys/fs/cgroup";

/// The group under the hierarchy's root that holds every process group.
const WORKLOAD: &str = "workload";

#[derive(Debug)]
pub struct GuestGroups {
    /// The hierarchy's root group.
    root: PathBuf,
    /// The `workload` group: the process groups are its children.
    workload: PathBuf,
    /// Whether the cpu controller was handed down to `workload`'s children,
    /// which the first root with a CPU limit or weight asks for: until
    /// then CPU is shared by thread, as it was.
    cpu_on: Mutex<bool>,
    /// Container roots with a group of their own (`root-<name>`).
    limited: Mutex<HashSet<String>>,
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

/// Memory and pids accounting, handed down at every level.
const CONTROLLERS: &str = "+memory +pids";
/// How long removing a root's group waits for its killed processes.
const EMPTIED_WITHIN: Duration = Duration::from_secs(5);
/// The kernel's PID_MAX_LIMIT: a pids limit at or past it is none.
const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;

fn pids_value(max: u64) -> String {
    if max >= PID_MAX_LIMIT {
        "max".to_string()
    } else {
        max.to_string()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl GuestGroups {
    fn make(root: &Path, pids_max: Option<u64>) -> io::Result<Self> {
        fs::write(root.join("cgroup.subtree_control"), CONTROLLERS)?;
        let workload = root.join(WORKLOAD);
        fs::create_dir(&workload)?;
        let groups = Self {
            root: root.to_owned(),
            workload,
            cpu_on: Mutex::new(false),
            limited: Mutex::default(),
            in_root: Mutex::default(),
        };
        if let Some(max) = pids_max {
            groups.limit_pids(max)?;
        }
        fs::write(groups.workload.join("cgroup.subtree_control"), CONTROLLERS)?;
        Ok(groups)
    }

    fn root_dir(&self, name: &str) -> PathBuf {
        self.workload.join(format!("root-{name}"))
    }

    /// Hands the cpu controller down to `workload`'s children, once; fails
    /// where the kernel has none, or, for a limit (`bandwidth`), no CFS
    /// bandwidth (no `cpu.max`).
    fn enable_cpu(&self, bandwidth: bool) -> io::Result<()> {
        let mut on = lock(&self.cpu_on);
        if !*on {
            for level in [&self.root, &self.workload] {
                fs::write(level.join("cgroup.subtree_control"), "+cpu").map_err(|e| {
                    io::Error::other(format!(
                        "the guest kernel has no cpu controller (CONFIG_CGROUP_SCHED) for a CPU limit or weight: {e}"
                    ))
                })?;
            }
            *on = true;
        }
        if bandwidth && !self.workload.join("cpu.max").exists() {
            return Err(io::Error::other(
                "the guest kernel has no CFS bandwidth (CONFIG_CFS_BANDWIDTH) for a CPU limit: workload has no cpu.max",
            ));
        }
        Ok(())
    }

    /// Makes the group of container root `name` with its `limits`; the
    /// groups of processes started in that root go under it.
    pub fn create_root_group(&self, name: &str, limits: &GuestRootLimits) -> io::Result<()> {
        if limits.cpu_quota_us.is_some() || limits.cpu_weight.is_some() {
            self.enable_cpu(limits.cpu_quota_us.is_some())?;
        }
        let mut limited = lock(&self.limited);
        let dir = self.root_dir(name);
        fs::create_dir(&dir)?;
        let set = || -> io::Result<()> {
            if let Some(quota) = limits.cpu_quota_us {
                fs::write(
                    dir.join("cpu.max"),
                    format!("{quota} {}", limits.cpu_period_us),
                )?;
            }
            if let Some(weight) = limits.cpu_weight {
                fs::write(dir.join("cpu.weight"), weight.to_string())?;
            }
            if let Some(bytes) = limits.memory_bytes {
                fs::write(dir.join("memory.max"), bytes.to_string())?;
            }
            if limits.oom_group {
                fs::write(dir.join("memory.oom.group"), "1")?;
            }
            if let Some(max) = limits.pids_max {
                fs::write(dir.join("pids.max"), pids_value(max))?;
            }
            fs::write(dir.join("cgroup.subtree_control"), CONTROLLERS)
        };
        set().inspect_err(|_| {
            let _ = fs::remove_dir(&dir);
        })?;
        limited.insert(name.to_owned());
        Ok(())
    }

    /// What container root `name`'s own group uses now (its processes'
    /// groups are under it); `None` for a root without one.
    /// The lock is not held while reading: a removal holds it while it
    /// waits for the group to empty, and a group removed meanwhile (its
    /// files gone) reads as none.
    pub fn root_usage(&self, name: &str) -> io::Result<Option<GuestRootUsage>> {
        if !lock(&self.limited).contains(name) {
            return Ok(None);
        }
        match self.read_root_usage(name) {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENODEV) =>
            {
                Ok(None)
            }
            read => read.map(Some),
        }
    }

    fn read_root_usage(&self, name: &str) -> io::Result<GuestRootUsage> {
        let dir = self.root_dir(name);
        let read = |file: &str| fs::read_to_string(dir.join(file));
        let number = |file: &str| -> io::Result<u64> { parse_number(file, &read(file)?) };
        let ceiling = |file: &str| -> io::Result<Option<u64>> {
            let text = read(file)?;
            if text.trim() == "max" {
                return Ok(None);
            }
            parse_number(file, &text).map(Some)
        };
        let cpu_usec = read("cpu.stat")?
            .lines()
            .find_map(|line| line.strip_prefix("usage_usec "))
            .map_or(Ok(0), |n| parse_number("cpu.stat", n))?;
        Ok(GuestRootUsage {
            cpu_usec,
            memory_bytes: number("memory.current")?,
            memory_max: ceiling("memory.max")?,
            pids: number("pids.current")?,
            pids_max: ceiling("pids.max")?,
            // Counts its processes' groups' kills too (not `.local`).
            oom_kills: oom_kill_count(&read("memory.events")?),
        })
    }

    /// Whether container root `name` has a group of its own.
    #[cfg(test)]
    fn has_root_group(&self, name: &str) -> bool {
        lock(&self.limited).contains(name)
    }

    /// Kills what runs in container root `name`'s group, waits for it to
    /// empty, and removes it with its processes' groups. An error leaves
    /// it known, so a root of the same name is never placed in it.
    pub fn remove_root_group(&self, name: &str) -> io::Result<()> {
        let mut limited = lock(&self.limited);
        if !limited.contains(name) {
            return Ok(());
        }
        let dir = self.root_dir(name);
        // Opened, never made: the kernel's file or nothing.
        let killed = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.kill"))
            .and_then(|mut kill| io::Write::write_all(&mut kill, b"1"));
        match killed {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let started = Instant::now();
        // The kernel says when the last task left (`populated 0`); it has
        // no event a plain file read could wait on, so this polls, bounded.
        while fs::read_to_string(dir.join("cgroup.events"))
            .is_ok_and(|events| events.lines().any(|l| l == "populated 1"))
            && started.elapsed() < EMPTIED_WITHIN
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
        lock(&self.in_root).retain(|_, root| root != name);
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        limited.remove(name);
        Ok(())
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
        match lock(&self.in_root).get(&proc) {
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
        fs::write(self.workload.join("pids.max"), pids_value(max))
    }

    /// Makes `proc`'s group (under container root `root`'s group, where
    /// that root has one) and opens its `cgroup.procs` for the child to
    /// write itself into before exec (what the launcher does with the groups
    /// a supervisor hands over).
    pub fn create(&self, proc: u64, root: Option<&str>) -> io::Result<OwnedFd> {
        {
            // Decided under the roots' lock, so a root's group being
            // removed is never chosen.
            let limited = lock(&self.limited);
            let mut in_root = lock(&self.in_root);
            match root.filter(|r| limited.contains(*r)) {
                Some(root) => in_root.insert(proc, root.to_owned()),
                None => in_root.remove(&proc),
            };
        }
        let dir = self.dir(proc);
        let opened = match fs::create_dir(&dir) {
            // A group left by an earlier process of this id (ids are not
            // reused by the host; a restored snapshot's may be).
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs")),
        };
        opened.map(OwnedFd::from).inspect_err(|_| {
            lock(&self.in_root).remove(&proc);
        })
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
        match fs::remove_dir(self.dir(proc)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {}
            _ => {
                lock(&self.in_root).remove(&proc);
            }
        }
    }
}

fn parse_number(file: &str, text: &str) -> io::Result<u64> {
    text.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{file}: {text:?}: {e}")))
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

    /// A plain folder stands in for cgroupfs: the files are what the
    /// kernel would offer, made by hand.
    fn folder(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("guest-groups-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("root");
        root
    }

    fn group_files(dir: &Path) {
        fs::create_dir(dir).expect("group");
        fs::write(dir.join("cgroup.procs"), "").expect("procs");
    }

    #[test]
    fn a_group_is_made_killed_and_removed_in_its_folder() {
        let root = folder("plain");
        let groups = GuestGroups::make(&root, Some(16)).expect("groups");
        let workload = root.join(WORKLOAD);
        for group in [&root, &workload] {
            assert_eq!(
                fs::read_to_string(group.join("cgroup.subtree_control")).expect("controllers"),
                "+memory +pids"
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
        group_files(&dir);
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
        fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn a_limited_roots_group_holds_its_processes_groups_until_removed() {
        let root = folder("roots");
        let groups = GuestGroups::make(&root, None).expect("groups");
        let workload = root.join(WORKLOAD);
        let limits = GuestRootLimits {
            cpu_quota_us: Some(50_000),
            cpu_period_us: 100_000,
            memory_bytes: Some(32 << 20),
            pids_max: Some(10),
            cpu_weight: Some(174),
            oom_group: true,
        };
        // The kernel gives workload cpu.max once cpu is handed down to it.
        fs::write(workload.join("cpu.max"), "max 100000").expect("cpu.max");
        groups
            .create_root_group("web", &limits)
            .expect("root group");
        let web = workload.join("root-web");
        for (file, value) in [
            ("cpu.max", "50000 100000"),
            ("cpu.weight", "174"),
            ("memory.max", "33554432"),
            ("memory.oom.group", "1"),
            ("pids.max", "10"),
            ("cgroup.subtree_control", "+memory +pids"),
        ] {
            assert_eq!(fs::read_to_string(web.join(file)).expect(file), value);
        }
        for level in [&root, &workload] {
            assert_eq!(
                fs::read_to_string(level.join("cgroup.subtree_control")).expect("controllers"),
                "+cpu",
                "the first CPU limit hands cpu down"
            );
        }
        group_files(&web.join("p5"));
        group_files(&workload.join("p6"));
        drop(groups.create(5, Some("web")).expect("in the root's group"));
        drop(groups.create(6, Some("plain")).expect("a root without one"));
        assert!(groups.kill(5).expect("kill"));
        assert_eq!(
            fs::read_to_string(web.join("p5/cgroup.kill")).expect("kill file"),
            "1",
            "p5 is under root-web"
        );
        assert!(groups.kill(6).expect("kill"), "p6 is workload's own");
        assert!(
            groups.create_root_group("web", &limits).is_err(),
            "one group per root"
        );
        // Its use, from the files the kernel keeps there.
        for (file, value) in [
            (
                "cpu.stat",
                "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
            ),
            ("memory.current", "4096\n"),
            ("pids.current", "2\n"),
            ("memory.events", "oom 1\noom_kill 1\n"),
        ] {
            fs::write(web.join(file), value).expect(file);
        }
        assert_eq!(
            groups.root_usage("web").expect("read"),
            Some(GuestRootUsage {
                cpu_usec: 1500,
                memory_bytes: 4096,
                memory_max: Some(32 << 20),
                pids: 2,
                pids_max: Some(10),
                oom_kills: 1,
            })
        );
        fs::write(web.join("pids.max"), "max\n").expect("no pids limit");
        assert_eq!(
            groups.root_usage("web").expect("read").map(|u| u.pids_max),
            Some(None)
        );
        fs::write(web.join("pids.max"), "10").expect("put back");
        assert_eq!(groups.root_usage("plain").expect("read"), None, "no group");

        // Removing it takes its processes' groups and its placements:
        // a later process naming the root is workload's own.
        fs::remove_dir_all(web.join("p5")).expect("p5 emptied");
        for file in [
            "cpu.max",
            "cpu.weight",
            "memory.max",
            "memory.oom.group",
            "pids.max",
            "cgroup.subtree_control",
            "cpu.stat",
            "memory.current",
            "pids.current",
            "memory.events",
        ] {
            fs::remove_file(web.join(file)).expect(file);
        }
        groups.remove_root_group("web").expect("removed");
        assert!(!web.exists());
        assert!(!groups.has_root_group("web"));
        group_files(&workload.join("p7"));
        drop(groups.create(7, Some("web")).expect("no group now"));
        assert!(groups.kill(7).expect("kill"), "p7 is workload's own");
        fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn a_cpu_limit_needs_the_kernels_cfs_bandwidth() {
        let root = folder("cpu");
        let groups = GuestGroups::make(&root, None).expect("groups");
        let limits = GuestRootLimits {
            cpu_quota_us: Some(50_000),
            cpu_period_us: 100_000,
            memory_bytes: None,
            pids_max: None,
            cpu_weight: None,
            oom_group: false,
        };
        // No cpu.max appears in workload: no CFS bandwidth.
        let err = groups
            .create_root_group("web", &limits)
            .expect_err("no cpu");
        assert!(err.to_string().contains("CONFIG_CFS_BANDWIDTH"), "{err}");
        assert!(!groups.has_root_group("web"));
        // A weight needs the cpu controller alone.
        groups
            .create_root_group(
                "web",
                &GuestRootLimits {
                    cpu_quota_us: None,
                    cpu_weight: Some(1),
                    ..limits
                },
            )
            .expect("a weight without bandwidth");
        let web = root.join(WORKLOAD).join("root-web");
        assert_eq!(
            fs::read_to_string(web.join("cpu.weight")).expect("weight"),
            "1"
        );
        assert!(!web.join("cpu.max").exists());
        fs::remove_dir_all(&root).expect("clean up");
    }
}
