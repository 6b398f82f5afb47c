//! MicroVM snapshot and fork benchmark on real KVM with the test guest:
//! a VM of 320 MiB whose guest touched 256 MiB (`touch=256`), then
//! - snapshot time (pause + memory + state + stamp), 10 samples;
//! - fork -> ready: `vmm --restore` spawned -> the guest answered `count`
//!   over vsock on a new connection, 30 samples (one fork at a time), plus
//!   the vmm's own "vCPUs running" figure (from its main());
//! - one fork with `--verify-memory always` (the full memory check);
//! - 100 forks started at once from one snapshot: time until all answered.
//!
//! Medians are printed; raw samples go to benches/results/vm_snapshot.json
//! at the workspace root. Nothing asserts on time. Snapshots go under
//! $VMM_BENCH_DIR (default: the temp dir).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm::config::VsockConfig;
use vmm::VmConfig;

const TOUCH_MIB: u64 = 256;
const MEM_MIB: u64 = 320;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CONNECT 1024, then `count`; returns the answer.
fn count(uds: &Path) -> String {
    let mut s = UnixStream::connect(uds).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(b"CONNECT 1024\n").expect("write");
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        s.read_exact(&mut b).expect("read OK line");
        line.push(b[0]);
    }
    assert!(
        line.starts_with(b"OK "),
        "{}",
        String::from_utf8_lossy(&line)
    );
    s.write_all(b"count").expect("write");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    // Leave the connection closed cleanly; the guest frees its slot.
    answer
}

fn quit(uds: &Path) {
    let mut s = UnixStream::connect(uds).expect("connect");
    s.write_all(b"CONNECT 1024\n").expect("write");
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        if s.read_exact(&mut b).is_err() {
            return;
        }
    }
    let _ = s.write_all(b"quit");
}

struct Fork {
    child: Child,
    uds: PathBuf,
    stdout: BufReader<std::process::ChildStdout>,
}

fn spawn_fork(snap: &Path, uds: PathBuf, extra: &[&str]) -> Fork {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmm"))
        .arg("--restore")
        .arg(snap)
        .arg("--vsock-uds")
        .arg(&uds)
        .args([
            "--serial-log",
            "/dev/null",
            "--ready-fd",
            "1",
            "--timeout-ms",
            "300000",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    Fork { child, uds, stdout }
}

impl Fork {
    /// Waits for `ready <us>`; returns the vmm's own figure.
    fn ready(&mut self) -> f64 {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read ready");
        line.trim()
            .strip_prefix("ready ")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("fork did not get ready: {line:?}"))
            / 1000.0
    }

    fn finish(mut self) {
        quit(&self.uds);
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "fork exited {status}");
    }
}

fn main() {
    let guest = env!("VMM_TEST_GUEST");
    if guest.is_empty() || vmm::vstate::kvm::KvmContext::open(Path::new("/dev/kvm")).is_err() {
        eprintln!("skipping: no test guest or no usable /dev/kvm");
        return;
    }
    let base = std::env::var_os("VMM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("vmm-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("bench dir");

    let uds = base.join("src.sock");
    let config = VmConfig {
        kernel: PathBuf::from(guest),
        mem_mib: MEM_MIB,
        cmdline: format!("touch={TOUCH_MIB}"),
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.clone(),
        }),
        ..Default::default()
    };
    let booted = Instant::now();
    let machine = vmm::build(&config, Box::new(std::io::sink())).expect("build");
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run());
    // The guest touches its memory before it listens.
    assert_eq!(count(&uds), "count=1");
    println!(
        "boot + touch {TOUCH_MIB} MiB + first count: {:.0} ms",
        ms(booted.elapsed())
    );

    let mut snapshot_ms = Vec::new();
    let mut snapshot_bytes = 0;
    let mut snap = PathBuf::new();
    for i in 0..10 {
        let dir = base.join(format!("snap{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let r = handle.snapshot(&dir).expect("snapshot");
        handle.resume().expect("resume");
        snapshot_ms.push(ms(r.elapsed));
        snapshot_bytes = r.bytes_written;
        if i > 0 {
            let _ = std::fs::remove_dir_all(&snap);
        }
        snap = dir;
    }
    println!(
        "snapshot ({} MiB written): median {:.1} ms over {} (min {:.1}, max {:.1})",
        snapshot_bytes >> 20,
        median(&snapshot_ms),
        snapshot_ms.len(),
        snapshot_ms.iter().copied().fold(f64::INFINITY, f64::min),
        snapshot_ms.iter().copied().fold(0.0, f64::max),
    );

    let mut fork_ready_ms = Vec::new();
    let mut fork_vcpus_ms = Vec::new();
    let mut fork_spawn_ready_ms = Vec::new();
    for i in 0..30 {
        let t = Instant::now();
        let mut fork = spawn_fork(&snap, base.join(format!("f{i}.sock")), &[]);
        let own = fork.ready();
        fork_spawn_ready_ms.push(ms(t.elapsed()));
        let answer = count(&fork.uds);
        fork_ready_ms.push(ms(t.elapsed()));
        fork_vcpus_ms.push(own);
        assert_eq!(answer, "count=2");
        fork.finish();
    }
    println!(
        "fork -> ready (spawn -> count answered): median {:.2} ms over {} (min {:.2}); \
         spawn -> vCPUs running: median {:.2} ms, of which vmm main -> vCPUs running: \
         median {:.2} ms",
        median(&fork_ready_ms),
        fork_ready_ms.len(),
        fork_ready_ms.iter().copied().fold(f64::INFINITY, f64::min),
        median(&fork_spawn_ready_ms),
        median(&fork_vcpus_ms),
    );

    let t = Instant::now();
    let mut fork = spawn_fork(
        &snap,
        base.join("full.sock"),
        &["--verify-memory", "always"],
    );
    fork.ready();
    assert_eq!(count(&fork.uds), "count=2");
    let full_verify_ms = ms(t.elapsed());
    fork.finish();
    println!("fork -> ready with --verify-memory always: {full_verify_ms:.1} ms");

    let t = Instant::now();
    let forks: Vec<Fork> = (0..100)
        .map(|i| spawn_fork(&snap, base.join(format!("m{i}.sock")), &[]))
        .collect();
    let spawned_ms = ms(t.elapsed());
    let waiters: Vec<_> = forks
        .into_iter()
        .map(|mut fork| {
            std::thread::spawn(move || {
                fork.ready();
                let answer = count(&fork.uds);
                let done = t.elapsed();
                assert_eq!(answer, "count=2");
                (fork, done)
            })
        })
        .collect();
    let mut done: Vec<(Fork, Duration)> = waiters
        .into_iter()
        .map(|w| w.join().expect("fork thread"))
        .collect();
    let all_ms = done.iter().map(|(_, d)| ms(*d)).fold(0.0, f64::max);
    let each: Vec<f64> = done.iter().map(|(_, d)| ms(*d)).collect();
    println!(
        "100 forks at once: all answered after {all_ms:.0} ms (spawning took {spawned_ms:.0} ms; \
         median fork answered at {:.0} ms)",
        median(&each)
    );
    for (fork, _) in done.drain(..) {
        fork.finish();
    }

    quit(&uds);
    let report = run.join().expect("join").expect("run");
    assert_eq!(report.exit, vmm::GuestExit::Code(0));

    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/results");
    let _ = std::fs::create_dir_all(&results);
    let json = format!(
        "{{\n  \"guest_touched_mib\": {TOUCH_MIB},\n  \"guest_mem_mib\": {MEM_MIB},\n  \
         \"snapshot_bytes_written\": {snapshot_bytes},\n  \"snapshot_ms\": {snapshot_ms:?},\n  \
         \"fork_ready_ms\": {fork_ready_ms:?},\n  \"fork_vcpus_running_ms\": {fork_vcpus_ms:?},\n  \
         \"fork_spawn_to_vcpus_running_ms\": {fork_spawn_ready_ms:?},\n  \
         \"fork_ready_full_verify_ms\": {full_verify_ms},\n  \"forks_100_all_answered_ms\": {all_ms},\n  \
         \"forks_100_each_ms\": {each:?}\n}}\n"
    );
    std::fs::write(results.join("vm_snapshot.json"), json).expect("write results");
    let _ = std::fs::remove_dir_all(&base);
}
