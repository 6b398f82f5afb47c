//! The exact bytes of every frame the daemon and a supervisor exchange on
//! `shim.sock`. A supervisor outlives the daemon that started it, so the
//! daemon of the next build reads these same bytes: a change to a frame's
//! encoding (a variant or field moved, added or removed, a type changed,
//! also in the types frames carry) fails here, and then
//! SUPERVISOR_PROTOCOL_VERSION must be bumped along with these pins.
//!
//! Needs no root and no images: it only encodes and decodes.

use std::collections::BTreeSet;

use sandbox_proto::confinement::ProcessConfinement;
use sandbox_proto::{AgentError, ErrorKind, PtySize, Reply, RequestBody, Stream};
use sandboxd::model::{Process, ProcessState};
use sandboxd::net::intercept::{Brokered, BrokeredSecret, LeafCert};
use sandboxd::net::proxy::{EgressCounters, EgressLogEntry, LoggedRequest};
use sandboxd::runtime::cgroups::CgroupLimits;
use sandboxd::runtime::fresh_tmpfs::{Entry, EntryKind, FreshTmpfs};
use sandboxd::runtime::sandbox::Checkpoint;
use sandboxd::runtime::CheckpointTarget;
use sandboxd::supervisor::protocol::{
    check_supervisor_version, Ceilings, HandOver, PolicyFields, SpawnSpec, SupervisorError,
    SupervisorErrorKind, SupervisorEvent, SupervisorHealth, SupervisorReply, SupervisorRequest,
    TrustBundleAppend, VersionMismatch, HEALTH_REPLY_TAG, SUPERVISOR_PROTOCOL_VERSION,
};

const BUMP: &str = "the encoding of a supervisor frame changed: bump \
     SUPERVISOR_PROTOCOL_VERSION and update the reference frames in tests/supervisor_frames.rs";

/// Bytes from space-separated hex.
fn bytes(hex: &str) -> Vec<u8> {
    hex.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("reference frames are hex"))
        .collect()
}

fn hex(payload: &[u8]) -> String {
    payload
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Asserts both ways: `value` encodes to exactly `payload` (behind the
/// length header) and `payload` decodes to exactly `value`.
fn pin<T>(value: &T, payload: &str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let payload = bytes(payload);
    let frame = sandbox_proto::encode(value).expect("encode");
    assert_eq!(
        hex(&frame[4..]),
        hex(&payload),
        "{BUMP}\nencoding {value:?}"
    );
    assert_eq!(
        frame[..4],
        (payload.len() as u32).to_le_bytes(),
        "length header of {value:?}"
    );
    let decoded: T = sandbox_proto::decode(&payload)
        .unwrap_or_else(|e| panic!("{BUMP}\ndecoding {} as {value:?}: {e}", hex(&payload)));
    assert_eq!(&decoded, value, "{BUMP}\ndecoding {}", hex(&payload));
}

/// How many variants enum `T` has, as a decoder sees it: the first tag
/// whose frame (the tag, then zeros: every field at its zero encoding)
/// does not decode.
fn variant_count<T: serde::de::DeserializeOwned>() -> u8 {
    (0u8..128)
        .find(|tag| {
            let mut payload = vec![*tag];
            payload.extend([0u8; 64]);
            sandbox_proto::decode::<T>(&payload).is_err()
        })
        .expect("fewer than 128 variants")
}

/// The tag of each request variant. Exhaustive: a new variant does not
/// compile until it has a tag here and a reference frame below.
fn request_tag(request: &SupervisorRequest) -> u8 {
    match request {
        SupervisorRequest::Health => 0,
        SupervisorRequest::Spawn(_) => 1,
        SupervisorRequest::Get { .. } => 2,
        SupervisorRequest::List => 3,
        SupervisorRequest::Attach { .. } => 4,
        SupervisorRequest::WriteStdin { .. } => 5,
        SupervisorRequest::CloseStdin { .. } => 6,
        SupervisorRequest::Signal { .. } => 7,
        SupervisorRequest::Kill { .. } => 8,
        SupervisorRequest::Resize { .. } => 9,
        SupervisorRequest::Wait { .. } => 10,
        SupervisorRequest::Watch { .. } => 11,
        SupervisorRequest::SetEnv { .. } => 12,
        SupervisorRequest::SetPolicy(_) => 13,
        SupervisorRequest::EgressLog => 14,
        SupervisorRequest::File(_) => 15,
        SupervisorRequest::Shutdown => 16,
        SupervisorRequest::CloneDisk { .. } => 17,
        SupervisorRequest::Checkpoint(_) => 18,
        SupervisorRequest::SetSecrets(_) => 19,
        SupervisorRequest::Dial { .. } => 20,
        SupervisorRequest::ListeningPorts => 21,
        SupervisorRequest::AttachRoot { .. } => 22,
        SupervisorRequest::DetachRoot { .. } => 23,
        SupervisorRequest::LimitGuestPids { .. } => 24,
        SupervisorRequest::GuestPids => 25,
        SupervisorRequest::HandOver(_) => 26,
        SupervisorRequest::OpenMailbox => 27,
        SupervisorRequest::GuestRootUsage { .. } => 28,
        SupervisorRequest::HoldTrustBundle { .. } => 29,
    }
}

/// The tag of each reply variant; exhaustive, as [`request_tag`].
fn reply_tag(reply: &SupervisorReply) -> u8 {
    match reply {
        SupervisorReply::UnversionedHealth => 0,
        SupervisorReply::Ok => 1,
        SupervisorReply::Process(_) => 2,
        SupervisorReply::Processes(_) => 3,
        SupervisorReply::Output { .. } => 4,
        SupervisorReply::Dropped { .. } => 5,
        SupervisorReply::Exited(_) => 6,
        SupervisorReply::EgressLog(_) => 7,
        SupervisorReply::Agent(_) => 8,
        SupervisorReply::Event { .. } => 9,
        SupervisorReply::Error(_) => 10,
        SupervisorReply::Checkpointed { .. } => 11,
        SupervisorReply::Health(_) => 12,
        SupervisorReply::Dialed => 13,
        SupervisorReply::Mailbox => 14,
    }
}

/// The tag of each event variant; exhaustive, as [`request_tag`].
fn event_tag(event: &SupervisorEvent) -> u8 {
    match event {
        SupervisorEvent::ProcessExited(_) => 0,
        SupervisorEvent::Failed(_) => 1,
    }
}

/// The tag of each error kind; exhaustive, as [`request_tag`].
fn error_kind_tag(kind: SupervisorErrorKind) -> u8 {
    match kind {
        SupervisorErrorKind::UnknownProcess => 0,
        SupervisorErrorKind::InvalidInput => 1,
        SupervisorErrorKind::Conflict => 2,
        SupervisorErrorKind::AgentGone => 3,
        SupervisorErrorKind::Internal => 4,
        SupervisorErrorKind::Refused => 5,
        SupervisorErrorKind::UnknownRoot => 6,
        SupervisorErrorKind::AgentTimeout => 7,
    }
}

/// Asserts that `tags` (of the reference frames) are every tag of enum `T`.
fn assert_covers<T: serde::de::DeserializeOwned>(name: &str, tags: BTreeSet<u8>) {
    let all: BTreeSet<u8> = (0..variant_count::<T>()).collect();
    assert_eq!(
        tags, all,
        "the reference frames of {name} must cover each of its variants; {BUMP}"
    );
}

fn running() -> Process {
    Process {
        id: 3,
        sandbox_id: "sb".into(),
        argv: vec!["sh".into()],
        state: ProcessState::Running,
        pid: 7,
        exit_code: None,
        signal: None,
        timed_out: false,
        oom_killed: false,
        dropped_bytes: 0,
        started_at: "t0".into(),
        ended_at: None,
    }
}

/// id, sandbox_id, argv, state, pid (zigzag), exit_code, signal, timed_out,
/// oom_killed, dropped_bytes, started_at, ended_at.
const RUNNING: &str = "03 02 73 62 01 02 73 68 00 0e 00 00 00 00 00 02 74 30 00";

fn exited() -> Process {
    Process {
        state: ProcessState::Exited,
        exit_code: Some(-1),
        signal: Some(9),
        timed_out: true,
        oom_killed: true,
        dropped_bytes: 300,
        ended_at: Some("t1".into()),
        ..running()
    }
}

const EXITED: &str = "03 02 73 62 01 02 73 68 01 0e 01 01 01 12 01 01 ac 02 02 74 30 01 02 74 31";

fn requests() -> Vec<(SupervisorRequest, String)> {
    let pty = PtySize { rows: 24, cols: 80 };
    vec![
        (SupervisorRequest::Health, "00".into()),
        (
            SupervisorRequest::Spawn(SpawnSpec {
                groups: vec![10, 4000],
                argv: vec!["sh".into(), "-c".into()],
                code: Some(b"x".to_vec()),
                env: vec![("A".into(), "b".into())],
                cwd: Some("/tmp".into()),
                uid: 1000,
                gid: 1000,
                stdin: true,
                pty: Some(pty),
                timeout_ms: Some(5000),
                root: Some("c1".into()),
                confinement: ProcessConfinement {
                    capabilities: Some(1 << 10 | 1),
                    seccomp_filter: Some(vec![1, 2]),
                    oom_score_adj: Some(900),
                },
            }),
            // argv, code, env, cwd, uid, gid, stdin, pty, timeout_ms, root,
            // groups, confinement (capabilities, seccomp filter, OOM score).
            "01 02 02 73 68 02 2d 63 01 01 78 01 01 41 01 62 01 04 2f 74 6d 70 \
             e8 07 e8 07 01 01 18 50 01 88 27 01 02 63 31 02 0a a0 1f \
             01 81 08 01 02 01 02 01 88 0e"
                .into(),
        ),
        (
            SupervisorRequest::Spawn(SpawnSpec {
                groups: Vec::new(),
                confinement: Default::default(),
                argv: vec![],
                code: None,
                env: vec![],
                cwd: None,
                uid: 0,
                gid: 0,
                stdin: false,
                pty: None,
                timeout_ms: None,
                root: None,
            }),
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00".into(),
        ),
        (SupervisorRequest::Get { proc: 3 }, "02 03".into()),
        (SupervisorRequest::List, "03".into()),
        (
            SupervisorRequest::Attach {
                proc: 3,
                stdout_offset: 300,
                stderr_offset: 0,
            },
            "04 03 ac 02 00".into(),
        ),
        (
            SupervisorRequest::WriteStdin {
                proc: 3,
                data: b"hi".to_vec(),
            },
            "05 03 02 68 69".into(),
        ),
        (SupervisorRequest::CloseStdin { proc: 3 }, "06 03".into()),
        (
            SupervisorRequest::Signal {
                proc: 3,
                signal: 15,
            },
            "07 03 1e".into(),
        ),
        (SupervisorRequest::Kill { proc: 3 }, "08 03".into()),
        (
            SupervisorRequest::Resize { proc: 3, size: pty },
            "09 03 18 50".into(),
        ),
        (
            SupervisorRequest::Wait {
                proc: 3,
                timeout_ms: 1000,
            },
            "0a 03 e8 07".into(),
        ),
        (SupervisorRequest::Watch { after: 7 }, "0b 07".into()),
        (
            SupervisorRequest::SetEnv {
                env: vec![("A".into(), "b".into())],
            },
            "0c 01 01 41 01 62".into(),
        ),
        (
            SupervisorRequest::SetPolicy(PolicyFields {
                block_network: Some(false),
                allow_list: Some(vec!["example.com".into()]),
            }),
            "0d 01 00 01 01 0b 65 78 61 6d 70 6c 65 2e 63 6f 6d".into(),
        ),
        (
            SupervisorRequest::SetPolicy(PolicyFields {
                block_network: None,
                allow_list: None,
            }),
            "0d 00 00".into(),
        ),
        (SupervisorRequest::EgressLog, "0e".into()),
        (
            SupervisorRequest::File(RequestBody::Stat { path: "/a".into() }),
            "0f 0b 02 2f 61".into(),
        ),
        (
            SupervisorRequest::File(RequestBody::OpenWrite {
                path: "/a".into(),
                mode: 0o644,
            }),
            "0f 06 02 2f 61 a4 03".into(),
        ),
        (SupervisorRequest::Shutdown, "10".into()),
        (
            SupervisorRequest::CloneDisk { to: "/d".into() },
            "11 02 2f 64".into(),
        ),
        (
            SupervisorRequest::Checkpoint(CheckpointTarget {
                criu: "/c".into(),
                freezer: "/f".into(),
                images_dir: "/i".into(),
                work_dir: "/w".into(),
            }),
            "12 02 2f 63 02 2f 66 02 2f 69 02 2f 77".into(),
        ),
        (
            SupervisorRequest::SetSecrets(Brokered {
                secrets: vec![BrokeredSecret {
                    name: "A".into(),
                    placeholder: "p".into(),
                    value: "v".into(),
                    hosts: vec!["h".into()],
                }],
                leaves: vec![LeafCert {
                    host: "h".into(),
                    chain: vec![vec![1]],
                    key_der: vec![2],
                }],
            }),
            // secrets (name, placeholder, value, hosts), leaves (host,
            // chain, key_der).
            "13 01 01 41 01 70 01 76 01 01 68 01 01 68 01 01 01 01 02".into(),
        ),
        // port (varint).
        (SupervisorRequest::Dial { port: 3000 }, "14 b8 17".into()),
        (SupervisorRequest::ListeningPorts, "15".into()),
        (
            SupervisorRequest::AttachRoot {
                name: "c1".into(),
                layers: vec!["/a".into()],
                limits: None,
                disk: None,
                volumes: vec![],
            },
            // name, layers (one path), no limits, no disk, no volumes.
            "16 02 63 31 01 02 2f 61 00 00 00".into(),
        ),
        (
            SupervisorRequest::AttachRoot {
                name: "c1".into(),
                layers: vec![],
                limits: Some(sandboxd::runtime::cgroups::RootLimits {
                    cpu_quota_us: Some(50_000),
                    memory_bytes: None,
                    pids_max: Some(-1),
                    cpu_shares: Some(2),
                    oom_group: true,
                }),
                disk: None,
                volumes: vec![],
            },
            // name, no layers, limits: quota (zigzag varint), no memory,
            // pids (zigzag), shares, OOM group; no disk, no volumes.
            "16 02 63 31 00 01 01 a0 8d 06 00 01 01 01 02 01 00 00".into(),
        ),
        (
            SupervisorRequest::AttachRoot {
                name: "c1".into(),
                layers: vec![],
                limits: None,
                disk: Some("/d".into()),
                volumes: vec![],
            },
            // name, no layers, no limits, a microVM's disk, no volumes.
            "16 02 63 31 00 00 01 02 2f 64 00".into(),
        ),
        (
            SupervisorRequest::AttachRoot {
                name: "c1".into(),
                layers: vec![],
                limits: None,
                disk: None,
                volumes: vec![sandboxd::model::HostVolume {
                    source: "/s".into(),
                    destination: "/d".into(),
                    read_only: true,
                }],
            },
            // name, no layers, no limits, no disk, one volume (source,
            // destination, read_only).
            "16 02 63 31 00 00 00 01 02 2f 73 02 2f 64 01".into(),
        ),
        (
            SupervisorRequest::DetachRoot { name: "c1".into() },
            "17 02 63 31".into(),
        ),
        // max (varint).
        (
            SupervisorRequest::LimitGuestPids { max: 300 },
            "18 ac 02".into(),
        ),
        (SupervisorRequest::GuestPids, "19".into()),
        // policy: block_network, allow_list ["a.b"]; no secrets; env
        // [("K", "v")]; guest pids 300 (varint); a container's ceilings
        // (variant 0): quota 50000 and pids 64 (zigzag varints), memory
        // 256 MiB (varint); a disk quota of 64 MiB (varint).
        (
            SupervisorRequest::HandOver(HandOver {
                policy: Some(PolicyFields {
                    block_network: Some(true),
                    allow_list: Some(vec!["a.b".into()]),
                }),
                secrets: None,
                env: Some(vec![("K".into(), "v".into())]),
                guest_pids: Some(300),
                ceilings: Some(Ceilings::Container(CgroupLimits {
                    cpu_quota_us: 50_000,
                    memory_bytes: 256 << 20,
                    pids_max: 64,
                })),
                disk_quota_bytes: Some(64 << 20),
                trust_bundle_append: Some(TrustBundleAppend {
                    image_length: 5,
                    tail: b"CA".to_vec(),
                }),
            }),
            "1a 01 01 01 01 01 03 61 2e 62 00 01 01 01 4b 01 76 01 ac 02 \
             01 00 a0 8d 06 80 80 80 80 01 80 01 01 80 80 80 20 01 05 02 43 41"
                .into(),
        ),
        // Every part absent but the secrets: no secrets, no leaves.
        (
            SupervisorRequest::HandOver(HandOver {
                secrets: Some(Brokered::default()),
                ..HandOver::default()
            }),
            "1a 00 01 00 00 00 00 00 00 00".into(),
        ),
        // A microVM's CPU quota alone (variant 1): 25000.
        (
            SupervisorRequest::HandOver(HandOver {
                ceilings: Some(Ceilings::VmCpuQuota { quota_us: 25_000 }),
                ..HandOver::default()
            }),
            "1a 00 00 00 00 01 01 d0 86 03 00 00".into(),
        ),
        (SupervisorRequest::OpenMailbox, "1b".into()),
        (
            SupervisorRequest::GuestRootUsage { name: "c1".into() },
            "1c 02 63 31".into(),
        ),
        (
            SupervisorRequest::HoldTrustBundle { path: "a/b".into() },
            "1d 03 61 2f 62".into(),
        ),
    ]
}

fn replies() -> Vec<(SupervisorReply, String)> {
    let mut cases: Vec<(SupervisorReply, String)> = vec![
        (SupervisorReply::UnversionedHealth, "00".into()),
        (SupervisorReply::Ok, "01".into()),
        (SupervisorReply::Process(running()), format!("02 {RUNNING}")),
        (
            SupervisorReply::Processes(vec![running()]),
            format!("03 01 {RUNNING}"),
        ),
        (
            SupervisorReply::Output {
                stream: Stream::Stderr,
                offset: 300,
                data: b"x".to_vec(),
            },
            "04 01 ac 02 01 78".into(),
        ),
        (
            SupervisorReply::Dropped {
                stream: Stream::Stdout,
                bytes: 5,
            },
            "05 00 05".into(),
        ),
        (SupervisorReply::Exited(exited()), format!("06 {EXITED}")),
        (
            SupervisorReply::EgressLog(vec![EgressLogEntry {
                time: "t".into(),
                verdict: "allowed".into(),
                host: "h".into(),
                port: 443,
                address: Some("a".into()),
                bytes: 2,
                reason: None,
                request: None,
            }]),
            // time, verdict, host, port, address, bytes, reason, request.
            "07 01 01 74 07 61 6c 6c 6f 77 65 64 01 68 bb 03 01 01 61 02 00 00".into(),
        ),
        (
            SupervisorReply::EgressLog(vec![EgressLogEntry {
                time: "t".into(),
                verdict: "x".into(),
                host: "h".into(),
                port: 443,
                address: None,
                bytes: 0,
                reason: None,
                request: Some(LoggedRequest {
                    method: "GET".into(),
                    path: "/".into(),
                    status: 200,
                    secrets: vec!["A".into()],
                }),
            }]),
            // ..., request (method, path, status, secrets).
            "07 01 01 74 01 78 01 68 bb 03 00 00 00 01 03 47 45 54 01 2f c8 01 01 01 41".into(),
        ),
        (
            SupervisorReply::Agent(Reply::Opened { handle: 1, size: 2 }),
            "08 03 01 02".into(),
        ),
        (
            SupervisorReply::Agent(Reply::Error(AgentError::new(ErrorKind::NotFound, "x"))),
            "08 07 00 01 78".into(),
        ),
        (
            SupervisorReply::Event {
                seq: 4,
                event: SupervisorEvent::ProcessExited(exited()),
            },
            format!("09 04 00 {EXITED}"),
        ),
        (
            SupervisorReply::Event {
                seq: 5,
                event: SupervisorEvent::Failed("gone".into()),
            },
            "09 05 01 04 67 6f 6e 65".into(),
        ),
        (
            SupervisorReply::Checkpointed {
                checkpoint: Checkpoint {
                    link_inode: 300,
                    external_mounts: vec!["/m".into()],
                    empty_mounts: vec!["/s".into()],
                    fresh_tmpfs: vec![FreshTmpfs {
                        point: "/d".into(),
                        options: "o".into(),
                        flags: vec!["f".into()],
                        entries: vec![
                            Entry {
                                path: "".into(),
                                kind: EntryKind::Dir,
                                mode: 0o755,
                                uid: 0,
                                gid: 1,
                            },
                            Entry {
                                path: "l".into(),
                                kind: EntryKind::Symlink { target: "t".into() },
                                mode: 0o777,
                                uid: 2,
                                gid: 3,
                            },
                        ],
                    }],
                },
                next_proc: 4,
                processes: vec![running()],
            },
            format!(
                "0b ac 02 01 02 2f 6d 01 02 2f 73 \
                 01 02 2f 64 01 6f 01 01 66 02 00 00 ed 03 00 01 01 6c 02 01 74 ff 03 02 03 \
                 04 01 {RUNNING}"
            ),
        ),
        (
            SupervisorReply::Health(SupervisorHealth {
                protocol: SUPERVISOR_PROTOCOL_VERSION,
                init_pid: 1234,
                oom_kills: 2,
                failure: Some("f".into()),
                egress: EgressCounters {
                    allowed: 1,
                    refused: 2,
                    bytes: 300,
                    dns_queries: 3,
                    dns_limited: 4,
                    connections_limited: 5,
                    throttled_us: 6,
                },
                substitutions: vec![("A".into(), 3)],
                claimed: true,
            }),
            // protocol, init_pid (zigzag), oom_kills, failure, egress
            // counters, substitutions, claimed.
            "0c 15 a4 13 02 01 01 66 01 02 ac 02 03 04 05 06 01 01 41 03 01".into(),
        ),
        (SupervisorReply::Dialed, "0d".into()),
        (SupervisorReply::Mailbox, "0e".into()),
        (
            SupervisorReply::Agent(Reply::Listening(vec![sandbox_proto::ListeningSocket {
                port: 8000,
                address: "::".into(),
            }])),
            // Reply::Listening, one socket (port, address).
            "08 08 01 c0 3e 02 3a 3a".into(),
        ),
        (
            SupervisorReply::Agent(Reply::Pids { current: 24 }),
            // Reply::Pids, current.
            "08 09 18".into(),
        ),
        (
            SupervisorReply::Agent(Reply::RootUsage(sandbox_proto::GuestRootUsage {
                cpu_usec: 1,
                memory_bytes: 2,
                memory_max: Some(3),
                pids: 4,
                pids_max: None,
                oom_kills: 5,
            })),
            // Reply::RootUsage: cpu_usec, memory_bytes, memory_max (some),
            // pids, pids_max (none), oom_kills.
            "08 0b 01 02 01 03 04 00 05".into(),
        ),
    ];
    for (kind, tag) in [
        (SupervisorErrorKind::UnknownProcess, "00"),
        (SupervisorErrorKind::InvalidInput, "01"),
        (SupervisorErrorKind::Conflict, "02"),
        (SupervisorErrorKind::AgentGone, "03"),
        (SupervisorErrorKind::Internal, "04"),
        (SupervisorErrorKind::Refused, "05"),
        (SupervisorErrorKind::UnknownRoot, "06"),
        (SupervisorErrorKind::AgentTimeout, "07"),
    ] {
        cases.push((
            SupervisorReply::Error(SupervisorError::new(kind, "m")),
            format!("0a {tag} 01 6d"),
        ));
    }
    cases
}

#[test]
fn what_the_daemon_sends() {
    assert_eq!(SUPERVISOR_PROTOCOL_VERSION, 21, "{BUMP}");
    let cases = requests();
    for (request, payload) in &cases {
        pin(request, payload);
        assert_eq!(
            bytes(payload)[0],
            request_tag(request),
            "{BUMP}\ntag of {request:?}"
        );
    }
    assert_covers::<SupervisorRequest>(
        "SupervisorRequest",
        cases.iter().map(|(r, _)| request_tag(r)).collect(),
    );
}

#[test]
fn what_a_supervisor_answers() {
    let cases = replies();
    for (reply, payload) in &cases {
        pin(reply, payload);
        assert_eq!(
            bytes(payload)[0],
            reply_tag(reply),
            "{BUMP}\ntag of {reply:?}"
        );
    }
    assert_covers::<SupervisorReply>(
        "SupervisorReply",
        cases.iter().map(|(r, _)| reply_tag(r)).collect(),
    );
    let events = cases.iter().filter_map(|(r, _)| match r {
        SupervisorReply::Event { event, .. } => Some(event_tag(event)),
        _ => None,
    });
    assert_covers::<SupervisorEvent>("SupervisorEvent", events.collect());
    let kinds = cases.iter().filter_map(|(r, _)| match r {
        SupervisorReply::Error(e) => Some(error_kind_tag(e.kind)),
        _ => None,
    });
    assert_covers::<SupervisorErrorKind>("SupervisorErrorKind", kinds.collect());
}

/// What every version keeps, so that any two builds can read each other's
/// version: Health is request tag 0, the health reply tag
/// HEALTH_REPLY_TAG with the version first.
#[test]
fn the_version_stays_where_every_build_finds_it() {
    assert_eq!(
        HEALTH_REPLY_TAG, 12,
        "the health reply's tag must never move"
    );
    assert_eq!(request_tag(&SupervisorRequest::Health), 0);
    let (health, payload) = replies()
        .into_iter()
        .find(|(r, _)| matches!(r, SupervisorReply::Health(_)))
        .expect("a health reply case");
    assert_eq!(u32::from(reply_tag(&health)), HEALTH_REPLY_TAG);
    let payload = bytes(&payload);
    assert_eq!(
        u32::from(payload[1]),
        SUPERVISOR_PROTOCOL_VERSION,
        "the version is the health reply's first field"
    );
    assert_eq!(check_supervisor_version(&payload), Ok(()));
}

#[test]
fn a_supervisor_of_the_unversioned_protocol_is_recognised() {
    // What a supervisor of a build before the version answered Health with:
    // tag 0, init_pid 1234 (zigzag), oom_kills 2, failure None, egress zeros.
    let v0 = bytes("00 a4 13 02 00 00 00 00 00 00 00 00");
    // The shape that build derived its encoding from.
    #[derive(serde::Serialize)]
    struct V0Health {
        init_pid: i32,
        oom_kills: u64,
        failure: Option<String>,
        egress: EgressCounters,
    }
    #[derive(serde::Serialize)]
    enum V0Reply {
        Health(V0Health),
    }
    let v0_health = V0Reply::Health(V0Health {
        init_pid: 1234,
        oom_kills: 2,
        failure: None,
        egress: EgressCounters::default(),
    });
    assert_eq!(
        sandbox_proto::encode(&v0_health).expect("encode")[4..],
        v0[..]
    );
    let mismatch = check_supervisor_version(&v0).expect_err("v0 is not this version");
    assert_eq!(mismatch, VersionMismatch::Unversioned);
    let text = mismatch.to_string();
    assert!(text.contains("v0"), "{text}");
    assert!(
        text.contains(&format!("v{SUPERVISOR_PROTOCOL_VERSION}")),
        "{text}"
    );
    assert!(text.contains("delete the sandbox"), "{text}");
    // The daemon's own decoder reads it too, rather than failing.
    assert_eq!(
        sandbox_proto::decode::<SupervisorReply>(&v0).expect("decode"),
        SupervisorReply::UnversionedHealth
    );
}

#[test]
fn a_supervisor_of_another_version_is_refused_without_reading_the_rest() {
    // Version 99 with a rest this build cannot decode.
    let v99 = bytes("0c 63 ff ff ff");
    let mismatch = check_supervisor_version(&v99).expect_err("v99 is not this version");
    assert_eq!(mismatch, VersionMismatch::Other(99));
    let text = mismatch.to_string();
    assert!(
        text.contains(&format!(
            "supervisor protocol v99, this daemon v{SUPERVISOR_PROTOCOL_VERSION}"
        )),
        "{text}"
    );
    assert!(text.contains("run the matching sandboxd build"), "{text}");
    // A large version is a multi-byte varint.
    assert_eq!(
        check_supervisor_version(&bytes("0c ac 02")),
        Err(VersionMismatch::Other(300))
    );
}

#[test]
fn an_answer_that_is_no_health_reply_is_unreadable() {
    for payload in ["", "01", "0c", "0c ff", "ff ff ff ff ff ff"] {
        match check_supervisor_version(&bytes(payload)) {
            Err(VersionMismatch::Unreadable(why)) => assert!(!why.is_empty()),
            other => panic!("{payload:?}: {other:?}"),
        }
    }
}
