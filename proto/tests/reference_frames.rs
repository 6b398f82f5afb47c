//! The exact bytes of the frames the freestanding test guest
//! (`vmm/guest/agent.c`) reads and writes with its own postcard codec. It
//! cannot link this crate, so these pins are the contract: a change to the
//! protocol types that moves a variant or a field fails here, and then the
//! guest must change with it.

use sandbox_proto::{
    decode, encode, AgentError, AgentMessage, ErrorKind, ExitStatus, Reply, Request, RequestBody,
    SpawnRequest, Stream, CONFINEMENT_PROTOCOL_VERSION, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

#[test]
fn what_the_guest_writes() {
    // The guest speaks 2, which hosts still take: it applies neither
    // supplementary groups nor per-process confinement, and hosts send it
    // neither (`CONFINEMENT_PROTOCOL_VERSION`).
    const {
        assert!(OLDEST_PROTOCOL_VERSION <= 2 && 2 < CONFINEMENT_PROTOCOL_VERSION);
        assert!(CONFINEMENT_PROTOCOL_VERSION <= PROTOCOL_VERSION);
    }
    let cases: Vec<(AgentMessage, Vec<u8>)> = vec![
        (AgentMessage::Hello { version: 2 }, vec![0, 2]),
        (
            AgentMessage::Reply {
                id: 5,
                reply: Reply::Health { version: 2 },
            },
            vec![1, 5, 1, 2],
        ),
        (
            AgentMessage::Reply {
                id: 300,
                reply: Reply::Spawned { pid: 1003 },
            },
            // id 300 as a varint; pid zigzag-encoded (2006) as a varint.
            vec![1, 0xac, 0x02, 2, 0xd6, 0x0f],
        ),
        (
            AgentMessage::Output {
                proc: 3,
                stream: Stream::Stdout,
                data: b"hi\n".to_vec(),
            },
            vec![2, 3, 0, 3, b'h', b'i', b'\n'],
        ),
        (
            AgentMessage::Output {
                proc: 3,
                stream: Stream::Stderr,
                data: b"x".to_vec(),
            },
            vec![2, 3, 1, 1, b'x'],
        ),
        (
            AgentMessage::Exit {
                proc: 3,
                status: ExitStatus {
                    code: Some(-1),
                    signal: None,
                    oom_killed: true,
                },
            },
            vec![3, 3, 1, 1, 0, 1],
        ),
        (
            AgentMessage::Reply {
                id: 7,
                reply: Reply::Error(AgentError::new(ErrorKind::NotFound, "x")),
            },
            vec![1, 7, 7, 0, 1, b'x'],
        ),
        (
            AgentMessage::Reply {
                id: 7,
                reply: Reply::Error(AgentError::new(ErrorKind::UnknownProcess, "")),
            },
            vec![1, 7, 7, 8, 0],
        ),
        (
            AgentMessage::Reply {
                id: 7,
                reply: Reply::Error(AgentError::new(ErrorKind::InvalidInput, "")),
            },
            vec![1, 7, 7, 3, 0],
        ),
        (
            AgentMessage::Reply {
                id: 7,
                reply: Reply::Error(AgentError::new(ErrorKind::Other, "")),
            },
            vec![1, 7, 7, 10, 0],
        ),
    ];
    for (message, payload) in cases {
        assert_eq!(
            encode(&message).expect("encode"),
            frame(&payload),
            "{message:?}"
        );
        assert_eq!(decode::<AgentMessage>(&payload).expect("decode"), message);
    }
}

#[test]
fn what_the_guest_reads() {
    let spawn = Request {
        id: 2,
        body: RequestBody::Spawn(SpawnRequest {
            groups: Vec::new(),
            confinement: Default::default(),
            proc: 3,
            argv: vec!["echo".into(), "hi".into()],
            code: None,
            env: vec![("A".into(), "b".into())],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            stdin: false,
            pty: None,
            cgroup_fds: 0,
            root: None,
        }),
    };
    let cases: Vec<(Request, Vec<u8>)> = vec![
        (
            Request {
                id: 5,
                body: RequestBody::Health,
            },
            vec![5, 0],
        ),
        (
            spawn,
            // id, Spawn, proc, argv (2 strings), code None, env (1 pair), cwd,
            // uid, gid, stdin, pty None, cgroup_fds, root None, groups (none),
            // confinement (capabilities, seccomp filter, OOM score: None).
            vec![
                2, 1, 3, 2, 4, b'e', b'c', b'h', b'o', 2, b'h', b'i', 0, 1, 1, b'A', 1, b'b', 1,
                b'/', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ),
        (
            Request {
                id: 9,
                body: RequestBody::WriteStdin {
                    proc: 3,
                    data: vec![],
                },
            },
            vec![9, 2, 3, 0],
        ),
        (
            // Byte fields are a length and the bytes, as a sequence of u8
            // was before they were encoded as one slice.
            Request {
                id: 9,
                body: RequestBody::WriteStdin {
                    proc: 3,
                    data: vec![7, 0xff],
                },
            },
            vec![9, 2, 3, 2, 7, 0xff],
        ),
        (
            Request {
                id: 9,
                body: RequestBody::CloseStdin { proc: 3 },
            },
            vec![9, 3, 3],
        ),
        (
            Request {
                id: 9,
                body: RequestBody::Signal { proc: 3, signal: 9 },
            },
            vec![9, 4, 3, 18],
        ),
        (
            Request {
                id: 9,
                body: RequestBody::Reseed {
                    seed: vec![1, 2],
                    unix_time_ns: 5,
                },
            },
            vec![9, 15, 2, 1, 2, 5],
        ),
    ];
    for (request, payload) in cases {
        assert_eq!(
            encode(&request).expect("encode"),
            frame(&payload),
            "{request:?}"
        );
    }
}
