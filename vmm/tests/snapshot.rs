//! MicroVM snapshots on real KVM with the test guest, whose vsock server
//! keeps a counter in guest memory (`count` -> `count=N`): the counter
//! continues from its snapshot value in the source and in forks (separate
//! `vmm --restore` processes), forks diverge independently, the memory file
//! is sparse and outlives its directory while forks use it, the control
//! socket drives pause/resume/snapshot, and corrupted, truncated or foreign
//! snapshots and forks with the wrong disks are refused with clear errors.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{guest, Captured, GuestConn, TempDir};
use vmm::config::{DiskConfig, DiskSource, VsockConfig};
use vmm::{GuestExit, MachineHandle, RunError, RunReport, VmConfig};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Boots the test guest with vsock at `uds` (and `disks`) on a thread.
fn boot(
    kernel: &Path,
    uds: &Path,
    mem_mib: u64,
    vcpus: u8,
    disks: Vec<DiskConfig>,
) -> (
    MachineHandle,
    JoinHandle<Result<RunReport, RunError>>,
    Captured,
) {
    let serial = Captured::default();
    let config = VmConfig {
        kernel: kernel.to_owned(),
        mem_mib,
        vcpus,
        timeout: Some(TIMEOUT),
        disks,
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.to_owned(),
        }),
        ..Default::default()
    };
    let machine = vmm::build(&config, Box::new(serial.clone())).expect("build");
    let handle = machine.handle();
    (handle, std::thread::spawn(move || machine.run()), serial)
}

/// A `vmm --restore` process, ready (vCPUs running) when returned.
struct Fork {
    child: Child,
    uds: PathBuf,
    log: PathBuf,
}

fn restore_cmd(dir: &Path, uds: &Path, log: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmm"));
    cmd.arg("--restore")
        .arg(dir)
        .arg("--vsock-uds")
        .arg(uds)
        .arg("--serial-log")
        .arg(log)
        .args(["--timeout-ms", "120000", "--ready-fd", "1"])
        .args(extra);
    cmd
}

impl Fork {
    fn start(dir: &Path, work: &TempDir, name: &str, extra: &[&str]) -> Self {
        let uds = work.join(&format!("{name}.sock"));
        let log = work.join(&format!("{name}.log"));
        let mut child = restore_cmd(dir, &uds, &log, extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vmm --restore");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ready");
        if !line.starts_with("ready ") {
            let out = child.wait_with_output().expect("wait");
            panic!(
                "fork {name} did not get ready: {line:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Fork { child, uds, log }
    }

    /// Waits for the exit; returns the status code and the serial log.
    fn wait(self) -> (Option<i32>, String) {
        let out = self.child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "fork failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            out.status.code(),
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }
}

/// Sends one control command, returns the answer line.
fn control(sock: &Path, cmd: &str) -> String {
    let mut s = UnixStream::connect(sock).expect("connect control socket");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(format!("{cmd}\n").as_bytes()).expect("write");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read");
    line.trim_end().to_owned()
}

#[test]
fn counter_continues_after_snapshot_and_forks_diverge() {
    let Some(kernel) = guest() else { return };
    let work = TempDir::new("snap");
    let uds = work.join("src.sock");
    let (handle, run, serial) = boot(&kernel, &uds, 64, 2, Vec::new());
    let mut conn = GuestConn::open(&uds);
    for want in 1..=3 {
        assert_eq!(conn.count(), want);
    }

    let dir = work.join("snap");
    std::fs::create_dir(&dir).expect("mkdir");
    let report = handle.snapshot(&dir).expect("snapshot");
    assert!(handle.is_paused(), "a snapshot leaves the VM paused");
    eprintln!(
        "info: snapshot of 64 MiB: {:?}, {} bytes written ({} of guest memory)",
        report.elapsed, report.bytes_written, report.memory_data_bytes
    );
    // Sparse: only touched pages have blocks.
    let meta = std::fs::metadata(dir.join("memory")).expect("memory file");
    assert_eq!(meta.len(), 64 << 20);
    assert!(
        meta.blocks() * 512 < 4 << 20,
        "memory file has {} bytes allocated for a guest that touched little",
        meta.blocks() * 512
    );
    // A snapshot into a non-empty directory is refused, the VM still paused.
    let err = handle.snapshot(&dir).expect_err("non-empty dir");
    assert!(err.to_string().contains("not empty"), "{err}");

    handle.resume().expect("resume");
    assert_eq!(conn.count(), 4, "the source continues");

    let a = Fork::start(
        &dir,
        &work,
        "a",
        &["--control-sock", &work.join("a.ctl").display().to_string()],
    );
    let b = Fork::start(&dir, &work, "b", &[]);
    let (mut ca, mut cb) = (GuestConn::open(&a.uds), GuestConn::open(&b.uds));
    assert_eq!(ca.count(), 4, "fork A starts from the snapshot's 3");
    assert_eq!(cb.count(), 4, "fork B starts from the snapshot's 3");
    assert_eq!(ca.count(), 5);
    assert_eq!(ca.count(), 6);
    assert_eq!(cb.count(), 5, "fork B did not see fork A's counts");
    assert_eq!(conn.count(), 5, "nor did the source");

    // The memory file lives as long as a fork maps it.
    std::fs::remove_dir_all(&dir).expect("remove the snapshot");
    assert_eq!(ca.count(), 7);

    // The control socket on fork A: status, pause, snapshot, resume.
    let ctl = work.join("a.ctl");
    assert_eq!(control(&ctl, "status"), "ok running");
    assert_eq!(control(&ctl, "pause"), "ok");
    assert_eq!(control(&ctl, "status"), "ok paused");
    let dir2 = work.join("snap-of-fork");
    std::fs::create_dir(&dir2).expect("mkdir");
    let answer = control(&ctl, &format!("snapshot {}", dir2.display()));
    let parts: Vec<&str> = answer.split(' ').collect();
    assert!(
        parts.len() == 3 && parts[0] == "ok" && parts[1].parse::<u64>().is_ok(),
        "{answer}"
    );
    assert!(control(&ctl, "snapshot").starts_with("error unknown command"));
    assert!(control(&ctl, "snapshot /nonexistent/dir").starts_with("error snapshot directory"));
    assert_eq!(control(&ctl, "resume"), "ok");
    assert_eq!(ca.count(), 8, "fork A resumed");
    // A fork of a fork: its memory is the first snapshot's (whose directory
    // is gone) plus fork A's own pages.
    let c = Fork::start(&dir2, &work, "c", &[]);
    let mut cc = GuestConn::open(&c.uds);
    assert_eq!(cc.count(), 8, "fork of fork A continues from 7");

    for conn in [ca, cb, cc, conn] {
        conn.quit();
    }
    for (name, fork) in [("a", a), ("b", b), ("c", c)] {
        let (code, log) = fork.wait();
        assert_eq!(code, Some(0), "fork {name}");
        assert!(log.contains("guest: vsock reset"), "fork {name} log: {log}");
        assert!(log.contains("guest: exit 0"), "fork {name} log: {log}");
    }
    let report = run.join().expect("join").expect("run");
    assert_eq!(report.exit, GuestExit::Code(0));
    assert!(
        serial.lines().iter().any(|l| l == "guest: vsock quit"),
        "{:?}",
        serial.lines()
    );
}

/// Runs `vmm --restore` expecting a failure; returns stderr.
fn refused(dir: &Path, work: &TempDir, extra: &[&str]) -> String {
    let out = restore_cmd(dir, &work.join("r.sock"), &work.join("r.log"), extra)
        .output()
        .expect("run vmm");
    assert_eq!(
        out.status.code(),
        Some(1),
        "restore of {} should fail",
        dir.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn corrupted_truncated_foreign_snapshots_and_wrong_disks_are_refused() {
    let Some(kernel) = guest() else { return };
    let work = TempDir::new("snapbad");
    let uds = work.join("src.sock");
    let disk = work.join("disk.img");
    std::fs::write(&disk, vec![0u8; 8 * 512]).expect("disk");
    let disks = vec![DiskConfig {
        source: DiskSource::Path(disk.clone()),
        read_only: true,
    }];
    let (handle, run, _serial) = boot(&kernel, &uds, 32, 1, disks);
    let mut conn = GuestConn::open(&uds);
    assert_eq!(conn.count(), 1);
    let snap = |name: &str| {
        let dir = work.join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        handle.snapshot(&dir).expect("snapshot");
        dir
    };
    let disk_arg = format!("{},ro", disk.display());

    // A good one restores (and proves the disk list is right).
    let good = snap("good");
    let f = Fork::start(&good, &work, "good", &["--disk", &disk_arg]);
    let mut fc = GuestConn::open(&f.uds);
    assert_eq!(fc.count(), 2);
    fc.quit();
    assert_eq!(f.wait().0, Some(0));

    let flip = |path: &Path, offset: u64| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, offset).expect("read");
        f.write_all_at(&[b[0] ^ 0x40], offset).expect("write");
    };

    let d = snap("state-flip");
    let len = std::fs::metadata(d.join("state")).expect("state").len();
    flip(&d.join("state"), len / 2);
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(err.contains("does not match its checksum"), "{err}");

    let d = snap("state-truncated");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("state"))
        .expect("open");
    f.set_len(len - 100).expect("truncate");
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(err.contains("truncated"), "{err}");

    let d = snap("version");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("state"))
        .expect("open");
    f.write_all_at(&99u32.to_le_bytes(), 8)
        .expect("write version");
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(err.contains("format version 99"), "{err}");

    let d = snap("memory-flip");
    // The guest image at 1 MiB was touched (it runs there).
    flip(&d.join("memory"), (1 << 20) + 100);
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(
        err.contains("memory file") && err.contains("checksum"),
        "{err}"
    );

    let d = snap("memory-truncated");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("memory"))
        .expect("open");
    f.set_len(16 << 20).expect("truncate");
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(err.contains("truncated"), "{err}");

    let d = snap("missing");
    std::fs::remove_file(d.join("memory")).expect("rm");
    let err = refused(&d, &work, &["--disk", &disk_arg]);
    assert!(
        err.contains("cannot read the snapshot memory file"),
        "{err}"
    );

    // Wrong disks: none, a different size, writable instead of read-only.
    let err = refused(&good, &work, &[]);
    assert!(err.contains("has 1 disk(s)"), "{err}");
    let other = work.join("other.img");
    std::fs::write(&other, vec![0u8; 16 * 512]).expect("disk");
    let err = refused(
        &good,
        &work,
        &["--disk", &format!("{},ro", other.display())],
    );
    assert!(err.contains("had 8 sectors"), "{err}");
    let err = refused(&good, &work, &["--disk", &disk.display().to_string()]);
    assert!(err.contains("read-only"), "{err}");

    handle.resume().expect("resume");
    assert_eq!(conn.count(), 2);
    conn.quit();
    let report = run.join().expect("join").expect("run");
    assert_eq!(report.exit, GuestExit::Code(0));
    let started = Instant::now();
    assert!(!handle.is_paused());
    assert!(handle.pause().is_err(), "a stopped VM cannot be paused");
    assert!(started.elapsed() < Duration::from_secs(5));
}
