//! Isolation of a container sandbox, seen from inside and from the host:
//! setuid binaries gain nothing, root inside is an unprivileged uid outside,
//! no cgroupfs, /proc/sysrq-trigger is not writable, no new user namespaces,
//! only `lo` and the in-namespace veth pair, hostname and /etc/hosts, default environment, /dev/shm tmpfs
//! and core dumps off.

mod common;

use std::time::Duration;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;

/// The `Uid:` line of /proc/PID/status on the host: real, effective, saved, fs.
fn host_uids(pid: i32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line")
        .split_whitespace()
        .map(|v| v.parse().expect("uid"))
        .collect()
}

#[tokio::test]
async fn setuid_binaries_gain_nothing() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "python"})).await;
    // python3 does not drop privileges itself (busybox would), so what it
    // prints is what the kernel gave it.
    let run = daemon
        .sh(&id, "cp \"$(readlink -f /usr/bin/python3)\" /tmp/suid && chown 0:0 /tmp/suid && chmod 4755 /tmp/suid && stat -c %a:%u /tmp/suid")
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(run.out().trim(), "4755:0");
    let proc = daemon
        .start_process(
            &id,
            json!({
                "argv": ["/tmp/suid", "-c", "import os; print(*os.getresuid())"],
                "uid": 1000,
                "cwd": "/tmp",
            }),
        )
        .await;
    let run = daemon.output(&id, proc).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(
        run.out().trim(),
        "1000 1000 1000",
        "setuid-root took effect"
    );
    // The same binary run by root inside prints 0: the test above is meaningful.
    let run = daemon
        .exec(&id, &["/tmp/suid", "-c", "import os; print(os.geteuid())"])
        .await;
    assert_eq!(run.out().trim(), "0");
}

/// A process gets exactly the supplementary groups it asks for (CRI's
/// `additionalGids` arrive so through the shim), and none when it asks
/// for none.
#[tokio::test]
async fn a_process_gets_exactly_the_supplementary_groups_it_asks_for() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let groups_of = |body: serde_json::Value| {
        let daemon = &daemon;
        let id = &id;
        async move {
            let proc = daemon.start_process(id, body).await;
            daemon.output(id, proc).await.out().trim().to_string()
        }
    };
    assert_eq!(
        groups_of(json!({"argv": ["id", "-G"], "uid": 1000, "gid": 1000, "cwd": "/tmp"})).await,
        "1000"
    );
    assert_eq!(
        groups_of(json!({"argv": ["id", "-G"]})).await,
        "0",
        "root keeps none of the agent's"
    );
    let asked = json!({"argv": ["sh", "-c", "id -G; grep ^Groups: /proc/self/status"], "uid": 1000, "gid": 1000, "cwd": "/tmp", "groups": [10, 4000]});
    let said = groups_of(asked).await;
    let mut lines = said.lines();
    assert_eq!(lines.next(), Some("1000 10 4000"), "{said}");
    assert_eq!(
        lines
            .next()
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>()),
        Some(vec!["10", "4000"]),
        "{said}"
    );
    for (body, code) in [
        (
            json!({"code": "print(1)", "language": "sh", "groups": [10]}),
            "invalid_request",
        ),
        (
            json!({"argv": ["id"], "groups": (0..65).collect::<Vec<u32>>()}),
            "invalid_groups",
        ),
    ] {
        let (status, answer) = daemon
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
    }
}

#[tokio::test]
async fn root_inside_is_an_unprivileged_uid_outside() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    for (uid, host_uid) in [(0u32, 100_000u32), (1000, 101_000)] {
        // The process prints once it runs as itself (after exec), then waits.
        let proc = daemon
            .start_process(
                &id,
                json!({"argv": ["sh", "-c", "id -u; exec sleep 1000"], "uid": uid, "cwd": "/tmp"}),
            )
            .await;
        // Its line is awaited: a kill before `id -u` ran would leave no
        // output to check.
        let printed = daemon
            .follow_output(&id, proc)
            .await
            .until(Duration::from_secs(20), |e| {
                e["type"] == "stdout" || e["type"] == "exit"
            })
            .await;
        assert_eq!(
            printed.last().map(|e| e["type"].clone()),
            Some(json!("stdout")),
            "{printed:?}"
        );
        let wait = format!("/v1/sandboxes/{id}/processes/{proc}/wait?timeout_seconds=0");
        let (status, process) = daemon.call(Method::GET, &wait, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(process["state"], "running", "{process}");
        let pids = common::process_host_pids(&id, proc);
        assert!(!pids.is_empty(), "no host pids for p{proc}");
        for pid in &pids {
            assert_eq!(
                host_uids(*pid),
                vec![host_uid; 4],
                "host pid {pid} of sandbox uid {uid}"
            );
        }
        let (status, _) = daemon
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes/{proc}/kill"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let run = daemon.output(&id, proc).await;
        assert_eq!(run.out(), format!("{uid}\n"));
    }
    // The agent (PID 1 inside) too.
    let init: Vec<i32> =
        std::fs::read_to_string(common::cgroup::sandbox_dir("pids", &id).join("cgroup.procs"))
            .expect("sandbox cgroup.procs")
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
    assert!(!init.is_empty());
    for pid in init {
        assert_eq!(host_uids(pid)[0], 100_000, "host pid {pid}");
    }
}

#[tokio::test]
async fn kernel_interfaces_are_closed() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;

    // No cgroupfs at all: /sys is an empty placeholder.
    let run = daemon
        .sh(
            &id,
            "test -e /sys/fs/cgroup; echo $?; grep -c cgroup /proc/mounts",
        )
        .await;
    assert_eq!(run.out(), "1\n0\n", "{}", run.err());

    // sysrq-trigger cannot be written (read-only where the kernel has it;
    // kernels without CONFIG_MAGIC_SYSRQ have no such file at all).
    let run = daemon.sh(&id, "echo h > /proc/sysrq-trigger").await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "writing /proc/sysrq-trigger succeeded"
    );
    assert!(!run.err().is_empty());
    // /proc/sys is mounted read-only.
    let mounts = daemon.exec(&id, &["cat", "/proc/mounts"]).await.out();
    let proc_sys = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&"/proc/sys"))
        .unwrap_or_else(|| panic!("/proc/sys is not a separate mount: {mounts}"));
    assert!(proc_sys[3].split(',').any(|o| o == "ro"), "{proc_sys:?}");
    let run = daemon.sh(&id, "echo 1 > /proc/sys/kernel/hostname").await;
    assert_ne!(run.exit_code(), Some(0), "wrote to /proc/sys");

    // No new user namespaces (seccomp), so no way to regain capabilities.
    let run = daemon.exec(&id, &["unshare", "-U", "true"]).await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "unshare -U succeeded: {}",
        run.out()
    );
    assert!(
        run.err().contains("not permitted"),
        "unshare -U failed for another reason: {}",
        run.err()
    );
    let run = daemon.exec(&id, &["unshare", "-Ur", "id", "-u"]).await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "unshare -Ur succeeded: {}",
        run.out()
    );

    // Mounting is refused too.
    let run = daemon
        .exec(&id, &["mount", "-t", "tmpfs", "none", "/mnt"])
        .await;
    assert_ne!(run.exit_code(), Some(0), "mount succeeded");

    // Core dumps are off.
    let run = daemon.sh(&id, "ulimit -c").await;
    assert_eq!(run.out(), "0\n");
}

#[tokio::test]
async fn network_is_lo_and_an_inner_veth_pair_and_blocks_egress_by_default() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = daemon.exec(&id, &["cat", "/proc/net/dev"]).await;
    assert_eq!(run.exit_code(), Some(0));
    // Two header lines, then one line per interface.
    let interfaces: Vec<String> = run
        .out()
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_string())
        .collect();
    // lo plus the veth pair whose both ends stay inside the namespace.
    let mut sorted = interfaces.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["eth0", "gw0", "lo"], "{}", run.out());
    let run = daemon.exec(&id, &["ip", "-o", "link"]).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(run.out().lines().count(), 3, "{}", run.out());
    // The only way out is the egress proxy, and the default policy is block:
    // TCP anywhere (the gateway included) and UDP get nowhere.
    let run = daemon
        .sh(
            &id,
            "timeout 5 wget -O - http://203.0.113.77/ 2>&1; echo rc=$?; \
             timeout 5 wget -O - http://10.200.0.1:22/ 2>&1; echo rc=$?; \
             echo x | timeout 2 nc -u -w 1 198.51.100.7 9999; echo rc=$?",
        )
        .await;
    let out = run.out();
    assert_eq!(out.matches("rc=0").count(), 0, "{out}");
}

#[tokio::test]
async fn identity_environment_and_mounts() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon
        .create(json!({"image": "busybox", "env": {"EXTRA": "yes"}}))
        .await;

    assert_eq!(daemon.exec(&id, &["hostname"]).await.out().trim(), id);
    assert_eq!(
        daemon
            .exec(&id, &["cat", "/etc/hostname"])
            .await
            .out()
            .trim(),
        id
    );
    let hosts = daemon.exec(&id, &["cat", "/etc/hosts"]).await.out();
    assert!(
        hosts
            .lines()
            .any(|l| l.split_whitespace().skip(1).any(|name| name == id)),
        "/etc/hosts lacks {id}: {hosts}"
    );
    assert!(hosts.contains("localhost"), "{hosts}");

    let env = daemon.exec(&id, &["env"]).await.out();
    let vars: Vec<&str> = env.lines().collect();
    for expected in [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
        "TZ=UTC",
        "EXTRA=yes",
    ] {
        assert!(vars.contains(&expected), "{expected} missing from {env}");
    }
    // A process's own env overrides the sandbox's.
    let proc = daemon
        .start_process(
            &id,
            json!({"argv": ["sh", "-c", "echo $TZ $EXTRA"], "env": {"TZ": "Europe/Paris"}}),
        )
        .await;
    assert_eq!(daemon.output(&id, proc).await.out(), "Europe/Paris yes\n");

    let mounts = daemon.exec(&id, &["cat", "/proc/mounts"]).await.out();
    let shm = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&"/dev/shm"))
        .unwrap_or_else(|| panic!("no /dev/shm mount: {mounts}"));
    assert_eq!(shm[2], "tmpfs", "{shm:?}");
    for option in ["nosuid", "nodev", "noexec"] {
        assert!(
            shm[3].split(',').any(|o| o == option),
            "/dev/shm lacks {option}: {shm:?}"
        );
    }
    let run = daemon
        .sh(&id, "echo shared > /dev/shm/x && cat /dev/shm/x")
        .await;
    assert_eq!(run.out(), "shared\n", "{}", run.err());
}
