//! A supervisor started ahead of any sandbox (`sandboxd supervise --standby
//! --cgroup-parent P RUN_DIR`). It does the part of a supervisor's start
//! that needs no sandbox: the exec, and the move into `<P>/supervisors`,
//! which on cgroup v1 waits out an RCU grace period the first time (several
//! milliseconds). Then it waits on stdin for the one line that makes it a
//! sandbox's supervisor: `DIR HANDED_NS` (the sandbox's run directory, under
//! RUN_DIR, and the daemon's CLOCK_MONOTONIC at the handoff). The end of its
//! input (the daemon stopped or died) ends it.

use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::StartClock;

/// Marks a standby's command line (recovery tells standbys from the
/// supervisors of named sandboxes by it).
pub const STANDBY_FLAG: &str = "--standby";

/// The line that hands a standby its sandbox.
pub fn handoff_line(dir: &Path, handed_ns: u64) -> String {
    format!("{} {handed_ns}\n", dir.display())
}

fn parse_handoff(line: &str) -> Option<(PathBuf, u64)> {
    let (dir, at) = line.trim_end_matches('\n').rsplit_once(' ')?;
    Some((PathBuf::from(dir), at.parse().ok()?))
}

/// Runs a standby supervisor; returns the process exit code.
pub fn run_standby(run_dir: &Path, cgroup_parent: &str) -> i32 {
    if let Err(e) = crate::runtime::cgroups::join_supervisors_group(cgroup_parent) {
        tracing::warn!("a standby supervisor leaving the daemon's cgroup: {e}");
    }
    // Work every container create needs, done while nothing waits for it.
    crate::runtime::seccomp_shared::read_from(run_dir);
    crate::runtime::seccomp_filter::prepare();
    crate::runtime::procfs_handle::prepare();
    // Kept for the process: on v1 the lookup reads the mount table.
    let _ = crate::runtime::cgroups::huge_page_sizes_to_deny();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => return 0,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!("a standby supervisor reading its handoff: {e}");
            return 1;
        }
    }
    let Some((dir, handed_ns)) = parse_handoff(&line) else {
        tracing::error!("a standby supervisor got a handoff it cannot read: {line:?}");
        return 1;
    };
    if dir.parent() != Some(run_dir) {
        tracing::error!(
            "a standby supervisor was handed {} outside {}",
            dir.display(),
            run_dir.display()
        );
        return 1;
    }
    // From here on, as a supervisor spawned for this sandbox: the daemon's
    // CPU priority (it waited at a lower one), its log in the run
    // directory, nothing on stdin. Still single-threaded: the threads
    // made from here on inherit it.
    crate::background_priority::set(crate::background_priority::base());
    if let Err(e) = redirect_stdio(&dir) {
        tracing::error!(
            "a standby supervisor opening its log in {}: {e}",
            dir.display()
        );
        return 1;
    }
    super::start(&dir, StartClock::since(Some(handed_ns)), false)
}

fn redirect_stdio(dir: &Path) -> std::io::Result<()> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(
        crate::runtime::paths::SandboxPaths {
            dir: dir.to_path_buf(),
        }
        .log(),
    )?;
    let null = std::fs::File::open("/dev/null")?;
    for (from, to) in [(log.as_raw_fd(), 2), (null.as_raw_fd(), 0)] {
        // SAFETY: dup2 of a descriptor this function holds open onto a
        // standard descriptor number.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handoff_line_reads_back() {
        let line = handoff_line(Path::new("/run/sandboxd/sandboxes/sb-0a1b 2"), 42);
        assert_eq!(
            parse_handoff(&line),
            Some((PathBuf::from("/run/sandboxd/sandboxes/sb-0a1b 2"), 42))
        );
        assert_eq!(parse_handoff("no-timestamp\n"), None);
        assert_eq!(parse_handoff("/x notanumber\n"), None);
    }
}
