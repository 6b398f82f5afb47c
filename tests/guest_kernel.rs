//! The guest side of a microVM sandbox, under QEMU TCG: runs
//! scripts/check-guest-kernel.sh (kernel boots, the agent is PID 1, builds its
//! overlay root, reaches the vsock connect) when its inputs exist, and says
//! why it skipped otherwise. It uses no KVM, so it runs on kvm_pvm hosts too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sandboxd_test_support::{skip, Reason};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

#[test]
fn guest_kernel_boots_to_the_agent_under_tcg() {
    let cache = std::env::var_os("SANDBOXD_BUILD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/sandboxd-build"));
    let kernel = std::env::var_os("KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("kernel/current/vmlinux"));
    // The static agent is built by scripts/build-agent.sh into this build's
    // target folder (CI keeps it outside the clone); building it from here
    // would take the cargo lock this test may already run under.
    let agent = Path::new(env!("CARGO_BIN_EXE_sandboxd"))
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("x86_64-unknown-linux-gnu/release/sandbox-agent"))
        .unwrap_or_else(|| repo().join("target/x86_64-unknown-linux-gnu/release/sandbox-agent"));
    let missing: Vec<(Reason, String)> = [
        (
            kernel.as_path(),
            Reason::MissingBuild,
            "run scripts/build-guest-kernel.sh",
        ),
        (
            agent.as_path(),
            Reason::NoAgent,
            "run scripts/build-agent.sh",
        ),
    ]
    .iter()
    .filter(|(path, _, _)| !Path::new(path).is_file())
    .map(|(path, reason, fix)| (*reason, format!("{} is missing ({fix})", path.display())))
    .chain(
        ["qemu-system-x86_64", "mkfs.ext4", "busybox"]
            .iter()
            .filter(|tool| !on_path(tool))
            .map(|tool| {
                (
                    Reason::MissingTool,
                    format!("{tool} is not on PATH (scripts/install-deps.sh, qemu-system-x86)"),
                )
            }),
    )
    .collect();
    if let Some((reason, _)) = missing.first() {
        let all: Vec<&str> = missing.iter().map(|(_, why)| why.as_str()).collect();
        skip!(*reason, "{}", all.join("; "));
    }
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(repo().join("scripts/check-guest-kernel.sh"))
        .env("KERNEL", &kernel)
        .env("AGENT", &agent)
        .output()
        .expect("run scripts/check-guest-kernel.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}check took {:?}", started.elapsed());
    assert!(out.status.success(), "the guest kernel check failed");
    assert!(stdout.contains("check-guest-kernel: PASS"));
}
