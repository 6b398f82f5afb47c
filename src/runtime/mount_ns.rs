//! Where a container sandbox's mounts are made: in a mount namespace that
//! lives only for its start, not in the host's.
//!
//! Every create reads the host's mount table, several times over
//! (libcgroups looks each v1 controller up in it, libcontainer's init
//! copies it into the container's namespace and looks its root's parent
//! mount up in it), so each mount a running sandbox kept there slowed
//! every later create. The supervisor now starts a container from a thread
//! that has unshared its mount namespace: the root overlay, the volumes'
//! binds and CRIU's mounts for a fork are made there, the container's own
//! namespace (libcontainer's, or CRIU's) is a copy of it, and when the
//! thread ends the copy it made is dropped with every mount in it. The
//! container's namespace is then the only one that holds its root: the
//! host's table grows by the network namespace's pin alone, and the root
//! goes with the container, whatever ended it.
//!
//! The host reaches a running container's root through its init:
//! [`HostRoot`]. A sandbox whose roots come from the host after its start
//! (a CRI pod's containers, mounted by containerd into the pod's
//! supervisor's view) makes them in the host's namespace, as before.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::beneath::Dir;
use super::sandbox::{RuntimeSpec, SandboxSpec};

/// Whether sandbox `spec` is started in a mount namespace of its start's
/// own: a container (or a container's fork) whose root is made at its
/// start. Not a microVM (it mounts nothing of its own), not a root
/// containerd unpacked (a pod's, whose later containers' roots the
/// supervisor mounts beside it in the host's namespace).
pub fn is_own(spec: &SandboxSpec) -> bool {
    matches!(
        spec.kind,
        RuntimeSpec::Container | RuntimeSpec::ContainerRestore(_)
    ) && !spec.host_owned_image
        && spec.joined_netns.is_none()
}

/// Runs `start` on a thread of its own that first unshares its mount
/// namespace (the process's other threads keep theirs), and returns what
/// it returns. The namespace, and what `start` mounted in it, goes when
/// the thread ends; the process's children forked from that thread (the
/// container's processes, CRIU) got a copy. Where the namespace cannot be
/// made, `start` runs in the host's, as it did before, and a warning says
/// so (the teardown unmounts the root there).
pub fn start_in_own<T: Send>(id: &str, start: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("start".into())
            // The main thread's size: libcontainer runs its clones' code
            // on this stack's copy.
            .stack_size(8 << 20)
            .spawn_scoped(scope, || {
                if let Err(e) = enter_own() {
                    tracing::warn!(sandbox = %id, "{e}; its mounts may be seen on the host");
                }
                start()
            })?;
        match thread.join() {
            Ok(started) => Ok(started),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Moves the calling thread into a new mount namespace, a copy of its
/// current one, whose mounts never reach the host's.
fn enter_own() -> io::Result<()> {
    // CLONE_FS too: the thread's root and working directory stop being
    // shared with the process's other threads, as a namespace of its own
    // needs.
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS).map_err(|e| {
        io::Error::other(format!(
            "no mount namespace of its own ({e}): starting in the host's"
        ))
    })?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| {
        io::Error::other(format!(
            "its own mount namespace stays a peer of the host's ({e}): mounts made there propagate"
        ))
    })
}

/// A container sandbox's root as the host reaches it: through its init
/// process (`/proc/PID/root`), whose root it is. Nowhere else shows it
/// once the start is over.
#[derive(Debug, Clone)]
pub struct HostRoot(Reach);

#[derive(Debug, Clone)]
enum Reach {
    /// Through the init `pid`, in group `cgroups_path`.
    Init { pid: i32, cgroups_path: String },
    /// At a directory of this namespace.
    Directory(PathBuf),
}

impl HostRoot {
    /// The root of the sandbox whose init is `init_pid`, in the sandbox's
    /// group `cgroups_path`; unknown where the pid is 0 (a record of a
    /// build that kept none).
    pub fn through_init(init_pid: i32, cgroups_path: &str) -> HostRoot {
        HostRoot(Reach::Init {
            pid: init_pid,
            cgroups_path: cgroups_path.to_owned(),
        })
    }

    /// A root mounted at `path` in this namespace (the unit tests' fake
    /// supervisors mount nothing; their roots are plain directories).
    pub fn in_directory(path: &Path) -> HostRoot {
        HostRoot(Reach::Directory(path.to_owned()))
    }

    /// Whether there is a way to the root to try.
    pub fn is_known(&self) -> bool {
        match &self.0 {
            Reach::Init { pid, .. } => *pid > 0,
            Reach::Directory(_) => true,
        }
    }

    /// Opens the root. Through an init, its pid must still be that init's
    /// when the root is open: a reused one could be another sandbox's
    /// process, with a root of its own making. So the process is pinned (a
    /// pidfd), found in the sandbox's group (which no other sandbox's
    /// process can enter), and still alive once its root is open.
    pub fn open(&self) -> io::Result<Dir> {
        let (pid, cgroups_path) = match &self.0 {
            Reach::Init { pid, cgroups_path } => (*pid, cgroups_path),
            Reach::Directory(path) => return Dir::at(path),
        };
        let gone = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("the sandbox's init (pid {pid}) is gone, and its root with it"),
            )
        };
        if pid <= 0 {
            return Err(gone());
        }
        let pinned = crate::pidfd::open(pid).map_err(|_| gone())?;
        let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|_| gone())?;
        if !in_group(&groups, cgroups_path) {
            return Err(gone());
        }
        let root = Dir::at(Path::new(&format!("/proc/{pid}/root")))?;
        if crate::pidfd::has_exited(&pinned) {
            return Err(gone());
        }
        Ok(root)
    }
}

/// The mount table (mountinfo) of every mount namespace a process or a
/// thread is in now, each read once, beside the namespace's inode. A
/// container's root is in its own namespace's table alone, and while it
/// starts in its supervisor's start thread's, which only that thread's
/// `/proc` entry shows.
pub fn mount_tables() -> Vec<(u64, String)> {
    use std::os::unix::fs::MetadataExt;
    let numbered = |dir: &Path| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    let mut seen = std::collections::HashSet::new();
    let mut tables = Vec::new();
    for process in numbered(Path::new("/proc")) {
        for thread in numbered(&process.join("task")) {
            // A thread gone meanwhile has nothing left to read.
            let Ok(namespace) = std::fs::metadata(thread.join("ns/mnt")) else {
                continue;
            };
            if !seen.insert((namespace.dev(), namespace.ino())) {
                continue;
            }
            if let Ok(mountinfo) = std::fs::read_to_string(thread.join("mountinfo")) {
                tables.push((namespace.ino(), mountinfo));
            }
        }
    }
    tables
}

/// Whether a process whose `/proc/PID/cgroup` is `groups` is in group
/// `path` or one below it, in any hierarchy.
fn in_group(groups: &str, path: &str) -> bool {
    let path = format!("/{}", path.trim_matches('/'));
    groups.lines().any(|line| {
        line.splitn(3, ':').nth(2).is_some_and(|group| {
            group == path
                || group
                    .strip_prefix(&path)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test's own process stands in for an init: reached through its
    /// own group, refused through any other, and refused once gone.
    #[test]
    fn a_root_is_reached_only_through_an_init_in_the_sandboxs_group() {
        sandboxd_test_support::require_root!("needs root (/proc/PID/root of a process)");
        let own = std::process::id() as i32;
        let groups = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
        let group = groups
            .lines()
            .find_map(|l| l.splitn(3, ':').nth(2))
            .expect("a group");
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        std::fs::write(dir.path().join("probe"), "found").expect("probe");
        let root = HostRoot::through_init(own, group)
            .open()
            .expect("through its group");
        let probe = dir.path().join("probe");
        let relative = probe.strip_prefix("/").expect("absolute");
        let read = root.read_regular_file(&relative.to_string_lossy(), 64);
        assert_eq!(read.ok().flatten().as_deref(), Some(&b"found"[..]));
        let elsewhere = HostRoot::through_init(own, "/sandboxd-no-such-group/sb-0").open();
        assert_eq!(
            elsewhere.err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
        let mut gone = std::process::Command::new("true").spawn().expect("true");
        let pid = gone.id() as i32;
        gone.wait().expect("wait");
        let reused = HostRoot::through_init(pid, group).open();
        assert_eq!(
            reused.err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
        assert!(!HostRoot::through_init(0, group).is_known());
    }

    #[test]
    fn membership_is_the_group_or_one_below_it_in_any_hierarchy() {
        let v1 = "12:pids:/sandboxd/sb-1\n11:memory:/sandboxd/sb-1/p-2\n0::/user.slice\n";
        assert!(in_group(v1, "/sandboxd/sb-1"));
        assert!(in_group(v1, "sandboxd/sb-1/"));
        assert!(!in_group(v1, "/sandboxd/sb-10"));
        assert!(!in_group(v1, "/sandboxd/sb"));
        assert!(in_group("0::/sandboxd/sb-1\n", "/sandboxd/sb-1"));
        assert!(!in_group("0::/sandboxd/sb-12\n", "/sandboxd/sb-1"));
    }
}
