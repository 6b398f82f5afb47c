//! Standby supervisors (`supervisor/standby.rs`): the daemon keeps
//! `standby_supervisors` of them started, exec'd and in the supervisors'
//! cgroup, and hands each to one launch with a line on its stdin, so a
//! create does not wait for a process to start or for its first cgroup
//! migration. Made by one background task, between callers' creates.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, MutexGuard};

use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};

use super::create::supervisor_command;
use super::manager::Manager;
use crate::runtime::paths::SandboxPaths;
use crate::supervisor::standby::{handoff_line, STANDBY_FLAG};

/// A started standby and its pipes (closing its stdin ends it).
pub(super) struct Standby {
    pid: i32,
    stdin: ChildStdin,
    stdout: ChildStdout,
}

/// The ready standbys, oldest first.
pub(super) type Standbys = VecDeque<Standby>;

impl Manager {
    fn standbys(&self) -> MutexGuard<'_, Standbys> {
        self.standbys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn standbys_wanted(&self) -> bool {
        self.standbys().len() < self.config.standby_supervisors
    }

    fn standbys_low(&self) -> bool {
        self.standbys().len() * 2 <= self.config.standby_supervisors
    }

    /// The task that keeps `standby_supervisors` started
    /// ([`Manager::keep_made_ahead`]).
    pub(super) fn start_standby_maker(self: &Arc<Self>) {
        self.keep_made_ahead(
            "a standby supervisor",
            Manager::standbys_wanted,
            Manager::standbys_low,
            |m| &m.standby_taken,
            |m| async move {
                let standby = m.spawn_standby().map_err(|e| e.to_string())?;
                m.standbys().push_back(standby);
                Ok(())
            },
        );
    }

    fn spawn_standby(&self) -> std::io::Result<Standby> {
        let mut command = supervisor_command();
        command
            .arg("supervise")
            .arg(STANDBY_FLAG)
            .arg("--cgroup-parent")
            .arg(&self.config.cgroup_parent)
            .arg(self.config.sandboxes_run_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Until its handoff it has no log of its own: the daemon's.
            // It lowers its own CPU priority below creates' as it starts;
            // its handoff puts it back to normal.
            .stderr(Stdio::inherit());
        let mut child = command.spawn()?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other(
                "a standby supervisor without its pipes",
            ));
        };
        // It lives on; tokio reaps it if it exits while we run.
        drop(child);
        Ok(Standby { pid, stdin, stdout })
    }

    /// Hands the sandbox of `paths` (its config written) to a standby;
    /// returns its pid and the stdout its ready line comes on, or `None`
    /// when no standby is ready.
    pub(super) async fn hand_to_standby(&self, paths: &SandboxPaths) -> Option<(i32, ChildStdout)> {
        loop {
            let standby = self.standbys().pop_front();
            self.standby_taken.notify_one();
            let mut standby = standby?;
            let line = handoff_line(&paths.dir, crate::supervisor::monotonic_ns());
            match standby.stdin.write_all(line.as_bytes()).await {
                // Its stdin closes here; the line stays in the pipe for it.
                Ok(()) => return Some((standby.pid, standby.stdout)),
                Err(e) => tracing::warn!(
                    pid = standby.pid,
                    "a standby supervisor is gone ({e}); trying another"
                ),
            }
        }
    }

    /// Ends the standbys (a clean stop): their stdin closes.
    pub fn drain_standbys(&self) {
        self.standbys().clear();
    }
}
