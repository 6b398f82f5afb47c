//! `ctr run --rm` of `/bin/true` (busybox's) through containerd with the
//! sandboxd shim, beside the same run with containerd's default runtime
//! (`io.containerd.runc.v2` driving runc) and with that shim driving crun,
//! in one run on one containerd of the benchmark's own. Everything outside
//! the runtime (ctr, snapshot, containerd) is the same for all three.
//! Prints medians and ratios; raw samples go to
//! `benches/results/containerd.json`.
//!
//!     sudo cargo bench --bench containerd     # BENCH_RUNS=20 runs each

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/containerd.rs"]
mod containerd;
#[path = "../tests/common/oci.rs"]
mod oci;
mod peers;

use std::time::Instant;

use common::Daemon;
use containerd::{Containerd, IMAGE, RUNTIME};
use peers::{bench_runs, median, write_results};
use serde_json::json;

/// Milliseconds of one `ctr run --rm` of `/bin/true` with `runtime_args`.
fn time_run(containerd: &Containerd, runtime_args: &[&str], name: &str) -> f64 {
    let mut args = vec!["run", "--rm"];
    args.extend_from_slice(runtime_args);
    args.extend_from_slice(&[IMAGE, name, "/bin/true"]);
    let begun = Instant::now();
    containerd.ctr_ok(&args);
    begun.elapsed().as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    if !peers::should_run() {
        return;
    }
    // crun refuses this hybrid cgroup host while cgroup2 is visible; the
    // daemon, containerd and every shim share the namespace.
    peers::private_mount_namespace();
    let runs = bench_runs(20);
    let daemon = Daemon::start();
    let containerd = Containerd::start(&daemon);
    containerd.import_busybox();
    let runtimes: [(&str, Vec<&str>); 3] = [
        ("sandboxd", vec!["--runtime", RUNTIME]),
        ("runc", vec!["--runtime", "io.containerd.runc.v2"]),
        (
            "crun",
            vec![
                "--runtime",
                "io.containerd.runc.v2",
                "--runc-binary",
                "crun",
            ],
        ),
    ];
    // One unmeasured run each warms the page cache and the shims' binaries.
    for (name, args) in &runtimes {
        time_run(&containerd, args, &format!("warm-{name}"));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); runtimes.len()];
    for round in 0..runs {
        // Interleaved, so drift on the host hits all three alike.
        for (i, (name, args)) in runtimes.iter().enumerate() {
            samples[i].push(time_run(&containerd, args, &format!("{name}-{round}")));
        }
    }
    let medians: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    println!("ctr run --rm /bin/true, {runs} runs each, medians:");
    for ((name, _), m) in runtimes.iter().zip(&medians) {
        println!("  {name:<9} {m:8.2} ms");
    }
    println!(
        "  sandboxd / runc {:.2}x, sandboxd / crun {:.2}x (target: <= 1.0x runc)",
        medians[0] / medians[1],
        medians[0] / medians[2]
    );
    let file = write_results(
        "containerd",
        &json!({
            "runs": runs,
            "sandboxd_ms": samples[0],
            "runc_ms": samples[1],
            "crun_ms": samples[2],
        }),
    );
    println!("raw samples: {}", file.display());
}
