//! A daemon restart, even by SIGKILL, loses no sandbox: processes keep
//! running under their supervisors, output resumes from an offset, and the
//! restarted daemon can exec and delete as before.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use nix::sys::signal::Signal;
use serde_json::json;

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

    let (status, _) = daemon
        .raw(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
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
