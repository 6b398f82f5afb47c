//! One process of a task (its init or an exec) as the shim tracks it: its
//! spec and FIFOs until it starts, then the sandboxd process it became,
//! whose output the shim copies into containerd's FIFOs and whose exit it
//! records for Wait, State and the TaskExit event.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
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
    /// Start is asking sandboxd for the process; a Kill waits it out.
    Starting,
    Running {
        api_id: u64,
        pid: u32,
    },
    Exited {
        pid: u32,
        code: u32,
        at: Timestamp,
    },
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

    /// The state once no Start is under way.
    pub fn settled_state(&self) -> State {
        let mut state = self.lock();
        while matches!(*state, State::Starting) {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.clone()
    }

    /// Created -> Starting; false when it was not Created (started twice,
    /// or killed before its start).
    pub fn begin_start(&self) -> bool {
        let mut state = self.lock();
        if !matches!(*state, State::Created) {
            return false;
        }
        *state = State::Starting;
        true
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
            State::Created | State::Starting => 0,
        };
        let at = containerd_shim::util::timestamp().unwrap_or_default();
        *state = State::Exited { pid, code, at };
        self.changed.notify_all();
        true
    }

    pub fn has_exited(&self) -> bool {
        matches!(*self.lock(), State::Exited { .. })
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
    128u32.saturating_add(u32::try_from(signal).unwrap_or(0))
}

/// Waits between retries while sandboxd is away (restarting): growing to
/// a second, for as long as it takes.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(50))
    }
    fn pause(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}

/// The exit status of `process` (sandboxd's `api_id`), however long it
/// runs and across daemon restarts; 137 when sandboxd no longer knows it
/// (its sandbox was removed under it), or when its end was recorded
/// otherwise while sandboxd could not answer (its sandbox failed: see
/// [`watch_sandbox`]).
pub fn wait_exit(daemon: &Daemon, sandbox: &str, api_id: u64, process: &Process) -> u32 {
    let path = format!("/v1/sandboxes/{sandbox}/processes/{api_id}/wait?timeout_seconds=60");
    let mut backoff = Backoff::new();
    loop {
        match daemon.call("GET", &path, None) {
            Ok(answer) if answer["state"] == "running" => backoff = Backoff::new(),
            Ok(answer) => return exit_status(&answer),
            Err(DaemonError::Refused { status: 404, .. }) => return 137,
            Err(_) if process.has_exited() => return 137,
            Err(e) => {
                log::debug!("waiting for process {api_id}: {e}");
                backoff.pause();
            }
        }
    }
}

/// Follows sandboxd's event log until sandbox `sandbox` fails (it died on
/// its own) or is deleted, by anyone (true), or until `holder`, the
/// process that stands for the sandbox, has ended otherwise (false). Reads
/// the log from its start, so an end before the watch began counts, and
/// resumes after the last event seen when a restarting daemon breaks the
/// stream.
pub fn watch_sandbox(daemon: &Daemon, sandbox: &str, holder: &Process) -> bool {
    let mut cursor = 0u64;
    let mut backoff = Backoff::new();
    loop {
        match daemon.stream(&format!("/v1/events?cursor={cursor}&follow=true")) {
            Ok(body) => {
                backoff = Backoff::new();
                for line in BufReader::new(body).lines() {
                    let Ok(line) = line else { break };
                    let Ok(event) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    if holder.has_exited() {
                        return false;
                    }
                    if event["kind"] == "events_lost" {
                        // What was trimmed may have been the end: ask.
                        if sandbox_gone(daemon, sandbox) {
                            return true;
                        }
                        continue;
                    }
                    cursor = event["cursor"].as_u64().unwrap_or(cursor);
                    let ended = matches!(event["kind"].as_str(), Some("failed" | "deleted"));
                    if ended && event["sandbox_id"] == sandbox {
                        return true;
                    }
                }
            }
            Err(e) => log::debug!("following sandboxd's events for {sandbox}: {e}"),
        }
        if holder.has_exited() {
            return false;
        }
        if sandbox_gone(daemon, sandbox) {
            return true;
        }
        backoff.pause();
    }
}

/// Whether sandboxd says `sandbox` does not exist (not: cannot answer).
fn sandbox_gone(daemon: &Daemon, sandbox: &str) -> bool {
    matches!(
        daemon.call("GET", &format!("/v1/sandboxes/{sandbox}"), None),
        Err(DaemonError::Refused { status: 404, .. })
    )
}

/// Opens containerd's FIFO for writing without blocking on a reader that
/// is gone (ENXIO: no sink), then writes block as usual.
fn open_fifo_for_writing(path: &str) -> Option<File> {
    if path.is_empty() {
        return None;
    }
    let path = path.strip_prefix("file://").unwrap_or(path);
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) => {
            log::warn!("opening {path} for output: {e}");
            return None;
        }
    };
    // SAFETY: F_SETFL on a descriptor this function owns.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_WRONLY) };
    Some(file)
}

/// How long output is still asked for after the process's exit was
/// recorded: its output stays in the supervisor, and a stream that broke
/// (a daemon restarting) or never came may still deliver it.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(10);

/// Copies the process's output into containerd's FIFOs until the stream
/// says it exited, resuming from the offsets reached when the stream
/// breaks (a restarted daemon). Ends early when sandboxd no longer knows
/// the process, or when the stream is still gone [`OUTPUT_AFTER_EXIT`]
/// after its exit was recorded (the exit may be recorded by the shim's
/// wait before this loop's next try: giving up then lost the output of a
/// process that ended at once).
pub fn copy_output(daemon: &Daemon, sandbox: &str, api_id: u64, process: &Process) {
    let mut stdout = open_fifo_for_writing(&process.stdio.stdout);
    let mut stderr = open_fifo_for_writing(&process.stdio.stderr);
    let (mut stdout_offset, mut stderr_offset) = (0u64, 0u64);
    let mut backoff = Backoff::new();
    let mut exit_seen: Option<std::time::Instant> = None;
    loop {
        if process.has_exited() {
            exit_seen.get_or_insert_with(std::time::Instant::now);
        }
        let path = format!(
            "/v1/sandboxes/{sandbox}/processes/{api_id}/output?stdout_offset={stdout_offset}&stderr_offset={stderr_offset}"
        );
        match daemon.stream(&path) {
            Ok(body) => {
                for line in BufReader::new(body).lines() {
                    let Ok(line) = line else { break };
                    let Ok(event) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    let (sink, offset) = match event["type"].as_str() {
                        Some("stdout") => (&mut stdout, &mut stdout_offset),
                        Some("stderr") => (&mut stderr, &mut stderr_offset),
                        Some("exit") => return,
                        _ => continue,
                    };
                    let data = base64::engine::general_purpose::STANDARD
                        .decode(event["data"].as_str().unwrap_or_default())
                        .unwrap_or_default();
                    *offset = event["offset"].as_u64().unwrap_or(*offset) + data.len() as u64;
                    // Still arriving: the wait after the exit starts again.
                    if exit_seen.is_some() {
                        exit_seen = Some(std::time::Instant::now());
                    }
                    if let Some(file) = sink {
                        if file.write_all(&data).is_err() {
                            // The reader went away (ctr detached): keep draining.
                            *sink = None;
                        }
                    }
                }
            }
            Err(DaemonError::Refused { status: 404, .. }) => return,
            Err(e) => log::debug!("the output of process {api_id}: {e}"),
        }
        if exit_seen.is_some_and(|at| at.elapsed() >= OUTPUT_AFTER_EXIT) {
            log::warn!(
                "the output of process {api_id}, which has exited, could not be read; giving up"
            );
            return;
        }
        backoff.pause();
    }
}

/// Feeds containerd's stdin FIFO to the process until EOF, then closes
/// the process's stdin; a send sandboxd cannot take (restarting) is
/// retried for a while.
pub fn copy_stdin(daemon: &Daemon, sandbox: &str, api_id: u64, path: &str) {
    let path = path.strip_prefix("file://").unwrap_or(path);
    // Blocks until containerd's side opens it for writing, which it does
    // before it asks for the start.
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
    'reading: loop {
        match fifo.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let mut backoff = Backoff::new();
                let mut tries = 0;
                loop {
                    match daemon.send_bytes("POST", &target, &buf[..n]) {
                        Ok(()) => break,
                        // The process is gone or its stdin closed.
                        Err(DaemonError::Refused { .. }) => break 'reading,
                        Err(e) if tries >= 40 => {
                            log::warn!("giving up on stdin of {api_id}: {e}");
                            break 'reading;
                        }
                        Err(_) => {
                            tries += 1;
                            backoff.pause();
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    close_stdin(daemon, sandbox, api_id);
}

/// Sends sandboxd process `api_id` `signal`.
/// SIGKILLs what is left of process `api_id`'s tree (sandboxd kills
/// through the process's cgroup, which outlives the process itself).
/// Best effort: a sandbox already gone has nothing left.
pub fn kill_tree(daemon: &Daemon, sandbox: &str, api_id: u64) {
    let path = format!("/v1/sandboxes/{sandbox}/processes/{api_id}/kill");
    if let Err(e) = daemon.call("POST", &path, None) {
        log::debug!("killing what process {api_id} left: {e}");
    }
}

pub fn signal(daemon: &Daemon, sandbox: &str, api_id: u64, signal: u32) -> Result<(), DaemonError> {
    let path = format!("/v1/sandboxes/{sandbox}/processes/{api_id}/signal");
    daemon
        .call(
            "POST",
            &path,
            Some(&serde_json::json!({ "signal": signal })),
        )
        .map(drop)
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
