//! The host's mounts in every mount namespace, not only the tests' own: a
//! container sandbox's root is mounted where only the container sees it
//! (src/runtime/mount_ns.rs), so a check that a root is there, or gone,
//! has to look in every namespace.

use std::os::unix::fs::MetadataExt;

/// One line of some namespace's mountinfo: where it is mounted (in that
/// namespace) and its filesystem's options.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mount {
    /// The namespace's inode (`/proc/PID/ns/mnt`).
    pub namespace: u64,
    pub point: String,
    pub fs_type: String,
    pub super_options: String,
}

/// The mount namespace of this test process.
pub fn own_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/mnt")
        .expect("own mount namespace")
        .ino()
}

/// The mount namespace of process `pid`, if it still runs.
pub fn namespace_of(pid: i32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| m.ino())
}

/// Every mount of every mount namespace a process or thread is in now
/// (sandboxd's own reading of them, `runtime::mount_ns::mount_tables`).
pub fn everywhere() -> Vec<Mount> {
    let mut mounts = Vec::new();
    for (namespace, info) in sandboxd::runtime::mount_ns::mount_tables() {
        mounts.extend(info.lines().filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = before.split(' ').nth(4)?;
            let mut fs = after.split(' ');
            let fs_type = fs.next()?;
            let super_options = fs.nth(1).unwrap_or("");
            Some(Mount {
                namespace,
                point: point.to_string(),
                fs_type: fs_type.to_string(),
                super_options: super_options.to_string(),
            })
        }));
    }
    mounts
}

/// The overlays, in any namespace, whose writable layer is `upper`.
pub fn overlays_over(upper: &std::path::Path) -> Vec<Mount> {
    let wanted = format!("upperdir={}", upper.display());
    everywhere()
        .into_iter()
        .filter(|m| m.fs_type == "overlay" && m.super_options.split(',').any(|o| o == wanted))
        .collect()
}
