//! Sandbox lifecycle through the real daemon: create, exec, inspect, delete.

mod common;

use std::time::Duration;

use common::Daemon;
use hyper::{Method, StatusCode};
use sandboxd::background_priority;
use serde_json::{json, Value};

#[tokio::test]
async fn create_exec_delete() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let (status, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sandbox["state"], "ready");
    // No ttl_seconds asked for: the documented default of 600 s.
    assert_eq!(sandbox["ttl_seconds"], 600, "{sandbox}");
    assert!(sandbox["expires_at"].is_string(), "{sandbox}");
    let run = daemon.sh(&id, "echo out; echo err >&2; exit 3").await;
    assert_eq!(run.out(), "out\n");
    assert_eq!(run.err(), "err\n");
    assert_eq!(run.exit_code(), Some(3));
    daemon.delete(&id).await;
    let (status, body) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "sandbox_not_found");
}

#[tokio::test]
async fn pooled_sandbox_is_handed_out_with_the_callers_env_and_ttl() {
    require_host!();
    let daemon = Daemon::start_with(&["--pool-size", "1", "--default-image", "busybox"]);
    let health = daemon.pool_reaches(1).await;
    assert_eq!(
        health["sandboxes"], 0,
        "pooled sandboxes are not the caller's"
    );
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));

    let mut events = daemon.follow_events(0).await;
    let id = daemon
        .create(json!({"env": {"GREETING": "hi"}, "ttl_seconds": 77, "labels": {"team": "a"}}))
        .await;
    // It came from the pool: its `created` event says so (a cold create's
    // does not), and the pool refills behind it.
    let seen = events
        .until(Duration::from_secs(30), |e| {
            e["kind"] == "ready" && e["sandbox_id"] == id.as_str()
        })
        .await;
    let created: Vec<&Value> = seen
        .iter()
        .filter(|e| e["kind"] == "created" && e["sandbox_id"] == id.as_str())
        .collect();
    assert_eq!(created.len(), 1, "{seen:?}");
    assert_eq!(created[0]["detail"], "from the warm pool", "{seen:?}");
    let health = daemon.pool_reaches(1).await;
    assert_eq!(
        health["sandboxes"], 1,
        "the refill is not the caller's: {health}"
    );
    let run = daemon.sh(&id, "echo $GREETING").await;
    assert_eq!(run.out(), "hi\n");
    let (_, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(sandbox["ttl_seconds"], 77);
    assert_eq!(sandbox["labels"]["team"], "a");
    let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(health["sandboxes"], 1);
    daemon.delete(&id).await;
}

/// A pooled sandbox whose supervisor finds a claim it cannot read in its
/// claim mailbox (written here straight into the memfd, as a broken daemon
/// might) fails at its next request, and a claim that finds it failed is
/// served by a cold create instead.
#[tokio::test]
async fn a_claim_the_supervisor_cannot_read_fails_the_pooled_sandbox() {
    use std::os::unix::fs::FileExt;
    require_host!();
    let daemon = Daemon::start_with(&["--pool-size", "1", "--default-image", "busybox"]);
    daemon.pool_reaches(1).await;
    let sandboxes = daemon.run_dir().join("sandboxes");
    let pooled: Vec<_> = std::fs::read_dir(&sandboxes)
        .expect("run dir")
        .map(|e| e.expect("entry").path())
        // Network slots made ahead are dot directories.
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sb-"))
        })
        .collect();
    let [pooled] = pooled.as_slice() else {
        panic!("one pooled sandbox expected: {pooled:?}");
    };
    let socket = pooled.join("shim.sock");
    let supervisor = sandboxd::supervisor::client::SupervisorClient::connect(&socket)
        .await
        .expect("the pooled supervisor");
    let pid = supervisor.peer_pid().expect("its pid");
    // Its mailbox: opened when it joined the pool.
    let memfd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("its descriptors")
        .map(|e| e.expect("fd").path())
        .find(|fd| {
            std::fs::read_link(fd)
                .is_ok_and(|target| target.to_string_lossy().contains("memfd:sandboxd-claim"))
        })
        .expect("the pooled supervisor holds its claim mailbox");
    let mailbox = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&memfd)
        .expect("open the mailbox");
    // A length, three bytes that are no claim, and the mark that posts them.
    mailbox.write_all_at(&3u64.to_le_bytes(), 8).unwrap();
    mailbox.write_all_at(&[0xff; 3], 16).unwrap();
    mailbox.write_all_at(&[1], 0).unwrap();

    let mut supervisor = supervisor;
    let health = supervisor.health().await.expect("health");
    let failure = health.failure.expect("the sandbox failed");
    assert!(failure.contains("cannot be read"), "{failure}");
    // Scrubbed: only the one-byte mark is left.
    assert_eq!(mailbox.metadata().unwrap().len(), 1);

    let mut events = daemon.follow_events(0).await;
    let id = daemon.create(json!({"env": {"GREETING": "hi"}})).await;
    let seen = events
        .until(Duration::from_secs(30), |e| {
            e["kind"] == "ready" && e["sandbox_id"] == id.as_str()
        })
        .await;
    let created = seen
        .iter()
        .find(|e| e["kind"] == "created" && e["sandbox_id"] == id.as_str())
        .expect("its created event");
    assert!(created["detail"].is_null(), "a cold create: {created}");
    assert_ne!(pooled.file_name(), Some(std::ffi::OsStr::new(&id)));
    assert!(!pooled.exists(), "the failed pooled sandbox was removed");
    assert_eq!(daemon.sh(&id, "echo $GREETING").await.out(), "hi\n");
    daemon.delete(&id).await;
}

/// A pooled container keeps Python started: run-code after the claim runs
/// in a fork of it, with the caller's environment and a fresh run's exit
/// codes, while a command naming `python3` is still a fresh exec.
#[tokio::test]
async fn python_run_code_in_a_pooled_sandbox_forks_its_warm_interpreter() {
    require_host!();
    let daemon = Daemon::start_with(&["--pool-size", "1", "--default-image", "python"]);
    daemon.pool_reaches(1).await;
    let id = daemon.create(json!({"env": {"GREETING": "hi"}})).await;
    // The fork server's source is on a warm fork's command line; spelled
    // in two halves so that `python3 -c` of this check does not find it.
    let origin =
        "'warm' if b'_soc' + b'ket' in open('/proc/self/cmdline', 'rb').read() else 'fresh'";
    let code = format!(
        "import os, sys\nprint({origin}, os.environ['GREETING'], sys.argv[0])\nsys.exit(4)\n"
    );
    let proc = daemon
        .start_process(&id, json!({"code": code, "language": "python"}))
        .await;
    let run = daemon.output(&id, proc).await;
    assert!(
        run.out().starts_with("warm hi /tmp/.sandbox-code/"),
        "{} {}",
        run.out(),
        run.err()
    );
    assert_eq!(run.exit_code(), Some(4));
    // The control: the same check in a fresh interpreter says so.
    let fresh = daemon
        .exec(&id, &["python3", "-c", &format!("print({origin})")])
        .await;
    assert_eq!(fresh.out(), "fresh\n", "{}", fresh.err());
    // A memory snapshot holds the server too; its fork runs Python code.
    let snap = daemon.snapshot(&id, "memory").await;
    let fork = daemon.create(json!({"from_snapshot": snap})).await;
    let proc = daemon
        .start_process(&fork, json!({"code": "print(6 * 7)", "language": "python"}))
        .await;
    let run = daemon.output(&fork, proc).await;
    assert_eq!(run.out(), "42\n", "{}", run.err());
    assert_eq!(run.exit_code(), Some(0));
    for id in [&id, &fork] {
        daemon.delete(id).await;
    }
}

/// A container's root overlay is mounted only where the container runs:
/// not in the host's mount table, which every create reads (each mount
/// left there made every later create slower), nor in its supervisor's
/// namespace; the host's table holds the sandbox's network namespace pin
/// alone. The root goes with the container.
#[tokio::test]
async fn a_container_root_is_mounted_only_in_the_container() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let dir = daemon.run_dir().join("sandboxes").join(&id);
    let upper = daemon.state_dir().join("disk").join(&id).join("upper");
    let roots = common::mounts::overlays_over(&upper);
    // The positive control: the scan finds the root, in one namespace.
    assert_eq!(roots.len(), 1, "{roots:?}");
    let own = common::mounts::own_namespace();
    assert_ne!(roots[0].namespace, own, "{roots:?}");
    assert_eq!(roots[0].point, "/", "{roots:?}");
    // Every supervisor (the sandbox's and the standbys) is back in the
    // host's namespace once its start is over.
    let supervisors = common::cgroup::procs_in(
        &common::cgroup::daemon_group(&common::cgroup::hierarchy("pids"), &daemon.cgroup_parent())
            .join("supervisors"),
    );
    assert!(!supervisors.is_empty());
    for pid in &supervisors {
        assert_eq!(common::mounts::namespace_of(*pid), Some(own), "{pid}");
    }
    let host: Vec<String> = common::mounts::everywhere()
        .into_iter()
        .filter(|m| m.namespace == own)
        .map(|m| m.point)
        .collect();
    assert!(
        host.contains(&dir.join("netns").display().to_string()),
        "{host:?}"
    );
    assert!(
        !host
            .iter()
            .any(|p| p.starts_with(&dir.join("rootfs").display().to_string())),
        "{host:?}"
    );
    daemon.delete(&id).await;
    assert_eq!(common::mounts::overlays_over(&upper), Vec::new());
}

/// A sandbox's root is a volatile overlay (its upper layer is never
/// synced; nothing outlives the sandbox that would need it), yet what is
/// written there is all in a filesystem snapshot taken right after: the
/// btrfs snapshot flushes the layer first.
#[tokio::test]
async fn a_volatile_root_loses_nothing_to_a_snapshot_taken_at_once() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let root = daemon
        .sh(&id, "grep ' / / ' /proc/self/mountinfo")
        .await
        .out();
    // The positive control: the line is the overlay root, found.
    assert!(root.contains(" - overlay overlay "), "{root}");
    // Spelled `fsync=volatile` by kernels since 6.6, `volatile` before.
    assert!(
        root.contains(",volatile") || root.contains(",fsync=volatile"),
        "{root}"
    );
    // A file of the image, changed (copied up), and a new one.
    let run = daemon
        .sh(
            &id,
            "echo changed >> /etc/passwd && echo new > /root/new && tail -1 /etc/passwd",
        )
        .await;
    assert_eq!(run.out(), "changed\n", "{}", run.err());
    let (status, snap) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"kind": "filesystem"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap = snap["id"].as_str().expect("snapshot id").to_string();
    let from = daemon.create(json!({"image": snap})).await;
    let run = daemon.sh(&from, "tail -1 /etc/passwd; cat /root/new").await;
    assert_eq!(run.out(), "changed\nnew\n", "{}", run.err());
    for id in [&id, &from] {
        daemon.delete(id).await;
    }
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// Pooled sandboxes hold room on the host; a caller's create that needs it
/// takes the room of one instead of being refused.
#[tokio::test]
async fn a_create_the_host_has_no_room_for_gives_up_a_pooled_sandbox() {
    require_host!();
    let daemon = Daemon::start_with(&[
        "--pool-size",
        "2",
        "--max-sandboxes",
        "2",
        "--default-image",
        "busybox",
    ]);
    daemon.pool_reaches(2).await;
    // Another image than the pooled one: a cold create, which needs room.
    let id = daemon.create(json!({"image": "python"})).await;
    assert_eq!(daemon.exec(&id, &["true"]).await.exit_code(), Some(0));
    let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(health["sandboxes"], 1, "{health}");
    assert_eq!(health["pooled"], 1, "one pooled sandbox gave way: {health}");
    // The second takes the last pooled sandbox's room; a third finds none
    // to take and is refused as on a full host.
    let second = daemon.create(json!({"image": "python"})).await;
    let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(health["pooled"], 0, "{health}");
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "python"})),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    daemon.delete(&id).await;
    daemon.delete(&second).await;
}

/// A create takes what the daemon made ahead of it: a network slot (its
/// namespace, renamed into the sandbox's run directory) and a standby
/// supervisor (handed the sandbox on its stdin, logging to the sandbox's
/// log from then on). Both are used once.
#[tokio::test]
async fn a_create_takes_a_network_slot_and_a_standby_supervisor_made_ahead() {
    use std::os::unix::fs::MetadataExt;
    require_host!();
    let daemon = Daemon::start_with(&["--net-slots", "1", "--standby-supervisors", "1"]);
    daemon.made_ahead(1, 1).await;
    let slot = daemon.slot_dirs().remove(0);
    let sandboxes = daemon.run_dir().join("sandboxes");
    let slot_ns = std::fs::metadata(sandboxes.join(&slot).join("netns"))
        .expect("slot netns")
        .ino();
    let standby = daemon.standby_pids()[0];
    // It starts its session itself (the daemon's spawn runs no code
    // between fork and exec), below creates' CPU priority: the first
    // thing its main does, so it may be found a moment before.
    let daemons = i64::from(background_priority::current());
    let waiting = i64::from(background_priority::lowered(daemons as i32));
    await_session_and_nice(standby, waiting).await;

    let id = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(daemon.sh(&id, "echo ok").await.out(), "ok\n");
    let sandbox_ns = std::fs::metadata(sandboxes.join(&id).join("netns"))
        .expect("sandbox netns")
        .ino();
    assert_eq!(sandbox_ns, slot_ns, "the sandbox's namespace is the slot's");
    assert!(
        !sandboxes.join(&slot).exists(),
        "the slot was moved, not copied"
    );
    let log = std::fs::read_link(format!("/proc/{standby}/fd/2")).expect("standby stderr");
    assert_eq!(log, sandboxes.join(&id).join("shim.log"));
    assert!(
        !daemon.standby_pids().contains(&standby),
        "a handed standby is a supervisor, not a standby"
    );
    assert_eq!(
        session_and_nice(standby),
        (standby, daemons),
        "its handoff restores the priority"
    );
    // Both are made again for the next create; neither is reused.
    daemon.made_ahead(1, 1).await;
    assert_ne!(daemon.slot_dirs(), vec![slot]);
    daemon.delete(&id).await;
    assert!(!sandboxes.join(&id).exists());
}

/// With no standby ready, a create spawns its supervisor, which also
/// leads a session of its own (nothing sent to the daemon's process
/// group or session reaches it), at the daemon's priority.
#[tokio::test]
async fn a_supervisor_spawned_for_a_create_leads_its_own_session() {
    require_host!();
    let daemon = Daemon::start_with(&["--standby-supervisors", "0"]);
    let id = daemon.create(json!({"image": "busybox"})).await;
    let supervisors = common::cgroup::procs_in(
        &common::cgroup::daemon_group(&common::cgroup::hierarchy("pids"), &daemon.cgroup_parent())
            .join("supervisors"),
    );
    assert_eq!(supervisors.len(), 1, "{supervisors:?}");
    let supervisor = supervisors[0];
    // The daemon runs at this test's priority.
    let own = session_and_nice(std::process::id() as i32).1;
    assert_eq!(session_and_nice(supervisor), (supervisor, own));
    daemon.delete(&id).await;
}

/// A daemon started at a lower priority (a unit's `Nice=`) runs what it
/// makes ahead that much lower again, and hands a standby back its own.
#[tokio::test]
async fn made_ahead_work_runs_below_the_daemons_own_priority() {
    require_host!();
    // The daemon inherits this thread's nice value.
    let before = background_priority::current();
    background_priority::set(3);
    let daemon = Daemon::start_with(&["--net-slots", "1", "--standby-supervisors", "1"]);
    background_priority::set(before);
    let daemon_pid = daemon.pid();
    assert_eq!(session_and_nice(daemon_pid).1, 3, "the positive control");
    daemon.made_ahead(1, 1).await;
    let standby = daemon.standby_pids()[0];
    await_session_and_nice(standby, 13).await;
    let id = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(session_and_nice(standby), (standby, 3));
    daemon.delete(&id).await;
}

/// Waits until process `pid` leads its own session at nice value `nice`
/// (a standby sets both as its main starts, so it may be found a moment
/// before), with a bounded deadline.
async fn await_session_and_nice(pid: i32, nice: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while session_and_nice(pid) != (pid, nice) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(session_and_nice(pid), (pid, nice));
}

/// Process `pid`'s session and nice value.
fn session_and_nice(pid: i32) -> (i32, i64) {
    let field = |n| common::proc_stat_field(pid, n).expect("the process's stat");
    (
        field(6).parse().expect("a session id"),
        field(19).parse().expect("a nice value"),
    )
}

#[tokio::test]
async fn a_create_may_name_the_sandboxs_hostname() {
    require_host!();
    let daemon = Daemon::start();
    let named = daemon
        .create(json!({"image": "busybox", "hostname": "web-1"}))
        .await;
    let seen = daemon
        .sh(
            &named,
            "hostname; cat /etc/hostname; grep -c web-1 /etc/hosts",
        )
        .await;
    assert_eq!(seen.out(), "web-1\nweb-1\n1\n", "{}", seen.err());
    // The positive control: without one, the hostname is the id.
    let plain = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(
        daemon.sh(&plain, "hostname").await.out(),
        format!("{plain}\n")
    );
    for (body, says) in [
        (
            json!({"image": "busybox", "hostname": "-web"}),
            "not a hostname",
        ),
        (
            json!({"image": "busybox", "hostname": "a b"}),
            "not a hostname",
        ),
        (
            json!({"image": "busybox", "hostname": "x".repeat(64)}),
            "not a hostname",
        ),
    ] {
        let (status, answer) = daemon
            .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], "invalid_hostname", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body} -> {message}");
    }
}
