//! Sandbox lifecycle through the real daemon: create, exec, inspect, delete.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;

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
    // The pool fills in the background and the API has no event for it, so
    // this polls health with a bounded deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
        if health["pooled"] == 1 {
            assert_eq!(
                health["sandboxes"], 0,
                "pooled sandboxes are not the caller's"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pool never filled: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));

    let id = daemon
        .create(json!({"env": {"GREETING": "hi"}, "ttl_seconds": 77, "labels": {"team": "a"}}))
        .await;
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
