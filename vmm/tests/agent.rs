//! The test guest's agent (vmm/guest/agent.c) on real KVM: it connects to
//! the host's agent port over vsock, says Hello, and answers requests made
//! with the real protocol codec (`sandbox-proto`), as the daemon's
//! supervisor will. The daemon's own tests drive the same guest end to end.

mod common;

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{guest, Agent, Captured};
use sandbox_proto::{ErrorKind, Reply, RequestBody, SpawnRequest, AGENT_VSOCK_PORT};
use vmm::config::{DiskConfig, DiskSource, VsockConfig};
use vmm::VmConfig;

struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("vmm-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_guest_agent_answers_the_real_protocol() {
    let Some(kernel) = guest() else { return };
    let dir = Dir::new();
    let uds = dir.0.join("v.sock");
    let base = dir.0.join("base.img");
    let scratch = dir.0.join("scratch.img");
    let mut base_bytes = vec![0u8; 4096];
    base_bytes[1024 + 56] = 0x53;
    base_bytes[1024 + 57] = 0xef;
    std::fs::write(&base, &base_bytes).expect("base");
    std::fs::write(&scratch, vec![0u8; 8192]).expect("scratch");
    // The guest dials the host: a listener at `<uds>_<port>` must exist first.
    let listener =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", uds.display())).expect("listen");
    let disk = |p: &Path, read_only| DiskConfig {
        source: DiskSource::Path(p.to_owned()),
        read_only,
    };
    let config = VmConfig {
        kernel,
        mem_mib: 48,
        vcpus: 2,
        timeout: Some(Duration::from_secs(60)),
        disks: vec![disk(&base, true), disk(&scratch, false)],
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.clone(),
        }),
        ..Default::default()
    };
    let serial = Captured::default();
    let machine = vmm::build(&config, Box::new(serial.clone())).expect("build");
    let vm = std::thread::spawn(move || machine.run());

    let mut agent = Agent::accept(
        &listener,
        Duration::from_secs(20),
        1,
        "the guest's agent connects",
    );
    assert_eq!(
        agent.call(RequestBody::Health).0,
        Reply::Health {
            version: common::TEST_GUEST_PROTOCOL_VERSION
        }
    );
    assert_eq!(
        agent.run(1, &["echo", "hello", "vm"]),
        ("hello vm\n".into(), Some(0))
    );
    assert_eq!(agent.run(2, &["vcpus"]), ("2\n".into(), Some(0)));
    assert_eq!(
        agent.run(3, &["mem"]),
        ("mem_mib=48 top=ok\n".into(), Some(0))
    );
    // The base disk is read-only whatever the guest does; the scratch disk
    // keeps what was written.
    assert_eq!(
        agent.run(4, &["disk-read", "0", "2", "56", "2"]),
        ("53ef\n".into(), Some(0))
    );
    assert_eq!(agent.run(5, &["disk-write", "0", "1", "x"]).1, Some(1));
    assert_eq!(
        agent.run(6, &["disk-write", "1", "3", "kept"]),
        ("status=0\n".into(), Some(0))
    );
    assert_eq!(
        agent.run(7, &["disk-read", "1", "3", "0", "4"]),
        ("6b657074\n".into(), Some(0))
    );
    assert_eq!(agent.run(8, &["count"]).0, "count=1\n");
    assert_eq!(agent.run(9, &["count"]).0, "count=2\n");
    assert_eq!(agent.run(10, &["exit", "7"]), (String::new(), Some(7)));
    let (reply, _) = agent.call(RequestBody::Spawn(SpawnRequest {
        groups: Vec::new(),
        confinement: Default::default(),
        proc: 11,
        argv: vec!["python3".into()],
        code: None,
        env: vec![],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        stdin: false,
        pty: None,
        cgroup_fds: 0,
        root: None,
    }));
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::NotFound),
        "{reply:?}"
    );
    let (reply, _) = agent.call(RequestBody::Signal { proc: 1, signal: 9 });
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::UnknownProcess),
        "{reply:?}"
    );
    let (reply, _) = agent.call(RequestBody::Stat { path: "/".into() });
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::Other),
        "{reply:?}"
    );
    assert_eq!(std::fs::read(&base).expect("base"), base_bytes);
    assert_eq!(
        &std::fs::read(&scratch).expect("scratch")[3 * 512..3 * 512 + 4],
        b"kept"
    );

    // A frame over the guest's bound resets the link instead of being buffered.
    agent
        .stream
        .write_all(&(1u32 << 20).to_le_bytes())
        .expect("write");
    let mut buf = [0u8; 16];
    assert_eq!(
        common::read_some(&mut agent.stream, &mut buf).ok(),
        Some(0),
        "link reset"
    );

    common::quit_through_echo(&uds, vm, &serial);
}
