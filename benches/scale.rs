//! Many sandboxes at once: N concurrent creates through the API (N=100 by
//! default), each followed by one `python3 -c 'print(1)'`, from a warm pool
//! sized for them and all cold, beside N concurrent `crun run` of the same
//! command in the same image; and from the pool with run-code `print(1)`
//! instead, which forks each pooled sandbox's warm interpreter. Per sandbox: create -> output latency (p50,
//! p99); per burst: the time until the last output. Then the memory an idle
//! sandbox costs beyond its workload: the PSS of its supervisor (which holds
//! the egress proxy) and of everything in its cgroups (the agent, its init),
//! over 50 idle sandboxes, beside containerd's: the PSS of the
//! `containerd-shim-runc-v2` holding each of 50 idle containers of the same
//! rootfs (containerd on its own root, state and socket). Raw samples go to
//! `benches/results/scale.json`.
//!
//!     sudo cargo bench --bench scale     # BENCH_RUNS=3 bursts, BENCH_SANDBOXES=100

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::Daemon;
use peers::{median, oci_bundle, private_mount_namespace, python_rootfs};
use serde_json::{json, Value};

/// Room for every sandbox of a burst whatever the host: the benchmark
/// measures the daemon, not its admission.
const ROOMY: [&str; 10] = [
    "--max-sandboxes",
    "512",
    "--capacity-cpu",
    "10000",
    "--capacity-memory-mib",
    "10000000",
    "--capacity-disk-mib",
    "100000000",
    "--disk-pool-gib",
    "64",
];

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// One burst's per-sandbox latencies and its total, in ms.
struct Burst {
    each: Vec<f64>,
    total: f64,
}

/// How each sandbox of a burst prints.
#[derive(Clone, Copy)]
enum Print {
    /// `python3 -c 'print(1)'`, a fresh exec.
    Exec,
    /// Run-code `print(1)` in Python.
    RunCode,
}

/// N creates at once, each running `print(1)` once ready; all deleted after.
async fn burst(daemon: &Daemon, n: usize, print: Print) -> Burst {
    let begun = Instant::now();
    let runs = (0..n).map(|_| async {
        let start = Instant::now();
        let id = daemon.create(json!({"image": "python"})).await;
        let out = match print {
            Print::Exec => daemon.exec(&id, &["python3", "-c", "print(1)"]).await,
            Print::RunCode => {
                let code = json!({"code": "print(1)", "language": "python"});
                let proc = daemon.start_process(&id, code).await;
                daemon.output(&id, proc).await
            }
        };
        assert_eq!(out.out(), "1\n", "{}", out.err());
        (id, ms(start))
    });
    let done = futures::future::join_all(runs).await;
    let total = ms(begun);
    futures::future::join_all(done.iter().map(|(id, _)| daemon.delete(id))).await;
    Burst {
        each: done.into_iter().map(|(_, t)| t).collect(),
        total,
    }
}

/// N `crun run` of the same command at once.
fn crun_burst(bundle: &Path, n: usize, round: usize) -> Burst {
    let begun = Instant::now();
    let each: Vec<f64> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..n)
            .map(|i| {
                scope.spawn(move || {
                    let name = format!("scale-{}-{round}-{i}", std::process::id());
                    peers::time_runtime_run("crun", bundle, &name, b"1\n")
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("crun thread"))
            .collect()
    });
    Burst {
        each,
        total: ms(begun),
    }
}

/// Proportional set size of `pid` in KiB (0 once it is gone).
fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Every pid in the cgroup tree at `dir`.
fn pids_under(dir: &Path, out: &mut Vec<i32>) {
    out.extend(common::cgroup::procs_in(dir));
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            pids_under(&entry.path(), out);
        }
    }
}

/// What `n` idle sandboxes cost in PSS (KiB), per sandbox: (supervisors,
/// which hold the egress proxies; the sandboxes' cgroup trees: the
/// agent, which is the container's init, as no workload runs).
async fn idle_pss(daemon: &Daemon, n: usize) -> (f64, f64) {
    let ids: Vec<String> =
        futures::future::join_all((0..n).map(|_| daemon.create(json!({"image": "python"})))).await;
    let group =
        common::cgroup::daemon_group(&common::cgroup::hierarchy("pids"), &daemon.cgroup_parent());
    let pss = |dir: &Path| {
        let mut pids = Vec::new();
        pids_under(dir, &mut pids);
        // Standby supervisors wait there for future creates: not the idle
        // sandboxes' cost. Listed after the group: one that joined it
        // meanwhile is a standby too.
        let standbys = daemon.standby_pids();
        pids.retain(|p| !standbys.contains(p));
        (pids.len(), pids.iter().map(|&p| pss_kib(p)).sum::<u64>())
    };
    let (supervisors, supervisors_kib) = pss(&group.join("supervisors"));
    assert_eq!(supervisors, n, "one supervisor per sandbox");
    let mut sandboxes_kib = 0;
    for id in &ids {
        let (pids, kib) = pss(&group.join(id));
        assert!(pids >= 1, "{id}: no agent in its cgroups");
        sandboxes_kib += kib;
    }
    futures::future::join_all(ids.iter().map(|id| daemon.delete(id))).await;
    (
        supervisors_kib as f64 / n as f64,
        sandboxes_kib as f64 / n as f64,
    )
}

/// containerd on its own root, state and socket, for the idle-shim peer.
struct Containerd {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let config = dir.path().join("config.toml");
        // Only what `ctr run` needs: no CRI, no image service plugins.
        std::fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .expect("containerd config");
        let d = dir.path();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(d.join("root"))
            .arg("--state")
            .arg(d.join("state"))
            .arg("--address")
            .arg(d.join("containerd.sock"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("containerd.log")).expect("log"))
            .spawn()
            .expect("containerd (scripts/install-deps.sh installs it)");
        let containerd = Containerd { dir, child };
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while !containerd.ctr(&["version"]).status.success() {
            assert!(Instant::now() < deadline, "containerd did not answer");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        containerd
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("ctr")
    }

    /// The PSS (KiB) of the shim of each of `n` idle containers (`sleep`)
    /// over `rootfs`, per container.
    fn idle_shims(&self, rootfs: &Path, n: usize) -> f64 {
        let rootfs = rootfs.display().to_string();
        let ids: Vec<String> = (0..n).map(|i| format!("scale-idle-{i}")).collect();
        for id in &ids {
            let run = self.ctr(&[
                "run",
                "-d",
                "--runtime",
                "io.containerd.runc.v2",
                "--rootfs",
                &rootfs,
                id,
                // No image config, so no PATH: the binary by its path.
                "/bin/sleep",
                "3600",
            ]);
            assert!(
                run.status.success(),
                "ctr run: {}",
                String::from_utf8_lossy(&run.stderr)
            );
        }
        let address = self
            .dir
            .path()
            .join("containerd.sock")
            .display()
            .to_string();
        let shims = common::processes_where(|_, args| {
            args.iter().any(|a| a.contains("containerd-shim-runc-v2"))
                && args.iter().any(|a| a.contains(&address))
        });
        assert_eq!(shims.len(), n, "one shim per container: {shims:?}");
        let kib: u64 = shims.iter().map(|&p| pss_kib(p)).sum();
        for id in &ids {
            self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
            // The task is gone once `delete` succeeds.
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while !self.ctr(&["task", "delete", id]).status.success() {
                assert!(Instant::now() < deadline, "{id} did not stop");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            self.ctr(&["container", "delete", id]);
        }
        kib as f64 / n as f64
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn summary(name: &str, bursts: &[Burst]) -> Value {
    let p50: Vec<f64> = bursts.iter().map(|b| percentile(&b.each, 50.0)).collect();
    let p99: Vec<f64> = bursts.iter().map(|b| percentile(&b.each, 99.0)).collect();
    let total: Vec<f64> = bursts.iter().map(|b| b.total).collect();
    println!(
        "  {name:<28} p50 {:8.1}  p99 {:8.1}  all done {:8.1}",
        median(&p50),
        median(&p99),
        median(&total)
    );
    json!({
        "p50": p50, "p99": p99, "total": total,
        "each": bursts.iter().map(|b| b.each.clone()).collect::<Vec<_>>(),
    })
}

fn main() {
    if !peers::should_run() {
        return;
    }
    let rounds = peers::bench_runs(3);
    let n: usize = std::env::var("BENCH_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    private_mount_namespace();
    // Built (where it is not) before `/run` is replaced: a host's
    // resolv.conf may point into it.
    let rootfs = python_rootfs(common::DAEMON);
    let run_tmpfs = peers::run_like_systemd();
    let scratch = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let bundle = oci_bundle(scratch.path(), &rootfs, &["python3", "-c", "print(1)"]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let (cold, pooled, idle) = runtime.block_on(async {
        let run_dir = peers::run_dir_flags();
        let mut flags: Vec<&str> = ROOMY.to_vec();
        flags.extend(run_dir.iter().map(String::as_str));
        let daemon = Daemon::start_with(&flags);
        // Warm-up: page cache, image lookup.
        burst(&daemon, 2, Print::Exec).await;
        let mut cold = Vec::new();
        for _ in 0..rounds {
            cold.push(burst(&daemon, n, Print::Exec).await);
        }
        let idle = idle_pss(&daemon, 50).await;
        drop(daemon);
        let (size, run_dir) = (n.to_string(), peers::run_dir_flags());
        let mut flags = ROOMY.to_vec();
        flags.extend(run_dir.iter().map(String::as_str));
        flags.extend(["--pool-size", size.as_str()]);
        let daemon = Daemon::start_with(&flags);
        let (mut pooled, mut pooled_code) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            daemon.pool_reaches(n as u64).await;
            pooled.push(burst(&daemon, n, Print::Exec).await);
            daemon.pool_reaches(n as u64).await;
            pooled_code.push(burst(&daemon, n, Print::RunCode).await);
        }
        (cold, (pooled, pooled_code), idle)
    });
    let (pooled, pooled_code) = pooled;
    let crun: Vec<Burst> = (0..rounds).map(|r| crun_burst(&bundle, n, r)).collect();
    let shim_kib = Containerd::start().idle_shims(&rootfs, 50);

    println!("scale: {n} at once, {rounds} bursts, medians over bursts in ms");
    let run = if run_tmpfs { "a tmpfs" } else { "the host's" };
    println!("  (/run, the daemon's run directory and crun's state: {run}; BENCH_HOST_RUN=1 keeps the host's)");
    let raw = json!({
        "sandboxes": n,
        "bursts": rounds,
        "unit": "ms",
        "run_dir_tmpfs": run_tmpfs,
        "sandboxd_cold": summary("sandboxd cold", &cold),
        "sandboxd_pooled": summary("sandboxd pooled", &pooled),
        "sandboxd_pooled_run_code": summary("sandboxd pooled, run-code", &pooled_code),
        "crun_run": summary("crun run", &crun),
        "idle_sandbox_pss_kib": {"supervisor": idle.0, "sandbox_cgroup": idle.1},
        "idle_containerd_shim_pss_kib": shim_kib,
    });
    let totals = |b: &[Burst]| median(&b.iter().map(|b| b.total).collect::<Vec<_>>());
    println!(
        "  ratio all done, cold / crun      {:8.2}",
        totals(&cold) / totals(&crun)
    );
    println!(
        "  ratio all done, pooled / crun    {:8.2}",
        totals(&pooled) / totals(&crun)
    );
    println!(
        "  ratio all done, pooled run-code / crun {:8.2}",
        totals(&pooled_code) / totals(&crun)
    );
    println!(
        "  idle sandbox PSS, mean of 50: supervisor {:.0} KiB + agent {:.0} KiB = {:.0} KiB",
        idle.0,
        idle.1,
        idle.0 + idle.1
    );
    println!("  idle containerd-shim-runc-v2 PSS, mean of 50: {shim_kib:.0} KiB");
    println!(
        "  ratio idle memory, sandboxd / containerd shim  {:8.2}",
        (idle.0 + idle.1) / shim_kib
    );
    let file = peers::write_results("scale", &raw);
    println!("  raw samples: {}", file.display());
}
