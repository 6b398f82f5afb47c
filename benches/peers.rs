//! What the benchmarks share to run the same work under runc/crun: a mount
//! namespace where those runtimes accept this hybrid cgroup host, an OCI
//! bundle over the cached python image, run counts and medians. Each benchmark uses
//! part of it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

/// Whether this run measures: as root, and not `cargo bench -- --list`
/// (which only lists the benchmark). Says why when not.
pub fn should_run() -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: the benchmark needs root");
        return false;
    }
    !std::env::args().any(|a| a == "--list")
}

/// The image cache every benchmark uses.
pub const IMAGES: &str = "/var/lib/sandboxd/images";

/// crun 1.8 refuses a hybrid cgroup host while a cgroup2 mount is visible,
/// so a benchmark runs wholly (daemon and peers) in a private mount
/// namespace without `/sys/fs/cgroup/unified`: same conditions for all.
pub fn private_mount_namespace() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare mount ns");
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("make / private");
    let _ = nix::mount::umount2("/sys/fs/cgroup/unified", nix::mount::MntFlags::MNT_DETACH);
}

/// Gives this (private) mount namespace an empty tmpfs at `/run`, as on a
/// systemd host, unless `BENCH_HOST_RUN` asks for this host's own `/run`
/// (on its ext4 root here); says which. CRIU keeps its kernel-feature
/// cache (`/run/criu.kdat`) only on tmpfs, and without it every `criu` run
/// probes the kernel again (30-40 ms on the 2-core dev host); runc and crun
/// keep their state under `/run`, and the daemon's run directory goes
/// there too ([`daemon_run_dir`]): every create makes a dozen files and
/// directories in it, which on this host's journal-less ext4 cost more
/// than on a production host's tmpfs `/run/sandboxd` (a few tenths of a
/// millisecond per cold create here, more while ext4 still holds many
/// recently deleted inodes).
/// True where `/run` is the tmpfs.
pub fn run_like_systemd() -> bool {
    if std::env::var_os("BENCH_HOST_RUN").is_some() {
        eprintln!("BENCH_HOST_RUN: /run is this host's own");
        return false;
    }
    nix::mount::mount(
        Some("tmpfs"),
        "/run",
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some("mode=755"),
    )
    .expect("mount a tmpfs on /run");
    RUN_IS_TMPFS.store(true, std::sync::atomic::Ordering::Relaxed);
    true
}

static RUN_IS_TMPFS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A fresh run directory for one of the benchmark's daemons: under the
/// tmpfs `/run` of [`run_like_systemd`] (as a systemd host's
/// `/run/sandboxd`), else `scratch/run`.
pub fn daemon_run_dir(scratch: &Path) -> PathBuf {
    tmpfs_run_dir().unwrap_or_else(|| scratch.join("run"))
}

/// The same for a daemon of the test harness (`common::Daemon`): its
/// `--run-dir` flag, or none (the harness's own) where `/run` is the host's.
pub fn run_dir_flags() -> Vec<String> {
    tmpfs_run_dir()
        .map(|dir| vec!["--run-dir".into(), dir.display().to_string()])
        .unwrap_or_default()
}

fn tmpfs_run_dir() -> Option<PathBuf> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if !RUN_IS_TMPFS.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Some(PathBuf::from(format!(
        "/run/sandboxd-bench-{}-{n}",
        std::process::id()
    )))
}

/// Builds (once) the python image with `daemon`; returns its rootfs.
pub fn python_rootfs(daemon: &str) -> PathBuf {
    let built = Command::new(daemon)
        .args(["--images-dir", IMAGES, "image", "build", "python"])
        .output()
        .expect("image build");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    PathBuf::from(
        String::from_utf8_lossy(&built.stdout)
            .split_whitespace()
            .nth(2)
            .expect("rootfs path"),
    )
}

/// An OCI bundle in `dir` running `args` over `rootfs` (read-only).
pub fn oci_bundle(dir: &Path, rootfs: &Path, args: &[&str]) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).expect("bundle");
    let status = Command::new("runc")
        .args(["spec", "-b"])
        .arg(&bundle)
        .status()
        .expect("runc spec");
    assert!(status.success());
    let path = bundle.join("config.json");
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("spec")).expect("json");
    spec["root"] = json!({"path": rootfs, "readonly": true});
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(args);
    std::fs::write(&path, spec.to_string()).expect("write spec");
    bundle
}

/// What an HTTP client script prints as JSON: per-request times on one
/// kept-alive connection and on new connections, and transfer rates.
pub struct HttpSamples {
    pub kept_ms: Vec<f64>,
    pub new_ms: Vec<f64>,
    pub mb_per_s: Vec<f64>,
}

impl HttpSamples {
    pub fn parse(out: &str) -> HttpSamples {
        let v: Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("client output {out:?}: {e}"));
        let list = |key: &str| -> Vec<f64> {
            v[key]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        HttpSamples {
            kept_ms: list("kept_ms"),
            new_ms: list("new_ms"),
            mb_per_s: list("mb_per_s"),
        }
    }

    /// The raw samples, for `write_results`.
    pub fn to_json(&self) -> Value {
        json!({"kept_ms": self.kept_ms, "new_ms": self.new_ms, "mb_per_s": self.mb_per_s})
    }
}

/// How many runs a benchmark makes: `BENCH_RUNS`, else its `default`.
pub fn bench_runs(default: usize) -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Writes a benchmark's raw samples to `benches/results/<name>.json`;
/// returns the path.
pub fn write_results(name: &str, raw: &Value) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    let _ = std::fs::create_dir_all(&dir);
    // benches/nested.sh tags a run on another kind of host (the nested
    // one's cgroup v2), so it does not replace this host's samples.
    let file = match std::env::var("BENCH_RESULTS_TAG") {
        Ok(tag) if !tag.is_empty() => dir.join(format!("{name}-{tag}.json")),
        _ => dir.join(format!("{name}.json")),
    };
    std::fs::write(&file, serde_json::to_string_pretty(raw).unwrap_or_default())
        .expect("write results");
    file
}

/// Removes cgroup `parent` (e.g. `/sandboxd-bench-123`) and the groups left
/// in it (its daemon's `supervisors`) from every hierarchy: v1 controllers
/// and v2's unified tree alike. A stopped daemon leaves them empty.
pub fn remove_cgroup_parent(parent: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut roots: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
    roots.push(PathBuf::from("/sys/fs/cgroup"));
    for root in roots {
        let group = root.join(parent.trim_start_matches('/'));
        if let Ok(children) = std::fs::read_dir(&group) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
            let _ = std::fs::remove_dir(&group);
        }
    }
}

/// Milliseconds of one `RUNTIME run -b BUNDLE NAME` (runc or crun), which
/// must succeed and print exactly `expect`.
pub fn time_runtime_run(runtime: &str, bundle: &Path, name: &str, expect: &[u8]) -> f64 {
    let start = Instant::now();
    let out = Command::new(runtime)
        .args(["run", "-b"])
        .arg(bundle)
        .arg(name)
        .stdin(Stdio::null())
        .output()
        .expect("run runtime");
    let elapsed = start.elapsed().as_secs_f64() * 1000.0;
    assert!(
        out.status.success() && out.stdout == expect,
        "{runtime}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}

/// The sum (s) and count of each `sandboxd_create_phase_seconds` phase of
/// `runtime`'s creates so far, from the text of the daemon's `/metrics`.
pub fn phase_totals(metrics: &str, runtime: &str) -> Vec<(String, f64, f64)> {
    let sample = |kind: &str, phase: &str| {
        let start = format!(
            "sandboxd_create_phase_seconds_{kind}{{phase=\"{phase}\",runtime=\"{runtime}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&start))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let mut phases: Vec<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("sandboxd_create_phase_seconds_sum{phase=\""))
        .filter(|rest| rest.contains(&format!("runtime=\"{runtime}\"")))
        .filter_map(|rest| rest.split('"').next().map(String::from))
        .collect();
    phases.sort();
    phases
        .into_iter()
        .filter_map(|phase| {
            let (sum, count) = (sample("sum", &phase)?, sample("count", &phase)?);
            Some((phase, sum, count))
        })
        .collect()
}

/// The mean of each phase (ms) over the creates between totals `before`
/// and `after` (see [`phase_totals`]).
pub fn phase_means(
    before: &[(String, f64, f64)],
    after: &[(String, f64, f64)],
) -> Vec<(String, f64)> {
    after
        .iter()
        .filter_map(|(phase, sum, count)| {
            let (sum0, count0) = before
                .iter()
                .find(|(p, _, _)| p == phase)
                .map_or((0.0, 0.0), |(_, s, c)| (*s, *c));
            let n = count - count0;
            (n > 0.0).then(|| (phase.clone(), (sum - sum0) / n * 1000.0))
        })
        .collect()
}
