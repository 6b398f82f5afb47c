//! Boot time of the freestanding test guest (vmm/guest/): process start ->
//! the guest's first serial line, for our `vmm` binary (release, seccomp on,
//! as sandboxd runs it; and with --no-seccomp, for the filter's cost) and
//! for QEMU microvm booting the same ELF through its
//! PVH entry, interleaved run by run so both see the same host load. Both
//! guests get 64 MiB and one vCPU. The first line is timestamped when its
//! `\n` arrives on the serial pipe (our stdout / QEMU's `-serial stdio`).
//!
//! Then the vmm's memory beyond its guest: with a vsock device the test
//! guest stays alive serving, and /proc/PID/smaps gives the process's RSS and
//! the guest-RAM mapping's RSS (what the guest touched); the difference is
//! the VMM's own footprint. QEMU's is measured the same way (its guest kept
//! alive with `hang`) for comparison.
//!
//! `cargo bench -p vmm --bench boot` (VMM_BENCH_RUNS=N for more than 31
//! runs). Prints medians, min and p90, the ratio, and writes the raw samples
//! to benches/results/vm_boot.json. Without QEMU it says so and measures ours
//! alone; without KVM or the test guest it says why and stops.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const VMM: &str = env!("CARGO_BIN_EXE_vmm");
const MEM_MIB: u64 = 64;
const FIRST_LINE: &str = "guest: up vcpus=1 mem_mib=64";
const QEMU: &str = "qemu-system-x86_64";

/// QEMU microvm as lean as it boots this guest: no option ROMs, legacy
/// PIT/PIC/RTC or ACPI tables, no default devices or config files, host
/// CPU model (fewer CPUID fix-ups). The fastest of the variants tried here
/// (see vmm/README.md); the firmware (qboot) cannot be skipped.
fn qemu_args(guest: &Path, cmdline: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "-M",
        "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,acpi=off",
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-smp",
        "1",
        "-m",
        "64",
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-serial",
        "stdio",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=1",
        "-kernel",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(guest.display().to_string());
    if !cmdline.is_empty() {
        args.extend(["-append".to_owned(), cmdline.to_owned()]);
    }
    args
}

fn vmm_command(guest: &Path) -> Command {
    let mut cmd = Command::new(VMM);
    cmd.arg("--kernel")
        .arg(guest)
        .args(["--mem-mib", &MEM_MIB.to_string(), "--vcpus", "1"]);
    cmd
}

/// Reads `child`'s stdout up to the end of the first line; returns it.
fn first_line(child: &mut Child) -> Result<String, String> {
    let out = child.stdout.as_mut().ok_or("no stdout pipe")?;
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let n = out.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "output ended before a full line: {:?}",
                String::from_utf8_lossy(&line)
            ));
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

/// Starts `cmd`, returns the time to its first serial line, then lets it
/// finish and checks its exit code.
fn time_boot(mut cmd: Command, expect_code: i32) -> Result<Duration, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let line = first_line(&mut child);
    let elapsed = start.elapsed();
    let out = child.wait_with_output().map_err(|e| format!("wait: {e}"))?;
    let line = line?;
    if line != FIRST_LINE {
        return Err(format!("first line {line:?}, expected {FIRST_LINE:?}"));
    }
    if out.status.code() != Some(expect_code) {
        return Err(format!(
            "exit {:?}, expected {expect_code}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(elapsed)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median, min and p90 (nearest rank) of samples in ms.
fn stats(samples: &[f64]) -> (f64, f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let p90 = s[((n * 9).div_ceil(10)).saturating_sub(1)];
    (median, s[0], p90)
}

/// From /proc/PID/smaps: (process RSS, RSS of the mappings of exactly
/// `guest_kib` KiB with no file, i.e. guest RAM), both in KiB.
fn rss_split(pid: u32, guest_kib: u64) -> Result<(u64, u64), String> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .map_err(|e| format!("read smaps of {pid}: {e}"))?;
    let (mut total, mut guest) = (0, 0);
    let mut in_guest = false;
    let kib = |line: &str, field: &str| -> Option<u64> {
        line.strip_prefix(field)?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    };
    for line in smaps.lines() {
        if let Some(size) = kib(line, "Size:") {
            in_guest = in_guest && size == guest_kib;
        } else if let Some(rss) = kib(line, "Rss:") {
            total += rss;
            if in_guest {
                guest += rss;
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|range| range.contains('-') && !range.ends_with(':'))
        {
            // A mapping header: "start-end perms offset dev inode [path]";
            // anonymous when it names no path.
            in_guest = line.split_whitespace().count() == 5;
        }
    }
    Ok((total, guest))
}

/// Our vmm kept alive by the guest's vsock server: its RSS split.
fn vmm_rss(guest: &Path) -> Result<(u64, u64), String> {
    let uds = std::env::temp_dir().join(format!("vmm-bench-{}.sock", std::process::id()));
    let mut child = vmm_command(guest)
        .arg("--vsock-uds")
        .arg(&uds)
        // Never left running, should the guest not quit.
        .args(["--timeout-ms", "60000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let result = (|| {
        let mut serial = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        while !line.starts_with("guest: vsock cid=3 listening") {
            line.clear();
            if serial.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("vmm ended before the guest listened on vsock".to_owned());
            }
        }
        let split = rss_split(child.id(), MEM_MIB * 1024)?;
        // `quit` ends the guest. It is sent once the guest has accepted the
        // connection, and the connection stays open until the vmm exits: a
        // host close before the guest read it would reset the connection
        // and leave the guest serving.
        let io = |e: std::io::Error| format!("vsock: {e}");
        let mut conn = UnixStream::connect(&uds).map_err(io)?;
        conn.write_all(b"CONNECT 1024\n").map_err(io)?;
        let mut ok = String::new();
        BufReader::new(conn.try_clone().map_err(io)?)
            .read_line(&mut ok)
            .map_err(io)?;
        if !ok.starts_with("OK ") {
            return Err(format!("vsock: CONNECT answered {ok:?}"));
        }
        conn.write_all(b"quit").map_err(io)?;
        child.wait().map_err(|e| format!("wait: {e}"))?;
        Ok(split)
    })();
    if result.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = std::fs::remove_file(&uds);
    result
}

/// QEMU kept alive by the guest's `hang`: its RSS split.
fn qemu_rss(guest: &Path) -> Result<(u64, u64), String> {
    let mut child = Command::new(QEMU)
        .args(qemu_args(guest, "hang"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let result = (|| {
        let mut serial = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        while !line.starts_with("guest: hang") {
            line.clear();
            if serial.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("qemu ended before the guest hung".to_owned());
            }
        }
        rss_split(child.id(), MEM_MIB * 1024)
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn qemu_available() -> Result<(), String> {
    match Command::new(QEMU).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("`{QEMU} --version` failed: {:?}", out.status)),
        Err(e) => Err(format!(
            "{QEMU} not found ({e}): install it with `apt-get install -y qemu-system-x86` \
             (scripts/install-deps.sh does)"
        )),
    }
}

fn main() {
    let guest = env!("VMM_TEST_GUEST");
    if guest.is_empty() {
        println!("vm_boot: skipped: the test guest was not built (see the build warning)");
        return;
    }
    let guest = PathBuf::from(guest);
    if let Err(e) = vmm::vstate::kvm::KvmContext::open(Path::new("/dev/kvm")) {
        println!("vm_boot: skipped: no usable KVM: {e}");
        return;
    }
    let runs: usize = std::env::var("VMM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(31);
    let qemu = match qemu_available() {
        Ok(()) => true,
        Err(why) => {
            println!("vm_boot: QEMU not measured: {why}");
            false
        }
    };

    // One unmeasured boot each, so neither pays for a cold page cache.
    let fail = |who: &str, e: String| -> ! {
        eprintln!("vm_boot: {who} boot failed: {e}");
        std::process::exit(1)
    };
    if let Err(e) = time_boot(vmm_command(&guest), 0) {
        fail("vmm", e);
    }
    if qemu {
        let mut cmd = Command::new(QEMU);
        cmd.args(qemu_args(&guest, ""));
        if let Err(e) = time_boot(cmd, 1) {
            fail("qemu", e);
        }
    }

    let (mut ours, mut theirs) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    // The same without the seccomp filter: what compiling and installing it
    // costs at boot.
    let mut unfiltered = Vec::with_capacity(runs);
    for _ in 0..runs {
        match time_boot(vmm_command(&guest), 0) {
            Ok(d) => ours.push(ms(d)),
            Err(e) => fail("vmm", e),
        }
        let mut cmd = vmm_command(&guest);
        cmd.arg("--no-seccomp");
        match time_boot(cmd, 0) {
            Ok(d) => unfiltered.push(ms(d)),
            Err(e) => fail("vmm --no-seccomp", e),
        }
        if qemu {
            let mut cmd = Command::new(QEMU);
            cmd.args(qemu_args(&guest, ""));
            // isa-debug-exit: QEMU exits with code * 2 + 1.
            match time_boot(cmd, 1) {
                Ok(d) => theirs.push(ms(d)),
                Err(e) => fail("qemu", e),
            }
        }
    }

    let (vmm_rss_kib, vmm_guest_kib) = vmm_rss(&guest).unwrap_or_else(|e| fail("vmm (rss)", e));
    let qemu_rss_kib = if qemu {
        Some(qemu_rss(&guest).unwrap_or_else(|e| fail("qemu (rss)", e)))
    } else {
        None
    };

    let (m, min, p90) = stats(&ours);
    println!(
        "vm_boot: process start -> first serial line of the test guest, {MEM_MIB} MiB, 1 vCPU, \
         {runs} runs each, interleaved"
    );
    println!("  vmm (release, seccomp on)   median {m:7.2} ms  min {min:7.2}  p90 {p90:7.2}");
    let (um, umin, up90) = stats(&unfiltered);
    println!("  vmm --no-seccomp            median {um:7.2} ms  min {umin:7.2}  p90 {up90:7.2}");
    let mut ratio = None;
    if qemu {
        let (qm, qmin, qp90) = stats(&theirs);
        println!(
            "  qemu microvm (PVH)          median {qm:7.2} ms  min {qmin:7.2}  p90 {qp90:7.2}"
        );
        println!("  qemu / vmm (medians)        {:.1}x", qm / m);
        ratio = Some(qm / m);
    }
    let beyond = vmm_rss_kib.saturating_sub(vmm_guest_kib);
    println!(
        "  vmm RSS {vmm_rss_kib} KiB = guest RAM touched {vmm_guest_kib} KiB + vmm {beyond} KiB \
         ({:.2} MiB; guest alive serving vsock)",
        beyond as f64 / 1024.0
    );
    if let Some((q, qg)) = qemu_rss_kib {
        println!(
            "  qemu RSS {q} KiB = guest RAM touched {qg} KiB + qemu {} KiB ({:.2} MiB)",
            q.saturating_sub(qg),
            q.saturating_sub(qg) as f64 / 1024.0
        );
    }

    let raw = json!({
        "unit": "ms",
        "runs": runs,
        "guest": "vmm/guest test guest, 64 MiB, 1 vCPU, first serial line",
        "vmm_first_line": ours,
        "vmm_no_seccomp_first_line": unfiltered,
        "qemu_microvm_first_line": theirs,
        "qemu_args": qemu.then(|| qemu_args(Path::new("test-guest.elf"), "")),
        "ratio_of_medians": ratio,
        "vmm_rss_kib": vmm_rss_kib,
        "vmm_guest_rss_kib": vmm_guest_kib,
        "vmm_rss_beyond_guest_kib": beyond,
        "qemu_rss_kib": qemu_rss_kib.map(|q| q.0),
        "qemu_guest_rss_kib": qemu_rss_kib.map(|q| q.1),
    });
    // The repository's benches/results, beside the workspace's other benches.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest
        .parent()
        .unwrap_or(manifest)
        .join("benches/results");
    let file = dir.join("vm_boot.json");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &file,
            serde_json::to_string_pretty(&raw).unwrap_or_default() + "\n",
        )
    });
    match written {
        Ok(()) => println!("  raw samples: {}", file.display()),
        Err(e) => eprintln!("vm_boot: cannot write {}: {e}", file.display()),
    }
}
