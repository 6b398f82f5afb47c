//! End-to-end tests: the built agent binary runs as a child with one end of a
//! socketpair as its link, and the test plays the host.

use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use sandbox_proto::{
    decode, encode, AgentMessage, ErrorKind, ExitStatus, FileKind, FrameDecoder, PtySize, Reply,
    Request, RequestBody, SpawnRequest, Stream, AGENT_LINK_ENV, MAX_CHUNK, MAX_FRAME,
    PROTOCOL_VERSION,
};

struct Host {
    agent: Child,
    link: UnixStream,
    decoder: FrameDecoder,
    backlog: VecDeque<AgentMessage>,
    next_id: u64,
}

#[derive(Default, Debug)]
struct Finished {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<ExitStatus>,
}

impl Host {
    fn start() -> Self {
        let (link, theirs) = UnixStream::pair().expect("socketpair");
        let their_fd = theirs.as_raw_fd();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
        command
            .env_clear()
            .env(AGENT_LINK_ENV, their_fd.to_string())
            .stdin(Stdio::null());
        // SAFETY: fcntl is async-signal-safe; it only clears close-on-exec on
        // the link end in the child.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let agent = command.spawn().expect("spawn agent");
        drop(theirs);
        link.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut host = Host {
            agent,
            link,
            decoder: FrameDecoder::new(),
            backlog: VecDeque::new(),
            next_id: 1,
        };
        assert_eq!(
            host.next_message().expect("hello"),
            AgentMessage::Hello {
                version: PROTOCOL_VERSION
            }
        );
        host
    }

    /// The next message from the agent, None at EOF.
    fn next_message(&mut self) -> Option<AgentMessage> {
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("frame") {
                return Some(decode(&frame).expect("decode"));
            }
            let mut buf = [0u8; 65536];
            let n = self.link.read(&mut buf).expect("read from agent");
            if n == 0 {
                return None;
            }
            self.decoder.push(&buf[..n]);
        }
    }

    fn send(&mut self, body: RequestBody) -> u64 {
        self.send_with_fds(body, &[])
    }

    fn send_with_fds(&mut self, body: RequestBody, fds: &[&OwnedFd]) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let frame = encode(&Request { id, body }).expect("encode");
        if fds.is_empty() {
            self.link.write_all(&frame).expect("write");
        } else {
            let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
            let cmsg = [ControlMessage::ScmRights(&raw)];
            let sent = sendmsg::<()>(
                self.link.as_raw_fd(),
                &[IoSlice::new(&frame)],
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .expect("sendmsg");
            self.link.write_all(&frame[sent..]).expect("write rest");
        }
        id
    }

    /// Waits for the reply to `id`, keeping other messages for later.
    fn reply_to(&mut self, id: u64) -> Reply {
        if let Some(pos) = self
            .backlog
            .iter()
            .position(|m| matches!(m, AgentMessage::Reply { id: got, .. } if *got == id))
        {
            if let Some(AgentMessage::Reply { reply, .. }) = self.backlog.remove(pos) {
                return reply;
            }
        }
        loop {
            match self.next_message().expect("agent closed the link") {
                AgentMessage::Reply { id: got, reply } if got == id => return reply,
                other => self.backlog.push_back(other),
            }
        }
    }

    fn call(&mut self, body: RequestBody) -> Reply {
        let id = self.send(body);
        self.reply_to(id)
    }

    fn ok(&mut self, body: RequestBody) {
        let reply = self.call(body.clone());
        assert_eq!(reply, Reply::Ok, "{body:?}");
    }

    fn error(&mut self, body: RequestBody) -> ErrorKind {
        match self.call(body.clone()) {
            Reply::Error(e) => e.kind,
            other => panic!("{body:?} should fail, got {other:?}"),
        }
    }

    fn spawn(&mut self, request: SpawnRequest) -> i32 {
        match self.call(RequestBody::Spawn(request)) {
            Reply::Spawned { pid } => pid,
            other => panic!("spawn failed: {other:?}"),
        }
    }

    /// Collects a process's output until its Exit, checking nothing of it
    /// arrives after the Exit that was already queued.
    fn wait_exit(&mut self, proc: u64) -> Finished {
        let mut done = Finished::default();
        let mut pending: VecDeque<AgentMessage> = std::mem::take(&mut self.backlog);
        loop {
            let message = match pending.pop_front() {
                Some(m) => m,
                None => self.next_message().expect("agent closed the link"),
            };
            match message {
                AgentMessage::Output {
                    proc: p,
                    stream,
                    data,
                } if p == proc => {
                    assert!(data.len() <= MAX_CHUNK);
                    match stream {
                        Stream::Stdout => done.stdout.extend(data),
                        Stream::Stderr => done.stderr.extend(data),
                    }
                }
                AgentMessage::Exit { proc: p, status } if p == proc => {
                    done.status = Some(status);
                    self.backlog.extend(pending);
                    return done;
                }
                other => self.backlog.push_back(other),
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.link.shutdown(std::net::Shutdown::Both);
        let _ = self.agent.wait();
    }
}

fn spawn_request(proc: u64, argv: &[&str]) -> SpawnRequest {
    SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        proc,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        code: None,
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        cwd: "/".into(),
        // SAFETY: getuid/getgid have no preconditions.
        uid: unsafe { libc::getuid() },
        // SAFETY: as above.
        gid: unsafe { libc::getgid() },
        stdin: false,
        pty: None,
        cgroup_fds: 0,
        root: None,
    }
}

fn exited(code: i32) -> Option<ExitStatus> {
    Some(ExitStatus {
        code: Some(code),
        signal: None,
        oom_killed: false,
    })
}

fn killed(signal: i32) -> Option<ExitStatus> {
    Some(ExitStatus {
        code: None,
        signal: Some(signal),
        oom_killed: false,
    })
}

#[test]
fn health_reports_the_protocol_version() {
    let mut host = Host::start();
    assert_eq!(
        host.call(RequestBody::Health),
        Reply::Health {
            version: PROTOCOL_VERSION
        }
    );
}

#[test]
fn output_arrives_per_stream_before_exit_code() {
    let mut host = Host::start();
    host.spawn(spawn_request(
        1,
        &["sh", "-c", "echo out; echo err >&2; echo more; exit 3"],
    ));
    let done = host.wait_exit(1);
    assert_eq!(done.stdout, b"out\nmore\n");
    assert_eq!(done.stderr, b"err\n");
    assert_eq!(done.status, exited(3));
}

#[test]
fn children_inherit_no_descriptors_and_no_ignored_signals() {
    let mut host = Host::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let cgroup = OwnedFd::from(std::fs::File::create(dir.path().join("procs")).expect("create"));
    let id = host.send_with_fds(
        RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            cgroup_fds: 1,
            root: None,
            stdin: true,
            ..spawn_request(1, &["sh", "-c", "ls /proc/self/fd; trap"])
        }),
        &[&cgroup],
    );
    assert!(matches!(host.reply_to(id), Reply::Spawned { .. }));
    let done = host.wait_exit(1);
    // ls's own directory descriptor is the 3.
    assert_eq!(String::from_utf8_lossy(&done.stdout), "0\n1\n2\n3\n");
    assert_eq!(done.status, exited(0));

    let mut request = spawn_request(2, &["ls", "/proc/self/fd"]);
    request.pty = Some(PtySize { rows: 24, cols: 80 });
    host.spawn(request);
    let done = host.wait_exit(2);
    let listed: Vec<String> = String::from_utf8_lossy(&done.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, ["0", "1", "2", "3"]);
}

#[test]
fn large_output_is_chunked_and_complete() {
    let mut host = Host::start();
    host.spawn(spawn_request(1, &["head", "-c", "3000000", "/dev/zero"]));
    let done = host.wait_exit(1);
    assert_eq!(done.stdout.len(), 3_000_000);
    assert!(done.stdout.iter().all(|&b| b == 0));
    assert_eq!(done.status, exited(0));
}

#[test]
fn stdin_round_trips_through_cat_in_order() {
    let mut host = Host::start();
    let mut request = spawn_request(7, &["cat"]);
    request.stdin = true;
    host.spawn(request);
    let binary: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    // Pipelined without waiting for replies: order must still hold.
    let ids = [
        host.send(RequestBody::WriteStdin {
            proc: 7,
            data: b"hello\n".to_vec(),
        }),
        host.send(RequestBody::WriteStdin {
            proc: 7,
            data: binary.clone(),
        }),
        host.send(RequestBody::CloseStdin { proc: 7 }),
    ];
    for id in ids {
        assert_eq!(host.reply_to(id), Reply::Ok);
    }
    let done = host.wait_exit(7);
    let mut expected = b"hello\n".to_vec();
    expected.extend(&binary);
    assert_eq!(done.stdout.len(), expected.len());
    assert!(done.stdout == expected);
    assert_eq!(done.status, exited(0));
    assert_eq!(
        host.error(RequestBody::WriteStdin {
            proc: 7,
            data: b"late".to_vec()
        }),
        ErrorKind::UnknownProcess
    );
}

#[test]
fn missing_programs_and_bad_requests_are_error_replies() {
    let mut host = Host::start();
    let kind = host.error(RequestBody::Spawn(spawn_request(
        1,
        &["/nonexistent/program"],
    )));
    assert_eq!(kind, ErrorKind::NotFound);
    let kind = host.error(RequestBody::Spawn(spawn_request(
        2,
        &["no-such-program-anywhere"],
    )));
    assert_eq!(kind, ErrorKind::NotFound);
    let dir = tempfile::tempdir().expect("tempdir");
    let not_executable = dir.path().join("script");
    std::fs::write(&not_executable, b"#!/bin/sh\n").expect("write");
    let path = not_executable.to_str().expect("utf8");
    let kind = host.error(RequestBody::Spawn(spawn_request(3, &[path])));
    assert_eq!(kind, ErrorKind::PermissionDenied);
    let mut bad_cwd = spawn_request(4, &["true"]);
    bad_cwd.cwd = "/nonexistent/dir".into();
    match host.call(RequestBody::Spawn(bad_cwd)) {
        Reply::Error(e) => {
            assert_eq!(e.kind, ErrorKind::NotFound);
            assert!(e.message.contains("working directory"), "{}", e.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(
        host.error(RequestBody::Spawn(spawn_request(5, &[]))),
        ErrorKind::InvalidInput
    );
    // The ids of failed spawns are free again.
    host.spawn(spawn_request(1, &["true"]));
    assert_eq!(host.wait_exit(1).status, exited(0));
    assert_eq!(
        host.error(RequestBody::Signal {
            proc: 99,
            signal: 15
        }),
        ErrorKind::UnknownProcess
    );
}

#[test]
fn code_is_written_to_a_private_file_and_run() {
    let mut host = Host::start();
    let mut request = spawn_request(42, &["sh"]);
    request.code = Some(b"echo from-code; echo \"$0\"; ls -l \"$0\" | cut -c1-10".to_vec());
    host.spawn(request);
    let done = host.wait_exit(42);
    let text = String::from_utf8(done.stdout).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "from-code");
    assert!(lines[1].starts_with("/tmp/.sandbox-code/"), "{text}");
    assert!(lines[1].contains("42"), "{text}");
    assert_eq!(lines[2], "-r--------");
    assert_eq!(done.status, exited(0));
    // Removed once the process is done.
    assert!(std::fs::symlink_metadata(lines[1]).is_err());
}

#[test]
fn signals_are_reported_and_delivered_to_the_group() {
    let mut host = Host::start();
    host.spawn(spawn_request(1, &["sh", "-c", "kill -9 $$"]));
    assert_eq!(host.wait_exit(1).status, killed(libc::SIGKILL));

    // The child sleep shares the group, so it dies too and the pipe closes.
    host.spawn(spawn_request(
        2,
        &["sh", "-c", "sleep 60 & echo started; wait"],
    ));
    loop {
        match host.next_message().expect("output") {
            AgentMessage::Output { proc: 2, data, .. } => {
                assert_eq!(data, b"started\n");
                break;
            }
            other => host.backlog.push_back(other),
        }
    }
    host.ok(RequestBody::Signal {
        proc: 2,
        signal: libc::SIGTERM,
    });
    let started = Instant::now();
    assert_eq!(host.wait_exit(2).status, killed(libc::SIGTERM));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        host.error(RequestBody::Signal {
            proc: 3,
            signal: 1000
        }),
        ErrorKind::InvalidInput
    );
}

#[test]
fn exit_is_not_held_up_by_a_descendant_keeping_the_pipes() {
    let mut host = Host::start();
    host.spawn(spawn_request(
        1,
        &["sh", "-c", "sleep 3 & echo parent-done"],
    ));
    let started = Instant::now();
    let done = host.wait_exit(1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(done.stdout, b"parent-done\n");
    assert_eq!(done.status, exited(0));
}

#[test]
fn output_still_in_the_pipe_when_the_exit_grace_ends_is_forwarded() {
    let mut host = Host::start();
    // A floods the link while the host reads nothing, so the readers'
    // sends wait; B writes more than one read takes and exits, leaving the
    // rest in its pipe until well after its exit grace has run out.
    host.spawn(spawn_request(1, &["head", "-c", "4000000", "/dev/zero"]));
    // Once the host has stopped reading, two writes of 60000 bytes: the
    // reader takes the first (then waits to send it), the second fits the
    // pipe, and B exits.
    host.spawn(spawn_request(
        2,
        &[
            "sh",
            "-c",
            "sleep 0.3; dd if=/dev/zero bs=60000 count=2 status=none",
        ],
    ));
    std::thread::sleep(Duration::from_millis(800));
    let b = host.wait_exit(2);
    assert_eq!(b.status, exited(0));
    assert_eq!(b.stdout.len(), 120_000, "all of what B wrote");
    let a = host.wait_exit(1);
    assert_eq!(a.stdout.len(), 4_000_000);
}

#[test]
fn cgroup_descriptors_are_written_by_the_child() {
    let mut host = Host::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("cgroup.procs");
    let file = std::fs::File::create(&target).expect("create");
    let fd = OwnedFd::from(file);
    let id = host.send_with_fds(
        RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            cgroup_fds: 1,
            root: None,
            ..spawn_request(1, &["true"])
        }),
        &[&fd],
    );
    assert!(matches!(host.reply_to(id), Reply::Spawned { .. }));
    assert_eq!(host.wait_exit(1).status, exited(0));
    assert_eq!(std::fs::read(&target).expect("read"), b"0");

    // A read-only descriptor cannot be written: the spawn fails, nothing runs.
    let read_only = OwnedFd::from(std::fs::File::open(&target).expect("open"));
    let id = host.send_with_fds(
        RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            cgroup_fds: 1,
            root: None,
            ..spawn_request(2, &["true"])
        }),
        &[&read_only],
    );
    match host.reply_to(id) {
        Reply::Error(e) => assert!(e.message.contains("cgroup"), "{}", e.message),
        other => panic!("expected an error, got {other:?}"),
    }

    // Declaring more descriptors than were sent is refused.
    let kind = host.error(RequestBody::Spawn(SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        cgroup_fds: 2,
        root: None,
        ..spawn_request(3, &["true"])
    }));
    assert_eq!(kind, ErrorKind::InvalidInput);
}

#[test]
fn pty_processes_get_a_terminal() {
    let mut host = Host::start();
    let mut request = spawn_request(
        1,
        &[
            "sh",
            "-c",
            "test -t 0 && test -t 1 && test -t 2 && echo tty; read line; echo got:$line",
        ],
    );
    request.pty = Some(PtySize { rows: 24, cols: 80 });
    host.spawn(request);
    host.ok(RequestBody::ResizePty {
        proc: 1,
        size: PtySize {
            rows: 50,
            cols: 100,
        },
    });
    host.ok(RequestBody::WriteStdin {
        proc: 1,
        data: b"hi\n".to_vec(),
    });
    let done = host.wait_exit(1);
    let text = String::from_utf8_lossy(&done.stdout);
    assert!(text.contains("tty\r\n"), "{text:?}");
    assert!(text.contains("got:hi"), "{text:?}");
    assert!(done.stderr.is_empty());
    assert_eq!(done.status, exited(0));
}

#[test]
fn slow_stdin_does_not_block_other_requests() {
    let mut host = Host::start();
    let mut request = spawn_request(1, &["sleep", "60"]);
    request.stdin = true;
    host.spawn(request);
    // Far more than a pipe holds, and sleep never reads.
    let write = host.send(RequestBody::WriteStdin {
        proc: 1,
        data: vec![b'x'; MAX_FRAME - 1024],
    });
    assert_eq!(
        host.call(RequestBody::Health),
        Reply::Health {
            version: PROTOCOL_VERSION
        }
    );
    host.ok(RequestBody::Signal {
        proc: 1,
        signal: libc::SIGKILL,
    });
    assert!(matches!(host.reply_to(write), Reply::Error(_)));
    assert_eq!(host.wait_exit(1).status, killed(libc::SIGKILL));
}

#[test]
fn files_round_trip() {
    let mut host = Host::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().to_str().expect("utf8").to_owned();
    let sub = format!("{base}/a/b");
    host.ok(RequestBody::Mkdir {
        path: sub.clone(),
        parents: true,
        mode: 0o750,
    });
    host.ok(RequestBody::Mkdir {
        path: sub.clone(),
        parents: true,
        mode: 0o750,
    });
    assert_eq!(
        host.error(RequestBody::Mkdir {
            path: sub.clone(),
            parents: false,
            mode: 0o750
        }),
        ErrorKind::AlreadyExists
    );

    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let file = format!("{sub}/data.bin");
    let handle = match host.call(RequestBody::OpenWrite {
        path: file.clone(),
        mode: 0o640,
    }) {
        Reply::Opened { handle, size: 0 } => handle,
        other => panic!("open write: {other:?}"),
    };
    // Pipelined writes: per-handle order must hold.
    let ids: Vec<u64> = data
        .chunks(300 * 1024)
        .map(|chunk| {
            host.send(RequestBody::Write {
                handle,
                data: chunk.to_vec(),
            })
        })
        .collect();
    let close = host.send(RequestBody::Close { handle });
    for id in ids {
        assert_eq!(host.reply_to(id), Reply::Ok);
    }
    assert_eq!(host.reply_to(close), Reply::Ok);
    assert_eq!(
        host.error(RequestBody::Write {
            handle,
            data: vec![1]
        }),
        ErrorKind::UnknownHandle
    );

    let (handle, size) = match host.call(RequestBody::OpenRead { path: file.clone() }) {
        Reply::Opened { handle, size } => (handle, size),
        other => panic!("open read: {other:?}"),
    };
    assert_eq!(size, data.len() as u64);
    let mut read = Vec::new();
    loop {
        match host.call(RequestBody::Read {
            handle,
            max: u32::MAX,
        }) {
            Reply::Data(chunk) if chunk.is_empty() => break,
            Reply::Data(chunk) => {
                assert!(chunk.len() <= MAX_CHUNK);
                read.extend(chunk);
            }
            other => panic!("read: {other:?}"),
        }
    }
    host.ok(RequestBody::Close { handle });
    assert!(read == data);

    let stat = match host.call(RequestBody::Stat { path: file.clone() }) {
        Reply::Stat(stat) => stat,
        other => panic!("stat: {other:?}"),
    };
    assert_eq!(stat.kind, FileKind::File);
    assert_eq!(stat.size, data.len() as u64);
    assert_eq!(stat.mode, 0o640);
    assert_eq!(stat.name, file);

    std::os::unix::fs::symlink("data.bin", format!("{sub}/link")).expect("symlink");
    host.ok(RequestBody::Mkdir {
        path: format!("{sub}/c"),
        parents: false,
        mode: 0o700,
    });
    let entries = match host.call(RequestBody::ListDir { path: sub.clone() }) {
        Reply::Entries(entries) => entries,
        other => panic!("list: {other:?}"),
    };
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["c", "data.bin", "link"]);
    assert_eq!(entries[0].kind, FileKind::Dir);
    assert_eq!(entries[0].mode, 0o700);
    assert_eq!(entries[2].kind, FileKind::Symlink);
    assert_eq!(entries[2].link_target.as_deref(), Some("data.bin"));
    match host.call(RequestBody::Stat {
        path: format!("{sub}/link"),
    }) {
        Reply::Stat(stat) => assert_eq!(stat.kind, FileKind::Symlink),
        other => panic!("stat link: {other:?}"),
    }

    // Removing the link leaves its target.
    host.ok(RequestBody::Remove {
        path: format!("{sub}/link"),
        recursive: false,
    });
    assert!(std::path::Path::new(&file).exists());
    assert_eq!(
        host.error(RequestBody::Remove {
            path: format!("{base}/a"),
            recursive: false
        }),
        ErrorKind::DirectoryNotEmpty
    );
    host.ok(RequestBody::Remove {
        path: format!("{base}/a"),
        recursive: true,
    });
    assert_eq!(
        host.error(RequestBody::Stat { path: sub.clone() }),
        ErrorKind::NotFound
    );
    assert_eq!(
        host.error(RequestBody::OpenRead {
            path: "relative/path".into()
        }),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        host.error(RequestBody::OpenRead { path: base.clone() }),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        host.error(RequestBody::Read {
            handle: 999,
            max: 1
        }),
        ErrorKind::UnknownHandle
    );
}

#[test]
fn too_many_open_handles_is_refused() {
    let mut host = Host::start();
    let mut opened = Vec::new();
    for _ in 0..64 {
        match host.call(RequestBody::OpenRead {
            path: "/etc/hostname".into(),
        }) {
            Reply::Opened { handle, .. } => opened.push(handle),
            other => panic!("open: {other:?}"),
        }
    }
    assert_eq!(
        host.error(RequestBody::OpenRead {
            path: "/etc/hostname".into()
        }),
        ErrorKind::Other
    );
    host.ok(RequestBody::Close { handle: opened[0] });
    assert!(matches!(
        host.call(RequestBody::OpenRead {
            path: "/etc/hostname".into()
        }),
        Reply::Opened { .. }
    ));
}

#[test]
fn oversized_frame_closes_the_link() {
    let mut host = Host::start();
    let header = ((MAX_FRAME as u32) + 1).to_le_bytes();
    host.link.write_all(&header).expect("write header");
    assert_eq!(host.next_message(), None);
    let status = host.agent.wait().expect("wait agent");
    assert!(!status.success());
}

#[test]
fn host_closing_the_link_ends_the_agent_and_its_processes() {
    let mut host = Host::start();
    host.spawn(spawn_request(1, &["sleep", "60"]));
    host.link
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    let status = host.agent.wait().expect("wait agent");
    assert!(status.success());
}

/// Starts the warm interpreter `python3 -u` with `spawn_request`'s environment.
fn warm_python(host: &mut Host) {
    let base = spawn_request(0, &["python3", "-u"]);
    host.ok(RequestBody::WarmInterpreter {
        argv: base.argv,
        env: base.env,
        uid: base.uid,
        gid: base.gid,
    });
}

fn run_python(proc: u64, code: &str) -> SpawnRequest {
    SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        code: Some(code.as_bytes().to_vec()),
        ..spawn_request(proc, &["python3", "-u"])
    }
}

/// Whether the process ran in a fork of the warm interpreter, whose
/// command line holds the fork server.
const FORKED_FROM_WARM: &str =
    "print('warm' if b'_socket' in open('/proc/self/cmdline', 'rb').read() else 'fresh')";

#[test]
fn run_code_runs_in_a_fork_of_the_warm_interpreter_as_a_fresh_start_would() {
    let mut host = Host::start();
    warm_python(&mut host);
    let code = format!(
        "import os, sys\n{FORKED_FROM_WARM}\nprint(sys.argv[0])\nprint(__name__, __file__ == sys.argv[0])\n\
         print(os.environ.get('CALLER'), os.getcwd(), sys.path[0])\n\
         print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())\n\
         print(input())\nprint('to stderr', file=sys.stderr)\nprint(type(__builtins__).__name__)\n"
    );
    let mut request = run_python(901, &code);
    request.env.push(("CALLER".into(), "the caller".into()));
    request.cwd = "/tmp".into();
    request.stdin = true;
    let pid = host.spawn(request);
    host.ok(RequestBody::WriteStdin {
        proc: 901,
        data: b"from stdin\n".to_vec(),
    });
    host.ok(RequestBody::CloseStdin { proc: 901 });
    let done = host.wait_exit(901);
    let text = String::from_utf8(done.stdout).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "warm", "{text}");
    assert!(lines[1].starts_with("/tmp/.sandbox-code/"), "{text}");
    assert_eq!(lines[2], "__main__ True", "{text}");
    assert_eq!(lines[3], "the caller /tmp /tmp/.sandbox-code", "{text}");
    assert_eq!(lines[4], "True True", "{text}");
    assert_eq!(lines[5], "from stdin", "{text}");
    assert_eq!(lines[6], "module", "{text}");
    assert_eq!(done.stderr, b"to stderr\n");
    assert_eq!(done.status, exited(0));
    assert!(pid > 1);

    // Exit codes, exceptions and syntax errors read as a fresh run's.
    host.spawn(run_python(902, "import sys\nsys.exit(3)\n"));
    assert_eq!(host.wait_exit(902).status, exited(3));
    host.spawn(run_python(
        903,
        "def f():\n    raise ValueError('boom')\nf()\n",
    ));
    let done = host.wait_exit(903);
    assert_eq!(done.status, exited(1));
    let trace = String::from_utf8(done.stderr).expect("utf8");
    let files: Vec<&str> = trace.lines().filter(|l| l.contains("File ")).collect();
    assert_eq!(files.len(), 2, "{trace}");
    assert!(
        files.iter().all(|l| l.contains("/tmp/.sandbox-code/903")),
        "{trace}"
    );
    assert!(trace.ends_with("ValueError: boom\n"), "{trace}");
    host.spawn(run_python(904, "print(\n"));
    let done = host.wait_exit(904);
    assert_eq!(done.status, exited(1));
    let trace = String::from_utf8(done.stderr).expect("utf8");
    assert!(trace.contains("SyntaxError"), "{trace}");
    assert!(!trace.contains("Traceback"), "{trace}");

    // An uncaught KeyboardInterrupt: exit work done, then death by SIGINT.
    host.spawn(run_python(
        908,
        "import atexit\natexit.register(print, 'exit work')\nraise KeyboardInterrupt\n",
    ));
    let done = host.wait_exit(908);
    assert_eq!(done.stdout, b"exit work\n");
    assert_eq!(done.status, killed(libc::SIGINT));
    // A request whose start-up environment differs starts fresh.
    let mut other = run_python(905, FORKED_FROM_WARM);
    other
        .env
        .push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    host.spawn(other);
    assert_eq!(host.wait_exit(905).stdout, b"fresh\n");
    // So does one too large for the server's buffer, and the server stays.
    let mut large = run_python(906, FORKED_FROM_WARM);
    // (Each under exec's 128 KiB limit on one string.)
    for i in 0..3 {
        large
            .env
            .push((format!("LARGE{i}"), "x".repeat(100 * 1024)));
    }
    host.spawn(large);
    assert_eq!(host.wait_exit(906).stdout, b"fresh\n");
    host.spawn(run_python(907, FORKED_FROM_WARM));
    assert_eq!(host.wait_exit(907).stdout, b"warm\n");
}

#[test]
fn a_warm_fork_is_killed_as_a_group_and_placed_in_its_cgroups_by_the_agent() {
    let mut host = Host::start();
    warm_python(&mut host);
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("cgroup.procs");
    let fd = OwnedFd::from(std::fs::File::create(&target).expect("create"));
    let code = format!(
        "import subprocess, sys\n{FORKED_FROM_WARM}\n\
         subprocess.Popen(['sleep', '60'])\nprint('started')\nsys.stdin.read()\n"
    );
    let id = host.send_with_fds(
        RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            cgroup_fds: 1,
            stdin: true,
            ..run_python(911, &code)
        }),
        &[&fd],
    );
    let pid = match host.reply_to(id) {
        Reply::Spawned { pid } => pid,
        other => panic!("spawn failed: {other:?}"),
    };
    // The agent wrote the fork's pid, which only it knows, not the child's "0".
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        pid.to_string()
    );
    let mut said = Vec::new();
    while !said.ends_with(b"started\n") {
        match host.next_message().expect("output") {
            AgentMessage::Output {
                proc: 911, data, ..
            } => said.extend(data),
            other => host.backlog.push_back(other),
        }
    }
    assert_eq!(said, b"warm\nstarted\n");
    host.ok(RequestBody::Signal {
        proc: 911,
        signal: libc::SIGKILL,
    });
    // The sleep shares the fork's group: the pipe closes and Exit comes.
    assert_eq!(host.wait_exit(911).status, killed(libc::SIGKILL));
}

/// Exit work a fresh run does: joins a thread, runs an atexit callback
/// (through the stdout the run put in), puts the original stdout back,
/// finalizes an object whose `__del__` still finds the globals it uses,
/// and flushes an unclosed file in `__main__` and one in a module of the
/// run's own (in `dir`).
fn exit_work(dir: &std::path::Path, tag: &str) -> String {
    let module = dir.join(format!("leftopen_{tag}.py"));
    std::fs::write(
        &module,
        format!(
            "f = open({:?}, 'w')\nf.write('module file')\n",
            dir.join(format!("module_{tag}")).display().to_string()
        ),
    )
    .expect("module");
    format!(
        "import atexit, sys, threading, time\n{FORKED_FROM_WARM}\n\
         sys.path.insert(0, {dir:?})\nimport leftopen_{tag}\n\
         out = open({main:?}, 'w')\nout.write('main file')\n\
         import json\nclass Bye:\n    def __del__(self):\n        print('finalized in main', json.dumps(1))\n\
         bye = Bye()\n\
         def late():\n    time.sleep(0.1)\n    print('thread done')\n\
         threading.Thread(target=late).start()\n\
         class Shout:\n    def write(self, s):\n        return sys.__stdout__.write(s.upper())\n\
         \x20   def flush(self):\n        sys.__stdout__.flush()\n\
         atexit.register(print, 'atexit')\nsys.stdout = Shout()\n{marker}sys.exit(4)\n",
        dir = dir.display().to_string(),
        main = dir.join(format!("main_{tag}")).display().to_string(),
        marker = if tag == "warm" { SLOW_EXIT_MARKER } else { "" },
    )
}

/// Left in `os` (made there, so that it holds no globals of the run's),
/// which a fresh run's exit clears and a warm fork's fast exit does not:
/// "slow exit" in the output says the fast way was not taken.
const SLOW_EXIT_MARKER: &str = r#"import os
exec("class Kept:\n    def __del__(self, write=write):\n        write(1, b'slow exit\\n')\nkept = Kept()\n", vars(os))
"#;

#[test]
fn a_warm_fork_ends_as_a_fresh_run_ends() {
    let mut host = Host::start();
    warm_python(&mut host);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut outputs = Vec::new();
    for (proc, tag, fresh) in [(941, "warm", false), (942, "fresh", true)] {
        let mut request = run_python(proc, &exit_work(dir.path(), tag));
        if fresh {
            request
                .env
                .push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
        }
        host.spawn(request);
        let done = host.wait_exit(proc);
        assert_eq!(
            done.status,
            exited(4),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        assert_eq!(done.stderr, b"");
        let text = String::from_utf8(done.stdout).expect("utf8");
        let (first, rest) = text.split_once('\n').expect("lines");
        assert_eq!(first, tag, "{text}");
        outputs.push(rest.to_string());
        for (file, content) in [("main", "main file"), ("module", "module file")] {
            let path = dir.path().join(format!("{file}_{tag}"));
            assert_eq!(
                std::fs::read_to_string(&path).expect("written"),
                content,
                "{tag} {file}"
            );
        }
    }
    assert_eq!(outputs[0], "THREAD DONE\nATEXIT\nfinalized in main 1\n");
    assert_eq!(outputs[0], outputs[1], "warm and fresh differ");

    // A code CPython prints is printed, as a fresh run's.
    host.spawn(run_python(946, "import sys\nsys.exit('bye')\n"));
    let done = host.wait_exit(946);
    assert_eq!((done.stderr, done.status), (b"bye\n".to_vec(), exited(1)));

    // C code of the run's own may have exit work that only the C library's
    // exit does: a C stream left open is flushed all the same.
    let c_file = dir.path().join("from_c");
    host.spawn(run_python(
        943,
        &format!(
            "{FORKED_FROM_WARM}\nimport ctypes\nlibc = ctypes.CDLL(None)\n\
             libc.fopen.restype = ctypes.c_void_p\n\
             libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]\n\
             libc.fputs(b'from C', libc.fopen({:?}.encode(), b'w'))\n",
            c_file.display().to_string()
        ),
    ));
    let done = host.wait_exit(943);
    assert_eq!(done.stdout, b"warm\n");
    assert_eq!(done.status, exited(0));
    assert_eq!(std::fs::read_to_string(&c_file).expect("C file"), "from C");

    // What a fork does not finalize: an object the run left in a module
    // loaded before it. A fresh run's exit clears `os` and prints.
    host.spawn(run_python(944, SLOW_EXIT_MARKER));
    assert_eq!(
        host.wait_exit(944).stdout,
        b"",
        "the fast way out was taken"
    );
    let mut fresh = run_python(945, SLOW_EXIT_MARKER);
    fresh
        .env
        .push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    host.spawn(fresh);
    assert_eq!(host.wait_exit(945).stdout, b"slow exit\n");
}

#[test]
fn run_code_starts_fresh_once_the_warm_interpreter_is_gone() {
    let mut host = Host::start();
    warm_python(&mut host);
    host.spawn(run_python(921, FORKED_FROM_WARM));
    assert_eq!(host.wait_exit(921).stdout, b"warm\n", "positive control");
    let agent = host.agent.id();
    let servers = interpreters_of(agent);
    assert_eq!(servers.len(), 1, "{servers:?}");
    // SAFETY: kill takes plain integers.
    assert_eq!(unsafe { libc::kill(servers[0], libc::SIGKILL) }, 0);
    host.spawn(run_python(922, FORKED_FROM_WARM));
    let done = host.wait_exit(922);
    assert_eq!(done.stdout, b"fresh\n");
    assert_eq!(done.status, exited(0));
}

/// The warm interpreters (fork servers) among `agent`'s children.
fn interpreters_of(agent: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let child = status.lines().any(|l| l == format!("PPid:\t{agent}"));
        let server = cmdline.windows(7).any(|w| w == b"_socket");
        if child && server {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_warm_interpreter_whose_start_read_what_changed_since_is_dropped() {
    let mut host = Host::start();
    // A directory first in PATH that has no python3 yet.
    let bin = tempfile::tempdir().expect("tempdir");
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.path().display());
    let with_path = |mut request: SpawnRequest| {
        request.env = vec![("PATH".into(), path.clone())];
        request
    };
    let base = with_path(spawn_request(0, &["python3", "-u"]));
    host.ok(RequestBody::WarmInterpreter {
        argv: base.argv,
        env: base.env,
        uid: base.uid,
        gid: base.gid,
    });
    host.spawn(with_path(run_python(931, FORKED_FROM_WARM)));
    assert_eq!(host.wait_exit(931).stdout, b"warm\n", "positive control");
    let servers = interpreters_of(host.agent.id());
    assert_eq!(servers.len(), 1, "{servers:?}");
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, servers[0], 0) } as i32;
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // A python3 that PATH now finds first would run in a fresh start.
    let python = std::fs::canonicalize("/usr/bin/python3").expect("python3");
    std::os::unix::fs::symlink(python, bin.path().join("python3")).expect("symlink");
    host.spawn(with_path(run_python(932, FORKED_FROM_WARM)));
    let done = host.wait_exit(932);
    assert_eq!(
        done.stdout,
        b"fresh\n",
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(done.status, exited(0));
    // The stale server ends (its pidfd turns readable), not left running.
    let mut ended = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd passed.
    let ready = unsafe { libc::poll(&mut ended, 1, 10_000) };
    // SAFETY: the descriptor is ours and unused after this.
    unsafe { libc::close(pidfd) };
    assert_eq!(ready, 1, "the stale interpreter still runs");
}
