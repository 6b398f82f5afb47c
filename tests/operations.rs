//! Operations: admission and capacity, metrics that parse and move, config
//! errors that name the field, a run dir sandboxes cannot reach refused at
//! start, systemd units that verify, a SIGKILL of the daemon in the middle
//! of creates that loses no ready sandbox and leaves nothing half-made, and
//! a SIGTERM with `stop_sandboxes_on_exit` that leaves nothing at all, and
//! cgroup2's `favordynmods` turned on at start without losing the root's
//! other options.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

fn metric(text: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("metrics parse as Prometheus text");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[tokio::test]
async fn admission_refuses_when_full_and_accepts_after_a_delete() {
    require_host!();
    let daemon = Daemon::start_with(&["--max-sandboxes", "2", "--capacity-memory-mib", "1200"]);
    let a = daemon
        .create(json!({"image": "busybox", "memory_mib": 512}))
        .await;
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox", "memory_mib": 1024})),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["resource"], "memory");
    let b = daemon
        .create(json!({"image": "busybox", "memory_mib": 128}))
        .await;
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox"})),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["resource"], "sandboxes");
    let (_, capacity) = daemon.call(Method::GET, "/v1/capacity", None).await;
    assert_eq!(capacity["sandboxes"]["used"], 2.0);
    assert_eq!(capacity["memory_mib"]["used"], 640.0);
    assert_eq!(capacity["memory_mib"]["total"], 1200.0);
    daemon.delete(&a).await;
    let c = daemon
        .create(json!({"image": "busybox", "labels": {"team": "x"}}))
        .await;
    let (_, list) = daemon
        .call(Method::GET, "/v1/sandboxes?label=team=x", None)
        .await;
    let ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, vec![c.as_str()]);
    let _ = b;
}

#[tokio::test]
async fn metrics_parse_and_move() {
    require_host!();
    let daemon = Daemon::start();
    let (status, before) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let before = String::from_utf8(before).expect("utf-8");
    assert_eq!(
        metric(&before, "sandboxd_sandboxes", Some(("state", "ready"))),
        0.0
    );
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = daemon.sh(&id, "echo hi").await;
    assert_eq!(run.out(), "hi\n");
    let (status, _) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "no-such-image"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, after) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    let after = String::from_utf8(after).expect("utf-8");
    assert_eq!(
        metric(&after, "sandboxd_sandboxes", Some(("state", "ready"))),
        1.0
    );
    assert_eq!(
        metric(&after, "sandboxd_process_starts_total", None)
            - metric(&before, "sandboxd_process_starts_total", None),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            "sandboxd_create_failures_total",
            Some(("reason", "image_not_found"))
        ),
        1.0
    );
    // Every part of a create is a phase: the supervisor's exec and its
    // ready line's way back included.
    for phase in [
        "runtime", "exec", "config", "egress", "agent", "serve", "handoff",
    ] {
        assert!(
            metric(
                &after,
                "sandboxd_create_phase_seconds_count",
                Some(("phase", phase))
            ) >= 1.0,
            "{phase}"
        );
    }
    daemon.delete(&id).await;
}

#[test]
fn bad_config_values_name_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (text, field) in [
        ("default_ttl_seconds = 0\n", "default_ttl_seconds"),
        ("log_format = \"xml\"\n", "log_format"),
        ("max_sandboxes = 0\n", "max_sandboxes"),
        ("sokcet = \"/x\"\n", "sokcet"),
        ("default_cpu = \"one\"\n", "default_cpu"),
    ] {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).expect("write");
        let out = std::process::Command::new(common::DAEMON)
            .arg("--config")
            .arg(&path)
            .arg("--check-config")
            .output()
            .expect("run");
        assert!(!out.status.success(), "{text} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(field), "{text}: {stderr}");
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/config.toml");
    let out = std::process::Command::new(common::DAEMON)
        .arg("--config")
        .arg(&example)
        .arg("--agent-path")
        .arg(common::agent_path())
        .arg("--check-config")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_run_dir_under_a_closed_folder_is_refused_at_start_with_the_fix() {
    require_host!();
    let outer = tempfile::Builder::new()
        .prefix("sandboxd-closed-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    // What `mktemp -d` makes: only its owner (root) may enter.
    let closed = outer.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let run = closed.join("run");
    let run_arg = run.display().to_string();
    let (status, output) = Daemon::refused_start(&["--run-dir", &run_arg]);
    assert!(!status.success(), "{output}");
    for part in [
        format!("{} (mode 0700", closed.display()),
        format!("chmod o+x {}", closed.display()),
        "--run-dir".to_string(),
    ] {
        assert!(output.contains(&part), "no {part:?} in: {output}");
    }
}

/// The host's cgroup2 mount point, its per-mount options and its root's
/// options, from mountinfo.
fn cgroup2_mount() -> (String, String, String) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let fs: Vec<&str> = fs.split(' ').collect();
            let mount: Vec<&str> = mount.split(' ').collect();
            (fs.first() == Some(&"cgroup2")).then(|| {
                (
                    mount[4].to_string(),
                    mount[5].to_string(),
                    fs[2].to_string(),
                )
            })
        })
        .expect("this host mounts cgroup2 (hybrid or unified)")
}

#[test]
fn the_daemon_turns_favordynmods_on_and_keeps_the_cgroup2_roots_other_options() {
    require_host!();
    sandboxd::runtime::cgroup_dynmods::stop_favoring_dynamic_modifications()
        .expect("remount cgroup2 without favordynmods");
    let (point, mount_before, root_before) = cgroup2_mount();
    assert!(
        !root_before.split(',').any(|o| o == "favordynmods"),
        "{point} still favours dynmods: {root_before}"
    );
    let _daemon = Daemon::start();
    let (_, mount_after, root_after) = cgroup2_mount();
    let after: BTreeSet<&str> = root_after.split(',').collect();
    assert!(after.contains("favordynmods"), "{point}: {root_after}");
    for option in root_before.split(',') {
        assert!(after.contains(option), "{option} lost: {root_after}");
    }
    assert_eq!(mount_after, mount_before, "{point}'s own flags changed");
}

#[test]
fn systemd_units_verify() {
    let Ok(analyze) = which("systemd-analyze") else {
        common::skip!(
            common::Reason::MissingTool,
            "systemd-analyze is not installed"
        );
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    for unit in ["sandboxd.service", "sandboxd.socket"] {
        let text = std::fs::read_to_string(units.join(unit)).expect("unit");
        // Verify against the binary this test run built, not an installed one.
        let text = text.replace("/usr/local/bin/sandboxd", common::DAEMON);
        std::fs::write(dir.path().join(unit), text).expect("write");
    }
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(dir.path().join("sandboxd.service"))
        .arg(dir.path().join("sandboxd.socket"))
        .output()
        .expect("systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

fn which(name: &str) -> Result<String, ()> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| format!("{d}/{name}"))
        .find(|p| Path::new(p).exists())
        .ok_or(())
}

/// What the host holds for sandboxes: cgroups, supervisors, run dirs, layers.
fn inventory(daemon: &Daemon) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    let parent =
        common::cgroup::daemon_group(&common::cgroup::hierarchy("pids"), &daemon.cgroup_parent());
    // Supervisors sit in this daemon's own `<cgroup_parent>/supervisors`,
    // beside the standbys started ahead of creates (counted apart: they
    // come and go with the creates).
    let in_group = common::cgroup::procs_in(&parent.join("supervisors"));
    // Listed after the group: a standby that joined it since is one too.
    let standbys = daemon.standby_pids();
    let supervisors = in_group
        .into_iter()
        .filter(|pid| !standbys.contains(pid))
        .count();
    items.insert(format!("supervisors {supervisors}"));
    for group in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = group.file_name().to_string_lossy().into_owned();
        if name.starts_with("sb-") {
            items.insert(format!("cgroup {name}"));
        }
    }
    for dir in std::fs::read_dir(daemon.run_dir().join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = dir.file_name().to_string_lossy().into_owned();
        // Network slots, made ahead of creates, are counted apart too, and
        // the seccomp program the daemon shares is no sandbox's.
        if !common::is_daemons_run_entry(&name) {
            items.insert(format!("run {name}"));
        }
    }
    for layer in std::fs::read_dir(daemon.state_dir().join("disk"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = layer.file_name().to_string_lossy().into_owned();
        if name.starts_with("sb-") {
            items.insert(format!("layer {name}"));
        }
    }
    let run = daemon.run_dir().display().to_string();
    let own = common::mounts::own_namespace();
    let layers = format!("upperdir={}/", daemon.state_dir().join("disk").display());
    for mount in common::mounts::everywhere() {
        if mount.namespace == own {
            if mount.point.starts_with(&run) && !mount.point.contains("/.slot-") {
                items.insert(format!("mount {}", mount.point));
            }
            continue;
        }
        // A root, mounted in its container's namespace alone.
        let id = mount
            .super_options
            .split(',')
            .find_map(|o| o.strip_prefix(&layers))
            .and_then(|rest| rest.strip_suffix("/upper"));
        if let Some(id) = id {
            items.insert(format!("root {id}"));
        }
    }
    items
}

fn expected_inventory(daemon: &Daemon, ids: &[String]) -> BTreeSet<String> {
    let run = daemon.run_dir();
    let supervisors = format!("supervisors {}", ids.len());
    ids.iter()
        .flat_map(|id| {
            [
                format!("cgroup {id}"),
                format!("run {id}"),
                format!("layer {id}"),
                format!(
                    "mount {}",
                    run.join("sandboxes").join(id).join("netns").display()
                ),
                // Mounted where only the container sees it.
                format!("root {id}"),
            ]
        })
        .chain([supervisors])
        .collect()
}

#[tokio::test]
async fn sigkill_during_creates_loses_no_ready_sandbox_and_leaves_nothing_half_made() {
    require_host!();
    let mut daemon = Daemon::start();
    // Five sandboxes with a process each that prints, then waits for stdin.
    let mut running = Vec::new();
    for _ in 0..5 {
        let id = daemon.create(json!({"image": "busybox"})).await;
        let proc = daemon
            .start_process(&id, json!({"argv": ["sh", "-c", "echo first; read line; echo \"got $line\""], "stdin": true}))
            .await;
        running.push((id, proc));
    }
    // Twenty creates in flight; the daemon dies once a few have answered.
    let socket = daemon.socket.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..20 {
        let socket = socket.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let body = json!({"image": "busybox"}).to_string().into_bytes();
            let answer = common::http(&socket, Method::POST, "/v1/sandboxes", body).await;
            let _ = tx.send(answer);
        });
    }
    drop(tx);
    let mut ready: Vec<String> = Vec::new();
    let mut answered = 0;
    while answered < 3 {
        let Some(answer) = rx.recv().await else { break };
        answered += 1;
        if let Some((StatusCode::CREATED, body)) = answer {
            let sandbox: Value = serde_json::from_slice(&body).expect("json");
            ready.push(sandbox["id"].as_str().expect("id").to_string());
        }
    }
    daemon.kill(nix::sys::signal::Signal::SIGKILL);
    while let Some(answer) = rx.recv().await {
        if let Some((StatusCode::CREATED, body)) = answer {
            let sandbox: Value = serde_json::from_slice(&body).expect("json");
            ready.push(sandbox["id"].as_str().expect("id").to_string());
        }
    }
    daemon.restart();

    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    let listed: BTreeSet<String> = list["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|s| s["state"] == "ready")
        .filter_map(|s| s["id"].as_str().map(String::from))
        .collect();
    for id in ready.iter().chain(running.iter().map(|(id, _)| id)) {
        assert!(
            listed.contains(id),
            "ready sandbox {id} was lost; have {listed:?}"
        );
    }
    // Nothing half-made: every listed sandbox is complete, nothing else exists.
    let all_ids: Vec<String> = listed.iter().cloned().collect();
    assert_eq!(inventory(&daemon), expected_inventory(&daemon, &all_ids));

    // The running processes still run and stream.
    for (id, proc) in &running {
        let (status, _) = daemon
            .raw(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
                b"hello\n".to_vec(),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let out = daemon.output(id, *proc).await;
        assert_eq!(out.out(), "first\ngot hello\n");
    }
    for id in &all_ids {
        let run = daemon.sh(id, "echo ok").await;
        assert_eq!(run.out(), "ok\n");
        daemon.delete(id).await;
    }
    assert_eq!(inventory(&daemon), expected_inventory(&daemon, &[]));
    let _ = Duration::from_secs(0);
}

#[tokio::test]
async fn a_retried_create_with_the_same_idempotency_key_returns_the_same_sandbox() {
    require_host!();
    let daemon = Daemon::start();
    let body = json!({"image": "busybox", "idempotency_key": "job-42"});
    let first = daemon.create(body.clone()).await;
    let (status, again) = daemon
        .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
        .await;
    assert!(status.is_success(), "{again}");
    assert_eq!(again["id"], first.as_str());
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(1));
    daemon.delete(&first).await;
    let second = daemon.create(body).await;
    assert_ne!(second, first, "a deleted sandbox's key starts a new create");
}

#[tokio::test]
async fn a_retried_create_whose_first_attempt_failed_gets_the_same_error() {
    require_host!();
    let daemon = Daemon::start_with(&["--max-sandboxes", "1"]);
    let body = json!({"image": "no-such-image-idem", "idempotency_key": "job-failed"});
    let (status, first) = daemon
        .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{first}");
    assert_eq!(first["error"]["code"], "image_not_found", "{first}");
    let (again_status, again) = daemon
        .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
        .await;
    assert_eq!(again_status, status, "not a sandbox: {again}");
    assert_eq!(again, first, "the same code and message");
    // A full host's 503 made nothing and means "not now": once room is
    // made, a retry with the same key is a new attempt, and it succeeds.
    let filler = daemon.create(json!({"image": "busybox"})).await;
    let full = json!({"image": "busybox", "idempotency_key": "job-full"});
    let (status, first) = daemon
        .call(Method::POST, "/v1/sandboxes", Some(full.clone()))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{first}");
    daemon.delete(&filler).await;
    let (again_status, again) = daemon.call(Method::POST, "/v1/sandboxes", Some(full)).await;
    assert_eq!(again_status, StatusCode::CREATED, "{again}");
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "only the retried create's sandbox: {list}"
    );
    daemon.delete(again["id"].as_str().expect("id")).await;
    // The failed key with another body is a reuse, not a retry.
    let (status, other) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox", "idempotency_key": "job-failed"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{other}");
    assert_eq!(other["error"]["code"], "idempotency_key_reused", "{other}");
}

#[tokio::test]
async fn the_same_idempotency_key_with_another_body_is_a_conflict() {
    require_host!();
    let daemon = Daemon::start();
    let first = daemon
        .create(json!({"image": "busybox", "idempotency_key": "job-7", "labels": {"a": "1"}}))
        .await;
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox", "idempotency_key": "job-7", "labels": {"a": "2"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_key_reused", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&first),
        "names the key's sandbox: {message}"
    );
    assert!(message.contains("another request body"), "{message}");
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    daemon.delete(&first).await;
}

/// This daemon's sandbox cgroups in every hierarchy, as `hierarchy/id`.
fn sandbox_cgroups(daemon: &Daemon) -> BTreeSet<String> {
    let parent = daemon.cgroup_parent();
    let mut groups = BTreeSet::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = hierarchy.path().join(parent.trim_start_matches('/'));
        for group in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = group.file_name().to_string_lossy().into_owned();
            if name.starts_with("sb-") {
                groups.insert(format!(
                    "{}/{name}",
                    hierarchy.file_name().to_string_lossy()
                ));
            }
        }
    }
    groups
}

/// Supervisors of this daemon's sandboxes, found by their command line
/// (`sandboxd supervise <run dir>/sandboxes/<id>`, or `sandboxd supervise
/// --standby ... <run dir>/sandboxes` once handed a sandbox) wherever their
/// cgroup.
fn supervisor_processes(daemon: &Daemon) -> BTreeSet<String> {
    let run = daemon.run_dir().display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
            let args: Vec<&str> = cmdline.split('\0').collect();
            // Not the daemon, whose flags name the run dir too.
            let supervisor = args
                .iter()
                .position(|a| *a == "supervise" || *a == "shim")
                .is_some_and(|at| args[at + 1..].iter().any(|a| a.starts_with(&run)));
            // Standbys waiting are told apart process by process: a list
            // read before the scan misses one started during it (a CI run
            // counted such a standby as a third supervisor).
            (supervisor && !common::is_waiting_standby(pid, &args, &run)).then(|| {
                let stdin = std::fs::read_link(e.path().join("fd/0")).unwrap_or_default();
                format!(
                    "{} {} (stdin {})",
                    e.file_name().to_string_lossy(),
                    args.join(" "),
                    stdin.display()
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn sigterm_with_stop_sandboxes_on_exit_tears_every_sandbox_down() {
    require_host!();
    let mut daemon = Daemon::start_with(&["--stop-sandboxes-on-exit", "true"]);
    let idle = daemon.create(json!({"image": "busybox"})).await;
    let busy = daemon.create(json!({"image": "busybox"})).await;
    // A process left running must not keep its sandbox alive.
    let proc = daemon
        .start_process(&busy, json!({"argv": ["sleep", "1000"]}))
        .await;
    let (_, process) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{busy}/processes/{proc}"),
            None,
        )
        .await;
    assert_eq!(process["state"], "running", "{process}");
    let ids = [idle.clone(), busy.clone()];

    // Positive controls: before the stop, the same checks find both, and
    // what the daemon makes ahead of creates is there.
    assert_eq!(inventory(&daemon), expected_inventory(&daemon, &ids));
    daemon.made_ahead(1, 1).await;
    // Listed with their arguments and stdin: the count alone would not
    // say which one is too many.
    let supervisors = supervisor_processes(&daemon);
    assert_eq!(
        supervisors.len(),
        2,
        "{supervisors:#?}\nstandbys waiting: {:?}",
        daemon.standby_pids()
    );
    let cgroups = sandbox_cgroups(&daemon);
    for id in &ids {
        assert!(
            cgroups.iter().any(|g| g.ends_with(&format!("/{id}"))),
            "{id} not in {cgroups:?}"
        );
    }
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );

    let status = daemon
        .stop(nix::sys::signal::Signal::SIGTERM)
        .expect("the daemon was running");
    let log = daemon.log();
    let supervisors = supervisor_processes(&daemon);
    let cgroups = sandbox_cgroups(&daemon);
    let leftovers = inventory(&daemon);
    let slots = daemon.slot_dirs();
    // Standbys end when the stopped daemon's pipes close.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !daemon.standby_pids().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let standbys = daemon.standby_pids();
    // Asserted after the restart, so that a failure still leaves a daemon
    // through which the harness deletes what this one left.
    daemon.restart();
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("every sandbox was torn down"), "{log}");
    assert_eq!(supervisors, BTreeSet::new());
    assert_eq!(cgroups, BTreeSet::new());
    assert_eq!(slots, Vec::<String>::new());
    assert_eq!(standbys, Vec::<i32>::new());
    // Also no run dir, layer or mount left.
    assert_eq!(leftovers, expected_inventory(&daemon, &[]));

    // Nor a record: a fresh daemon on the same state has nothing to adopt.
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    assert_eq!(inventory(&daemon), expected_inventory(&daemon, &[]));
}
