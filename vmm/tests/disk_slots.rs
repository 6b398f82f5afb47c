//! Disk slots on real KVM with the test guest: a disk started `empty` is 0
//! sectors until the control socket's `attach-disk` hands in a read-only
//! descriptor (SCM_RIGHTS), and empty again after `detach-disk`; the guest
//! reads what was put in, never writes it, and a snapshot waits until the
//! slot is empty.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use common::{guest, Agent, Captured, TempDir};
use sandbox_proto::AGENT_VSOCK_PORT;
use vmm::config::{DiskConfig, DiskSource, VsockConfig};
use vmm::control::ControlServer;
use vmm::VmConfig;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// One control command, with `fd` riding along when given; the answer line.
fn control(ctl: &std::path::Path, line: &str, fd: Option<&std::fs::File>) -> String {
    let stream = UnixStream::connect(ctl).expect("control socket");
    let line = format!("{line}\n");
    match fd {
        Some(file) => {
            stream
                .send_with_fd(line.as_bytes(), file.as_raw_fd())
                .expect("send with fd");
        }
        None => (&stream).write_all(line.as_bytes()).expect("send"),
    }
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .expect("answer");
    answer.trim_end().to_owned()
}

#[test]
fn a_slot_takes_a_read_only_disk_while_the_guest_runs_and_gives_it_back() {
    let Some(kernel) = guest() else { return };
    let dir = TempDir::new("slots");
    let uds = dir.join("v.sock");
    let ctl = dir.join("control.sock");
    let base = dir.join("base.img");
    std::fs::write(&base, vec![0u8; 512]).expect("base");
    // Four sectors; sector 2 starts with the text the guest must read.
    let medium = dir.join("medium.img");
    let mut bytes = vec![0u8; 4 * 512];
    bytes[2 * 512..2 * 512 + 7].copy_from_slice(b"medium!");
    std::fs::write(&medium, &bytes).expect("medium");
    let listener =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", uds.display())).expect("listen");
    let config = VmConfig {
        kernel,
        mem_mib: 48,
        timeout: Some(Duration::from_secs(60)),
        disks: vec![
            DiskConfig {
                source: DiskSource::Path(base.clone()),
                read_only: true,
            },
            "empty".parse().expect("an empty slot parses"),
        ],
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.clone(),
        }),
        ..Default::default()
    };
    assert_eq!(
        config.disks[1],
        DiskConfig {
            source: DiskSource::Empty,
            read_only: true
        }
    );
    let serial = Captured::default();
    let machine = vmm::build(&config, Box::new(serial.clone())).expect("build");
    let handle = machine.handle();
    let _server = ControlServer::spawn(&ctl, handle.clone()).expect("control socket");
    let vm = std::thread::spawn(move || machine.run());
    let mut agent = Agent::accept(
        &listener,
        Duration::from_secs(20),
        1,
        "the guest's agent connects",
    );
    let lines = serial.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("guest: blk1 sectors=0 ro=1 id=disk1 ")),
        "the slot boots empty and read-only: {lines:?}"
    );
    let read = ["disk-read", "1", "2", "0", "7"];
    let (out, code) = agent.run(1, &read);
    assert_eq!(code, Some(1), "an empty slot has nothing to read: {out}");

    let read_only = || std::fs::File::open(&medium).expect("open medium");
    assert_eq!(control(&ctl, "attach-disk 1", Some(&read_only())), "ok 4");
    assert_eq!(
        agent.run(2, &read),
        ("6d656469756d21\n".into(), Some(0)),
        "the guest reads the disk put in"
    );
    assert_eq!(
        agent.run(3, &["disk-write", "1", "2", "x"]).1,
        Some(1),
        "a slot's disk refuses writes"
    );

    // Refusals, each saying what to do.
    let occupied = control(&ctl, "attach-disk 1", Some(&read_only()));
    assert!(occupied.contains("detach it first"), "{occupied}");
    let not_slot = control(&ctl, "attach-disk 0", Some(&read_only()));
    assert!(not_slot.contains("is not a slot"), "{not_slot}");
    let no_fd = control(&ctl, "attach-disk 1", None);
    assert!(
        no_fd.contains("needs a read-only disk descriptor"),
        "{no_fd}"
    );
    let writable = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&medium)
        .expect("open rw");
    assert_eq!(control(&ctl, "detach-disk 1", None), "ok 0");
    let writable_refused = control(&ctl, "attach-disk 1", Some(&writable));
    assert!(
        writable_refused.contains("slots take read-only disks"),
        "{writable_refused}"
    );
    let no_disk = control(&ctl, "detach-disk 7", None);
    assert!(no_disk.contains("no disk number 7"), "{no_disk}");

    // A snapshot cannot name a disk handed in later: it waits for the slot
    // to be empty.
    assert_eq!(control(&ctl, "attach-disk 1", Some(&read_only())), "ok 4");
    let snap = dir.join("snap");
    std::fs::create_dir(&snap).expect("snapshot dir");
    let err = handle
        .snapshot(&snap)
        .expect_err("a held slot blocks a snapshot");
    assert!(err.to_string().contains("empty the slot"), "{err}");
    handle.resume().expect("resume");
    assert_eq!(control(&ctl, "detach-disk 1", None), "ok 0");
    let (out, code) = agent.run(4, &read);
    assert_eq!(code, Some(1), "an emptied slot reads nothing: {out}");
    assert_eq!(std::fs::read(&medium).expect("medium"), bytes);

    common::quit_through_echo(&uds, vm, &serial);
}
