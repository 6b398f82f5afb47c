//! The one teardown path: DELETE, TTL expiry, a failed create and recovery
//! after a restart all end here. Each step is idempotent, so a teardown that
//! was interrupted (even by SIGKILL) is finished by running it again.

use std::path::Path;
use std::time::Duration;

use crate::disk::DiskPool;
use crate::runtime::paths::SandboxPaths;
use crate::supervisor::client::{CallError, SupervisorClient};
use crate::supervisor::protocol::ClientError;

/// How long a supervisor may take to exit once it has torn its sandbox down.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);

/// Removes every trace of sandbox `id`; returns what could not be removed.
pub async fn teardown(
    id: &str,
    cgroups_path: &str,
    paths: &SandboxPaths,
    disk: &DiskPool,
) -> Vec<String> {
    let mut problems = Vec::new();
    // The supervisor kills and removes the sandbox itself when it is there...
    if let Ok(mut client) = SupervisorClient::connect(&paths.socket()).await {
        let supervisor = client.peer_pid();
        // ...if it speaks this daemon's protocol and answers: one of another
        // build (left running by recovery) could misread Shutdown, and one
        // that does not answer its health check in time would not answer
        // Shutdown either (15 s more, and then it would be left running,
        // stopped or stuck, outside the sandbox's groups). Either is
        // killed, and the pass below removes its sandbox.
        let why = match client.health().await {
            Err(CallError::Client(ClientError::Version(mismatch))) => {
                Some(format!("a supervisor of another build: {mismatch}"))
            }
            Err(CallError::Client(ClientError::Timeout(after))) => Some(format!(
                "a supervisor that did not answer its health check within {after:?}"
            )),
            _ => None,
        };
        if let Some(why) = why {
            tracing::info!(sandbox = %id, "killing {why}");
            if let Some(pid) = supervisor {
                if let Err(problem) = kill(pid).await {
                    problems.push(problem);
                }
            }
            return finish(id, cgroups_path, paths, disk, problems).await;
        }
        match client.shutdown().await {
            // Gone means gone: the supervisor exits right after answering.
            Ok(()) => {
                if let Some(pid) = supervisor {
                    if !exited(pid, EXIT_DEADLINE).await {
                        problems.push(format!("supervisor {pid} still runs after its teardown"));
                    }
                }
            }
            Err(CallError::Refused(e)) => problems.push(format!("supervisor teardown: {e}")),
            Err(e) => problems.push(e.to_string()),
        }
    }
    finish(id, cgroups_path, paths, disk, problems).await
}

/// SIGKILLs supervisor `pid` and waits until it has exited.
async fn kill(pid: i32) -> Result<(), String> {
    use nix::sys::signal::{kill, Signal};
    match kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => return Err(format!("killing supervisor {pid}: {e}")),
    }
    if exited(pid, EXIT_DEADLINE).await {
        Ok(())
    } else {
        Err(format!("supervisor {pid} still runs after SIGKILL"))
    }
}

/// Everything after the supervisor: catches whatever it did not remove (or
/// all of it, when it is gone or was killed).
async fn finish(
    id: &str,
    cgroups_path: &str,
    paths: &SandboxPaths,
    disk: &DiskPool,
    mut problems: Vec<String>,
) -> Vec<String> {
    let (id_owned, cg, p) = (id.to_string(), cgroups_path.to_string(), paths.clone());
    match tokio::task::spawn_blocking(move || crate::runtime::destroy_sandbox(&id_owned, &cg, &p))
        .await
    {
        Ok(more) => problems.extend(more),
        Err(e) => problems.push(format!("teardown task: {e}")),
    }
    if let Err(e) = disk.remove_layer(id) {
        problems.push(e.to_string());
    }
    if let Err(e) = remove_run_dir(&paths.dir) {
        problems.push(e);
    }
    problems
}

/// Waits (on a pidfd, no polling) until process `pid` has exited; `true`
/// when it has, or when it cannot be watched because it is already gone.
pub(super) async fn exited(pid: i32, deadline: Duration) -> bool {
    let Ok(pidfd) = crate::pidfd::open(pid) else {
        // ESRCH: already gone.
        return true;
    };
    // SAFETY: `pidfd` is an open descriptor that the AsyncFd owns from here
    // until it is dropped, and OwnedFd always reports that same descriptor.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    };
    let Ok(watch) = registered else {
        return true;
    };
    // A pidfd becomes readable when its process exits.
    tokio::time::timeout(deadline, watch.readable())
        .await
        .is_ok()
}

/// Deletes the sandbox's run directory, but never through a mount that is
/// still there (that would reach into the sandbox's files).
fn remove_run_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    // A fork's fresh tmpfs (runtime::fresh_tmpfs) is detached once CRIU is
    // done with it; one is left only by a supervisor that died meanwhile.
    if let Ok(entries) = std::fs::read_dir(dir.join("fresh")) {
        for entry in entries.flatten() {
            if entry.metadata().is_ok_and(|m| m.dev() != top.dev()) {
                crate::runtime::fresh_tmpfs::unmount(&entry.path());
            }
        }
    }
    let rootfs = dir.join("rootfs");
    if let Ok(meta) = std::fs::symlink_metadata(&rootfs) {
        if meta.dev() != top.dev() {
            return Err(format!(
                "{} is still mounted; unmount it and delete the sandbox again",
                rootfs.display()
            ));
        }
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))
}
