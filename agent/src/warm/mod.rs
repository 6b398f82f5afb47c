//! The warm interpreter: a Python process the agent starts ahead of demand
//! when the host asks (a pooled sandbox, before it joins its pool), which
//! serves run-code by forking a fresh copy of itself (`server.py`) rather
//! than paying an interpreter's start-up. The copy runs the code file as
//! `python3 -u FILE` would; the agent adopts it (it is PID 1, or a
//! subreaper), moves it into the process's cgroups and tracks it as a
//! process it forked itself. Only requests that the interpreter's own
//! start could not have shaped differently are served (see
//! [`Interpreter::serves`]); the rest, and every request once the
//! interpreter is gone or misbehaves, start fresh.

mod exchange;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use sandbox_proto::SpawnRequest;

use crate::agent::Agent;
use crate::launch::{spawn_server, Launched};
use crate::process::ProcError;

/// The fork server, run as `ARGV -c SERVER`.
const SERVER: &str = include_str!("server.py");

/// How long the interpreter may take to start and say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The interpreter the agent keeps, if any.
static WARM: Mutex<Option<Interpreter>> = Mutex::new(None);

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("the interpreter's argv is empty")]
    NoArgv,
    #[error("the environment or argv holds a NUL byte")]
    Nul,
    #[error("making the interpreter's control socket: {0}")]
    Socket(io::Error),
    #[error("starting the interpreter: {0}")]
    Start(#[from] ProcError),
    #[error("the interpreter did not say it was ready within {START_TIMEOUT:?}: {0}")]
    NotReady(String),
}

/// A started, ready interpreter; killed when dropped.
struct Interpreter {
    /// The agent's end of the control socket (SOCK_SEQPACKET).
    control: OwnedFd,
    server: Server,
    argv: Vec<String>,
    uid: u32,
    gid: u32,
    /// The part of its environment that shaped its start, sorted.
    startup_env: Vec<(String, String)>,
}

impl Interpreter {
    /// Whether a fork of this interpreter runs `request` as a fresh
    /// `ARGV FILE` would: run-code with the same interpreter, user, no
    /// terminal or container root, and the same start-up environment
    /// (other variables, as the caller's secrets and settings, are set in
    /// the fork).
    fn serves(&self, request: &SpawnRequest) -> bool {
        request.code.is_some()
            && request.pty.is_none()
            && request.root.is_none()
            && request.argv == self.argv
            && request.uid == self.uid
            && request.gid == self.gid
            && startup_env(&request.env) == self.startup_env
    }
}

/// The server process: its pid (the session its forks are in until they
/// start) and a pidfd to kill it by, which cannot hit a process that took
/// the pid over once the server was reaped.
struct Server {
    pid: i32,
    pidfd: Option<OwnedFd>,
}

impl Server {
    /// Called before the reaper can have collected `pid` (spawn gate held).
    fn new(pid: i32) -> Self {
        // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = i32::try_from(fd).ok().filter(|fd| *fd >= 0).map(|fd| {
            // SAFETY: a fresh descriptor that nothing else owns.
            unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        });
        Self { pid, pidfd }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pidfd) = &self.pidfd {
            // SAFETY: signals the process the pidfd refers to; no memory is passed.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
}

/// Whether the interpreter (or the C library under it) reads `key` while
/// it starts: its own settings, the locale (stdio's encoding), the user
/// site directory, which `python3` runs, the dynamic linker and malloc.
fn affects_startup(key: &str) -> bool {
    const PREFIXES: [&str; 4] = ["PYTHON", "LC_", "LD_", "MALLOC_"];
    const NAMES: [&str; 6] = [
        "LANG",
        "LANGUAGE",
        "HOME",
        "PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
    ];
    PREFIXES.iter().any(|prefix| key.starts_with(prefix)) || NAMES.contains(&key)
}

/// The variables of `env` that shape a start, sorted; of a name given
/// twice, the last (as the process gets it).
fn startup_env(env: &[(String, String)]) -> Vec<(String, String)> {
    let kept: std::collections::BTreeMap<&String, &String> = env
        .iter()
        .filter(|(key, _)| affects_startup(key))
        .map(|(key, value)| (key, value))
        .collect();
    kept.into_iter()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// Starts the interpreter `argv` as `uid`:`gid` with `env`, replacing any
/// the agent kept, and returns once it is ready to serve.
pub fn start(
    agent: &Agent,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    uid: u32,
    gid: u32,
) -> Result<(), WarmError> {
    if argv.is_empty() {
        return Err(WarmError::NoArgv);
    }
    if argv
        .iter()
        .chain(env.iter().flat_map(|(k, v)| [k, v]))
        .any(|s| s.contains('\0'))
    {
        return Err(WarmError::Nul);
    }
    // The one it replaces is killed (dropped).
    lock().take();
    let (control, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| WarmError::Socket(e.into()))?;
    let mut server_argv = argv.clone();
    server_argv.extend(["-c".to_string(), SERVER.to_string()]);
    let request = SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        proc: 0,
        argv: server_argv,
        code: None,
        env: env.clone(),
        cwd: "/".into(),
        uid,
        gid,
        stdin: false,
        pty: None,
        cgroup_fds: 0,
        root: None,
    };
    let server = {
        // std waits for a child whose exec failed: the reaper must not take it first.
        let _gate = agent.spawn_gate.blocking_read();
        Server::new(spawn_server(&request, theirs)?)
    };
    // From here on a server that is not kept is killed (dropped).
    match exchange::receive(control.as_fd(), START_TIMEOUT) {
        Ok(reply) if reply == b"R" => {}
        Ok(reply) => {
            return Err(WarmError::NotReady(format!(
                "it said {:?}",
                String::from_utf8_lossy(&reply)
            )))
        }
        Err(e) => return Err(WarmError::NotReady(e.to_string())),
    }
    *lock() = Some(Interpreter {
        control,
        server,
        argv,
        uid,
        gid,
        startup_env: startup_env(&env),
    });
    Ok(())
}

/// Runs `request`'s code file `code_path` in a fork of the warm
/// interpreter. None: not served (no interpreter, a request it cannot
/// serve, or an interpreter that stopped answering, which is dropped);
/// the caller starts the process fresh.
pub fn launch(
    request: &SpawnRequest,
    code_path: &Path,
    cgroup_fds: &[OwnedFd],
) -> Option<Result<Launched, ProcError>> {
    // Its forks keep the server's groups, capabilities, filters and OOM
    // score: a request for others execs.
    if !request.groups.is_empty() || request.confinement != Default::default() {
        return None;
    }
    let mut warm = lock();
    let interpreter = warm.as_ref().filter(|i| i.serves(request))?;
    let sent = exchange::run(
        interpreter.control.as_fd(),
        interpreter.server.pid,
        request,
        code_path,
        cgroup_fds,
    );
    match sent {
        Ok(launched) => Some(Ok(launched)),
        Err(exchange::Failure::Refused(e)) => Some(Err(e)),
        Err(exchange::Failure::NotServed) => None,
        Err(exchange::Failure::Broken(reason)) => {
            eprintln!("sandbox-agent: dropping the warm interpreter: {reason}");
            warm.take();
            None
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Interpreter>> {
    WARM.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpreter(env: &[(&str, &str)]) -> Interpreter {
        let (control, _) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .expect("socketpair");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Interpreter {
            control,
            server: Server {
                pid: 0,
                pidfd: None,
            },
            argv: vec!["python3".into(), "-u".into()],
            uid: 1000,
            gid: 1000,
            startup_env: startup_env(&env),
        }
    }

    fn run_code(env: &[(&str, &str)]) -> SpawnRequest {
        SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            proc: 7,
            argv: vec!["python3".into(), "-u".into()],
            code: Some(b"print(1)".to_vec()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: "/".into(),
            uid: 1000,
            gid: 1000,
            stdin: false,
            pty: None,
            cgroup_fds: 1,
            root: None,
        }
    }

    #[test]
    fn serves_run_code_whose_start_would_be_the_same() {
        let warm = interpreter(&[("PATH", "/usr/bin"), ("LANG", "C.UTF-8")]);
        // Order and variables read only later make no difference.
        let request = run_code(&[
            ("API_TOKEN", "x"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/usr/bin"),
        ]);
        assert!(warm.serves(&request));
        // A name given twice (defaults, then the image's) counts as the last.
        let twice = interpreter(&[("PATH", "/bin"), ("LANG", "C.UTF-8"), ("PATH", "/usr/bin")]);
        assert!(twice.serves(&request));
        let mut with_stdin = request.clone();
        with_stdin.stdin = true;
        assert!(warm.serves(&with_stdin));
    }

    #[test]
    fn leaves_requests_its_start_would_have_shaped_to_a_fresh_process() {
        let warm = interpreter(&[("PATH", "/usr/bin")]);
        let base = run_code(&[("PATH", "/usr/bin")]);
        assert!(warm.serves(&base), "positive control");
        let mut refused = Vec::new();
        for (what, change) in [
            ("a venv first in PATH", ("PATH", "/venv/bin:/usr/bin")),
            ("PYTHONPATH", ("PYTHONPATH", "/lib")),
            ("PYTHONUNBUFFERED", ("PYTHONUNBUFFERED", "1")),
            ("a locale", ("LC_ALL", "C")),
            ("HOME (the user site)", ("HOME", "/home/u")),
            ("LD_PRELOAD", ("LD_PRELOAD", "/x.so")),
        ] {
            let mut request = base.clone();
            request.env.retain(|(k, _)| k != change.0);
            request.env.push((change.0.into(), change.1.into()));
            refused.push((what, warm.serves(&request)));
        }
        let mut argv = base.clone();
        argv.argv = vec!["python3".into()];
        refused.push(("another interpreter argv", warm.serves(&argv)));
        let mut user = base.clone();
        user.uid = 0;
        refused.push(("another user", warm.serves(&user)));
        let mut command = base.clone();
        command.code = None;
        refused.push(("a command, not run-code", warm.serves(&command)));
        let mut tty = base.clone();
        tty.pty = Some(sandbox_proto::PtySize { rows: 24, cols: 80 });
        refused.push(("a terminal", warm.serves(&tty)));
        let mut root = base;
        root.root = Some("app".into());
        refused.push(("a container root", warm.serves(&root)));
        let served: Vec<_> = refused.iter().filter(|(_, served)| *served).collect();
        assert!(served.is_empty(), "served: {served:?}");
    }
}
