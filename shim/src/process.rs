//! One process of a task (its init or an exec) as the shim tracks it: its
//! spec and FIFOs until it starts, then the sandboxd process it became,
//! whose output the shim copies into containerd's FIFOs and whose exit it
//! records for Wait, State and the TaskExit event.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use serde_json::Value;

use crate::daemon::{Daemon, DaemonError};
use crate::spec::ProcessSpec;

/// The FIFO paths containerd gave (empty: none).
#[derive(Debug, Clone, Default)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, Clone)]
pub enum State {
    Created,
    Running { api_id: u64, pid: u32 },
    Exited { pid: u32, code: u32, at: Timestamp },
}

pub struct Process {
    pub exec_id: String,
    pub spec: ProcessSpec,
    pub stdio: Stdio,
    state: Mutex<State>,
    changed: Condvar,
}

impl Process {
    pub fn new(exec_id: &str, spec: ProcessSpec, stdio: Stdio) -> Arc<Process> {
        Arc::new(Process {
            exec_id: exec_id.to_string(),
            spec,
            stdio,
            state: Mutex::new(State::Created),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> State {
        self.lock().clone()
    }

    pub fn set_running(&self, api_id: u64, pid: u32) {
        *self.lock() = State::Running { api_id, pid };
        self.changed.notify_all();
    }

    /// Records the exit once; false when it was already recorded.
    pub fn set_exited(&self, code: u32) -> bool {
        let mut state = self.lock();
        let pid = match *state {
            State::Exited { .. } => return false,
            State::Running { pid, .. } => pid,
            State::Created => 0,
        };
        let at = containerd_shim::util::timestamp().unwrap_or_default();
        *state = State::Exited { pid, code, at };
        self.changed.notify_all();
        true
    }

    /// Blocks until the process has exited: its status and time.
    pub fn wait(&self) -> (u32, Timestamp) {
        let mut state = self.lock();
        loop {
            if let State::Exited { code, at, .. } = &*state {
                return (*code, at.clone());
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The exit status containerd reports: the code, or 128 + the signal.
pub fn exit_status(process: &Value) -> u32 {
    if let Some(code) = process.get("exit_code").and_then(Value::as_i64) {
        return u32::try_from(code).unwrap_or(255);
    }
    let signal = process.get("signal").and_then(Value::as_u64).unwrap_or(0);
    128 + u32::try_from(signal).unwrap_or(0)
}

fn open_fifo_for_writing(path: &str) -> Option<File> {
    if path.is_empty() {
        return None;
    }
    let path = path.strip_prefix("file://").unwrap_or(path);
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => Some(file),
        Err(e) => {
            log::warn!("opening {path} for output: {e}");
            None
        }
    }
}

/// Copies the process's output into containerd's FIFOs until its exit,
/// resuming from the offsets it reached if the stream breaks (a restarted
/// daemon); returns its exit status.
pub fn copy_output(daemon: &Daemon, sandbox: &str, api_id: u64, stdio: &Stdio) -> u32 {
    let mut stdout = open_fifo_for_writing(&stdio.stdout);
    let mut stderr = open_fifo_for_writing(&stdio.stderr);
    let (mut stdout_offset, mut stderr_offset) = (0u64, 0u64);
    let mut failures = 0u32;
    loop {
        let path = format!(
            "/v1/sandboxes/{sandbox}/processes/{api_id}/output?stdout_offset={stdout_offset}&stderr_offset={stderr_offset}"
        );
        let body = match daemon.stream(&path) {
            Ok(body) => body,
            Err(DaemonError::Refused { status: 404, .. }) => {
                // The sandbox or process is gone (deleted under the task).
                return 137;
            }
            Err(e) => {
                failures += 1;
                if failures > 600 {
                    log::error!("giving up on the output of process {api_id}: {e}");
                    return 255;
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        for line in BufReader::new(body).lines() {
            let Ok(line) = line else { break };
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let (sink, offset) = match event["type"].as_str() {
                Some("stdout") => (&mut stdout, &mut stdout_offset),
                Some("stderr") => (&mut stderr, &mut stderr_offset),
                Some("exit") => return exit_status(&event["process"]),
                _ => continue,
            };
            let data = base64::engine::general_purpose::STANDARD
                .decode(event["data"].as_str().unwrap_or_default())
                .unwrap_or_default();
            *offset = event["offset"].as_u64().unwrap_or(*offset) + data.len() as u64;
            if let Some(file) = sink {
                if file.write_all(&data).is_err() {
                    // The reader went away (ctr detached): keep draining.
                    *sink = None;
                }
            }
        }
    }
}

/// Feeds containerd's stdin FIFO to the process until EOF, then closes
/// the process's stdin.
pub fn copy_stdin(daemon: &Daemon, sandbox: &str, api_id: u64, path: &str) {
    let path = path.strip_prefix("file://").unwrap_or(path);
    // Blocks until containerd's side opens it for writing.
    let mut fifo = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => {
            log::warn!("opening {path} for stdin: {e}");
            close_stdin(daemon, sandbox, api_id);
            return;
        }
    };
    let target = format!("/v1/sandboxes/{sandbox}/processes/{api_id}/stdin");
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match fifo.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if daemon.send_bytes("POST", &target, &buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    close_stdin(daemon, sandbox, api_id);
}

pub fn close_stdin(daemon: &Daemon, sandbox: &str, api_id: u64) {
    let target = format!("/v1/sandboxes/{sandbox}/processes/{api_id}/stdin");
    if let Err(e) = daemon.call("DELETE", &target, None) {
        log::debug!("closing stdin of {api_id}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exit_codes_and_signals_read_as_containerd_reports_them() {
        assert_eq!(exit_status(&json!({"exit_code": 3})), 3);
        assert_eq!(exit_status(&json!({"exit_code": null, "signal": 15})), 143);
    }

    #[test]
    fn wait_returns_once_the_exit_is_recorded_and_only_the_first_counts() {
        let p = Process::new("", ProcessSpec { body: json!({}) }, Stdio::default());
        p.set_running(1, 42);
        let waiter = {
            let p = Arc::clone(&p);
            std::thread::spawn(move || p.wait().0)
        };
        assert!(p.set_exited(7));
        assert!(!p.set_exited(9));
        assert_eq!(waiter.join().unwrap(), 7);
        assert!(matches!(
            p.state(),
            State::Exited {
                pid: 42,
                code: 7,
                ..
            }
        ));
    }
}
