//! Linux guests in microVMs, beside QEMU: create -> agent ready and create
//! -> python output through a real sandboxd, booting (a daemon with boot
//! templates off) and forked from the image's boot template (a daemon with
//! them on, its template made before the runs), the same guest booted by
//! our `vmm` alone, and QEMU `-M microvm -accel kvm` booting the same
//! kernel with the same disks and the same agent as init to the same
//! marker (the agent dialling its host over vsock), interleaved run by
//! run; then fork -> ready of a Linux guest from a snapshot of a running
//! one, and one boot with the kernel's log timestamped for the phase table
//! and its longest silence.
//!
//! It needs VMX/SVM, which this host's kvm_pvm lacks, so it runs in the
//! nested host: `benches/nested.sh microvm_linux` builds it and runs it there
//! (the figures are 10-20x slower than on hardware; the ratios are what
//! count). Prints medians and writes the raw samples to
//! `benches/results/microvm_linux.json`.
//!
//! What differs between the three, on purpose: the daemon's VM also gets a
//! tap and its agent brings eth0 up, and its ready is the agent's Hello
//! answered through the supervisor; the VMM alone and QEMU stop at the
//! agent's connection.

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Daemon;
use hyper::Method;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, VsockAddr};
use peers::median;
use serde_json::json;

/// Where scripts/build-guest-kernel.sh leaves the guest kernel.
const GUEST_KERNEL: &str = "/var/cache/sandboxd-build/kernel/current/vmlinux";
const QEMU: &str = "qemu-system-x86_64";
const MEM_MIB: u64 = 256;
/// How long one boot may take in the nested host before the run fails.
const BOOT_LIMIT: Duration = Duration::from_secs(120);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Why Linux guests cannot run on this host's KVM, if they cannot.
fn no_hardware_virt() -> Option<String> {
    if !Path::new("/dev/kvm").exists() {
        return Some("no /dev/kvm".into());
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        return Some(
            "/dev/kvm is kvm_pvm (no VMX/SVM); run benches/nested.sh microvm_linux, \
             which runs this in the nested host"
                .into(),
        );
    }
    None
}

/// The disks the daemon gave a running VM (`--disk` of its `vmm`): image,
/// scratch, agent.
fn disks_of(id: &str) -> Vec<PathBuf> {
    let pids = common::processes_where(|_, argv| {
        argv.first().is_some_and(|a| a.ends_with("/vmm")) && argv.iter().any(|a| a.contains(id))
    });
    let pid = pids.first().expect("the VM's vmm process");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("vmm cmdline");
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.windows(2)
        .filter(|w| w[0] == "--disk")
        .map(|w| PathBuf::from(w[1].trim_end_matches(",ro")))
        .collect()
}

/// The kernel command line the daemon gives a Linux guest, less the RNG
/// seed (the agent goes on without one).
fn guest_cmdline(extra: &str) -> String {
    sandboxd::runtime::microvm::guest_cmdline(None, None, None, extra)
}

/// The guest's disks for one boot outside the daemon: the image and the
/// agent disk read-only, and a fresh copy of an empty ext4 scratch disk.
struct Disks {
    image: PathBuf,
    agent: PathBuf,
    empty_scratch: PathBuf,
}

impl Disks {
    fn scratch_copy(&self, dir: &Path) -> PathBuf {
        let copy = dir.join("scratch.ext4");
        let status = Command::new("cp")
            .arg("--reflink=auto")
            .arg(&self.empty_scratch)
            .arg(&copy)
            .status()
            .expect("cp");
        assert!(status.success(), "copying the scratch disk failed");
        copy
    }
}

/// Waits for one connection on `accept`, which runs on its own thread, or
/// for `limit`; the child is killed either way.
fn time_until_connected<T: Send + 'static>(
    started: Instant,
    mut child: Child,
    accept: impl FnOnce() -> T + Send + 'static,
    what: &str,
    console: &Path,
) -> Duration {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let conn = accept();
        let _ = tx.send((started.elapsed(), conn));
    });
    let got = rx.recv_timeout(BOOT_LIMIT);
    let _ = child.kill();
    let _ = child.wait();
    match got {
        Ok((elapsed, _conn)) => elapsed,
        Err(_) => panic!(
            "{what}: the agent did not connect within {BOOT_LIMIT:?}; console:\n{}",
            std::fs::read_to_string(console).unwrap_or_default()
        ),
    }
}

/// Where our `vmm` delivers the guest's connections to the agent port.
fn agent_listener(uds: &Path) -> UnixListener {
    UnixListener::bind(format!(
        "{}_{}",
        uds.display(),
        sandbox_proto::AGENT_VSOCK_PORT
    ))
    .expect("bind the agent socket")
}

/// Our `vmm` booting the guest on `disks` (with `scratch` as its scratch
/// disk), its vsock at `uds`, `cmdline_extra` after the daemon's command line.
fn vmm_command(
    vmm: &Path,
    kernel: &Path,
    disks: &Disks,
    scratch: &Path,
    uds: &Path,
    cmdline_extra: &str,
) -> Command {
    let mut command = Command::new(vmm);
    command
        .arg("--kernel")
        .arg(kernel)
        .arg("--cmdline")
        .arg(guest_cmdline(cmdline_extra))
        .args(["--mem-mib", &MEM_MIB.to_string(), "--vcpus", "1"])
        .arg("--disk")
        .arg(format!("{},ro", disks.image.display()))
        .arg("--disk")
        .arg(scratch)
        .arg("--disk")
        .arg(format!("{},ro", disks.agent.display()))
        .arg("--vsock-uds")
        .arg(uds);
    command
}

/// Our `vmm` alone: process start -> the agent connects to its vsock.
fn boot_vmm(vmm: &Path, kernel: &Path, disks: &Disks) -> Duration {
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let uds = dir.path().join("v.sock");
    let listener = agent_listener(&uds);
    let console = dir.path().join("console");
    let scratch = disks.scratch_copy(dir.path());
    let started = Instant::now();
    let child = vmm_command(vmm, kernel, disks, &scratch, &uds, "")
        .arg("--serial-log")
        .arg(&console)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vmm");
    time_until_connected(started, child, move || listener.accept(), "vmm", &console)
}

/// A host-side AF_VSOCK listener on the agent's port, for QEMU's
/// vhost-vsock guests.
fn vsock_listener() -> OwnedFd {
    let fd = socket::socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("AF_VSOCK socket (is vhost_vsock loaded?)");
    socket::bind(
        fd.as_raw_fd(),
        &VsockAddr::new(libc::VMADDR_CID_ANY, sandbox_proto::AGENT_VSOCK_PORT),
    )
    .expect("bind the vsock port");
    socket::listen(&fd, socket::Backlog::new(4).expect("backlog")).expect("listen");
    fd
}

/// QEMU microvm: process start -> the agent connects over vhost-vsock.
fn boot_qemu(kernel: &Path, disks: &Disks, listener: &OwnedFd, cid: u32) -> Duration {
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let console = dir.path().join("console");
    let scratch = disks.scratch_copy(dir.path());
    let drive = |id: &str, path: &Path, ro: bool| {
        [
            "-drive".to_string(),
            format!(
                "id={id},file={},format=raw,if=none{}",
                path.display(),
                if ro { ",readonly=on" } else { "" }
            ),
            "-device".to_string(),
            format!("virtio-blk-device,drive={id}"),
        ]
    };
    let listen_fd = listener.as_raw_fd();
    let started = Instant::now();
    let child = Command::new(QEMU)
        .args([
            "-M",
            "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,acpi=off",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            &MEM_MIB.to_string(),
            "-smp",
            "1",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-serial",
        ])
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(kernel)
        .arg("-append")
        .arg(guest_cmdline(""))
        .args(drive("image", &disks.image, true))
        .args(drive("scratch", &scratch, false))
        .args(drive("agent", &disks.agent, true))
        .args(["-device", &format!("vhost-vsock-device,guest-cid={cid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn qemu");
    let accept = move || {
        let fd = socket::accept(listen_fd).expect("accept");
        // SAFETY: accept returned a new descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    time_until_connected(started, child, accept, "qemu", &console)
}

/// One boot of our `vmm` with the kernel's log on and timestamped, read
/// line by line as it arrives. Returns the phase table's rows (name, ms
/// since the vmm started) and the longest silence in the kernel's log.
fn phases(vmm: &Path, kernel: &Path, disks: &Disks) -> (Vec<(String, f64)>, (f64, String)) {
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let uds = dir.path().join("v.sock");
    let listener = agent_listener(&uds);
    let scratch = disks.scratch_copy(dir.path());
    let started = Instant::now();
    let mut child = vmm_command(
        vmm,
        kernel,
        disks,
        &scratch,
        &uds,
        "printk.time=1 ignore_loglevel",
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn vmm");
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        // Lines with their arrival times, until the vmm is killed.
        let mut lines = Vec::new();
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b == b'\n' {
                    lines.push((
                        started.elapsed(),
                        String::from_utf8_lossy(&pending).into_owned(),
                    ));
                    pending.clear();
                } else {
                    pending.push(b);
                }
            }
        }
        lines
    });
    std::thread::spawn(move || {
        let conn = listener.accept();
        let _ = tx.send((started.elapsed(), conn));
    });
    let connected = rx.recv_timeout(BOOT_LIMIT).expect("the agent connected");
    let _ = child.kill();
    let _ = child.wait();
    let lines = reader.join().expect("serial reader");

    // printk's clock starts near the kernel's entry: the last kernel line's
    // arrival less its own timestamp places that entry on the host's clock.
    let stamped: Vec<(Duration, f64, &str)> = lines
        .iter()
        .filter_map(|(at, l)| {
            let rest = l.strip_prefix('[')?;
            let (ts, text) = rest.split_once(']')?;
            Some((*at, ts.trim().parse::<f64>().ok()?, text.trim()))
        })
        .collect();
    let arrival = |needle: &str| {
        lines
            .iter()
            .find(|(_, l)| l.contains(needle))
            .map(|(at, _)| ms(*at))
            .unwrap_or(f64::NAN)
    };
    let init_line = stamped
        .iter()
        .find(|(_, _, t)| t.contains("as init process"))
        .expect("the kernel's 'Run ... as init process' line");
    let kernel_entry = ms(init_line.0) - init_line.1 * 1000.0;
    let mut gap = (0.0, String::new());
    for pair in stamped.windows(2) {
        let silence = (pair[1].1 - pair[0].1) * 1000.0;
        if silence > gap.0 {
            gap = (silence, format!("{} -> {}", pair[0].2, pair[1].2));
        }
    }
    let rows = vec![
        (
            "vmm start -> kernel entry (printk clock 0)".into(),
            kernel_entry,
        ),
        (
            "kernel runs init".into(),
            kernel_entry + init_line.1 * 1000.0,
        ),
        (
            "agent: root overlay mounted".into(),
            arrival("sandbox-agent: root is an overlay"),
        ),
        (
            "agent: connecting to the host".into(),
            arrival("sandbox-agent: connecting"),
        ),
        ("agent connected (vsock)".into(), ms(connected.0)),
    ];
    (rows, gap)
}

struct Samples {
    daemon_ready: Vec<f64>,
    daemon_output: Vec<f64>,
    template_ready: Vec<f64>,
    template_output: Vec<f64>,
    vmm_connect: Vec<f64>,
    qemu_connect: Vec<f64>,
    fork_ready: Vec<f64>,
}

async fn daemon_create(daemon: &Daemon) -> (f64, f64) {
    let vm = json!({"runtime": "vm", "image": "python", "memory_mib": MEM_MIB});
    let begun = Instant::now();
    let id = daemon.create(vm).await;
    let ready = ms(begun.elapsed());
    let run = daemon.exec(&id, &["python3", "-c", "print(6*7)"]).await;
    let output = ms(begun.elapsed());
    assert_eq!(run.out(), "42\n", "{}", run.err());
    daemon.delete(&id).await;
    (ready, output)
}

async fn fork_ready(daemon: &Daemon, runs: usize) -> Vec<f64> {
    let vm = json!({"runtime": "vm", "image": "python", "memory_mib": MEM_MIB});
    let source = daemon.create(vm).await;
    let snap = daemon.snapshot(&source, "memory").await;
    let mut samples = Vec::new();
    for _ in 0..runs {
        let begun = Instant::now();
        let fork = daemon.create(json!({"from_snapshot": snap})).await;
        samples.push(ms(begun.elapsed()));
        let run = daemon.exec(&fork, &["python3", "-c", "print(6*7)"]).await;
        assert_eq!(run.out(), "42\n", "{}", run.err());
        daemon.delete(&fork).await;
    }
    daemon.delete(&source).await;
    let _ = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    samples
}

/// The daemon's create phases (means over every create it made), from
/// its metrics.
async fn daemon_phases(daemon: &Daemon) -> Vec<(String, f64)> {
    let (_, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    let text = String::from_utf8_lossy(&metrics).into_owned();
    let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    let mut rows = Vec::new();
    for sum in text
        .lines()
        .filter(|l| l.starts_with("sandboxd_create_phase_seconds_sum"))
    {
        let labels = sum
            .split_once('{')
            .and_then(|(_, r)| r.split_once('}'))
            .map(|(l, _)| l.to_string())
            .unwrap_or_default();
        let count = text
            .lines()
            .find(|l| l.starts_with(&format!("sandboxd_create_phase_seconds_count{{{labels}}}")))
            .and_then(value);
        if let (Some(sum), Some(count)) = (value(sum), count) {
            if count > 0.0 {
                rows.push((labels, sum / count * 1000.0));
            }
        }
    }
    rows
}

fn main() {
    if !peers::should_run() {
        return;
    }
    if let Some(why) = no_hardware_virt() {
        println!("microvm_linux benchmark skipped: {why}");
        return;
    }
    if let Some((_, why)) = common::skip_reason() {
        println!("microvm_linux benchmark skipped: {why}");
        return;
    }
    let vmm = Path::new(common::DAEMON)
        .parent()
        .map(|d| d.join("vmm"))
        .unwrap_or_default();
    let kernel = PathBuf::from(
        std::env::var("SANDBOXD_TEST_GUEST_KERNEL").unwrap_or_else(|_| GUEST_KERNEL.into()),
    );
    for (path, build) in [
        (&vmm, "cargo build --release -p vmm"),
        (&kernel, "scripts/build-guest-kernel.sh"),
    ] {
        if !path.is_file() {
            println!(
                "microvm_linux benchmark skipped: {} missing: run {build}",
                path.display()
            );
            return;
        }
    }
    let qemu = Command::new(QEMU).arg("--version").output().is_ok();
    let runs = peers::bench_runs(7);
    let start = |templates: &str| {
        Daemon::start_with(&[
            "--vm-kernel",
            &kernel.display().to_string(),
            "--vmm-path",
            &vmm.display().to_string(),
            "--ready-timeout-seconds",
            "120",
            "--vm-boot-templates",
            templates,
        ])
    };
    let daemon = start("false");
    let templated = start("true");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // The templated daemon's first create boots and asks for the template,
    // made before the runs so that it never shares the CPUs with them.
    runtime.block_on(async {
        let (ready, _) = daemon_create(&templated).await;
        eprintln!("  templated daemon's first (booted) create: ready {ready:.0} ms");
        templated
            .await_metric_within("sandboxd_vm_boot_templates ", BOOT_LIMIT * 2)
            .await;
    });

    // Warm-up: the image's ext4 export and the agent disk are made once,
    // and a running VM names them.
    let disks = runtime.block_on(async {
        let id = daemon
            .create(json!({"runtime": "vm", "image": "python", "memory_mib": MEM_MIB}))
            .await;
        let found = disks_of(&id);
        daemon.delete(&id).await;
        found
    });
    assert_eq!(disks.len(), 3, "image, scratch and agent disks: {disks:?}");
    let work = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let empty_scratch = work.path().join("empty-scratch.ext4");
    let made = Command::new("truncate")
        .args(["-s", "256M"])
        .arg(&empty_scratch)
        .status()
        .and_then(|_| {
            Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&empty_scratch)
                .status()
        })
        .expect("mkfs.ext4");
    assert!(made.success(), "mkfs.ext4 of the scratch disk failed");
    let disks = Disks {
        image: disks[0].clone(),
        agent: disks[2].clone(),
        empty_scratch,
    };
    let vsock = qemu.then(vsock_listener);

    let mut s = Samples {
        daemon_ready: Vec::new(),
        daemon_output: Vec::new(),
        template_ready: Vec::new(),
        template_output: Vec::new(),
        vmm_connect: Vec::new(),
        qemu_connect: Vec::new(),
        fork_ready: Vec::new(),
    };
    for run in 0..runs {
        let (ready, output) = runtime.block_on(daemon_create(&daemon));
        s.daemon_ready.push(ready);
        s.daemon_output.push(output);
        let (forked, forked_output) = runtime.block_on(daemon_create(&templated));
        s.template_ready.push(forked);
        s.template_output.push(forked_output);
        s.vmm_connect.push(ms(boot_vmm(&vmm, &kernel, &disks)));
        if let Some(listener) = &vsock {
            s.qemu_connect
                .push(ms(boot_qemu(&kernel, &disks, listener, 100 + run as u32)));
        }
        eprintln!(
            "  run {run}: daemon ready {ready:.0} ms, output {output:.0} ms; from the template {forked:.0} / {forked_output:.0} ms; vmm {:.0} ms; qemu {}",
            s.vmm_connect.last().copied().unwrap_or(f64::NAN),
            s.qemu_connect
                .last()
                .map_or("-".into(), |q| format!("{q:.0} ms"))
        );
    }
    s.fork_ready = runtime.block_on(fork_ready(&daemon, runs));
    let daemon_rows = runtime.block_on(daemon_phases(&daemon));
    let (boot_rows, gap) = phases(&vmm, &kernel, &disks);

    let qemu_median = median(&s.qemu_connect);
    let ratio = |ours: f64| {
        if qemu_median.is_nan() {
            "-".to_string()
        } else {
            format!("{:.2}x", ours / qemu_median)
        }
    };
    println!("Linux guest microVMs, python image, {MEM_MIB} MiB, 1 vCPU ({runs} runs, medians in ms; ratio = ours / QEMU)");
    println!(
        "  daemon create -> agent ready (boot)       {:9.1}  {}",
        median(&s.daemon_ready),
        ratio(median(&s.daemon_ready))
    );
    println!(
        "  daemon create -> agent ready (template)   {:9.1}  {}",
        median(&s.template_ready),
        ratio(median(&s.template_ready))
    );
    println!(
        "  daemon create -> python output (boot)     {:9.1}  {}",
        median(&s.daemon_output),
        ratio(median(&s.daemon_output))
    );
    println!(
        "  daemon create -> python output (template) {:9.1}  {}",
        median(&s.template_output),
        ratio(median(&s.template_output))
    );
    println!(
        "  vmm alone start -> agent connected       {:9.1}  {}",
        median(&s.vmm_connect),
        ratio(median(&s.vmm_connect))
    );
    if qemu {
        println!("  QEMU microvm -> agent connected          {qemu_median:9.1}");
    } else {
        println!("  QEMU microvm: {QEMU} not found, not measured");
    }
    println!(
        "  daemon fork of a snapshot -> ready       {:9.1}",
        median(&s.fork_ready)
    );
    println!("Boot phases of one vmm boot with the kernel log on (ms since the vmm started):");
    for (name, at) in &boot_rows {
        println!("  {name:42} {at:9.1}");
    }
    println!(
        "  longest silence in the kernel log: {:.1} ms ({})",
        gap.0, gap.1
    );
    println!("Daemon create phases (means over every create, ms):");
    for (labels, mean) in &daemon_rows {
        println!("  {labels:42} {mean:9.1}");
    }
    let raw = json!({
        "runs": runs,
        "unit": "ms",
        "daemon_create_to_ready": s.daemon_ready,
        "daemon_create_to_output": s.daemon_output,
        "template_create_to_ready": s.template_ready,
        "template_create_to_output": s.template_output,
        "vmm_start_to_agent_connected": s.vmm_connect,
        "qemu_start_to_agent_connected": s.qemu_connect,
        "daemon_fork_to_ready": s.fork_ready,
        "boot_phases_ms": boot_rows.iter().map(|(n, v)| json!({"phase": n, "ms": v})).collect::<Vec<_>>(),
        "longest_kernel_log_silence_ms": gap.0,
        "longest_kernel_log_silence_between": gap.1,
        "daemon_create_phase_means_ms": daemon_rows.iter().map(|(n, v)| json!({"phase": n, "ms": v})).collect::<Vec<_>>(),
        "medians": {
            "daemon_create_to_ready": median(&s.daemon_ready),
            "daemon_create_to_output": median(&s.daemon_output),
            "template_create_to_ready": median(&s.template_ready),
            "template_create_to_output": median(&s.template_output),
            "vmm_start_to_agent_connected": median(&s.vmm_connect),
            "qemu_start_to_agent_connected": qemu_median,
            "daemon_fork_to_ready": median(&s.fork_ready),
        },
    });
    let file = peers::write_results("microvm_linux", &raw);
    println!("raw samples: {}", file.display());
}
