//! The `vmm` binary as sandboxd will run it: under its seccomp filter on
//! every thread through the whole device flow (virtio-blk I/O, vsock
//! echo), and as an unprivileged uid in an empty chroot with /dev/kvm, the
//! kernel, the console and a disk handed in as inherited descriptors. Real
//! KVM and the test guest; each test prints why it skips where they (or
//! root, to change uid) are missing.

mod common;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use common::guest;

const VMM: &str = env!("CARGO_BIN_EXE_vmm");
/// The unprivileged uid/gid the test runs the vmm as (`nobody`).
const NOBODY: libc::uid_t = 65534;

/// A fresh path under the temp dir, removed (recursively) on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        TempPath(std::env::temp_dir().join(format!(
            "vmm-sbx-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )))
    }

    /// A zero-filled disk of `sectors` sectors.
    fn disk(tag: &str, sectors: u64) -> Self {
        let p = Self::new(tag);
        File::create(&p.0)
            .and_then(|f| f.set_len(sectors * 512))
            .expect("create disk");
        p
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The guest's writable-disk pattern (devices.c): byte i of sector 1.
fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

fn assert_sector1_written(disk: &Path) {
    let data = std::fs::read(disk).expect("read disk");
    let expected: Vec<u8> = (0..512).map(pattern).collect();
    assert_eq!(
        &data[512..1024],
        &expected[..],
        "sector 1 holds the pattern"
    );
    assert!(data[..512].iter().all(|&b| b == 0), "sector 0 unchanged");
}

/// The `Seccomp:` and `Seccomp_filters:` values of every thread of `pid`.
fn seccomp_of_threads(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let status =
            std::fs::read_to_string(task.expect("task").path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        out.push((field("Seccomp:"), field("Seccomp_filters:")));
    }
    out
}

#[test]
fn device_flow_runs_under_the_seccomp_filter_on_every_thread() {
    let Some(kernel) = guest() else { return };
    let base = TempPath::disk("base", 4);
    let scratch = TempPath::disk("scratch", 4);
    let uds = TempPath::new("v.sock");
    let mut child = Command::new(VMM)
        .arg("--kernel")
        .arg(&kernel)
        .args(["--mem-mib", "32", "--timeout-ms", "60000"])
        .arg("--disk")
        .arg(format!("{},ro", base.0.display()))
        .arg("--disk")
        .arg(&scratch.0)
        .arg("--vsock-uds")
        .arg(&uds.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let mut serial = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    // The guest announces its vsock listener after its block checks; the
    // device workers (threads started at DRIVER_OK, after the filter) are
    // running by then.
    loop {
        let mut line = String::new();
        let n = serial.read_line(&mut line).expect("read serial");
        assert!(n > 0, "vmm ended early: {lines:?}");
        lines.push(line.trim_end().to_owned());
        if line.starts_with("guest: vsock cid=3 listening") {
            break;
        }
    }
    let threads = seccomp_of_threads(child.id());
    // main, vCPU 0, two block workers, the vsock worker.
    assert!(threads.len() >= 5, "{threads:?}");
    for (mode, filters) in &threads {
        assert_eq!(mode, "2", "every thread is in filter mode: {threads:?}");
        assert_eq!(filters, "2", "both filters on every thread: {threads:?}");
    }

    let mut conn = UnixStream::connect(&uds.0).expect("connect");
    conn.write_all(b"CONNECT 1024\n").expect("connect line");
    let mut reply = BufReader::new(conn.try_clone().expect("clone"));
    let mut ok = String::new();
    reply.read_line(&mut ok).expect("OK line");
    assert!(ok.starts_with("OK "), "{ok:?}");
    for i in 0..10 {
        let msg = format!("message {i} under seccomp");
        conn.write_all(msg.as_bytes()).expect("send");
        let mut back = vec![0; msg.len()];
        reply.read_exact(&mut back).expect("echo");
        assert_eq!(back, msg.as_bytes());
    }
    conn.write_all(b"quit").expect("quit");

    let mut rest = String::new();
    serial.read_to_string(&mut rest).expect("serial");
    lines.extend(rest.lines().map(str::to_owned));
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(
        status.signal(),
        None,
        "killed (SIGSYS = 31 means a syscall the filter lacks; rerun with --seccomp log): \
         {stderr} {lines:?}"
    );
    assert_eq!(status.code(), Some(0), "{stderr} {lines:?}");
    assert!(
        lines.contains(&"guest: blk0 write status=1".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"guest: blk1 write status=0 flush=0 readback=ok".to_owned()),
        "{lines:?}"
    );
    assert_eq!(lines.last().map(String::as_str), Some("guest: exit 0"));
    assert_sector1_written(&scratch.0);
    assert!(
        std::fs::read(&base.0)
            .expect("base")
            .iter()
            .all(|&b| b == 0),
        "read-only disk unchanged"
    );
    assert!(!uds.0.exists(), "socket removed at stop, under the filter");
}

#[test]
fn seccomp_flags() {
    let Some(kernel) = guest() else { return };
    let run = |args: &[&str]| {
        let out = Command::new(VMM)
            .arg("--kernel")
            .arg(&kernel)
            .args(["--mem-mib", "32"])
            .args(args)
            .output()
            .expect("run vmm");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["--seccomp", "log"][..],
        &["--seccomp", "off"],
        &["--no-seccomp"],
    ] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(
            stdout.starts_with("guest: up vcpus=1"),
            "{args:?}: {stdout}"
        );
    }
    let (code, _, stderr) = run(&["--seccomp", "strict"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("use kill, log or off"), "{stderr}");
    let (code, _, stderr) = run(&["--seccomp", "log", "--no-seccomp"]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn descriptor_flags_and_their_errors() {
    let Some(kernel) = guest() else { return };
    let kvm = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .expect("/dev/kvm");
    let image = File::open(&kernel).expect("kernel");
    let (serial_read, serial_write) = pipe();
    let (kvm_fd, image_fd, serial_fd) =
        (kvm.as_raw_fd(), image.as_raw_fd(), serial_write.as_raw_fd());
    // Handed in under fixed numbers, as a daemon would.
    let mut cmd = Command::new(VMM);
    cmd.args([
        "--kvm-fd",
        "100",
        "--kernel-fd",
        "101",
        "--serial-fd",
        "102",
    ])
    .args(["--mem-mib", "32", "--cmdline", "exit=5"]);
    // SAFETY: dup2 is async-signal-safe; the closure touches no memory of
    // the parent beyond copied integers.
    unsafe { cmd.pre_exec(move || hand_in(&[(kvm_fd, 100), (image_fd, 101), (serial_fd, 102)])) };
    let mut child = cmd.stdout(Stdio::null()).spawn().expect("spawn");
    drop(serial_write);
    let mut text = String::new();
    File::from(serial_read)
        .read_to_string(&mut text)
        .expect("serial");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(5), "{text}");
    assert!(text.starts_with("guest: up vcpus=1 mem_mib=32\n"), "{text}");
    assert!(text.ends_with("guest: exit 5\n"), "{text}");

    let run = |args: &[&str]| {
        let out = Command::new(VMM)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run vmm");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let k = kernel.to_str().expect("utf-8");
    let (code, stderr) = run(&["--kernel", k, "--kvm-fd", "999"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot use --kvm-fd 999"), "{stderr}");
    // fd 0 is /dev/null: open, but not KVM.
    let (code, stderr) = run(&["--kernel", k, "--kvm-fd", "0"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not a usable KVM device"), "{stderr}");
    let (code, stderr) = run(&["--kernel-fd", "999"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot open kernel image --kernel-fd 999"),
        "{stderr}"
    );
    let (code, stderr) = run(&["--kernel", k, "--serial-fd", "999"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot use --serial-fd 999"), "{stderr}");
    let (code, stderr) = run(&["--kernel", k, "--kernel-fd", "3"]);
    assert_eq!(code, Some(2), "--kernel and --kernel-fd conflict: {stderr}");
    let (code, stderr) = run(&["--mem-mib", "32"]);
    assert_eq!(code, Some(2), "a kernel is required: {stderr}");
    let (code, stderr) = run(&["--kernel", k, "--kvm-fd", "-1"]);
    assert_eq!(code, Some(2), "{stderr}");
}

/// A pipe, both ends close-on-exec.
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both are new descriptors nothing else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// In a forked child before exec: puts each `(from, to)` descriptor at `to`
/// (dup2 clears close-on-exec, so the vmm inherits it).
fn hand_in(fds: &[(RawFd, RawFd)]) -> std::io::Result<()> {
    for &(from, to) in fds {
        // SAFETY: dup2 on descriptors open in this process; async-signal-safe.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In a forked child before exec: drops to `NOBODY` (groups, gid, uid).
fn drop_privileges() -> std::io::Result<()> {
    // SAFETY: setgroups/setgid/setuid with constant arguments;
    // async-signal-safe.
    let rc = unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 {
            -1
        } else {
            libc::setuid(NOBODY)
        }
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Copies the vmm binary and the shared libraries `ldd` lists into `root`
/// at the same paths, so it can run chrooted there with nothing else.
fn populate_chroot(root: &Path) -> PathBuf {
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from, to).expect("copy");
    };
    copy(Path::new(VMM), &root.join("vmm"));
    let ldd = Command::new("ldd").arg(VMM).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no path.
        let path = line
            .split("=>")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path {
            copy(Path::new(p), &root.join(p.trim_start_matches('/')));
        }
    }
    PathBuf::from("/vmm")
}

#[test]
fn unprivileged_vmm_in_an_empty_chroot_boots_from_descriptors() {
    let Some(kernel) = guest() else { return };
    sandboxd_test_support::require_root!("changing to uid {NOBODY} needs root");
    let root = TempPath::new("root");
    let vmm_in_root = populate_chroot(&root.0);
    let disk = TempPath::disk("disk", 4);
    let kvm = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .expect("/dev/kvm");
    let image = File::open(&kernel).expect("kernel");
    let disk_file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk.0)
        .expect("disk");
    let (serial_read, serial_write) = pipe();
    let fds = [
        (kvm.as_raw_fd(), 100),
        (image.as_raw_fd(), 101),
        (serial_write.as_raw_fd(), 102),
        (disk_file.as_raw_fd(), 103),
    ];
    let root_c = CString::new(root.0.as_os_str().as_bytes()).expect("path");
    let mut cmd = Command::new(&vmm_in_root);
    cmd.args([
        "--kvm-fd",
        "100",
        "--kernel-fd",
        "101",
        "--serial-fd",
        "102",
    ])
    .args([
        "--disk",
        "fd=103",
        "--mem-mib",
        "32",
        "--timeout-ms",
        "60000",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    // SAFETY: dup2, chroot, chdir, setgroups, setgid and setuid are
    // async-signal-safe; the closure only reads copied integers and a
    // CString made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            hand_in(&fds)?;
            if libc::chroot(root_c.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            drop_privileges()
        })
    };
    let child = cmd.spawn().expect("spawn the vmm as nobody in the chroot");
    drop(serial_write);
    let mut text = String::new();
    File::from(serial_read)
        .read_to_string(&mut text)
        .expect("serial");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr} {text}");
    assert!(text.starts_with("guest: up vcpus=1 mem_mib=32\n"), "{text}");
    assert!(
        text.contains("guest: blk0 write status=0 flush=0 readback=ok\n"),
        "{text}"
    );
    assert!(text.ends_with("guest: exit 0\n"), "{text}");
    let mut sector1 = [0u8; 512];
    disk_file.read_exact_at(&mut sector1, 512).expect("read");
    assert_eq!(
        sector1[..4],
        [pattern(0), pattern(1), pattern(2), pattern(3)]
    );

    // The same uid may not open /dev/kvm itself: the descriptor is what
    // makes the run above work.
    let mut cmd = Command::new(VMM);
    cmd.arg("--kernel").arg(&kernel).args(["--mem-mib", "32"]);
    // SAFETY: as above.
    unsafe { cmd.pre_exec(drop_privileges) };
    let out = cmd.output().expect("run as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("permission denied opening /dev/kvm"),
        "{stderr}"
    );
}
