//! A daemon restart, even by SIGKILL, loses no sandbox: processes keep
//! running under their supervisors, output resumes from an offset, and the
//! restarted daemon can exec and delete as before.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn sigkill_restart_keeps_sandboxes_and_processes() {
    require_host!();
    let mut daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    // Prints one line, then waits for stdin to close before the second.
    let proc = daemon
        .start_process(&id, json!({"argv": ["sh", "-c", "echo before; cat > /dev/null; echo after"], "stdin": true}))
        .await;
    let (status, before) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{proc}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(before["state"], "running");

    daemon.kill(Signal::SIGKILL);
    daemon.restart();

    let (status, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{sandbox}");
    assert_eq!(sandbox["state"], "ready");
    let (_, process) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{proc}"),
            None,
        )
        .await;
    assert_eq!(process["state"], "running");
    assert_eq!(process["pid"], before["pid"]);

    daemon.close_stdin(&id, proc).await;
    // "before\n" is 7 bytes: resuming there yields only what came after.
    let (status, body) = daemon
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{proc}/output?stdout_offset=7"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("\"offset\":7"), "{text}");
    assert!(!text.contains("\"offset\":0"), "{text}");
    let full = daemon.output(&id, proc).await;
    assert_eq!(full.out(), "before\nafter\n");

    let run = daemon.sh(&id, "echo still here").await;
    assert_eq!(run.out(), "still here\n");
    daemon.delete(&id).await;
}

/// A claim from the warm pool returns once the store's journal holds it,
/// before its commit: a daemon SIGKILLed right after still finds the
/// sandbox the caller's (never pooled again, never handed to another), and
/// its refill makes a new one.
#[tokio::test]
async fn a_pool_claim_stays_the_callers_across_a_sigkill_right_after_it() {
    require_host!();
    let mut daemon = Daemon::start_with(&["--pool-size", "1", "--default-image", "busybox"]);
    daemon.pool_reaches(1).await;
    let id = daemon
        .create(json!({"labels": {"team": "a"}, "ttl_seconds": 77}))
        .await;
    daemon.kill(Signal::SIGKILL);
    daemon.restart();

    // It was a claim, and its events outlived the kill with it.
    let seen = daemon
        .follow_events(0)
        .await
        .until(Duration::from_secs(30), |e| {
            e["kind"] == "ready" && e["sandbox_id"] == id.as_str()
        })
        .await;
    let created = seen
        .iter()
        .find(|e| e["kind"] == "created" && e["sandbox_id"] == id.as_str());
    assert_eq!(
        created.map(|e| e["detail"].clone()),
        Some(json!("from the warm pool")),
        "{seen:?}"
    );
    let (status, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{sandbox}");
    assert_eq!(sandbox["state"], "ready");
    assert_eq!(sandbox["labels"]["team"], "a");
    assert_eq!(sandbox["ttl_seconds"], 77);
    let health = daemon.pool_reaches(1).await;
    assert_eq!(health["sandboxes"], 1, "{health}");
    let second = daemon.create(json!({})).await;
    assert_ne!(second, id, "a claimed sandbox was handed out again");
    let run = daemon.sh(&id, "echo mine").await;
    assert_eq!(run.out(), "mine\n");
    daemon.delete(&second).await;
    daemon.delete(&id).await;
}

#[tokio::test]
async fn second_daemon_on_same_state_dir_refuses_to_start() {
    require_host!();
    let daemon = Daemon::start();
    let output = std::process::Command::new(common::DAEMON)
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .arg("--socket")
        .arg(daemon.dir.path().join("other.sock"))
        .arg("--agent-path")
        .arg(common::agent_path())
        .output()
        .expect("run second daemon");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("another sandboxd"), "{stderr}");
}

/// A supervisor of an earlier build (the unversioned protocol) found on
/// restart is not adopted and is sent nothing but the health check: its
/// sandbox shows as failed, naming both versions. Faked by a socket that
/// answers Health as a v0 supervisor did, at the path recovery looks at.
#[tokio::test]
async fn restart_refuses_a_supervisor_of_another_protocol_version() {
    use std::io::{Read, Write};
    require_host!();
    let mut daemon = Daemon::start();
    daemon.kill(Signal::SIGTERM);
    let id = "sb-00000000000f";
    {
        let store =
            sandboxd::store::Store::open(&daemon.state_dir().join("state.redb")).expect("store");
        let record = json!({
            "id": id, "state": "ready", "runtime": "container", "image": "busybox",
            "image_digest": "", "limits": {"cpu": 1.0, "memory_mib": 256, "disk_mib": 1024, "pids": 64},
            "ttl_seconds": -1, "expires_at_ms": null, "created_at": "2024-01-01T00:00:00.000Z",
            "labels": {}, "env": {}, "cgroups_path": format!("{}/{id}", daemon.cgroup_parent()),
            "supervisor_pid": 0, "oom_kills": 0, "failure": null,
        });
        store.put(id, &record).expect("put");
    }
    let dir = daemon.run_dir().join("sandboxes").join(id);
    std::fs::create_dir_all(&dir).expect("run dir");
    let socket = dir.join("shim.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    // The fake runs in this process and a delete SIGKILLs a foreign
    // supervisor: it must be unreachable before the harness deletes the
    // sandbox, a failed assertion included (its thread stays parked in
    // accept until the test binary ends).
    struct Unreachable(std::path::PathBuf);
    impl Drop for Unreachable {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let unreachable = Unreachable(socket.clone());
    // Each request's tag; answers Health (tag 0) as v0 did, nothing else.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let fake = {
        let seen = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut header = [0u8; 4];
                while conn.read_exact(&mut header).is_ok() {
                    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
                    if conn.read_exact(&mut payload).is_err() {
                        break;
                    }
                    let tag = payload.first().copied().unwrap_or(255);
                    seen.lock().expect("seen").push(tag);
                    if tag == 0 {
                        // Tag 0, init_pid 1234, oom_kills 2, no failure, egress zeros.
                        let v0 = [0u8, 0xa4, 0x13, 2, 0, 0, 0, 0, 0, 0, 0, 0];
                        let mut frame = (v0.len() as u32).to_le_bytes().to_vec();
                        frame.extend_from_slice(&v0);
                        let _ = conn.write_all(&frame);
                    } else {
                        break;
                    }
                }
            }
        })
    };
    daemon.restart();
    let (status, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{sandbox}");
    assert_eq!(sandbox["state"], "failed", "{sandbox}");
    let failure = sandbox["failure"].as_str().unwrap_or_default().to_string();
    let this_daemon = format!(
        "unversioned supervisor protocol (v0), this daemon v{}",
        sandboxd::supervisor::protocol::SUPERVISOR_PROTOCOL_VERSION
    );
    assert!(failure.contains(&this_daemon), "{failure}");
    assert!(failure.contains("delete the sandbox"), "{failure}");
    assert!(daemon.log().contains(id), "{}", daemon.log());
    // The API refuses to pass requests on to it.
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"argv": ["true"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("v0"), "{body}");
    assert_eq!(
        *seen.lock().expect("seen"),
        vec![0u8],
        "only the health check"
    );
    drop(unreachable);
    drop(fake);
}

/// A supervisor that stops answering (here SIGSTOPped) does not hold a
/// restart up for long nor outlive its sandbox: recovery finds its health
/// check timed out, kills it and tears its sandbox down, keeping the record
/// as failed; another sandbox, whose supervisor answers, is adopted.
#[tokio::test]
async fn a_supervisor_that_stopped_answering_is_killed_at_recovery() {
    require_host!();
    let mut daemon = Daemon::start();
    let stuck = daemon.create(json!({"image": "busybox"})).await;
    let fine = daemon.create(json!({"image": "busybox"})).await;
    let socket = daemon
        .run_dir()
        .join("sandboxes")
        .join(&stuck)
        .join("shim.sock");
    let peer = std::os::unix::net::UnixStream::connect(&socket).expect("the supervisor's socket");
    let supervisor =
        nix::sys::socket::getsockopt(&peer, nix::sys::socket::sockopt::PeerCredentials)
            .expect("its peer credentials")
            .pid();
    drop(peer);
    let state = |pid: i32| common::proc_stat_field(pid, 3).and_then(|s| s.chars().next());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(supervisor), Signal::SIGSTOP)
        .expect("stop the supervisor");
    // The stop reaches its threads a moment later, and nothing but /proc
    // tells a process that is not the parent.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while state(supervisor) != Some('T') && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        state(supervisor),
        Some('T'),
        "the positive control: it is stopped"
    );

    daemon.kill(Signal::SIGKILL);
    daemon.restart();
    // Gone (or a zombie waiting for its parent): never left stopped.
    assert!(
        matches!(state(supervisor), None | Some('Z')),
        "supervisor {supervisor} is {:?}\n{}",
        state(supervisor),
        daemon.log()
    );
    let (status, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{stuck}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "failed", "{view}");
    assert_eq!(daemon.sh(&fine, "echo adopted").await.out(), "adopted\n");
    daemon.delete(&stuck).await;
    daemon.delete(&fine).await;
}
