//! The daemon under a real systemd. PID 1 on these hosts is not systemd, so
//! this boots a Debian rootfs (built once by scripts/test.sh) with
//! `systemd-nspawn --boot` and installs the repo's units in it: the socket
//! unit activates the daemon on the first request, `Type=notify` makes it
//! active only after READY=1, it sits in its own service cgroup, and a stop
//! ends it. The rootfs is mounted volatile, so each run starts clean.
//!
//! Creating sandboxes inside nspawn is not part of this test: nspawn mounts
//! the host's v1 cgroup controllers read-only and drops CAP_NET_ADMIN, so
//! the runtime itself is covered by the other integration tests instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOTFS: &str = "/var/cache/sandboxd-nspawn/root";

const SELFTEST: &str = r#"#!/bin/sh
# Runs at boot inside the container; results go to /out.
exec >/out/selftest.log 2>&1
set -x
systemctl start sandboxd.socket
systemctl show sandboxd -p ActiveState --value >/out/before-request
sandboxctl --socket /run/sandboxd/sandboxd.sock health >/out/health
systemctl show sandboxd -p Type -p ActiveState -p SubState -p NRestarts >/out/show
cat /proc/"$(systemctl show -p MainPID --value sandboxd)"/cgroup >/out/cgroup
systemctl stop sandboxd
systemctl show sandboxd -p ActiveState --value >/out/after-stop
echo done >/out/finished
systemctl poweroff
"#;

/// Booted as the default unit (`systemd.unit=`): a wants symlink cannot be
/// added to the read-only rootfs, and systemd ignores a bind-mounted file there.
const SELFTEST_UNIT: &str = "[Unit]\nRequires=basic.target\nAfter=basic.target\n\
     [Service]\nType=oneshot\nExecStart=/usr/local/bin/selftest\n";

fn which(name: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

#[test]
fn runs_under_systemd_with_socket_activation_and_notify() {
    require_host!();
    let Some(nspawn) = which("systemd-nspawn") else {
        common::skip!(
            common::Reason::MissingTool,
            "systemd-nspawn is not installed (package systemd-container)"
        );
    };
    if !Path::new(ROOTFS).join("lib/systemd/systemd").exists() {
        common::skip!(
            common::Reason::MissingBuild,
            "no systemd rootfs at {ROOTFS}; scripts/test.sh builds it"
        );
    }
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    let pool_dir = dir.path().join("pool");
    let pool = sandboxd::disk::DiskPool::open(&pool_dir, &dir.path().join("pool.btrfs"), 2 << 30)
        .expect("disk pool");

    let parent = format!("/sandboxd-nspawn-{}", std::process::id());
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let service = std::fs::read_to_string(units.join("sandboxd.service"))
        .expect("service unit")
        .replace(
            "ExecStart=/usr/local/bin/sandboxd --config /etc/sandboxd/config.toml",
            &format!(
                "ExecStart=/usr/local/bin/sandboxd --disk-pool-dir /var/lib/sandboxd/disk \
                 --images-dir /images --agent-path /agent --cgroup-parent {parent}"
            ),
        );
    assert!(
        service.contains("--cgroup-parent"),
        "ExecStart line changed; update this test"
    );
    std::fs::write(dir.path().join("sandboxd.service"), service).expect("write");
    std::fs::write(dir.path().join("selftest"), SELFTEST).expect("write");
    std::fs::write(dir.path().join("selftest.service"), SELFTEST_UNIT).expect("write");
    Command::new("chmod")
        .arg("755")
        .arg(dir.path().join("selftest"))
        .status()
        .expect("chmod");

    let bind_ro = |from: &Path, to: &str| format!("--bind-ro={}:{to}", from.display());
    // coreutils timeout bounds a boot that goes wrong.
    let status = Command::new("timeout")
        .arg("180")
        .arg(nspawn)
        .args([
            "-q",
            "--keep-unit",
            "--register=no",
            "--boot",
            "--volatile=overlay",
        ])
        .arg(format!("--directory={ROOTFS}"))
        .arg(bind_ro(
            Path::new(common::DAEMON),
            "/usr/local/bin/sandboxd",
        ))
        .arg(bind_ro(Path::new(common::CTL), "/usr/local/bin/sandboxctl"))
        .arg(bind_ro(&common::agent_path(), "/agent"))
        .arg(bind_ro(&common::images_dir(), "/images"))
        .arg(bind_ro(
            &dir.path().join("sandboxd.service"),
            "/etc/systemd/system/sandboxd.service",
        ))
        .arg(bind_ro(
            &units.join("sandboxd.socket"),
            "/etc/systemd/system/sandboxd.socket",
        ))
        .arg(bind_ro(
            &dir.path().join("selftest"),
            "/usr/local/bin/selftest",
        ))
        .arg(bind_ro(
            &dir.path().join("selftest.service"),
            "/etc/systemd/system/selftest.service",
        ))
        .arg(format!("--bind={}:/out", out.display()))
        .arg(format!(
            "--bind={}:/var/lib/sandboxd/disk",
            pool_dir.display()
        ))
        .args(["--", "systemd.unit=selftest.service"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("systemd-nspawn");
    let log = read(&out, "selftest.log");
    let _ = pool.unmount();
    for hierarchy in common::cgroup::hierarchies() {
        let group = common::cgroup::daemon_group(&hierarchy, &parent);
        let _ = std::fs::remove_dir(group.join("supervisors"));
        let _ = std::fs::remove_dir(group);
    }
    assert!(status.success(), "nspawn failed\n{log}");
    assert_eq!(read(&out, "finished").trim(), "done", "{log}");
    // Socket activation: nothing ran until the first request came.
    assert_eq!(read(&out, "before-request").trim(), "inactive", "{log}");
    assert!(read(&out, "health").starts_with("ok"), "{log}");
    let show = read(&out, "show");
    for line in [
        "Type=notify",
        "ActiveState=active",
        "SubState=running",
        "NRestarts=0",
    ] {
        assert!(
            show.lines().any(|l| l == line),
            "missing {line} in:\n{show}\n{log}"
        );
    }
    assert!(
        read(&out, "cgroup").contains("/system.slice/sandboxd.service"),
        "{log}"
    );
    assert_eq!(read(&out, "after-stop").trim(), "inactive", "{log}");
}
