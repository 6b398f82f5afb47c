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
    let (status, sandbox) = daemon.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sandbox["state"], "ready");
    let run = daemon.sh(&id, "echo out; echo err >&2; exit 3").await;
    assert_eq!(run.out(), "out\n");
    assert_eq!(run.err(), "err\n");
    assert_eq!(run.exit_code(), Some(3));
    daemon.delete(&id).await;
    let (status, body) = daemon.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "sandbox_not_found");
}
