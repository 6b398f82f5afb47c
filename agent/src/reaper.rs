//! The reaper: as PID 1 (or a subreaper) the agent collects every child that
//! exits, tracked or orphaned, from a SIGCHLD-driven waitpid(-1) loop, and
//! hands tracked exits to their process's supervisor.

use std::io;
use std::sync::Arc;

use sandbox_proto::ExitStatus;
use tokio::signal::unix::Signal;

use crate::agent::Agent;

pub async fn run(agent: Arc<Agent>, mut sigchld: Signal) {
    loop {
        {
            // Spawns hold this shared until their pid is in the table; see Agent::spawn_gate.
            let _gate = agent.spawn_gate.write().await;
            reap_all(&agent);
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

fn reap_all(agent: &Agent) {
    loop {
        let mut raw = 0;
        // SAFETY: waitpid writes only to `raw`, a local we own.
        let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if pid > 0 {
            agent.procs().reaped(pid, exit_status(raw));
        } else if pid < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            // 0: children remain but none has exited; ECHILD: no children at all.
            return;
        }
    }
}

/// waitpid without WUNTRACED/WCONTINUED reports only terminations: an exit or a signal.
pub fn exit_status(raw: libc::c_int) -> ExitStatus {
    if libc::WIFEXITED(raw) {
        ExitStatus {
            code: Some(libc::WEXITSTATUS(raw)),
            signal: None,
            oom_killed: false,
        }
    } else {
        ExitStatus {
            code: None,
            signal: Some(libc::WTERMSIG(raw)),
            oom_killed: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_exit_codes_and_signals() {
        assert_eq!(exit_status(3 << 8).code, Some(3));
        assert_eq!(exit_status(3 << 8).signal, None);
        assert_eq!(exit_status(libc::SIGKILL).signal, Some(libc::SIGKILL));
        assert_eq!(
            exit_status(libc::SIGKILL | 0x80).signal,
            Some(libc::SIGKILL)
        );
        assert_eq!(exit_status(libc::SIGKILL).code, None);
    }
}
