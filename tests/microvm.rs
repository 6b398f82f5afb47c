//! MicroVM sandboxes through the real daemon, on real KVM: `runtime: "vm"`
//! boots the freestanding test guest (vmm/guest, built here with gcc) in a
//! `vmm` process, whose agent answers over vsock with the real protocol. The
//! daemon is only told `vm_kernel`: nothing in it knows this guest.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cgroup, vmm_path, Daemon, Reason};
use hyper::{Method, StatusCode};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Builds the test guest into `dir`, or says why microVM tests cannot run.
fn test_guest(dir: &Path) -> Result<PathBuf, (Reason, String)> {
    if !Path::new("/dev/kvm").exists() {
        return Err((Reason::NoKvm, "no /dev/kvm on this host".into()));
    }
    if !vmm_path().is_file() {
        return Err((
            Reason::MissingBuild,
            format!("{} missing; run cargo build --bins", vmm_path().display()),
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vmm/guest/build.sh");
    let out = std::process::Command::new("sh")
        .arg(script)
        .arg(dir)
        .output()
        .map_err(|e| {
            (
                Reason::MissingTool,
                format!("cannot run the guest build: {e}"),
            )
        })?;
    if !out.status.success() {
        return Err((
            Reason::MissingTool,
            format!(
                "the test guest did not build (is gcc installed?): {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    Ok(dir.join("test-guest.elf"))
}

/// A daemon that boots the test guest for `runtime: "vm"`, or `None` (with
/// the reason printed) where microVMs cannot run.
fn vm_daemon() -> Option<(Daemon, tempfile::TempDir)> {
    vm_daemon_with(&[])
}

/// [`vm_daemon`] with more flags.
fn vm_daemon_with(flags: &[&str]) -> Option<(Daemon, tempfile::TempDir)> {
    if let Some((reason, why)) = common::skip_reason() {
        common::note_skip!(reason, "{why}");
        return None;
    }
    let guest_dir = tempfile::tempdir().expect("tempdir");
    let guest = match test_guest(guest_dir.path()) {
        Ok(g) => g,
        Err((reason, why)) => {
            common::note_skip!(reason, "{why}");
            return None;
        }
    };
    let (guest, vmm) = (
        guest.display().to_string(),
        vmm_path().display().to_string(),
    );
    let mut all = vec!["--vm-kernel", &guest, "--vmm-path", &vmm];
    // A boot template made in the background would outlive the tests'
    // "nothing left" checks: the tests of templates ask for them.
    if !flags.contains(&"--vm-boot-templates") {
        all.extend(["--vm-boot-templates", "false"]);
    }
    all.extend_from_slice(flags);
    let daemon = Daemon::start_with(&all);
    Some((daemon, guest_dir))
}

/// Creates a 32 MiB microVM of the busybox image (asserting 201).
async fn small_vm(daemon: &Daemon) -> String {
    daemon
        .create(json!({"runtime": "vm", "image": "busybox", "memory_mib": 32}))
        .await
}

/// The host pids in a sandbox's memory cgroup (a microVM: its vmm).
fn cgroup_pids(id: &str) -> Vec<i32> {
    controller_pids("memory", id)
}

/// The host pids in a sandbox's group of `controller` (on v2 every
/// controller names the one unified group).
fn controller_pids(controller: &str, id: &str) -> Vec<i32> {
    cgroup::procs(controller, id)
}

fn process_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test]
async fn a_vm_sandbox_runs_processes_and_disk_io_through_its_agent() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let id = daemon
        .create(json!({"runtime": "vm", "image": "busybox", "cpu": 2, "memory_mib": 64}))
        .await;
    let (status, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["runtime"], "vm");
    assert_eq!(view["state"], "ready");

    let run = daemon
        .exec(&id, &["echo", "hello", "from", "a", "vm"])
        .await;
    assert_eq!(run.out(), "hello from a vm\n");
    assert_eq!(run.exit_code(), Some(0));
    // cpu 2 -> 2 vCPUs; memory_mib -> guest RAM, its last byte usable.
    assert_eq!(daemon.exec(&id, &["vcpus"]).await.out(), "2\n");
    assert_eq!(
        daemon.exec(&id, &["mem"]).await.out(),
        "mem_mib=64 top=ok\n"
    );
    // Disk 0 is the image as ext4 (its superblock magic), read-only; disk 1
    // is the sandbox's scratch disk and keeps what is written.
    assert_eq!(
        daemon
            .exec(&id, &["disk-read", "0", "2", "56", "2"])
            .await
            .out(),
        "53ef\n"
    );
    let refused = daemon.exec(&id, &["disk-write", "0", "0", "x"]).await;
    assert_eq!(refused.exit_code(), Some(1), "{}", refused.err());
    let wrote = daemon.exec(&id, &["disk-write", "1", "9", "hello"]).await;
    assert_eq!(wrote.out(), "status=0\n");
    assert_eq!(
        daemon
            .exec(&id, &["disk-read", "1", "9", "0", "5"])
            .await
            .out(),
        "68656c6c6f\n"
    );
    assert_eq!(daemon.exec(&id, &["exit", "7"]).await.exit_code(), Some(7));
    // A program the guest does not have is refused as in a container.
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"argv": ["python3", "-c", "1"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // The VMM runs in the sandbox's cgroups, with guest RAM plus the stated
    // overhead as its memory limit, in the sandbox's own network namespace.
    let pids = cgroup_pids(&id);
    assert_eq!(pids.len(), 1, "one vmm process: {pids:?}");
    let vmm = pids[0];
    assert_eq!(process_name(vmm), "vmm");
    // CPU accounting and the pids and freezer groups hold it too.
    for controller in ["cpuacct", "pids", "freezer"] {
        assert_eq!(controller_pids(controller, &id), vec![vmm], "{controller}");
    }
    let limit = cgroup::memory_limit(&id).expect("a memory limit");
    assert_eq!(limit, (64 + 32) << 20);
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("netns");
    assert_ne!(ns(&vmm.to_string()), ns("self"));
    let console = daemon
        .run_dir()
        .join("sandboxes")
        .join(&id)
        .join("vm/console.log");
    let console = std::fs::read_to_string(&console).unwrap_or_default();
    assert!(
        console.contains("guest: up vcpus=2 mem_mib=64"),
        "{console}"
    );

    daemon.delete(&id).await;
    assert!(
        !Path::new(&format!("/proc/{vmm}")).exists(),
        "the vmm outlived its sandbox"
    );
    assert!(!cgroup::sandbox_dir("memory", &id).exists());
    assert!(!cgroup::sandbox_dir("pids", &id).exists());
}

/// A layered image (here one built from a spec over busybox) boots as one
/// disk: its layers merged, with the build's file in it.
#[tokio::test]
async fn a_built_image_boots_from_one_merged_disk() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let nonce = hex::encode(rand::random::<[u8; 6]>());
    let spec = json!({"base": "busybox", "commands": [format!("echo {nonce} > /marker")]});
    let id = daemon
        .create(json!({"runtime": "vm", "image": spec, "memory_mib": 32}))
        .await;
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(view["runtime"], "vm", "{view}");
    let digest = view["image_digest"].as_str().expect("digest");
    let disk = common::images_dir()
        .join("vm-disks")
        .join(format!("{}.ext4", digest.trim_start_matches("sha256:")));
    let cat = |path: &str| {
        let out = std::process::Command::new("debugfs")
            .args(["-R", &format!("cat {path}")])
            .arg(&disk)
            .output()
            .expect("debugfs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(cat("/marker"), format!("{nonce}\n"), "{}", disk.display());
    assert!(
        !cat("/bin/busybox").is_empty(),
        "the base's files are there too"
    );
    daemon.delete(&id).await;
    // The disk is this run's alone (its nonce): not left in the shared cache.
    let mut lock = disk.clone().into_os_string();
    lock.push(".lock");
    for file in [disk.clone(), PathBuf::from(lock)] {
        std::fs::remove_file(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}

#[tokio::test]
async fn killing_a_vmm_fails_only_its_sandbox() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let victim = small_vm(&daemon).await;
    let bystander = small_vm(&daemon).await;
    let mut events = daemon.follow_events(0).await;
    let pids = cgroup_pids(&victim);
    assert_eq!(pids.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the vmm");
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "failed" && e["sandbox_id"] == victim.as_str()
        })
        .await;
    assert!(
        seen.iter()
            .any(|e| e["kind"] == "failed" && e["sandbox_id"] == victim.as_str()),
        "no failed event: {seen:?}"
    );
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{victim}"), None)
        .await;
    assert_eq!(view["state"], "failed", "{view}");
    assert_eq!(
        daemon
            .exec(&bystander, &["echo", "still", "here"])
            .await
            .out(),
        "still here\n"
    );
    daemon.delete(&victim).await;
    assert!(!cgroup::sandbox_dir("memory", &victim).exists());
    assert!(!daemon.run_dir().join("sandboxes").join(&victim).exists());
    daemon.delete(&bystander).await;
}

#[tokio::test]
async fn ten_vms_at_once() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let creates = (0..10).map(|_| small_vm(&daemon));
    let ids = futures::future::join_all(creates).await;
    let daemon = &daemon;
    let runs = ids
        .iter()
        .enumerate()
        .map(|(i, id)| async move { daemon.exec(id, &["echo", &i.to_string()]).await });
    let outputs = futures::future::join_all(runs).await;
    for (i, run) in outputs.iter().enumerate() {
        assert_eq!(run.out(), format!("{i}\n"));
    }
    let vmms: Vec<i32> = ids.iter().flat_map(|id| cgroup_pids(id)).collect();
    assert_eq!(vmms.len(), 10, "{vmms:?}");
    futures::future::join_all(ids.iter().map(|id| daemon.delete(id))).await;
    for pid in vmms {
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}

#[tokio::test]
async fn vm_requests_that_cannot_work_say_why() {
    require_host!();
    // No guest kernel configured.
    let daemon = Daemon::start();
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"runtime": "vm", "image": "busybox"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "runtime_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    if Path::new("/dev/kvm").exists() {
        assert!(message.contains("vm_kernel"), "{message}");
    }
    drop(daemon);

    // A kernel path that does not exist.
    let daemon = Daemon::start_with(&["--vm-kernel", "/nonexistent/vmlinux"]);
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"runtime": "vm", "image": "busybox"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    if Path::new("/dev/kvm").exists() {
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("/nonexistent/vmlinux")),
            "{body}"
        );
    }
    drop(daemon);

    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    for (request, code) in [
        (
            json!({"runtime": "vm", "image": "busybox", "gpu": "any"}),
            "gpu_unsupported_runtime",
        ),
        (
            json!({"runtime": "vm", "image": "busybox", "memory_mib": 1u64 << 40}),
            "",
        ),
    ] {
        let (status, body) = daemon
            .call(Method::POST, "/v1/sandboxes", Some(request.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        if !code.is_empty() {
            assert_eq!(body["error"]["code"], code, "{request}: {body}");
        }
    }
    // The test guest's agent speaks protocol 2, as an agent restored from
    // a snapshot of a build before groups and per-process confinement
    // does: it would read past them, so a process asking for them is
    // refused, not run without them.
    let id = small_vm(&daemon).await;
    assert_eq!(daemon.exec(&id, &["echo", "plain"]).await.out(), "plain\n");
    for confinement in [
        json!({"capabilities": []}),
        json!({"oom_score_adj": 10}),
        json!({"groups": [10]}),
    ] {
        let mut body = json!({"argv": ["echo", "confined"]});
        body.as_object_mut()
            .expect("object")
            .extend(confinement.as_object().cloned().unwrap_or_default());
        let message = daemon.refused_process(&id, body, "invalid_request").await;
        assert!(
            message.contains("speaks protocol 2"),
            "{confinement}: {message}"
        );
    }
    // A kernel file that is not a kernel: the VMM refuses it and the create
    // fails with its reason, at once, leaving nothing behind.
    let bogus = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(bogus.path(), b"not an ELF image").expect("write");
    drop(daemon);
    let daemon = Daemon::start_with(&[
        "--vm-kernel",
        &bogus.path().display().to_string(),
        "--vmm-path",
        &vmm_path().display().to_string(),
    ]);
    let started = std::time::Instant::now();
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"runtime": "vm", "image": "busybox"})),
        )
        .await;
    assert!(status.is_server_error(), "{status}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("VMM exited") && m.contains("ELF")),
        "{body}"
    );
    assert!(
        started.elapsed() < WAIT,
        "the failure took {:?}",
        started.elapsed()
    );
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}

/// Takes a snapshot of `kind` (asserting 201); returns its id.
async fn count(daemon: &Daemon, id: &str) -> String {
    let run = daemon.exec(id, &["count"]).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    run.out()
}

#[tokio::test]
async fn a_vm_memory_snapshot_forks_into_vms_that_continue_from_it() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let source = small_vm(&daemon).await;
    for n in 1..=3 {
        assert_eq!(count(&daemon, &source).await, format!("count={n}\n"));
    }
    let wrote = daemon
        .exec(&source, &["disk-write", "1", "5", "before"])
        .await;
    assert_eq!(wrote.out(), "status=0\n");
    let snap = daemon.snapshot(&source, "memory").await;

    // The source runs on from where it stood, and writes on.
    assert_eq!(count(&daemon, &source).await, "count=4\n");
    let wrote = daemon
        .exec(&source, &["disk-write", "1", "5", "after!"])
        .await;
    assert_eq!(wrote.out(), "status=0\n");

    // Two forks: each continues from the snapshot's counter and disk, then
    // goes its own way.
    let fork_a = daemon.create(json!({"from_snapshot": snap})).await;
    let fork_b = daemon
        .create(json!({"from_snapshot": snap, "runtime": "vm"}))
        .await;
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{fork_a}"), None)
        .await;
    assert_eq!(view["runtime"], "vm", "{view}");
    assert_eq!(count(&daemon, &fork_a).await, "count=4\n");
    assert_eq!(count(&daemon, &fork_b).await, "count=4\n");
    assert_eq!(count(&daemon, &fork_a).await, "count=5\n");
    assert_eq!(count(&daemon, &fork_a).await, "count=6\n");
    assert_eq!(count(&daemon, &fork_b).await, "count=5\n");
    assert_eq!(count(&daemon, &source).await, "count=5\n");
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>() + "\n";
    for (id, text) in [
        (&fork_a, "before"),
        (&fork_b, "before"),
        (&source, "after!"),
    ] {
        let read = daemon.exec(id, &["disk-read", "1", "5", "0", "6"]).await;
        assert_eq!(read.out(), hex(text), "{id}");
    }
    // Each fork's agent took its own fresh seed before it was ready.
    let seed_a = daemon.exec(&fork_a, &["seed"]).await.out();
    let seed_b = daemon.exec(&fork_b, &["seed"]).await.out();
    assert_eq!(seed_a.len(), 33, "{seed_a:?}");
    assert_ne!(seed_a, seed_b);
    assert_eq!(daemon.exec(&source, &["seed"]).await.out(), "none\n");
    // Process ids in a fork continue above the source's at the snapshot.
    let proc = daemon
        .start_process(&fork_b, json!({"argv": ["echo", "x"]}))
        .await;
    assert!(proc > 5, "fork process id {proc}");

    // A fork asking for another runtime is refused.
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": snap, "runtime": "container"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Deleting the snapshot while forks run leaves them running.
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(count(&daemon, &fork_a).await, "count=7\n");
    for id in [&source, &fork_a, &fork_b] {
        daemon.delete(id).await;
    }
    let images = daemon.state_dir().join("snapshot-images").join(&snap);
    assert!(
        !images.exists(),
        "{} outlived its last fork",
        images.display()
    );
}

/// The ids of the snapshots whose memory the daemon keeps (boot templates
/// and the API's alike).
fn memory_snapshot_ids(daemon: &Daemon) -> Vec<String> {
    let dir = daemon.state_dir().join("snapshot-images");
    let mut ids: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// The ids `GET /v1/snapshots` lists.
async fn listed_snapshots(daemon: &Daemon) -> Vec<String> {
    let (status, list) = daemon.call(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["snapshots"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// After a create boots an image at a size for the first time, the daemon
/// makes a boot template of it while idle; later creates of that image
/// and size are forks of it, each with its own seed, counter, CPU quota and
/// egress policy. The template is not the API's snapshot; a template whose
/// fork fails is dropped and the create boots; a clean stop removes it.
#[tokio::test]
async fn vm_creates_fork_from_a_boot_template_of_their_image_and_size() {
    let Some((mut daemon, _guest)) = vm_daemon_with(&[
        "--vm-boot-templates",
        "true",
        "--default-image",
        "busybox",
        "--default-memory-mib",
        "32",
    ]) else {
        return;
    };
    let metric =
        |result: &str| format!("sandboxd_vm_boot_template_creates_total{{result=\"{result}\"}} ");
    let templates_ready = "sandboxd_vm_boot_templates ";
    let first = daemon.create(json!({"runtime": "vm"})).await;
    assert_eq!(daemon.metric(&metric("miss")).await, 1.0);
    // Booted, not forked: its agent never took a fork's seed.
    assert_eq!(daemon.exec(&first, &["seed"]).await.out(), "none\n");
    daemon.await_metric(templates_ready).await;
    let templates = memory_snapshot_ids(&daemon);
    assert_eq!(templates.len(), 1, "{templates:?}");
    let template = &templates[0];
    assert!(listed_snapshots(&daemon).await.is_empty());
    let (status, body) = daemon
        .call(Method::GET, &format!("/v1/snapshots/{template}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": template})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    let mut events = daemon.follow_events(0).await;
    // Half a CPU boots one vCPU, as the template did; an open policy where
    // the default blocks.
    let a = daemon
        .create(
            json!({"runtime": "vm", "cpu": 0.5, "cpu_shares": 512, "block_network": false, "labels": {"team": "a"}}),
        )
        .await;
    let b = daemon.create(json!({"runtime": "vm"})).await;
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "ready" && e["sandbox_id"] == b.as_str()
        })
        .await;
    for id in [&a, &b] {
        let created: Vec<&serde_json::Value> = seen
            .iter()
            .filter(|e| e["kind"] == "created" && e["sandbox_id"] == id.as_str())
            .collect();
        assert_eq!(created.len(), 1, "{seen:?}");
        assert_eq!(created[0]["detail"], "from a boot template", "{seen:?}");
    }
    assert_eq!(daemon.metric(&metric("hit")).await, 2.0);
    // Each fork starts from the template's idle guest and goes its own way.
    assert_eq!(count(&daemon, &a).await, "count=1\n");
    assert_eq!(count(&daemon, &a).await, "count=2\n");
    assert_eq!(count(&daemon, &b).await, "count=1\n");
    let seed_a = daemon.exec(&a, &["seed"]).await.out();
    let seed_b = daemon.exec(&b, &["seed"]).await.out();
    assert_eq!(seed_a.len(), 33, "{seed_a:?}");
    assert_ne!(seed_a, seed_b);
    assert_eq!(daemon.exec(&a, &["vcpus"]).await.out(), "1\n");
    assert_eq!(daemon.exec(&a, &["mem"]).await.out(), "mem_mib=32 top=ok\n");
    let (quota, period) = cgroup::cpu_max(&a);
    assert_eq!(quota.map(|q| q * 2), Some(period), "half a CPU");
    // The fork's own weight; the other fork keeps the default.
    assert_eq!(cgroup::cpu_weight(&a), cgroup::weight_of_shares(512));
    assert_eq!(cgroup::cpu_weight(&b), cgroup::weight_of_shares(1024));
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{a}"), None)
        .await;
    assert_eq!(view["labels"]["team"], "a", "{view}");
    // The fork's open policy: the proxy holds the connection open.
    let run = daemon.exec(&a, &["net-connect", "10.1.2.3", "443"]).await;
    assert_eq!(run.out(), "open to 10.1.2.3:443\n", "{}", run.err());

    // A snapshot of a fork stacks on the template; it alone is listed,
    // and forks of it continue from it.
    let snap = daemon.snapshot(&a, "memory").await;
    assert_eq!(listed_snapshots(&daemon).await, vec![snap.clone()]);
    let grandchild = daemon.create(json!({"from_snapshot": snap})).await;
    assert_eq!(count(&daemon, &grandchild).await, "count=3\n");
    // It keeps its parent's weight; naming another (the default
    // included) is a conflict, naming the same one is not.
    assert_eq!(
        cgroup::cpu_weight(&grandchild),
        cgroup::weight_of_shares(512)
    );
    for shares in [1024, 2048] {
        let (status, body) = daemon
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"from_snapshot": snap, "cpu_shares": shares})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shares}: {body}");
        assert_eq!(body["error"]["code"], "snapshot_conflict", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("limits")),
            "{body}"
        );
    }
    let same = daemon
        .create(json!({"from_snapshot": snap, "cpu_shares": 512}))
        .await;
    assert_eq!(cgroup::cpu_weight(&same), cgroup::weight_of_shares(512));
    daemon.delete(&same).await;

    for id in [&a, &b, &grandchild] {
        daemon.delete(id).await;
    }
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // A template whose fork fails (its memory file altered) is dropped,
    // and the create boots instead, under another id than the failure's.
    let memory = daemon
        .state_dir()
        .join("snapshot-images")
        .join(template)
        .join("memory");
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&memory)
            .expect("open the template's memory");
        file.write_all_at(b"altered", 4096).expect("alter it");
    }
    let mut events = daemon.follow_events(0).await;
    let booted = daemon.create(json!({"runtime": "vm"})).await;
    assert_eq!(daemon.metric(&metric("failed")).await, 1.0);
    assert_eq!(daemon.exec(&booted, &["seed"]).await.out(), "none\n");
    assert_eq!(daemon.metric(templates_ready).await, 0.0);
    assert_eq!(memory_snapshot_ids(&daemon), Vec::<String>::new());
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "ready" && e["sandbox_id"] == booted.as_str()
        })
        .await;
    let failed: Vec<&serde_json::Value> = seen.iter().filter(|e| e["kind"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{seen:?}");
    assert_ne!(failed[0]["sandbox_id"], booted.as_str(), "{seen:?}");

    // Another size is another template, made after its first boot.
    let other = daemon
        .create(json!({"runtime": "vm", "memory_mib": 64}))
        .await;
    assert_eq!(daemon.metric(&metric("miss")).await, 2.0);
    assert_eq!(
        daemon.exec(&other, &["mem"]).await.out(),
        "mem_mib=64 top=ok\n"
    );
    daemon.await_metric(templates_ready).await;
    assert_eq!(memory_snapshot_ids(&daemon).len(), 1);
    // A daemon that did not stop cleanly left it: the next drops it as it
    // starts (it may boot another kernel or agent), and adopts the VMs.
    daemon.kill(nix::sys::signal::Signal::SIGKILL);
    daemon.restart();
    assert_eq!(memory_snapshot_ids(&daemon), Vec::<String>::new());
    assert_eq!(count(&daemon, &other).await, "count=1\n");
    // The restarted daemon makes the 64 MiB one again after its next
    // boot; an image prune drops it (a cache of the daemon's own).
    let again = daemon
        .create(json!({"runtime": "vm", "memory_mib": 64}))
        .await;
    assert_eq!(daemon.exec(&again, &["seed"]).await.out(), "none\n");
    daemon.await_metric(templates_ready).await;
    assert_eq!(memory_snapshot_ids(&daemon).len(), 1);
    let (status, body) = daemon.call(Method::POST, "/v1/images/prune", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(daemon.metric(templates_ready).await, 0.0);
    assert_eq!(memory_snapshot_ids(&daemon), Vec::<String>::new());
    // A clean stop drops the templates too.
    let last = daemon
        .create(json!({"runtime": "vm", "memory_mib": 64}))
        .await;
    assert_eq!(daemon.exec(&last, &["seed"]).await.out(), "none\n");
    daemon.await_metric(templates_ready).await;
    assert_eq!(memory_snapshot_ids(&daemon).len(), 1);
    for id in [&first, &booted, &other, &again, &last] {
        daemon.delete(id).await;
    }
    daemon.stop(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(memory_snapshot_ids(&daemon), Vec::<String>::new());
}

#[tokio::test]
async fn a_vm_filesystem_snapshot_becomes_an_image() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let source = small_vm(&daemon).await;
    let wrote = daemon
        .exec(&source, &["disk-write", "1", "7", "keep"])
        .await;
    assert_eq!(wrote.out(), "status=0\n");
    let snap = daemon.snapshot(&source, "filesystem").await;
    // Written after the snapshot: not in it.
    daemon
        .exec(&source, &["disk-write", "1", "7", "gone"])
        .await;

    let child = daemon
        .create(json!({"runtime": "vm", "image": snap, "memory_mib": 32}))
        .await;
    let read = daemon
        .exec(&child, &["disk-read", "1", "7", "0", "4"])
        .await;
    assert_eq!(read.out(), "6b656570\n", "the snapshot's disk");
    // The image underneath is the source's.
    assert_eq!(
        daemon
            .exec(&child, &["disk-read", "0", "2", "56", "2"])
            .await
            .out(),
        "53ef\n"
    );
    // The child's writes are its own.
    daemon.exec(&child, &["disk-write", "1", "7", "mine"]).await;
    let again = daemon
        .create(json!({"runtime": "vm", "image": snap, "memory_mib": 32}))
        .await;
    let read = daemon
        .exec(&again, &["disk-read", "1", "7", "0", "4"])
        .await;
    assert_eq!(read.out(), "6b656570\n");

    // Only microVMs can start from a microVM's disk.
    let (status, body) = daemon
        .call(Method::POST, "/v1/sandboxes", Some(json!({"image": snap})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_image", "{body}");

    for id in [&source, &child, &again] {
        daemon.delete(id).await;
    }
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_vm_reaches_the_egress_proxy_through_its_tap() {
    let Some((daemon, _guest)) = vm_daemon() else {
        return;
    };
    let id = small_vm(&daemon).await;
    // A SYN to a public address is answered by the sandbox's namespace (its
    // nftables redirect every TCP connection arriving on the tap to the
    // egress proxy), with the address the guest dialled: nothing left the
    // host, and the guest cannot tell.
    let run = daemon.exec(&id, &["net-syn", "203.0.113.7", "443"]).await;
    assert_eq!(run.out(), "synack from 203.0.113.7:443\n", "{}", run.err());

    // That SYN-ACK is no way out: the destination is refused. Once the
    // handshake completes the proxy has the connection and its original
    // destination, and under the default policy (block) it closes it
    // before a byte goes either way, and logs the refusal.
    let run = daemon
        .exec(&id, &["net-connect", "203.0.113.7", "443"])
        .await;
    assert_eq!(run.out(), "closed by 203.0.113.7:443\n", "{}", run.err());
    let entries = daemon.egress_log(&id).await;
    assert!(
        entries.iter().any(|e| e["verdict"] == "refused"
            && e["host"] == "203.0.113.7"
            && e["port"] == 443
            && e["bytes"] == 0
            && e["reason"] == "block_network is set"),
        "no refusal of 203.0.113.7:443 in {entries:?}"
    );
    assert!(
        entries.iter().all(|e| e["verdict"] != "allowed"),
        "{entries:?}"
    );
    daemon.delete(&id).await;
}

/// A microVM pool serves `runtime: "vm"` creates of its image and size:
/// the claim gets a VM that booted before it asked, with its own egress
/// policy and CPU quota put in force; a create of another size boots cold.
#[tokio::test]
async fn a_vm_pool_hands_out_booted_vms_of_its_size_with_the_claims_policy() {
    let Some((mut daemon, _guest)) = vm_daemon_with(&[
        "--vm-pool-size",
        "1",
        "--default-image",
        "busybox",
        "--default-cpu",
        "1",
        "--default-memory-mib",
        "64",
    ]) else {
        return;
    };
    let health = daemon.pool_reaches(1).await;
    assert_eq!(health["sandboxes"], 0, "{health}");
    // The pooled VM outlives a killed daemon and is pooled again by the
    // next one (which then boots no other): the claim below gets it.
    let pooled = daemon.sandbox_run_dirs();
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    daemon.kill(nix::sys::signal::Signal::SIGKILL);
    daemon.restart();
    daemon.pool_reaches(1).await;
    let mut events = daemon.follow_events(0).await;
    // Half a CPU still boots one vCPU; an open policy instead of the
    // pooled VM's blocked one.
    let id = daemon
        .create(
            json!({"runtime": "vm", "cpu": 0.5, "block_network": false, "labels": {"team": "a"}}),
        )
        .await;
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "ready" && e["sandbox_id"] == id.as_str()
        })
        .await;
    let created: Vec<&serde_json::Value> = seen
        .iter()
        .filter(|e| e["kind"] == "created" && e["sandbox_id"] == id.as_str())
        .collect();
    assert_eq!(created.len(), 1, "{seen:?}");
    assert_eq!(created[0]["detail"], "from the warm pool", "{seen:?}");
    assert_eq!(id, pooled[0], "the VM pooled before the restart");
    let hit = "sandboxd_pool_claims_total{runtime=\"vm\",image=\"busybox\",result=\"hit\"} ";
    assert_eq!(daemon.metric(hit).await, 1.0);
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(view["runtime"], "vm");
    assert_eq!(view["labels"]["team"], "a");
    assert_eq!(daemon.exec(&id, &["vcpus"]).await.out(), "1\n");
    assert_eq!(
        daemon.exec(&id, &["mem"]).await.out(),
        "mem_mib=64 top=ok\n"
    );
    let (quota, period) = cgroup::cpu_max(&id);
    assert_eq!(quota.map(|q| q * 2), Some(period), "half a CPU");
    // The claim's open policy is in force: where the pooled VM's blocked
    // one closed every connection at once, the proxy now holds it open
    // (waiting for a TLS or HTTP host name), then refuses the private
    // address for what it is.
    let run = daemon.exec(&id, &["net-connect", "10.1.2.3", "443"]).await;
    assert_eq!(run.out(), "open to 10.1.2.3:443\n", "{}", run.err());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let entries = daemon.egress_log(&id).await;
        let refused: Vec<&serde_json::Value> = entries
            .iter()
            .filter(|e| e["verdict"] == "refused" && e["host"] == "10.1.2.3")
            .collect();
        if let Some(entry) = refused.first() {
            assert_ne!(entry["reason"], "block_network is set", "{entries:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal of 10.1.2.3: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Another memory size is not the pool's: it boots cold, and the pool
    // (refilled behind the claim) keeps its VM.
    daemon.pool_reaches(1).await;
    let unfit = "sandboxd_pool_claims_total{runtime=\"vm\",image=\"busybox\",result=\"unfit\"} ";
    let cold = daemon
        .create(json!({"runtime": "vm", "memory_mib": 32}))
        .await;
    assert_eq!(daemon.metric(unfit).await, 1.0);
    assert_eq!(
        daemon.exec(&cold, &["mem"]).await.out(),
        "mem_mib=32 top=ok\n"
    );
    // Nor is a weight of its own: a claim does not reweigh the pooled VM.
    let weighed = daemon
        .create(json!({"runtime": "vm", "cpu_shares": 512}))
        .await;
    assert_eq!(daemon.metric(unfit).await, 2.0);
    assert_eq!(cgroup::cpu_weight(&weighed), cgroup::weight_of_shares(512));
    let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(health["pooled"], 1, "{health}");
    assert_eq!(health["sandboxes"], 3, "{health}");
    for id in [&id, &cold, &weighed] {
        daemon.delete(id).await;
        assert!(!cgroup::sandbox_dir("memory", id).exists());
    }
}

#[tokio::test]
async fn a_vm_sandboxs_port_is_reached_through_the_ingress_over_its_tap() {
    let ingress = common::free_loopback_addr();
    let listen = ingress.to_string();
    let Some((daemon, _guest)) =
        vm_daemon_with(&["--ingress-listen", &listen, "--ingress-domain", "sbx.test"])
    else {
        return;
    };
    let id = small_vm(&daemon).await;
    for port in [8080, 9090] {
        daemon.expose_public(&id, port).await;
    }
    // The guest answers one request on 8080 (the test guest's built-in
    // holds its agent until it has), while the request goes through the
    // ingress, the supervisor's dial from the VM's namespace and the tap.
    let host = format!("{id}-8080.sbx.test");
    let (served, answer) = tokio::join!(
        daemon.exec(&id, &["net-serve", "8080"]),
        common::ingress_get(ingress, &host, WAIT)
    );
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\nserved by the guest\n"),
        "{answer}"
    );
    assert_eq!(served.out(), "served port 8080\n", "{}", served.err());
    // Nothing serves 9090 (the test guest answers no SYN then): a 502
    // that says what the dial met.
    let refused = common::ingress_get(ingress, &format!("{id}-9090.sbx.test"), WAIT).await;
    assert!(refused.starts_with("HTTP/1.1 502"), "{refused}");
    assert!(
        refused.contains("10.201.0.2:9090: no answer within"),
        "{refused}"
    );
    // The guest's own connections still go to the egress proxy, which
    // refuses them under the default policy and logs it.
    let run = daemon.exec(&id, &["net-connect", "10.1.2.3", "443"]).await;
    assert_eq!(run.out(), "closed by 10.1.2.3:443\n", "{}", run.err());
    let entries = daemon.egress_log(&id).await;
    assert!(
        entries
            .iter()
            .any(|e| e["verdict"] == "refused" && e["host"] == "10.1.2.3"),
        "{entries:?}"
    );
    daemon.delete(&id).await;
}
