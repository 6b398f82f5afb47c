//! The event log: ordered events with cursors, process exits from the
//! supervisors, resume after a daemon restart, and the clean-up of a create
//! whose client went away.

mod common;

use std::time::Duration;

use common::Daemon;
use hyper::Method;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(30);

fn kinds_for(events: &[Value], id: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["sandbox_id"] == id)
        .map(|e| e["kind"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn lifecycle_events_in_order_and_resumable_across_restart() {
    require_host!();
    let mut daemon = Daemon::start();
    let mut stream = daemon.follow_events(0).await;
    let id = daemon.create(json!({"image": "busybox"})).await;
    let run = daemon.sh(&id, "exit 4").await;
    assert_eq!(run.exit_code(), Some(4));
    let seen = stream
        .until(WAIT, |e| {
            e["kind"] == "process_exited" && e["sandbox_id"] == id.as_str()
        })
        .await;
    assert_eq!(
        kinds_for(&seen, &id),
        vec!["created", "ready", "process_exited"]
    );
    let exited = seen.last().expect("event");
    assert_eq!(exited["detail"], "exit code 4");
    let cursor = exited["cursor"].as_u64().expect("cursor");

    daemon.kill(nix::sys::signal::Signal::SIGKILL);
    daemon.restart();
    // After the restart, a process that ends is still reported, and the log
    // resumes exactly after the cursor the scheduler had.
    let run = daemon.sh(&id, "exit 5").await;
    assert_eq!(run.exit_code(), Some(5));
    daemon.delete(&id).await;
    let mut resumed = daemon.follow_events(cursor).await;
    let seen = resumed
        .until(WAIT, |e| {
            e["kind"] == "deleted" && e["sandbox_id"] == id.as_str()
        })
        .await;
    assert_eq!(kinds_for(&seen, &id), vec!["process_exited", "deleted"]);
    assert_eq!(seen[0]["detail"], "exit code 5");
    assert!(seen.iter().all(|e| e["cursor"].as_u64() > Some(cursor)));
}

#[tokio::test]
async fn a_create_abandoned_by_its_client_is_removed() {
    require_host!();
    let daemon = Daemon::start();
    let mut stream = daemon.follow_events(0).await;
    {
        // Send a create and hang up without reading the answer.
        let mut socket = tokio::net::UnixStream::connect(&daemon.socket)
            .await
            .expect("connect");
        let body = json!({"image": "busybox"}).to_string();
        let request = format!(
            "POST /v1/sandboxes HTTP/1.1\r\nhost: sandboxd\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.expect("write");
        let created = stream.until(WAIT, |e| e["kind"] == "created").await;
        assert_eq!(created.len(), 1);
    }
    let seen = stream.until(WAIT, |e| e["kind"] == "deleted").await;
    let kinds: Vec<&str> = seen.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(
        kinds == ["ready", "deleted"] || kinds == ["failed"] || kinds == ["deleted"],
        "{kinds:?}"
    );
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));
    let left = daemon.sandbox_run_dirs();
    assert_eq!(left, Vec::<String>::new(), "run files left behind");
}
