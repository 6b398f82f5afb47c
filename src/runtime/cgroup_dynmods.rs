//! cgroup2's `favordynmods`, which the daemon turns on at start.
//!
//! Every create moves a process into the sandbox's cgroups, and every move
//! takes the kernel's global `cgroup_threadgroup_rwsem` for writing. Unless
//! cgroups favour dynamic modifications, the first writer after a quiet
//! moment waits for a full RCU grace period (measured at 15 ms a create on
//! the 2-core dev host, more than crun needs to start a container). With
//! `favordynmods` the semaphore stays in its writer-friendly mode and forks
//! and exits pay a memory barrier instead. The flag belongs to cgroup2's
//! root but switches the one global semaphore, so it serves cgroup v1
//! hierarchies too, as on hybrid hosts. A cgroup2 remount replaces the
//! root's flags (`nsdelegate`, `memory_recursiveprot`, ...) with those it
//! names and the mount's own flags (`nosuid`, ...) with those it passes, so
//! both are read from mountinfo and passed back with `favordynmods` added.

use std::io;
use std::path::PathBuf;

use nix::mount::{mount, MsFlags};

use crate::image::mounts::unescape;

const OPTION: &str = "favordynmods";

#[derive(Debug, thiserror::Error)]
pub enum DynmodsError {
    #[error("reading /proc/self/mountinfo: {0}")]
    Mountinfo(io::Error),
    #[error("remounting {mount_point} with favordynmods: {source}; set cgroup_favor_dynmods = false to leave it as it is")]
    Remount {
        mount_point: String,
        source: nix::Error,
    },
    #[error("{mount_point} was remounted but shows no favordynmods (the daemon is not in the host's cgroup namespace); boot the host with cgroup_favordynmods=true, or set cgroup_favor_dynmods = false")]
    NotApplied { mount_point: String },
}

/// What [`favor_dynamic_modifications`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DynmodsOutcome {
    AlreadyOn,
    TurnedOn {
        mount_point: PathBuf,
    },
    /// A cgroup v1-only host: nothing to remount (the kernel's
    /// `cgroup_favordynmods=true` boot option does the same there).
    NoCgroup2,
}

/// The host's cgroup2 mount as mountinfo shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cgroup2Mount {
    mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,nodev,noexec,relatime`).
    mount_options: String,
    /// The root's options (`rw,nsdelegate,memory_recursiveprot`).
    super_options: String,
}

impl Cgroup2Mount {
    fn favors_dynmods(&self) -> bool {
        self.super_options.split(',').any(|o| o == OPTION)
    }

    /// The remount's flags: the mount's own, kept as they are.
    fn remount_flags(&self) -> MsFlags {
        self.mount_options
            .split(',')
            .fold(MsFlags::MS_REMOUNT, |flags, option| {
                flags
                    | match option {
                        "ro" => MsFlags::MS_RDONLY,
                        "nosuid" => MsFlags::MS_NOSUID,
                        "nodev" => MsFlags::MS_NODEV,
                        "noexec" => MsFlags::MS_NOEXEC,
                        "noatime" => MsFlags::MS_NOATIME,
                        "nodiratime" => MsFlags::MS_NODIRATIME,
                        "relatime" => MsFlags::MS_RELATIME,
                        _ => MsFlags::empty(),
                    }
            })
    }

    /// The remount's data: the root's options as they are (`rw`/`ro` are
    /// the flags' business), with ours or without it.
    fn remount_data(&self, favor: bool) -> String {
        self.super_options
            .split(',')
            .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro" && *o != OPTION)
            .chain(favor.then_some(OPTION))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn remount(&self, favor: bool) -> Result<(), DynmodsError> {
        mount(
            None::<&str>,
            &self.mount_point,
            None::<&str>,
            self.remount_flags(),
            Some(self.remount_data(favor).as_str()),
        )
        .map_err(|source| DynmodsError::Remount {
            mount_point: self.mount_point.display().to_string(),
            source,
        })
    }
}

/// The first cgroup2 mount in `mountinfo`: fields are `id parent dev root
/// mount_point mount_options [optional...] - fstype source super_options`.
fn find_cgroup2(mountinfo: &str) -> Option<Cgroup2Mount> {
    mountinfo.lines().find_map(|line| {
        let (mount_fields, fs_fields) = line.split_once(" - ")?;
        let mut fs = fs_fields.split(' ');
        if fs.next()? != "cgroup2" {
            return None;
        }
        let super_options = fs.nth(1)?.to_string();
        let mut fields = mount_fields.split(' ');
        let mount_point = unescape(fields.nth(4)?);
        let mount_options = fields.next()?.to_string();
        Some(Cgroup2Mount {
            mount_point,
            mount_options,
            super_options,
        })
    })
}

fn read_cgroup2() -> Result<Option<Cgroup2Mount>, DynmodsError> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(DynmodsError::Mountinfo)?;
    Ok(find_cgroup2(&mountinfo))
}

/// Turns `favordynmods` on for the host's cgroup2, keeping its other
/// options, and checks that it took.
pub fn favor_dynamic_modifications() -> Result<DynmodsOutcome, DynmodsError> {
    let Some(cgroup2) = read_cgroup2()? else {
        return Ok(DynmodsOutcome::NoCgroup2);
    };
    if cgroup2.favors_dynmods() {
        return Ok(DynmodsOutcome::AlreadyOn);
    }
    cgroup2.remount(true)?;
    match read_cgroup2()? {
        Some(now) if now.favors_dynmods() => Ok(DynmodsOutcome::TurnedOn {
            mount_point: now.mount_point,
        }),
        _ => Err(DynmodsError::NotApplied {
            mount_point: cgroup2.mount_point.display().to_string(),
        }),
    }
}

/// Turns `favordynmods` off again, keeping the other options: how a test
/// gets a host the daemon has not tuned yet.
pub fn stop_favoring_dynamic_modifications() -> Result<(), DynmodsError> {
    match read_cgroup2()? {
        Some(cgroup2) => cgroup2.remount(false),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const HYBRID: &str = "\
30 1 254:0 / / rw,relatime - ext4 /dev/vda rw
35 30 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
41 35 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
42 35 0:39 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,freezer
";

    #[test]
    fn the_remount_keeps_the_mounts_flags_and_the_roots_options() {
        let found = find_cgroup2(HYBRID).expect("cgroup2 found");
        assert_eq!(found.mount_point, Path::new("/sys/fs/cgroup/unified"));
        assert!(!found.favors_dynmods());
        assert_eq!(
            found.remount_flags(),
            MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_RELATIME
        );
        assert_eq!(
            found.remount_data(true),
            "nsdelegate,memory_recursiveprot,favordynmods"
        );
    }

    #[test]
    fn a_root_that_favors_dynmods_is_seen_as_such() {
        let on = HYBRID.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods");
        let found = find_cgroup2(&on).expect("cgroup2");
        assert!(found.favors_dynmods());
        assert_eq!(found.remount_data(false), "nsdelegate,memory_recursiveprot");
    }

    #[test]
    fn a_v1_only_host_has_no_cgroup2_and_an_escaped_mount_point_is_read() {
        let v1_only: String = HYBRID.lines().filter(|l| !l.contains("cgroup2")).collect();
        assert_eq!(find_cgroup2(&v1_only), None);
        let escaped = "41 35 0:38 / /sys/fs/a\\040b rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_cgroup2(escaped).expect("cgroup2").mount_point,
            Path::new("/sys/fs/a b")
        );
    }
}
