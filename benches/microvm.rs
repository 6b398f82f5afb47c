//! MicroVM sandboxes through a real sandboxd: create -> ready (the guest's
//! agent has dialled in and said Hello), create -> the output of a process,
//! memory snapshot, fork -> ready, claims from a warm microVM pool, and
//! (in a second daemon, alone on the host) creates forked from the image's
//! boot template, with the freestanding test guest as the kernel (what
//! this kvm_pvm host can run). A container create -> ready runs in the
//! same daemon for scale. Prints medians and writes the raw samples to
//! `benches/results/microvm.json`.
//!
//!     sudo cargo bench --bench microvm        # BENCH_RUNS=30 by default
//!
//! The peer, interleaved run by run: our `vmm` alone booting the same guest
//! with the same memory, disks and vsock (no tap, namespace, cgroups or
//! jail: those are the daemon's), from process start to the guest's first
//! serial line and to its agent connecting over vsock, which is the moment
//! the daemon's ready waits for (only the agent's hello follows). The test
//! guest checks every device before its agent dials out, each step a few
//! thousand instructions that kvm_pvm may run in KVM's emulator, so the
//! two markers are far apart here.
//!
//! The fork's peer, interleaved too: our `vmm` alone restoring the very
//! snapshot the forks come from, with the same disks (its scratch disk a
//! reflink of the snapshot's, as the daemon makes it) and a tap in a
//! namespace of the benchmark's own, from process start to the restored
//! guest's agent dialling in again, which is what a fork's ready waits for
//! (the fork's Reseed round trip follows).
//!
//! The VMM beside QEMU microvm is `cargo bench -p vmm --bench boot`; its
//! snapshots with 256 MiB touched are `cargo bench -p vmm --bench
//! vm_snapshot`.

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::Daemon;
use hyper::{Method, StatusCode};
use peers::median;
use serde_json::{json, Value};

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// The test guest, built with the repository's script into `dir`.
fn test_guest(dir: &Path) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vmm/guest/build.sh");
    let built = std::process::Command::new("sh")
        .arg(script)
        .arg(dir)
        .output()
        .ok()?;
    built.status.success().then(|| dir.join("test-guest.elf"))
}

/// Our `vmm` alone, started as the daemon starts it minus what is the
/// daemon's (see the module's documentation).
struct Alone {
    vmm: PathBuf,
    guest: PathBuf,
    dir: tempfile::TempDir,
    /// A network namespace of the benchmark's own holding the `tap0` a
    /// restored VM's net device needs (a snapshot keeps its devices).
    netns: String,
}

impl Drop for Alone {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

impl Alone {
    /// Sparse disks of the sizes a busybox VM gets (the guest reads their
    /// first sector and writes and flushes one of the scratch disk's).
    fn new(vmm: &Path, guest: &Path) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, mib) in [("base.img", 36), ("scratch.img", 64), ("agent.img", 19)] {
            let disk = std::fs::File::create(dir.path().join(name)).expect("disk");
            disk.set_len(mib << 20).expect("disk size");
        }
        let netns = format!("sbxbench-{}", std::process::id());
        common::ip(&["netns", "add", &netns]);
        common::ip(&["-n", &netns, "tuntap", "add", "tap0", "mode", "tap"]);
        common::ip(&["-n", &netns, "link", "set", "tap0", "up"]);
        Self {
            vmm: vmm.to_path_buf(),
            guest: guest.to_path_buf(),
            dir,
            netns,
        }
    }

    /// One boot: ms from spawn to the first serial line, and to the agent's
    /// vsock connection.
    fn boot(&self) -> (f64, f64) {
        let dir = self.dir.path();
        let vsock = dir.join("vsock.sock");
        let agent = dir.join("vsock.sock_1025");
        let _ = std::fs::remove_file(&vsock);
        let _ = std::fs::remove_file(&agent);
        let listener = UnixListener::bind(&agent).expect("agent socket");
        let disk = |name: &str, ro: bool| {
            let path = dir.join(name).display().to_string();
            if ro {
                format!("{path},ro")
            } else {
                path
            }
        };
        let begun = Instant::now();
        let mut child = Command::new(&self.vmm)
            .args(["--kernel", &self.guest.display().to_string()])
            .args(["--mem-mib", "64", "--vcpus", "1", "--vsock-cid", "3"])
            .args(["--disk", &disk("base.img", true)])
            .args(["--disk", &disk("scratch.img", false)])
            .args(["--disk", &disk("agent.img", true)])
            .args(["--vsock-uds", &vsock.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("vmm");
        let mut out = child.stdout.take().expect("stdout");
        let mut byte = [0u8; 1];
        while out.read(&mut byte).expect("serial") == 1 && byte[0] != b'\n' {}
        let first_line = ms(begun);
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10_000u16));
        let connected = ms(begun);
        assert_eq!(ready.ok(), Some(1), "the guest's agent did not connect");
        drop(listener.accept().expect("agent connection"));
        let _ = child.kill();
        let _ = child.wait();
        (first_line, connected)
    }

    /// One restore of the snapshot in `images` with `disks` (the daemon's,
    /// in order; the writable one is copied from `scratch` first, by
    /// reflink, into `work` on the same btrfs): ms from spawn to the
    /// restored guest's agent dialling in.
    fn restore(&self, images: &Path, disks: &[String], scratch: &Path, work: &Path) -> f64 {
        use std::os::unix::process::CommandExt;
        std::fs::create_dir_all(work).expect("work dir");
        let copy = work.join("scratch.ext4");
        let vsock = work.join("vsock.sock");
        let agent = work.join("vsock.sock_1025");
        for stale in [&copy, &vsock, &agent] {
            let _ = std::fs::remove_file(stale);
        }
        let copied = Command::new("cp")
            .arg("--reflink=always")
            .arg(scratch)
            .arg(&copy)
            .status();
        assert!(
            copied.is_ok_and(|s| s.success()),
            "reflink the scratch disk"
        );
        let listener = UnixListener::bind(&agent).expect("agent socket");
        let netns = std::fs::File::open(format!("/var/run/netns/{}", self.netns)).expect("netns");
        let mut command = Command::new(&self.vmm);
        command.arg("--restore").arg(images);
        for disk in disks {
            let disk = if disk.ends_with(",ro") {
                disk.clone()
            } else {
                copy.display().to_string()
            };
            command.args(["--disk", &disk]);
        }
        command
            .args(["--vsock-uds", &vsock.display().to_string(), "--net", "tap0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: setns is async-signal-safe, on a descriptor this process
        // keeps open until spawn returns.
        unsafe {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&netns);
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let begun = Instant::now();
        let mut child = command.spawn().expect("vmm --restore");
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10_000u16));
        let redialled = ms(begun);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            ready.ok(),
            Some(1),
            "the restored guest's agent did not dial in"
        );
        redialled
    }
}

/// The disks sandbox `id`'s VMM was given, in order, as its command line
/// says (`PATH` or `PATH,ro`).
fn vmm_disks_of(id: &str) -> Vec<String> {
    let pids = common::processes_where(|_, argv| {
        argv.first().is_some_and(|a| a.ends_with("/vmm")) && argv.iter().any(|a| a.contains(id))
    });
    let pid = *pids.first().expect("the source sandbox's vmm");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("its command line");
    let args: Vec<String> = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .map(String::from)
        .collect();
    args.windows(2)
        .filter(|w| w[0] == "--disk")
        .map(|w| w[1].clone())
        .collect()
}

struct Samples {
    alone_first_line: Vec<f64>,
    alone_agent: Vec<f64>,
    create_ready: Vec<f64>,
    create_output: Vec<f64>,
    container_ready: Vec<f64>,
    snapshot: Vec<f64>,
    fork_ready: Vec<f64>,
    alone_restore: Vec<f64>,
    pool_claim: Vec<f64>,
    pool_claim_custom: Vec<f64>,
    /// Mean of each create phase (ms) over the cold creates, per runtime,
    /// and over the microVM forks.
    vm_phases: Vec<(String, f64)>,
    container_phases: Vec<(String, f64)>,
    fork_phases: Vec<(String, f64)>,
}

/// The sum (s) and count of each phase of `runtime`'s creates so far.
async fn phase_totals(daemon: &Daemon, runtime: &str) -> Vec<(String, f64, f64)> {
    let (_, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    peers::phase_totals(&String::from_utf8_lossy(&metrics), runtime)
}

async fn measure(daemon: &Daemon, alone: &Alone, runs: usize) -> Samples {
    let vm = json!({"runtime": "vm", "image": "busybox", "memory_mib": 64});
    // Warm-up: the image's ext4 export and the agent disk are made once.
    let id = daemon.create(vm.clone()).await;
    daemon.delete(&id).await;
    let mut s = Samples {
        alone_first_line: Vec::new(),
        alone_agent: Vec::new(),
        create_ready: Vec::new(),
        create_output: Vec::new(),
        container_ready: Vec::new(),
        snapshot: Vec::new(),
        fork_ready: Vec::new(),
        alone_restore: Vec::new(),
        pool_claim: Vec::new(),
        pool_claim_custom: Vec::new(),
        vm_phases: Vec::new(),
        container_phases: Vec::new(),
        fork_phases: Vec::new(),
    };
    for _ in 0..runs {
        let begun = Instant::now();
        let id = daemon.create(vm.clone()).await;
        s.create_ready.push(ms(begun));
        let run = daemon.exec(&id, &["echo", "hi"]).await;
        s.create_output.push(ms(begun));
        assert_eq!(run.out(), "hi\n");
        daemon.delete(&id).await;

        let (first_line, agent) = tokio::task::block_in_place(|| alone.boot());
        s.alone_first_line.push(first_line);
        s.alone_agent.push(agent);

        let begun = Instant::now();
        let id = daemon.create(json!({"image": "busybox"})).await;
        s.container_ready.push(ms(begun));
        daemon.delete(&id).await;
    }
    // Where a cold create's time goes, before forks and claims add theirs
    // (the pool's one fill is a cold VM create too).
    s.vm_phases = peers::phase_means(&[], &phase_totals(daemon, "vm").await);
    s.container_phases = peers::phase_means(&[], &phase_totals(daemon, "container").await);
    let source = daemon.create(vm.clone()).await;
    for _ in 0..3 {
        daemon.exec(&source, &["count"]).await;
    }
    let mut snapshots = Vec::new();
    for _ in 0..runs.min(10) {
        let begun = Instant::now();
        let (status, snap): (StatusCode, Value) = daemon
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{source}/snapshots"),
                Some(json!({"kind": "memory"})),
            )
            .await;
        s.snapshot.push(ms(begun));
        assert_eq!(status, StatusCode::CREATED, "{snap}");
        snapshots.push(snap["id"].as_str().expect("id").to_string());
    }
    let snap = snapshots[0].clone();
    let disks = vmm_disks_of(&source);
    let state = daemon.state_dir();
    let (images, scratch) = (
        state.join("snapshot-images").join(&snap),
        state
            .join("disk/snapshots")
            .join(&snap)
            .join("scratch.ext4"),
    );
    let work = state.join("disk/bench-alone");
    let before_forks = phase_totals(daemon, "vm").await;
    for _ in 0..runs {
        let begun = Instant::now();
        let fork = daemon.create(json!({"from_snapshot": snap})).await;
        s.fork_ready.push(ms(begun));
        assert_eq!(daemon.exec(&fork, &["count"]).await.out(), "count=4\n");
        daemon.delete(&fork).await;

        s.alone_restore.push(tokio::task::block_in_place(|| {
            alone.restore(&images, &disks, &scratch, &work)
        }));
    }
    s.fork_phases = peers::phase_means(&before_forks, &phase_totals(daemon, "vm").await);
    let _ = std::fs::remove_dir_all(&work);
    // Claims from the warm microVM pool (one VM of the default size, which
    // the 64 MiB creates above do not fit), each once the pool refilled:
    // as it is, and with the claim's own policy, env, labels, TTL and a
    // lower CPU quota put in force.
    let custom = json!({"runtime": "vm", "image": "busybox", "cpu": 0.5,
        "block_network": false, "env": {"A": "1"}, "labels": {"l": "1"}, "ttl_seconds": 600});
    for _ in 0..runs {
        for (body, samples) in [
            (
                json!({"runtime": "vm", "image": "busybox"}),
                &mut s.pool_claim,
            ),
            (custom.clone(), &mut s.pool_claim_custom),
        ] {
            daemon.pool_reaches(1).await;
            let begun = Instant::now();
            let id = daemon.create(body).await;
            samples.push(ms(begun));
            daemon.delete(&id).await;
        }
    }
    let hits = "sandboxd_pool_claims_total{runtime=\"vm\",image=\"busybox\",result=\"hit\"} ";
    assert_eq!(
        daemon.metric(hits).await,
        (2 * runs) as f64,
        "every claim a hit"
    );
    daemon.delete(&source).await;
    for snap in snapshots {
        let _ = daemon
            .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
            .await;
    }
    s
}

/// Creates forked from the image's boot template (made before the runs),
/// each beside the VMM alone booting the guest.
struct TemplateSamples {
    ready: Vec<f64>,
    output: Vec<f64>,
    alone_first_line: Vec<f64>,
}

async fn measure_templates(daemon: &Daemon, alone: &Alone, runs: usize) -> TemplateSamples {
    let vm = json!({"runtime": "vm", "image": "busybox", "memory_mib": 64});
    // The first create of the image and size boots and asks for the
    // template, which the daemon makes once it is idle.
    let first = daemon.create(vm.clone()).await;
    daemon.delete(&first).await;
    daemon.await_metric("sandboxd_vm_boot_templates ").await;
    let mut t = TemplateSamples {
        ready: Vec::new(),
        output: Vec::new(),
        alone_first_line: Vec::new(),
    };
    for _ in 0..runs {
        let begun = Instant::now();
        let id = daemon.create(vm.clone()).await;
        t.ready.push(ms(begun));
        let run = daemon.exec(&id, &["echo", "hi"]).await;
        t.output.push(ms(begun));
        assert_eq!(run.out(), "hi\n");
        daemon.delete(&id).await;
        let (first_line, _) = tokio::task::block_in_place(|| alone.boot());
        t.alone_first_line.push(first_line);
    }
    let hits = "sandboxd_vm_boot_template_creates_total{result=\"hit\"} ";
    assert_eq!(
        daemon.metric(hits).await,
        runs as f64,
        "every create a fork"
    );
    t
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("microvm benchmark skipped: {why}");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // The vmm is another package's binary: cargo bench does not build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "-p", "vmm", "--bin", "vmm"])
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("microvm benchmark skipped: cargo build --release -p vmm failed");
        return;
    }
    let vmm = Path::new(common::DAEMON)
        .parent()
        .map(|d| d.join("vmm"))
        .unwrap_or_default();
    let guest_dir = tempfile::tempdir().expect("tempdir");
    let Some(guest) = test_guest(guest_dir.path()).filter(|_| vmm.is_file()) else {
        println!("microvm benchmark skipped: no vmm binary or test guest (gcc) here");
        return;
    };
    let runs = peers::bench_runs(30);
    let (guest, vmm) = (guest.display().to_string(), vmm.display().to_string());
    let start = |templates: &str, pool: &str| {
        Daemon::start_with(&[
            "--vm-kernel",
            &guest,
            "--vmm-path",
            &vmm,
            "--default-image",
            "busybox",
            "--default-memory-mib",
            "96",
            "--vm-pool-size",
            pool,
            "--vm-boot-templates",
            templates,
        ])
    };
    // Its creates are cold boots; forks are measured as forks.
    let daemon = start("false", "1");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let alone = Alone::new(Path::new(&vmm), Path::new(&guest));
    let s = runtime.block_on(measure(&daemon, &alone, runs));
    // Then, alone on the host, a daemon whose creates fork from a template.
    drop(daemon);
    let templated = start("true", "0");
    let t = runtime.block_on(measure_templates(&templated, &alone, runs));
    let ratio = |ours: &[f64], peer: &[f64]| median(ours) / median(peer);

    let medians = json!({
        "vmm_alone_to_first_line_ms": median(&s.alone_first_line),
        "vmm_alone_to_agent_ms": median(&s.alone_agent),
        "vm_create_to_ready_ms": median(&s.create_ready),
        "vm_create_to_output_ms": median(&s.create_output),
        "container_create_to_ready_ms": median(&s.container_ready),
        "vm_snapshot_ms": median(&s.snapshot),
        "vm_fork_to_ready_ms": median(&s.fork_ready),
        "vmm_alone_restore_to_agent_ms": median(&s.alone_restore),
        "vm_pool_claim_ms": median(&s.pool_claim),
        "vm_pool_claim_custom_ms": median(&s.pool_claim_custom),
        "vm_template_create_to_ready_ms": median(&t.ready),
        "vm_template_create_to_output_ms": median(&t.output),
        "vmm_alone_to_first_line_beside_templates_ms": median(&t.alone_first_line),
    });
    println!("microVM sandboxes, test guest, 64 MiB ({runs} runs, medians in ms)");
    println!(
        "  VM create -> ready            {:8.1}",
        median(&s.create_ready)
    );
    println!(
        "  vmm alone -> first line       {:8.1}",
        median(&s.alone_first_line)
    );
    println!(
        "  vmm alone -> agent connected  {:8.1}",
        median(&s.alone_agent)
    );
    println!(
        "  ratio create -> ready / vmm -> first line  {:6.2}",
        ratio(&s.create_ready, &s.alone_first_line)
    );
    println!(
        "  ratio create -> ready / vmm -> agent       {:6.2}",
        ratio(&s.create_ready, &s.alone_agent)
    );
    println!(
        "  VM create -> echo output      {:8.1}",
        median(&s.create_output)
    );
    println!(
        "  container create -> ready     {:8.1}",
        median(&s.container_ready)
    );
    println!(
        "  VM memory snapshot            {:8.1}",
        median(&s.snapshot)
    );
    println!(
        "  VM fork -> ready              {:8.1}",
        median(&s.fork_ready)
    );
    println!(
        "  vmm alone restore -> agent    {:8.1}",
        median(&s.alone_restore)
    );
    println!(
        "  ratio fork -> ready / vmm restore -> agent  {:5.2}",
        ratio(&s.fork_ready, &s.alone_restore)
    );
    println!(
        "  VM pool claim -> ready        {:8.2}  ratio to VM create {:6.3}",
        median(&s.pool_claim),
        ratio(&s.pool_claim, &s.create_ready)
    );
    println!(
        "  + policy, env, labels, TTL, CPU {:6.2}  ratio to VM create {:6.3}",
        median(&s.pool_claim_custom),
        ratio(&s.pool_claim_custom, &s.create_ready)
    );
    println!(
        "  VM create from a boot template -> ready  {:8.1}  vmm alone -> first line (beside it) {:6.1}  ratio {:5.2}",
        median(&t.ready),
        median(&t.alone_first_line),
        ratio(&t.ready, &t.alone_first_line)
    );
    println!(
        "  VM create from a boot template -> echo output {:8.1}",
        median(&t.output)
    );
    println!("  create phases, means in ms (microVM cold / container cold / microVM fork):");
    let of = |phases: &[(String, f64)], phase: &str| {
        phases
            .iter()
            .find(|(p, _)| p == phase)
            .map_or("-".to_string(), |(_, ms)| format!("{ms:.2}"))
    };
    let mut names: Vec<&String> = s
        .vm_phases
        .iter()
        .chain(&s.fork_phases)
        .map(|(p, _)| p)
        .collect();
    names.sort();
    names.dedup();
    for phase in names {
        println!(
            "    {phase:12} {:>8} / {:>8} / {:>8}",
            of(&s.vm_phases, phase),
            of(&s.container_phases, phase),
            of(&s.fork_phases, phase)
        );
    }
    let raw = json!({
        "runs": runs,
        "unit": "ms",
        "vmm_alone_to_first_line": s.alone_first_line,
        "vmm_alone_to_agent": s.alone_agent,
        "vm_create_to_ready": s.create_ready,
        "vm_create_to_output": s.create_output,
        "container_create_to_ready": s.container_ready,
        "vm_snapshot": s.snapshot,
        "vm_fork_to_ready": s.fork_ready,
        "vmm_alone_restore_to_agent": s.alone_restore,
        "vm_pool_claim": s.pool_claim,
        "vm_pool_claim_custom": s.pool_claim_custom,
        "vm_template_create_to_ready": t.ready,
        "vm_template_create_to_output": t.output,
        "vmm_alone_to_first_line_beside_templates": t.alone_first_line,
        "vm_create_phase_means_ms": s.vm_phases,
        "container_create_phase_means_ms": s.container_phases,
        "vm_fork_phase_means_ms": s.fork_phases,
        "medians": medians,
    });
    peers::write_results("microvm", &raw);
}
