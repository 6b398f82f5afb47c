//! virtio devices on real KVM with the freestanding test guest (vmm/guest/),
//! which drives them with its own polling virtio-mmio drivers: virtio-blk
//! reads, writes and read-only enforcement checked against the host files,
//! virtio-vsock CONNECT/echo round trips (sequential and concurrent),
//! refused ports, large transfers through the credit window, the `vmm`
//! binary's device flags, and device state saved at VM stop restored into
//! fresh devices. Tests print why they skip where KVM or the guest is
//! missing. Round-trip times are printed, not asserted.

mod common;

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{guest, Captured};
use vmm::config::{DiskConfig, DiskSource, VsockConfig};
use vmm::devices::virtio::block::{Block, Disk};
use vmm::devices::virtio::mmio::MmioTransport;
use vmm::devices::virtio::persist::{DeviceState, VirtioMmioState};
use vmm::devices::virtio::vsock::{Vsock, VsockUnixBackend};
use vmm::devices::virtio::{Interrupt, VirtioDevice};
use vmm::{GuestExit, RunError, RunReport, VmConfig};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The guest's writable-disk pattern (devices.c): byte i of sector 1.
fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// A file under the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        TempFile(std::env::temp_dir().join(format!(
            "vmm-dev-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )))
    }

    /// A disk of `sectors` sectors; sector s holds bytes (s + i) % 251.
    fn disk(tag: &str, sectors: usize) -> Self {
        let f = Self::new(tag);
        let data: Vec<u8> = (0..sectors * 512)
            .map(|i| ((i / 512 + i % 512) % 251) as u8)
            .collect();
        std::fs::write(&f.0, data).expect("write disk");
        f
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config(kernel: &Path) -> VmConfig {
    VmConfig {
        kernel: kernel.to_owned(),
        mem_mib: 32,
        timeout: Some(TIMEOUT),
        ..Default::default()
    }
}

fn disk(path: &Path, read_only: bool) -> DiskConfig {
    DiskConfig {
        source: DiskSource::Path(path.to_owned()),
        read_only,
    }
}

/// Starts the VM on a thread; the caller acts as the host meanwhile.
fn start(config: VmConfig) -> (JoinHandle<Result<RunReport, RunError>>, Captured) {
    let serial = Captured::default();
    let machine = vmm::build(&config, Box::new(serial.clone())).expect("build");
    (std::thread::spawn(move || machine.run()), serial)
}

#[test]
fn block_reads_writes_and_refuses_writes_to_the_read_only_disk() {
    let Some(kernel) = guest() else { return };
    let base = TempFile::disk("base", 8);
    let scratch = TempFile::disk("scratch", 16);
    let base_before = std::fs::read(base.path()).expect("read");
    let cfg = VmConfig {
        disks: vec![disk(base.path(), true), disk(scratch.path(), false)],
        ..config(&kernel)
    };
    let (vm, serial) = start(cfg);
    let report = vm.join().expect("thread").expect("run");
    let lines = serial.lines();
    assert_eq!(report.exit, GuestExit::Code(0), "{lines:?}");
    // Sector 0 of the base disk holds bytes i % 251: its sum and first bytes.
    let sum: u32 = base_before[..512].iter().map(|&b| u32::from(b)).sum();
    assert_eq!(
        lines[2],
        format!("guest: blk0 sectors=8 ro=1 id=disk0 read=0 sum={sum:#x} head=0001020304050607")
    );
    assert_eq!(
        lines[3], "guest: blk0 write status=1",
        "IOERR for the read-only disk"
    );
    assert!(
        lines[4].starts_with("guest: blk1 sectors=16 ro=0 id=disk1 read=0 "),
        "{lines:?}"
    );
    assert_eq!(lines[5], "guest: blk1 write status=0 flush=0 readback=ok");
    assert_eq!(lines.last().map(String::as_str), Some("guest: exit 0"));
    // On the host: the base disk is untouched, the scratch disk has the
    // guest's sector 1 and nothing else changed.
    assert_eq!(std::fs::read(base.path()).expect("read"), base_before);
    let after = std::fs::read(scratch.path()).expect("read");
    assert!((0..512).all(|i| after[512 + i] == pattern(i)));
    assert!(after[..512]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));
    assert!(after[1024..]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == ((2 + i / 512 + i % 512) % 251) as u8));
    assert_eq!(report.virtio.len(), 2);
    eprintln!(
        "info: virtio notifies that exited to the VMM: {} (0 = all caught by ioeventfds)",
        report.virtio_notify_exits
    );
}

#[test]
fn a_disk_handed_in_as_a_descriptor() {
    let Some(kernel) = guest() else { return };
    let scratch = TempFile::disk("fd", 4);
    let file = File::options()
        .read(true)
        .write(true)
        .open(scratch.path())
        .expect("open");
    let cfg = VmConfig {
        disks: vec![DiskConfig {
            source: DiskSource::Fd(file.as_raw_fd()),
            read_only: false,
        }],
        ..config(&kernel)
    };
    let (vm, serial) = start(cfg);
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.exit, GuestExit::Code(0));
    assert!(serial
        .lines()
        .contains(&"guest: blk0 write status=0 flush=0 readback=ok".to_owned()));
    let mut sector = [0u8; 512];
    file.read_exact_at(&mut sector, 512)
        .expect("the caller's fd stays open");
    assert!((0..512).all(|i| sector[i] == pattern(i)));

    // A read-only descriptor for a writable disk is refused up front.
    let ro = File::open(scratch.path()).expect("open");
    let err = vmm::build(
        &VmConfig {
            disks: vec![DiskConfig {
                source: DiskSource::Fd(ro.as_raw_fd()),
                read_only: false,
            }],
            ..config(&kernel)
        },
        Box::new(io::sink()),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(err.to_string().contains("mark the disk `ro`"), "{err}");
}

/// A host connection through the VMM's vsock socket.
struct HostConn {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl HostConn {
    /// Connects and sends `CONNECT port`; returns the answer line too.
    fn open(uds: &Path, port: u32) -> (Self, String) {
        let stream = UnixStream::connect(uds).expect("connect to the vsock socket");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        (&stream)
            .write_all(format!("CONNECT {port}\n").as_bytes())
            .expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut line = String::new();
        reader.read_line(&mut line).expect("read answer");
        (HostConn { stream, reader }, line)
    }

    /// Opens a connection to the guest's port 1024, retrying while the
    /// guest refuses (its 4 slots free up asynchronously after closes).
    fn open_echo(uds: &Path) -> Self {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (conn, line) = Self::open(uds, 1024);
            if line.starts_with("OK ") {
                return conn;
            }
            assert!(Instant::now() < deadline, "the guest kept refusing");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn echo(&mut self, msg: &[u8]) -> Vec<u8> {
        self.stream.write_all(msg).expect("write");
        let mut back = vec![0u8; msg.len()];
        self.reader.read_exact(&mut back).expect("read echo");
        back
    }
}

fn vsock(uds: &Path) -> Option<VsockConfig> {
    Some(VsockConfig {
        cid: 3,
        uds_path: uds.to_owned(),
    })
}

fn stats(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "median {:?}, min {:?}, max {:?} over {}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        times.len()
    )
}

#[test]
fn vsock_connect_echo_concurrency_refusal_and_quit() {
    let Some(kernel) = guest() else { return };
    let uds = TempFile::new("v.sock");
    let (vm, serial) = start(VmConfig {
        vsock: vsock(uds.path()),
        ..config(&kernel)
    });

    // Sequential connections, each with a few echoes; timed.
    let mut connects = Vec::new();
    let mut round_trips = Vec::new();
    for round in 0..5 {
        let started = Instant::now();
        let (mut conn, line) = HostConn::open(uds.path(), 1024);
        connects.push(started.elapsed());
        assert!(line.starts_with("OK "), "{line:?}");
        let host_port: u32 = line[3..].trim_end().parse().expect("port number");
        assert!(host_port >= 1 << 30);
        for i in 0..10 {
            let msg = format!("round {round} message {i}");
            let started = Instant::now();
            assert_eq!(conn.echo(msg.as_bytes()), msg.as_bytes());
            round_trips.push(started.elapsed());
        }
    }
    eprintln!("info: vsock CONNECT -> OK: {}", stats(connects));
    eprintln!(
        "info: vsock echo round trip (small): {}",
        stats(round_trips)
    );

    // Concurrent connections (the guest serves 4 at once), interleaved.
    let mut conns: Vec<HostConn> = (0..4)
        .map(|_| {
            let (c, line) = HostConn::open(uds.path(), 1024);
            assert!(line.starts_with("OK "), "{line:?}");
            c
        })
        .collect();
    for i in 0..3 {
        for (n, c) in conns.iter_mut().enumerate() {
            let msg = format!("conn {n} msg {i}");
            assert_eq!(c.echo(msg.as_bytes()), msg.as_bytes());
        }
    }
    // A fifth while four are open: the guest refuses it, the host sees the
    // connection closed without an OK.
    let (_, line) = HostConn::open(uds.path(), 1024);
    assert_eq!(line, "", "refused: closed without an answer");
    drop(conns);

    // An unknown port is refused the same way.
    let (_, line) = HostConn::open(uds.path(), 9999);
    assert_eq!(line, "");

    // A transfer larger than the guest's RX buffers and the VMM's credit
    // window, echoed back in full while it is still being sent.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let conn = HostConn::open_echo(uds.path());
    let mut writer = conn.stream.try_clone().expect("clone");
    let to_send = big.clone();
    let started = Instant::now();
    let sender = std::thread::spawn(move || writer.write_all(&to_send).expect("send"));
    let mut back = vec![0u8; big.len()];
    let mut reader = conn.reader;
    reader.read_exact(&mut back).expect("echo");
    sender.join().expect("sender");
    let elapsed = started.elapsed();
    assert!(back == big, "200 kB echoed intact");
    eprintln!(
        "info: vsock 200 kB echo: {elapsed:?} ({:.1} MB/s each way)",
        0.2 / elapsed.as_secs_f64()
    );

    drop(reader);
    drop(conn.stream);

    // "quit" ends the guest through the exit port.
    let mut conn = HostConn::open_echo(uds.path());
    conn.stream.write_all(b"quit").expect("quit");
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.exit, GuestExit::Code(0));
    let lines = serial.lines();
    assert_eq!(lines[2], "guest: vsock cid=3 listening port=1024");
    assert_eq!(
        &lines[lines.len() - 2..],
        ["guest: vsock quit", "guest: exit 0"]
    );
    assert!(!uds.path().exists(), "socket removed when the VM stops");
}

#[test]
fn binary_device_flags() {
    let Some(kernel) = guest() else { return };
    let kernel = kernel.to_str().expect("utf-8");
    let base = TempFile::disk("bin-base", 2);
    let scratch = TempFile::disk("bin-scratch", 2);
    let uds = TempFile::new("bin.sock");
    let log = TempFile::new("bin.log");
    let child = Command::new(env!("CARGO_BIN_EXE_vmm"))
        .args([
            "--kernel",
            kernel,
            "--mem-mib",
            "32",
            "--timeout-ms",
            "60000",
        ])
        .arg("--disk")
        .arg(format!("{},ro", base.path().display()))
        .arg("--disk")
        .arg(scratch.path())
        .arg("--vsock-uds")
        .arg(uds.path())
        .args(["--vsock-cid", "7", "-v", "--serial-log"])
        .arg(log.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !uds.path().exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut conn, line) = HostConn::open(uds.path(), 1024);
    assert!(line.starts_with("OK "), "{line:?}");
    assert_eq!(conn.echo(b"through the binary"), b"through the binary");
    conn.stream.write_all(b"quit").expect("quit");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = std::fs::read_to_string(log.path()).expect("log");
    assert!(text.contains("guest: blk0 write status=1\n"), "{text}");
    assert!(
        text.contains("guest: blk1 write status=0 flush=0 readback=ok\n"),
        "{text}"
    );
    assert!(
        text.contains("guest: vsock cid=7 listening port=1024\n"),
        "{text}"
    );
    assert!(stderr.contains("virtio notifies via exit"), "{stderr}");

    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_vmm"))
            .args(["--kernel", kernel])
            .args(args)
            .output()
            .expect("run vmm");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--disk", "x,rx"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--disk PATH[,ro]"), "{stderr}");
    let (code, stderr) = run(&["--vsock-uds", "/tmp/x.sock", "--vsock-cid", "2"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--vsock-cid must be between 3"), "{stderr}");
    let (code, stderr) = run(&["--vsock-cid", "5"]);
    assert_eq!(code, Some(2), "--vsock-cid needs --vsock-uds: {stderr}");
    let (code, stderr) = run(&["--disk", "/nonexistent/disk.img"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot open disk /nonexistent/disk.img"),
        "{stderr}"
    );
}

/// Restores one saved device into fresh objects and saves it again.
fn restore_and_save(
    state: &VirtioMmioState,
    mem: &vm_memory::GuestMemoryMmap,
    disks: &[DiskConfig],
    uds: &Path,
) -> VirtioMmioState {
    let device: Box<dyn VirtioDevice> = match &state.device {
        DeviceState::Block(b) => {
            let index: usize = b.id.trim_start_matches("disk").parse().expect("disk id");
            let disk = Disk::from_config(&disks[index], &b.id).expect("reopen disk");
            Box::new(Block::restore(b, disk).expect("restore block"))
        }
        DeviceState::Vsock(v) => {
            let backend = VsockUnixBackend::new(v.cid, uds).expect("listen again");
            Box::new(Vsock::restore(v, backend).expect("restore vsock"))
        }
        DeviceState::Net(n) => panic!("these tests give the VM no net device, found {n:?}"),
    };
    let interrupt = Arc::new(Interrupt::new().expect("eventfd"));
    let transport = MmioTransport::restore(device, mem.clone(), interrupt, &state.transport)
        .expect("restore transport");
    assert_eq!(
        transport.device().is_activated(),
        state.transport.device_status & 4 != 0,
        "a device the guest had started runs again"
    );
    transport.snapshot()
}

#[test]
fn device_state_saved_at_stop_restores_into_fresh_devices() {
    let Some(kernel) = guest() else { return };
    let base = TempFile::disk("rs-base", 2);
    let scratch = TempFile::disk("rs-scratch", 2);
    let uds = TempFile::new("rs.sock");
    let disks = vec![disk(base.path(), true), disk(scratch.path(), false)];
    let (vm, _serial) = start(VmConfig {
        disks: disks.clone(),
        vsock: vsock(uds.path()),
        ..config(&kernel)
    });
    let (mut conn, line) = HostConn::open(uds.path(), 1024);
    assert!(line.starts_with("OK "));
    assert_eq!(conn.echo(b"before the save"), b"before the save");
    conn.stream.write_all(b"quit").expect("quit");
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.virtio.len(), 3);

    // Through JSON, as a snapshot file would carry it.
    let json = serde_json::to_string(&report.virtio).expect("serialise");
    let states: Vec<VirtioMmioState> = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(states, report.virtio);
    for s in &states {
        assert_eq!(
            s.transport.device_status, 0xf,
            "the guest started every device"
        );
        assert!(s.transport.queues.iter().any(|q| q.next_used > 0), "{s:?}");
    }
    // The queues the guest set up lie in its memory: restore into a VM-sized
    // memory of the same shape.
    let mem = vmm::vstate::memory::create_guest_memory(32).expect("memory");
    for s in &states {
        assert_eq!(&restore_and_save(s, &mem, &disks, uds.path()), s);
    }
}
