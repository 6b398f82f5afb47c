//! The link is any connected byte stream, not only a Unix socketpair: in a
//! microVM it is AF_VSOCK, which carries no descriptors. No vsock transport
//! is reachable from a test, so a TCP connection stands in for it (like vsock,
//! it cannot carry SCM_RIGHTS): the agent greets, serves spawns that declare
//! `cgroup_fds: 0`, and refuses, without losing the link, one that expects
//! descriptors that cannot arrive.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use sandbox_proto::{
    decode, encode, AgentMessage, ExitStatus, FrameDecoder, Reply, Request, RequestBody,
    SpawnRequest, Stream, AGENT_LINK_ENV, PROTOCOL_VERSION,
};

struct Link {
    stream: TcpStream,
    decoder: FrameDecoder,
}

impl Link {
    fn next(&mut self) -> AgentMessage {
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("frame") {
                return decode(&frame).expect("decode");
            }
            let mut buf = [0u8; 65536];
            let n = self.stream.read(&mut buf).expect("read from agent");
            assert!(n > 0, "agent closed the link");
            self.decoder.push(&buf[..n]);
        }
    }

    fn send(&mut self, id: u64, body: RequestBody) {
        let frame = encode(&Request { id, body }).expect("encode");
        self.stream.write_all(&frame).expect("write");
    }
}

fn spawn(proc: u64, cgroup_fds: u8) -> RequestBody {
    RequestBody::Spawn(SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        proc,
        argv: vec!["echo".into(), "over a stream".into()],
        code: None,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        // SAFETY: getuid/getgid have no preconditions.
        uid: unsafe { libc::getuid() },
        // SAFETY: as above.
        gid: unsafe { libc::getgid() },
        stdin: false,
        pty: None,
        cgroup_fds,
        root: None,
    })
}

#[test]
fn agent_serves_a_stream_that_cannot_carry_descriptors() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let theirs = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (ours, _) = listener.accept().expect("accept");
    let their_fd = theirs.as_raw_fd();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
    command
        .env_clear()
        .env(AGENT_LINK_ENV, their_fd.to_string())
        .stdin(Stdio::null());
    // SAFETY: fcntl is async-signal-safe; it only clears close-on-exec on the
    // link end in the child.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut agent = command.spawn().expect("spawn agent");
    drop(theirs);
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut link = Link {
        stream: ours,
        decoder: FrameDecoder::new(),
    };
    assert_eq!(
        link.next(),
        AgentMessage::Hello {
            version: PROTOCOL_VERSION
        }
    );

    link.send(1, spawn(7, 0));
    let (mut stdout, mut exit, mut spawned) = (Vec::new(), None, false);
    while exit.is_none() {
        match link.next() {
            AgentMessage::Reply { id: 1, reply } => {
                assert!(matches!(reply, Reply::Spawned { .. }), "{reply:?}");
                spawned = true;
            }
            AgentMessage::Output {
                proc: 7,
                stream: Stream::Stdout,
                data,
            } => stdout.extend(data),
            AgentMessage::Exit { proc: 7, status } => exit = Some(status),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(spawned);
    assert_eq!(stdout, b"over a stream\n");
    assert_eq!(
        exit,
        Some(ExitStatus {
            code: Some(0),
            signal: None,
            oom_killed: false,
        })
    );

    // A spawn that waits for a descriptor gets an error, and the link lives on.
    link.send(2, spawn(8, 1));
    match link.next() {
        AgentMessage::Reply { id: 2, reply } => {
            assert!(matches!(reply, Reply::Error(_)), "{reply:?}")
        }
        other => panic!("unexpected {other:?}"),
    }
    link.send(3, RequestBody::Health);
    assert_eq!(
        link.next(),
        AgentMessage::Reply {
            id: 3,
            reply: Reply::Health {
                version: PROTOCOL_VERSION
            }
        }
    );

    drop(link);
    let status = agent.wait().expect("wait for agent");
    assert!(status.success(), "agent exited with {status}");
}
