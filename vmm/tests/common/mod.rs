//! What the KVM tests share: the test guest (or why it cannot run here), a
//! serial sink the test reads after the run, and one that stops the VM at a
//! line it watches for.

#![allow(dead_code)]

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

// Not every test crate that includes this module skips.
#[allow(unused_imports)]
pub use sandboxd_test_support::{note_skip, skip, Reason};

/// One `read(2)` that is retried when a signal interrupts it. The VMM runs
/// in the test process and installs its vCPU kick handler without
/// SA_RESTART, so a plain read on a test thread can end in EINTR.
pub fn read_some(stream: &mut impl std::io::Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The test guest, if it was built and KVM is usable; otherwise records the
/// skip (sandboxd_test_support) and the caller returns.
pub fn guest() -> Option<PathBuf> {
    let path = env!("VMM_TEST_GUEST");
    if path.is_empty() {
        note_skip!(
            Reason::MissingBuild,
            "the test guest was not built (see the build warning)"
        );
        return None;
    }
    if let Err(e) = vmm::vstate::kvm::KvmContext::open(Path::new("/dev/kvm")) {
        note_skip!(Reason::NoKvm, "no usable KVM: {e}");
        return None;
    }
    Some(PathBuf::from(path))
}

/// Serial output the test can read after the run.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("lock"))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// A serial sink that keeps everything as [`Captured`] does and stops the
/// VM, through the handle given to [`Self::arm`], at the first line that
/// holds one of its needles. The stop happens on the vCPU thread that
/// wrote the line, so the run ends there and then. With
/// [`Self::stop_after_silence`] it also stops a guest that writes no line
/// for that long.
#[derive(Clone)]
pub struct StopOnLine {
    captured: Captured,
    needles: &'static [&'static str],
    handle: Arc<OnceLock<vmm::MachineHandle>>,
    partial: Arc<Mutex<Vec<u8>>>,
    seen: Arc<Mutex<Option<String>>>,
    /// Told of every line, while a silence watch runs.
    lines: Arc<Mutex<Option<std::sync::mpsc::Sender<()>>>>,
}

impl StopOnLine {
    pub fn new(captured: Captured, needles: &'static [&'static str]) -> Self {
        Self {
            captured,
            needles,
            handle: Arc::default(),
            partial: Arc::default(),
            seen: Arc::default(),
            lines: Arc::default(),
        }
    }

    /// Stops the armed VM once it has written no line for `limit`; the
    /// reason then reads `the guest went silent for ...`. Ends at
    /// [`Self::disarm`].
    pub fn stop_after_silence(&self, limit: std::time::Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        *self.lines.lock().expect("lock") = Some(tx);
        let (handle, seen) = (Arc::clone(&self.handle), Arc::clone(&self.seen));
        std::thread::spawn(move || loop {
            match rx.recv_timeout(limit) {
                Ok(()) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // Held across the stop, so whoever reads the reason
                    // after the run ended finds it.
                    let mut seen = seen.lock().expect("lock");
                    if seen.is_none() && handle.get().is_some_and(|h| h.stop()) {
                        *seen = Some(format!("the guest went silent for {limit:?}"));
                    }
                    return;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        });
    }

    /// Ends the silence watch (the run is over).
    pub fn disarm(&self) {
        self.lines.lock().expect("lock").take();
    }

    /// Gives the sink the machine to stop (before it runs).
    pub fn arm(&self, handle: vmm::MachineHandle) {
        let _ = self.handle.set(handle);
    }

    /// The line that stopped the VM, if one did.
    pub fn seen(&self) -> Option<String> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Write for StopOnLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.captured.write(buf)?;
        let mut partial = self.partial.lock().expect("lock");
        partial.extend_from_slice(buf);
        while let Some(end) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            if let Some(lines) = self.lines.lock().expect("lock").as_ref() {
                let _ = lines.send(());
            }
            if self.needles.iter().any(|n| line.contains(n)) {
                let mut seen = self.seen.lock().expect("lock");
                if seen.is_none() {
                    *seen = Some(line);
                    if let Some(handle) = self.handle.get() {
                        handle.stop();
                    }
                }
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A host connection to the test guest's vsock port 1024 through the VMM's
/// socket (`CONNECT 1024` then messages).
pub struct GuestConn {
    stream: std::os::unix::net::UnixStream,
}

impl GuestConn {
    /// Connects to `uds` and opens port 1024; panics if the guest refuses.
    pub fn open(uds: &Path) -> Self {
        use std::io::Read;
        let mut stream = std::os::unix::net::UnixStream::connect(uds)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", uds.display()));
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        stream.write_all(b"CONNECT 1024\n").expect("write CONNECT");
        // The answer line, byte by byte so nothing after it is consumed.
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while b[0] != b'\n' {
            stream.read_exact(&mut b).expect("read the CONNECT answer");
            line.push(b[0]);
        }
        assert!(
            line.starts_with(b"OK "),
            "{}",
            String::from_utf8_lossy(&line)
        );
        GuestConn { stream }
    }

    /// Sends `count`; returns the counter the guest answers with.
    pub fn count(&mut self) -> u64 {
        self.stream.write_all(b"count").expect("write count");
        // The guest answers in one packet, which the VMM writes at once.
        let mut buf = [0u8; 64];
        let n = read_some(&mut self.stream, &mut buf).expect("read count answer");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        text.strip_prefix("count=")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("unexpected answer {text:?}"))
    }

    /// Sends `quit`: the guest exits 0.
    pub fn quit(mut self) {
        self.stream.write_all(b"quit").expect("write quit");
    }
}

/// A directory under the temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "vmm-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

use sandbox_proto::{decode, encode, AgentMessage, Reply, Request, RequestBody, SpawnRequest};

/// The agent protocol the freestanding test guest speaks (`PROTOCOL_VERSION`
/// in `vmm/guest/agent.c`): 2, which hosts still take; it applies neither
/// supplementary groups nor per-process confinement, which need 3.
pub const TEST_GUEST_PROTOCOL_VERSION: u32 = 2;

/// The host side of the test guest's agent link (vsock, through the VMM's
/// socket), speaking the real protocol codec.
pub struct Agent {
    pub stream: std::os::unix::net::UnixStream,
    pub decoder: sandbox_proto::FrameDecoder,
    pub next_id: u64,
}

impl Agent {
    /// Waits for the guest's agent to dial `listener` (`what` says who, in
    /// the failure), and for its Hello; requests are numbered from
    /// `first_id`.
    pub fn accept(
        listener: &std::os::unix::net::UnixListener,
        read_timeout: std::time::Duration,
        first_id: u64,
        what: &str,
    ) -> Agent {
        let stream = accept_within(listener, read_timeout, what);
        stream
            .set_read_timeout(Some(read_timeout))
            .expect("timeout");
        let mut agent = Agent {
            stream,
            decoder: sandbox_proto::FrameDecoder::new(),
            next_id: first_id,
        };
        assert_eq!(
            agent.next_message(),
            AgentMessage::Hello {
                version: TEST_GUEST_PROTOCOL_VERSION
            }
        );
        agent
    }

    pub fn next_message(&mut self) -> AgentMessage {
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("frame") {
                return decode(&frame).expect("decode");
            }
            let mut buf = [0u8; 4096];
            let n = read_some(&mut self.stream, &mut buf).expect("read from the agent");
            assert!(n > 0, "the agent closed its link");
            self.decoder.push(&buf[..n]);
        }
    }

    pub fn call(&mut self, body: RequestBody) -> (Reply, Vec<AgentMessage>) {
        let id = self.next_id;
        self.next_id += 1;
        let frame = encode(&Request { id, body }).expect("encode");
        self.stream.write_all(&frame).expect("write");
        let reply = match self.next_message() {
            AgentMessage::Reply { id: got, reply } if got == id => reply,
            other => panic!("expected the reply to {id}, got {other:?}"),
        };
        let mut rest = Vec::new();
        if matches!(reply, Reply::Spawned { .. }) {
            loop {
                let m = self.next_message();
                let done = matches!(m, AgentMessage::Exit { .. });
                rest.push(m);
                if done {
                    break;
                }
            }
        }
        (reply, rest)
    }

    pub fn run(&mut self, proc: u64, argv: &[&str]) -> (String, Option<i32>) {
        let (reply, rest) = self.call(RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            proc,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            code: None,
            env: vec![("PATH".into(), "/bin".into())],
            cwd: "/root".into(),
            uid: 0,
            gid: 0,
            stdin: false,
            pty: None,
            cgroup_fds: 0,
            root: None,
        }));
        assert_eq!(
            reply,
            Reply::Spawned {
                pid: 1000 + proc as i32
            }
        );
        let mut out = String::new();
        let mut code = None;
        for m in rest {
            match m {
                AgentMessage::Output { proc: p, data, .. } if p == proc => {
                    out.push_str(&String::from_utf8_lossy(&data))
                }
                AgentMessage::Exit { proc: p, status } if p == proc => code = status.code,
                other => panic!("unexpected {other:?}"),
            }
        }
        (out, code)
    }
}

/// The first connection to `listener` within `deadline`; panics naming
/// `what` when none comes (a VMM that died before dialling must fail the
/// test, not hang it).
pub fn accept_within(
    listener: &std::os::unix::net::UnixListener,
    deadline: std::time::Duration,
    what: &str,
) -> std::os::unix::net::UnixStream {
    assert!(
        connects_within(listener, deadline),
        "{what}: nothing connected within {deadline:?}"
    );
    listener.accept().expect(what).0
}

/// Whether a connection waits on `listener` within `deadline`.
pub fn connects_within(
    listener: &std::os::unix::net::UnixListener,
    deadline: std::time::Duration,
) -> bool {
    connects_before_exit(listener, None, deadline)
}

/// [`connects_within`], given up at once if `child` (when given) exits
/// first.
pub fn connects_before_exit(
    listener: &std::os::unix::net::UnixListener,
    child: Option<&std::process::Child>,
    deadline: std::time::Duration,
) -> bool {
    use std::os::fd::AsRawFd;
    let pidfd = child.map_or(-1, |child| {
        let pid = libc::pid_t::try_from(child.id()).unwrap_or(0);
        // SAFETY: pidfd_open(2) on our own child's pid, no flags; the
        // descriptor it returns (or -1, which poll skips) is closed below.
        unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int }
    });
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pidfd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(deadline.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: poll(2) on the two pollfds this function owns.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if pidfd >= 0 {
        // SAFETY: the descriptor pidfd_open returned, closed once.
        unsafe { libc::close(pidfd) };
    }
    ready > 0 && fds[0].revents & libc::POLLIN != 0
}

/// Ends a test guest through its echo port (`quit`) and checks that the
/// run ends with exit code 0.
pub fn quit_through_echo(
    uds: &Path,
    vm: std::thread::JoinHandle<Result<vmm::RunReport, vmm::RunError>>,
    serial: &Captured,
) {
    let mut echo = std::os::unix::net::UnixStream::connect(uds).expect("connect");
    echo.write_all(b"CONNECT 1024\n").expect("write");
    let mut line = [0u8; 64];
    let _ = read_some(&mut echo, &mut line).expect("OK line");
    echo.write_all(b"quit").expect("quit");
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.exit, vmm::GuestExit::Code(0), "{:?}", serial.lines());
}
