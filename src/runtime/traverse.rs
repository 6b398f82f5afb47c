//! Whether a sandbox's shifted ids can reach, on the host, what its
//! container's init opens by path: the run directory (the rootfs and the
//! `/etc` files it mounts) and the agent binary it bind-mounts and runs.
//!
//! Init is the sandbox's root, which on the host is uid and gid
//! `id_map_base` (see [`super::spec`]): it holds no privilege over host
//! directories whose owner is not in its range, so every folder on the way
//! must let that uid search it. A `--run-dir` under a folder of mode 0700
//! otherwise fails every create with a bare "failed to prepare rootfs";
//! the daemon checks this once at start and refuses to run, naming the
//! folder and the fix. Paths opened by the supervisor or the VMM as host
//! root (image layers, the disk pool, microVM disks) are not checked: host
//! root reaches them whatever their mode.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::model::ID_MAP_SIZE;

#[derive(Debug, thiserror::Error)]
pub enum TraverseError {
    #[error(
        "sandboxes cannot reach the {what} {target}: {dir} (mode {mode:04o}, owner {owner}:{group}) \
         does not let their ids (uid {uid}, gid {gid}, from id_map_base) search it; \
         run `chmod o+x {dir}` or choose {fix}"
    )]
    NotSearchable {
        what: &'static str,
        target: PathBuf,
        dir: PathBuf,
        mode: u32,
        owner: u32,
        group: u32,
        uid: u32,
        gid: u32,
        fix: &'static str,
    },
    #[error(
        "sandboxes cannot run the {what} {target}: its mode {mode:04o} (owner {owner}:{group}) \
         does not let their ids (uid {uid}, gid {gid}, from id_map_base) execute it; \
         run `chmod o+rx {target}` or choose {fix}"
    )]
    NotExecutable {
        what: &'static str,
        target: PathBuf,
        mode: u32,
        owner: u32,
        group: u32,
        uid: u32,
        gid: u32,
        fix: &'static str,
    },
    #[error("checking that sandboxes can reach the {what} {target}: {path}: {source}")]
    Inspect {
        what: &'static str,
        target: PathBuf,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The host ids of a sandbox's root, and the range its namespace maps.
#[derive(Debug, Clone, Copy)]
pub struct SandboxIds {
    pub uid: u32,
    pub gid: u32,
    pub range: u32,
}

impl SandboxIds {
    /// A sandbox's ids when its namespace maps from `id_map_base`.
    pub fn from_base(id_map_base: u32) -> Self {
        SandboxIds {
            uid: id_map_base,
            gid: id_map_base,
            range: ID_MAP_SIZE,
        }
    }

    fn mapped(&self, id: u32, base: u32) -> bool {
        id.checked_sub(base)
            .is_some_and(|offset| offset < self.range)
    }
}

/// What a sandbox must do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Look up names in a directory (the `x` bit).
    Search,
    /// Execute a file (the `x` bit; without the capability to override it
    /// when the file has no `x` bit at all).
    Execute,
}

/// Whether `ids` may `access` an inode of `mode`, `owner` and `group`,
/// as the kernel decides it for a process in the sandbox's user namespace:
/// its root holds CAP_DAC_OVERRIDE only over inodes whose owner and group
/// are both mapped; otherwise the owner, group or other bits apply.
pub fn may(mode: u32, owner: u32, group: u32, ids: SandboxIds, access: Access) -> bool {
    if ids.mapped(owner, ids.uid) && ids.mapped(group, ids.gid) {
        return access == Access::Search || mode & 0o111 != 0;
    }
    let shift = if owner == ids.uid {
        6
    } else if group == ids.gid {
        3
    } else {
        0
    };
    (mode >> shift) & 0o1 != 0
}

/// The daemon's start-up check: the sandboxes' run directory and the agent
/// binary, with the settings that change them.
pub fn check_daemon_paths(
    sandboxes_run_dir: &Path,
    agent_path: &Path,
    id_map_base: u32,
) -> Result<(), TraverseError> {
    let ids = SandboxIds::from_base(id_map_base);
    check_dir(
        "run directory",
        sandboxes_run_dir,
        "another --run-dir (`run_dir`) whose every parent folder others may search",
        ids,
    )?;
    check_file(
        "agent",
        agent_path,
        "another --agent-path (`agent_path`) whose every parent folder others may search",
        ids,
    )
}

/// Checks that `ids` can search `dir` and every folder above it.
pub fn check_dir(
    what: &'static str,
    dir: &Path,
    fix: &'static str,
    ids: SandboxIds,
) -> Result<(), TraverseError> {
    for folder in folders_on_the_way(what, dir, true)? {
        search(what, dir, &folder, fix, ids)?;
    }
    Ok(())
}

/// Checks that `ids` can search every folder above `file` and execute it.
pub fn check_file(
    what: &'static str,
    file: &Path,
    fix: &'static str,
    ids: SandboxIds,
) -> Result<(), TraverseError> {
    for folder in folders_on_the_way(what, file, false)? {
        search(what, file, &folder, fix, ids)?;
    }
    let meta = inspect(what, file, file)?;
    if may(meta.mode(), meta.uid(), meta.gid(), ids, Access::Execute) {
        return Ok(());
    }
    Err(TraverseError::NotExecutable {
        what,
        target: file.to_path_buf(),
        mode: meta.mode() & 0o7777,
        owner: meta.uid(),
        group: meta.gid(),
        uid: ids.uid,
        gid: ids.gid,
        fix,
    })
}

fn search(
    what: &'static str,
    target: &Path,
    folder: &Path,
    fix: &'static str,
    ids: SandboxIds,
) -> Result<(), TraverseError> {
    let meta = inspect(what, target, folder)?;
    if may(meta.mode(), meta.uid(), meta.gid(), ids, Access::Search) {
        return Ok(());
    }
    Err(TraverseError::NotSearchable {
        what,
        target: target.to_path_buf(),
        dir: folder.to_path_buf(),
        mode: meta.mode() & 0o7777,
        owner: meta.uid(),
        group: meta.gid(),
        uid: ids.uid,
        gid: ids.gid,
        fix,
    })
}

fn inspect(what: &'static str, target: &Path, path: &Path) -> Result<Metadata, TraverseError> {
    std::fs::metadata(path).map_err(|source| TraverseError::Inspect {
        what,
        target: target.to_path_buf(),
        path: path.to_path_buf(),
        source,
    })
}

/// The folders a lookup of `path` passes, from `/` down (with `path`
/// itself when `inclusive`): those of the path as written and, when a
/// symlink is on the way, those of where it leads. Topmost first, so the
/// error names the folder to fix first.
fn folders_on_the_way(
    what: &'static str,
    path: &Path,
    inclusive: bool,
) -> Result<Vec<PathBuf>, TraverseError> {
    let inspect_err = |source| TraverseError::Inspect {
        what,
        target: path.to_path_buf(),
        path: path.to_path_buf(),
        source,
    };
    let written = std::path::absolute(path).map_err(inspect_err)?;
    let resolved = std::fs::canonicalize(path).map_err(inspect_err)?;
    let mut folders: Vec<PathBuf> = Vec::new();
    for full in [written, resolved] {
        let mut chain: Vec<PathBuf> = full
            .ancestors()
            .skip(usize::from(!inclusive))
            .map(Path::to_path_buf)
            .collect();
        chain.reverse();
        for folder in chain {
            if !folders.contains(&folder) {
                folders.push(folder);
            }
        }
    }
    Ok(folders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const IDS: SandboxIds = SandboxIds {
        uid: 100_000,
        gid: 100_000,
        range: 65_536,
    };
    const FIX: &str = "another --run-dir";

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn the_class_that_applies_decides() {
        // Host root's folder: only the other bits count.
        assert!(!may(0o700, 0, 0, IDS, Access::Search));
        assert!(!may(0o770, 0, 0, IDS, Access::Search));
        assert!(may(0o701, 0, 0, IDS, Access::Search));
        // Owned by the sandbox's root (not its group): the owner bits, even
        // when others may.
        assert!(may(0o700, 100_000, 0, IDS, Access::Search));
        assert!(!may(0o071, 100_000, 0, IDS, Access::Search));
        // Its group, an unmapped owner: the group bits.
        assert!(may(0o710, 0, 100_000, IDS, Access::Search));
        assert!(!may(0o701, 0, 100_000, IDS, Access::Search));
        // Owner and group both mapped: the namespace's root overrides the
        // bits, but cannot run a file nobody may run.
        assert!(may(0o000, 100_005, 100_007, IDS, Access::Search));
        assert!(may(0o100, 100_005, 100_007, IDS, Access::Execute));
        assert!(!may(0o644, 100_005, 100_007, IDS, Access::Execute));
        // An agent of mode 0755 owned by host root runs; 0700 does not.
        assert!(may(0o755, 0, 0, IDS, Access::Execute));
        assert!(!may(0o700, 0, 0, IDS, Access::Execute));
    }

    #[test]
    fn a_closed_folder_above_the_run_dir_is_named_with_the_fix() {
        let top = tempfile::tempdir().expect("tempdir");
        chmod(top.path(), 0o755);
        let closed = top.path().join("closed");
        let run = closed.join("run/sandboxes");
        std::fs::create_dir_all(&run).expect("mkdir");
        chmod(&closed, 0o700);
        let err = check_dir("run directory", &run, FIX, IDS).expect_err("0700 on the way");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{} (mode 0700", closed.display())),
            "{text}"
        );
        assert!(
            text.contains(&format!("chmod o+x {}", closed.display())),
            "{text}"
        );
        assert!(text.contains(FIX), "{text}");

        chmod(&closed, 0o711);
        check_dir("run directory", &run, FIX, IDS).expect("searchable all the way");

        // The run dir itself counts too.
        chmod(&run, 0o700);
        let err = check_dir("run directory", &run, FIX, IDS).expect_err("run dir 0700");
        assert!(err
            .to_string()
            .contains(&format!("chmod o+x {}", run.display())));
    }

    #[test]
    fn a_symlink_is_followed_to_where_it_leads() {
        let top = tempfile::tempdir().expect("tempdir");
        chmod(top.path(), 0o755);
        let hidden = top.path().join("hidden");
        let real = hidden.join("real");
        std::fs::create_dir_all(&real).expect("mkdir");
        chmod(&hidden, 0o700);
        let link = top.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let err = check_dir("run directory", &link, FIX, IDS).expect_err("target hidden");
        assert!(err
            .to_string()
            .contains(&format!("chmod o+x {}", hidden.display())));
    }

    #[test]
    fn the_agent_must_be_reachable_and_executable() {
        let top = tempfile::tempdir().expect("tempdir");
        chmod(top.path(), 0o755);
        let agent = top.path().join("sandbox-agent");
        std::fs::write(&agent, b"\x7fELF").expect("write");
        chmod(&agent, 0o755);
        check_file("agent", &agent, FIX, IDS).expect("0755 agent");
        chmod(&agent, 0o700);
        let err = check_file("agent", &agent, FIX, IDS).expect_err("0700 agent");
        assert!(err.to_string().contains("chmod o+rx"), "{err}");
        chmod(&agent, 0o755);
        chmod(top.path(), 0o700);
        let err = check_file("agent", &agent, FIX, IDS).expect_err("closed folder");
        assert!(err
            .to_string()
            .contains(&format!("chmod o+x {}", top.path().display())));
        chmod(top.path(), 0o755);
    }

    #[test]
    fn a_missing_path_says_which() {
        let err = check_dir("run directory", Path::new("/nonexistent/run"), FIX, IDS)
            .expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/run"), "{err}");
    }
}
