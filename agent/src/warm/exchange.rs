//! One run-code request served by the warm interpreter, the agent's side
//! of `server.py`'s protocol. The interpreter and its forks run sandbox
//! code, so everything they say is checked and every wait is bounded:
//!
//! 1. agent -> interpreter (control): `FILE \0 CWD \0 K=V \0 ...` with the
//!    fork's stdin, stdout, stderr and report socket (SCM_RIGHTS);
//! 2. interpreter -> agent (control): `D` once its middle child, which
//!    forked the process and exited, is reaped (the process is the
//!    agent's child from then on), `F<errno>` if it could not fork, or `S`
//!    when what it read while starting changed on disk (it then exits);
//! 3. fork -> agent (report): `P<pid>`; the agent checks the pid is an
//!    unreaped child of its own still in the interpreter's session (which
//!    no other process of the agent's is), moves it into the process's
//!    cgroups, and answers `G`;
//! 4. fork -> agent (report): `K` once it leads its own session, is in its
//!    working directory and holds its stdio, or `E<step>:<errno>`.
//!
//! The fork exits by itself whenever its report socket closes before `G`.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::socket::{
    self, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use sandbox_proto::SpawnRequest;

use crate::launch::{Launched, Step};
use crate::process::ProcError;

/// How long each answer may take. The spawn gate is held meanwhile (the
/// reaper waits), so a stopped interpreter must not hold it for long.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest request sent (the server's buffer); a larger one (a huge
/// environment) starts fresh.
const MAX_MESSAGE: usize = 1 << 18;

/// Largest answer read; every valid one is far shorter.
const MAX_ANSWER: usize = 64;

pub enum Failure {
    /// The request is not one to send (too large a message): start it fresh.
    NotServed,
    /// The interpreter or its fork did not keep to the protocol: drop the
    /// interpreter and start the process fresh.
    Broken(String),
    /// The process could not start, as a fresh start would not either.
    Refused(ProcError),
}

/// Runs `request`'s code file through the interpreter `server` behind `control`.
pub fn run(
    control: BorrowedFd<'_>,
    server: i32,
    request: &SpawnRequest,
    code_path: &Path,
    cgroup_fds: &[OwnedFd],
) -> Result<Launched, Failure> {
    let message = message(request, code_path)
        .filter(|m| m.len() <= MAX_MESSAGE)
        .ok_or(Failure::NotServed)?;
    if let Some(unasked) = pending(control) {
        return Err(Failure::Broken(unasked));
    }
    let prepare = |e: nix::Error| Failure::Refused(ProcError::Prepare(e.into()));
    let (stdin, stdin_theirs) = if request.stdin {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(prepare)?;
        (Some(write), read)
    } else {
        let null = std::fs::File::open("/dev/null")
            .map_err(|e| Failure::Refused(ProcError::Prepare(e)))?;
        (None, OwnedFd::from(null))
    };
    let (stdout, stdout_theirs) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(prepare)?;
    let (stderr, stderr_theirs) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(prepare)?;
    let (report, report_theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(prepare)?;
    let passed = [
        stdin_theirs.as_raw_fd(),
        stdout_theirs.as_raw_fd(),
        stderr_theirs.as_raw_fd(),
        report_theirs.as_raw_fd(),
    ];
    // Never blocking: a server that stopped reading is broken, and the
    // spawn gate is held.
    match socket::sendmsg::<()>(
        control.as_raw_fd(),
        &[IoSlice::new(&message)],
        &[ControlMessage::ScmRights(&passed)],
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    ) {
        Ok(_) => {}
        Err(nix::Error::EMSGSIZE) => return Err(Failure::NotServed),
        Err(e) => return Err(Failure::Broken(format!("sending it the request: {e}"))),
    }
    // The fork holds its own copies now.
    drop((stdin_theirs, stdout_theirs, stderr_theirs, report_theirs));

    let forked = receive(control, ANSWER_TIMEOUT).map_err(broken("its fork"))?;
    match forked.split_first() {
        Some((b'D', [])) => {}
        Some((b'F', errno)) => {
            let errno = parse::<i32>(errno).unwrap_or(libc::EIO);
            return Err(Failure::Refused(ProcError::Prepare(
                io::Error::from_raw_os_error(errno),
            )));
        }
        Some((b'S', [])) => {
            return Err(Failure::Broken(
                "what it read while starting changed on disk".into(),
            ))
        }
        _ => {
            return Err(Failure::Broken(format!(
                "it answered {forked:?} to a request"
            )))
        }
    }
    let said = receive(report.as_fd(), ANSWER_TIMEOUT).map_err(broken("the fork's pid"))?;
    let pid = match said.split_first() {
        Some((b'P', pid)) => parse::<i32>(pid).filter(|pid| *pid > 1),
        _ => None,
    }
    .ok_or_else(|| Failure::Broken(format!("its fork said {said:?} for its pid")))?;
    if pid == server || !is_unreaped_child(pid) || session_of(pid) != Some(server) {
        return Err(Failure::Broken(format!(
            "its fork named pid {pid}, not a child of the agent's in its session"
        )));
    }
    // From here on a failure kills the fork, which is ours to kill: an
    // unreaped child, and the reaper waits on the spawn gate the caller holds.
    let kill = |failure: Failure| {
        // SAFETY: kill takes plain integers; pid is checked above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        failure
    };
    for cgroup in cgroup_fds {
        let written = nix::unistd::write(cgroup, pid.to_string().as_bytes());
        if let Err(e) = written {
            return Err(kill(Failure::Refused(ProcError::Setup {
                step: Step::Cgroup.describe(&request.cwd),
                source: e.into(),
            })));
        }
    }
    nix::unistd::write(&report, b"G").map_err(|e| kill(broken("going on")(e.into())))?;
    let started = receive(report.as_fd(), ANSWER_TIMEOUT);
    let failure = match started.as_deref().map(<[u8]>::split_first) {
        Ok(Some((b'K', []))) => {
            return Ok(Launched {
                pid,
                stdin,
                stdout,
                stderr: Some(stderr),
                pty_dup: None,
                code_path: None,
            })
        }
        Ok(Some((b'E', detail))) => setup_failure(detail, &request.cwd).map(Failure::Refused),
        _ => None,
    };
    Err(kill(failure.unwrap_or_else(|| {
        Failure::Broken(format!("its fork said {started:?} instead of starting"))
    })))
}

/// The request's fields as the server reads them; None if any holds a NUL.
fn message(request: &SpawnRequest, code_path: &Path) -> Option<Vec<u8>> {
    let cwd = if request.cwd.is_empty() {
        "/"
    } else {
        request.cwd.as_str()
    };
    let mut fields: Vec<Vec<u8>> = vec![code_path.as_os_str().as_bytes().to_vec(), cwd.into()];
    fields.extend(
        request
            .env
            .iter()
            .map(|(key, value)| format!("{key}={value}").into_bytes()),
    );
    if fields.iter().any(|field| field.contains(&0)) {
        return None;
    }
    Some(fields.join(&0u8))
}

/// A fork's `E<step>:<errno>`, as the error a fresh start would give.
fn setup_failure(detail: &[u8], cwd: &str) -> Option<ProcError> {
    let text = std::str::from_utf8(detail).ok()?;
    let (step, errno) = text.split_once(':')?;
    let step = match step {
        "session" => Step::Session,
        "cwd" => Step::Cwd,
        _ => return None,
    };
    Some(ProcError::Setup {
        step: step.describe(cwd),
        source: io::Error::from_raw_os_error(errno.parse().ok()?),
    })
}

fn broken(waiting_for: &'static str) -> impl Fn(io::Error) -> Failure {
    move |e| Failure::Broken(format!("waiting for {waiting_for}: {e}"))
}

fn parse<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// What the server said without being asked (or that it closed the
/// socket), which would be taken for the next answer.
fn pending(control: BorrowedFd<'_>) -> Option<String> {
    let mut byte = 0u8;
    // SAFETY: recv writes at most one byte into `byte`.
    let n = unsafe {
        libc::recv(
            control.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        1 => Some("it said something it was not asked".into()),
        0 => Some("it closed its control socket".into()),
        _ => None,
    }
}

/// The session `pid` is in.
fn session_of(pid: i32) -> Option<i32> {
    // SAFETY: getsid takes a pid and returns a session id or -1.
    let sid = unsafe { libc::getsid(pid) };
    (sid >= 0).then_some(sid)
}

/// Whether `pid` is a child of the agent that has not been reaped.
fn is_unreaped_child(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child
    // waitable, WNOHANG keeps it from blocking.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    rc == 0
}

/// One message from `fd`, waiting at most `timeout`; an error when none
/// comes in time or the other end closed.
pub fn receive(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<Vec<u8>> {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let millis = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: poll reads and writes the one pollfd passed.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        match ready {
            0 => return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer")),
            n if n > 0 => break,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    let mut buf = [0u8; MAX_ANSWER];
    // SAFETY: recv writes at most buf.len() bytes into buf.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    match n {
        n if n > 0 => Ok(buf[..n as usize].to_vec()),
        0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "it closed the socket",
        )),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_failures_read_as_a_fresh_start_reports_them() {
        let error = setup_failure(b"cwd:2", "/nowhere").expect("parsed");
        let text = error.to_string();
        assert!(text.contains("/nowhere"), "{text}");
        assert!(
            matches!(error, ProcError::Setup { ref source, .. } if source.raw_os_error() == Some(2))
        );
        assert!(setup_failure(b"session:1", "/").is_some());
        for garbage in [&b"cwd"[..], b"root:2", b"cwd:x", b"\xff:1"] {
            assert!(setup_failure(garbage, "/").is_none(), "{garbage:?}");
        }
    }

    #[test]
    fn requests_with_a_nul_are_not_sent() {
        let mut request = SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            proc: 1,
            argv: vec!["python3".into()],
            code: Some(Vec::new()),
            env: vec![("A".into(), "1".into())],
            cwd: String::new(),
            uid: 0,
            gid: 0,
            stdin: false,
            pty: None,
            cgroup_fds: 0,
            root: None,
        };
        let sent = message(&request, Path::new("/tmp/c")).expect("message");
        assert_eq!(sent, b"/tmp/c\0/\0A=1");
        request.env.push(("B".into(), "x\0y".into()));
        assert!(message(&request, Path::new("/tmp/c")).is_none());
    }

    #[test]
    fn a_process_that_is_not_our_child_is_not_taken_for_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        assert!(is_unreaped_child(pid), "positive control");
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(!is_unreaped_child(pid));
        assert!(!is_unreaped_child(1));
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        assert!(session_of(me).is_some());
        assert_eq!(session_of(pid), None);
    }
}
