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

/// Runs process `body` in sandbox `id` and waits for all of its output.
async fn ran(daemon: &Daemon, id: &str, body: serde_json::Value) -> common::Exec {
    let proc = daemon.start_process(id, body).await;
    daemon.output(id, proc).await
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
    let groups_of = |body| async { ran(&daemon, &id, body).await.out().trim().to_string() };
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
        daemon.refused_process(&id, body, code).await;
    }
}

/// The `Cap*` lines of a process's /proc/self/status, by their names.
fn capability_sets(status: &str) -> std::collections::BTreeMap<String, u64> {
    status
        .lines()
        .filter_map(|line| line.split_once(":\t"))
        .filter(|(name, _)| name.starts_with("Cap"))
        .map(|(name, hex)| {
            let bits = u64::from_str_radix(hex.trim(), 16).unwrap_or_else(|e| panic!("{hex}: {e}"));
            (name.to_string(), bits)
        })
        .collect()
}

/// A process keeps the capabilities it names (Kubernetes' `drop: [ALL]`
/// arrives so through the shim) and no others, in every set; without the
/// field it has the sandbox's, and a capability the sandbox does not grant
/// is refused by name.
#[tokio::test]
async fn a_process_keeps_only_the_capabilities_it_names() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = |body| ran(&daemon, &id, body);
    // Docker's fourteen: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID
    // SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP.
    let sandbox_set = 0xa80425fb_u64;
    let status = "cat /proc/self/status; touch /tmp/f; chown 1000 /tmp/f && echo chowned";
    let whole = run(json!({"argv": ["sh", "-c", status]})).await;
    let sets = capability_sets(&whole.out());
    assert_eq!(sets["CapBnd"], sandbox_set, "{sets:x?}");
    assert_eq!(sets["CapEff"], sandbox_set, "{sets:x?}");
    assert!(whole.out().contains("chowned"), "{}", whole.err());

    let two = run(json!({"argv": ["sh", "-c", status], "capabilities": ["CAP_NET_BIND_SERVICE", "CAP_SETUID"]})).await;
    let sets = capability_sets(&two.out());
    let kept = 1u64 << 10 | 1 << 7;
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        assert_eq!(sets[set], kept, "{set}: {sets:x?}");
    }
    assert_eq!((sets["CapInh"], sets["CapAmb"]), (0, 0), "{sets:x?}");
    assert!(
        !two.out().contains("chowned"),
        "chown without CAP_CHOWN: {}",
        two.out()
    );
    assert!(
        two.err().contains("Operation not permitted"),
        "{}",
        two.err()
    );

    let none = run(json!({"argv": ["sh", "-c", status], "capabilities": []})).await;
    let sets = capability_sets(&none.out());
    assert!(sets.values().all(|bits| *bits == 0), "{sets:x?}");
    // Not root: nothing held, the bounding set still narrowed.
    let user = run(json!({"argv": ["cat", "/proc/self/status"], "uid": 1000, "cwd": "/tmp", "capabilities": ["CAP_KILL"]})).await;
    let sets = capability_sets(&user.out());
    assert_eq!(
        (sets["CapBnd"], sets["CapEff"], sets["CapPrm"]),
        (1 << 5, 0, 0),
        "{sets:x?}"
    );

    let message = daemon
        .refused_process(
            &id,
            json!({"argv": ["id"], "capabilities": ["CAP_SYS_ADMIN"]}),
            "invalid_capabilities",
        )
        .await;
    assert!(message.contains("CAP_SYS_ADMIN"), "{message}");
}

/// The sandbox's seccomp program is compiled once, by the daemon, and
/// installed by every supervisor it spawns from the file it shares: a
/// program put in that file's place is the one the next sandbox runs under.
#[tokio::test]
async fn supervisors_install_the_seccomp_program_the_daemon_shared() {
    use std::os::unix::fs::PermissionsExt;
    require_host!();
    // No standby: each create spawns its supervisor, which reads the file then.
    let daemon = Daemon::start_with(&["--standby-supervisors", "0"]);
    let shared = daemon.shared_seccomp_programs();
    assert_eq!(shared.len(), 1, "{shared:?}");
    let shared = &shared[0];
    let meta = std::fs::metadata(shared).expect("shared program");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let original = std::fs::read(shared).expect("read");
    assert_eq!(original.len() % 8, 0, "whole BPF instructions");
    // mkdir(2), then what the sandbox's profile refuses (a user namespace).
    let probe = |id: String| {
        let daemon = &daemon;
        async move {
            let script = "mkdir /tmp/d; echo rc=$?; unshare -U true 2>/dev/null; echo unshare=$?";
            let run = daemon.sh(&id, script).await;
            daemon.delete(&id).await;
            run
        }
    };
    let under_the_profile = "rc=0\nunshare=1\n";
    // The positive control: the daemon's program is the sandbox's profile.
    let id = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(probe(id).await.out(), under_the_profile);
    // A program that refuses mkdir(2) and mkdirat(2) (x86_64 83 and 258)
    // with EPERM and allows the rest, a user namespace too.
    let refuse_mkdir: [(u16, u8, u8, u32); 5] = [
        (0x20, 0, 0, 0),                                // ld seccomp_data.nr
        (0x15, 1, 0, 83),                               // jeq #83, to the ret ERRNO
        (0x15, 0, 1, 258),                              // jeq #258, else to ret ALLOW
        (0x06, 0, 0, 0x0005_0000 | libc::EPERM as u32), // ret ERRNO(EPERM)
        (0x06, 0, 0, 0x7fff_0000),                      // ret ALLOW
    ];
    let program: Vec<u8> = refuse_mkdir
        .iter()
        .flat_map(|&(code, jt, jf, k)| {
            let mut bytes = code.to_ne_bytes().to_vec();
            bytes.extend([jt, jf]);
            bytes.extend(k.to_ne_bytes());
            bytes
        })
        .collect();
    std::fs::write(shared, &program).expect("swap the program");
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = probe(id).await;
    std::fs::write(shared, &original).expect("restore the program");
    // It replaced the profile: mkdir refused, the user namespace made.
    assert_eq!(run.out(), "rc=1\nunshare=0\n", "{}", run.err());
    assert!(
        run.err().contains("Operation not permitted"),
        "{}",
        run.err()
    );
    // A file that is not whole instructions is not used: the supervisor
    // compiles the profile itself.
    std::fs::write(shared, &original[..original.len() - 1]).expect("truncate");
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = probe(id).await;
    std::fs::write(shared, &original).expect("restore the program");
    assert_eq!(run.out(), under_the_profile);
}

/// A process's own seccomp profile (the OCI form, as a pod's
/// `RuntimeDefault` or a `Localhost` profile arrives through the shim)
/// is loaded on top of the sandbox's filter: it refuses what it names,
/// kills where it says to, and leaves the rest to the sandbox's.
#[tokio::test]
async fn a_process_seccomp_profile_stacks_on_the_sandboxes() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = |body| ran(&daemon, &id, body);
    let script = "grep ^Seccomp /proc/self/status; mkdir /tmp/d && echo made";
    let no_mkdir = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]
    });
    let plain = run(json!({"argv": ["sh", "-c", script]})).await;
    assert!(
        plain.out().contains("made"),
        "{} {}",
        plain.out(),
        plain.err()
    );
    assert!(
        plain.out().contains("Seccomp_filters:\t1"),
        "{}",
        plain.out()
    );
    let confined = run(
        json!({"argv": ["sh", "-c", "rmdir /tmp/d; ".to_string() + script], "seccomp": no_mkdir}),
    )
    .await;
    assert!(
        confined.out().contains("Seccomp_filters:\t2"),
        "{}",
        confined.out()
    );
    assert!(!confined.out().contains("made"), "{}", confined.out());
    assert!(
        confined.err().contains("Permission denied"),
        "errnoRet 13: {}",
        confined.err()
    );
    // The sandbox's own filter still answers under an allow-all profile:
    // a user namespace, which the kernel gives unprivileged processes, is
    // refused by it alone.
    let unshare = run(
        json!({"argv": ["unshare", "-U", "true"], "seccomp": {"defaultAction": "SCMP_ACT_ALLOW"}}),
    )
    .await;
    assert_ne!(unshare.exit_code(), Some(0), "{}", unshare.out());
    assert!(unshare.err().contains("not permitted"), "{}", unshare.err());
    // A masked comparison reads as runc's (and so containerd's default
    // profile's rule for clone): the argument masked with `value` is
    // compared with `valueTwo`. This one refuses a clone without namespace
    // flags, as a plain fork is.
    let no_fork = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
            "args": [{"index": 0, "value": 2114060288u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}]
    });
    let forks = "(true) && echo forked";
    let plain = run(json!({"argv": ["sh", "-c", forks]})).await;
    assert_eq!(plain.out().trim(), "forked", "{}", plain.err());
    let unforked = run(json!({"argv": ["sh", "-c", forks], "seccomp": no_fork})).await;
    assert!(
        !unforked.out().contains("forked"),
        "{} {}",
        unforked.out(),
        unforked.err()
    );
    // A kill action ends the process with SIGSYS.
    let killed = run(json!({
        "argv": ["sh", "-c", "echo $PPID"],
        "seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["getppid"], "action": "SCMP_ACT_KILL_PROCESS"}]}
    }))
    .await;
    assert_eq!(killed.process["signal"], 31, "{}", killed.process);
    // A profile written before clone3 (every call but it allowed, the rest
    // EPERM): clone3 answers ENOSYS, as under runc, so glibc's threads
    // fall back to clone and start.
    let python = daemon.create(json!({"image": "python"})).await;
    let known: Vec<String> = (0..512)
        .filter_map(|n| libseccomp::ScmpSyscall::from(n).get_name().ok())
        .filter(|name| name != "clone3")
        .collect();
    assert!(known.iter().any(|n| n == "clone"), "{known:?}");
    let before_clone3 = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [{"names": known, "action": "SCMP_ACT_ALLOW"}]
    });
    // clone3 (435) answers ENOSYS (38) itself, and a thread starts.
    let threads = "import ctypes, threading; libc = ctypes.CDLL(None, use_errno=True); print(libc.syscall(435, 0, 0), ctypes.get_errno()); t = threading.Thread(target=print, args=('threaded',)); t.start(); t.join()";
    let threaded = ran(
        &daemon,
        &python,
        json!({"argv": ["python3", "-c", threads], "seccomp": before_clone3}),
    )
    .await;
    assert_eq!(threaded.out(), "-1 38\nthreaded\n", "{}", threaded.err());
    for profile in [
        json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
        json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/l.sock"}),
        json!({"defaultAction": "ALLOW"}),
    ] {
        let body = json!({"argv": ["true"], "seccomp": profile});
        daemon.refused_process(&id, body, "invalid_seccomp").await;
    }
}

/// A sandbox's processes start at OOM score 0 and may ask for a higher
/// one, at start or later, never a lower one. (That they start at 0 when
/// the daemon runs below it, as `sandboxd.service` runs it at -500, needs
/// CAP_SYS_RESOURCE to set up, which the development hosts do not grant
/// even to root; `oom_score::sandbox_score` has the rule's unit test.)
#[tokio::test]
async fn a_sandboxs_processes_start_at_oom_score_zero_and_go_only_up() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let lower = "cat /proc/self/oom_score_adj; echo 10 > /proc/self/oom_score_adj && echo raised; echo -1 > /proc/self/oom_score_adj && echo lowered; cat /proc/self/oom_score_adj";
    // The daemon inherits this test's score; a sandbox starts at 0 or at
    // the daemon's, if that is higher.
    let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("own oom_score_adj");
    assert!(
        (0..=10).contains(&own),
        "this test needs a score of 0 to 10 (one to raise, and a floor at 0), has {own}"
    );
    let start = own.max(0).to_string();
    let said = daemon.sh(&id, lower).await;
    assert_eq!(
        said.out().lines().collect::<Vec<_>>(),
        [start.as_str(), "raised", "10"],
        "{}",
        said.err()
    );
    let said = ran(
        &daemon,
        &id,
        json!({"argv": ["sh", "-c", lower], "oom_score_adj": 900}),
    )
    .await;
    assert_eq!(
        said.out().lines().collect::<Vec<_>>(),
        ["900", "raised", "10"],
        "{}",
        said.err()
    );
    let body = json!({"argv": ["true"], "oom_score_adj": -500});
    daemon
        .refused_process(&id, body, "invalid_oom_score_adj")
        .await;
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
