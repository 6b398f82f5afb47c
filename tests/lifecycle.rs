//! Sandbox lifecycle through the real daemon: create, exec, inspect, delete.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

/// The pool fills in the background and the API has no event for that (a
/// pooled sandbox is invisible until handed out), so this polls
/// `/v1/health` until `pooled` reaches `want`, with a bounded deadline.
async fn pool_reaches(daemon: &Daemon, want: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
        if health["pooled"] == want {
            return health;
        }
        assert!(
            Instant::now() < deadline,
            "pool never reached {want}: {health}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    let health = pool_reaches(&daemon, 1).await;
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
    let health = pool_reaches(&daemon, 1).await;
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
