//! Root-only: filesystem snapshots of running container sandboxes, used as
//! images by new sandboxes (stacked read-only under a fresh writable layer),
//! chained, and deleted while sandboxes still stand on them.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

async fn snapshot(daemon: &Daemon, id: &str, kind: &str) -> (StatusCode, Value) {
    daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({ "kind": kind })),
        )
        .await
}

fn snapshot_dirs(daemon: &Daemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(daemon.state_dir().join("disk/snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_filesystem_snapshot_becomes_an_image() {
    require_host!();
    let daemon = Daemon::start();
    let source = daemon.create(json!({"image": "busybox"})).await;
    let run = daemon
        .sh(
            &source,
            "mkdir -p /data && echo before > /data/file && rm /bin/vi && echo ok",
        )
        .await;
    assert_eq!(run.out(), "ok\n", "{}", run.err());

    let (status, snap) = snapshot(&daemon, &source, "filesystem").await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert!(snap_id.starts_with("snap-"), "{snap}");
    assert_eq!(snap["kind"], "filesystem");
    assert_eq!(snap["sandbox"], source.as_str());
    assert_eq!(snap["image"], "busybox");
    // The directory holding snapshots is the daemon's alone.
    let mode = std::fs::metadata(daemon.state_dir().join("disk/snapshots"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("snapshots dir");
    assert_eq!(mode, 0o700);

    // The source keeps running; what it writes now is not in the snapshot.
    let run = daemon
        .sh(&source, "echo after > /data/file; cat /data/file")
        .await;
    assert_eq!(run.out(), "after\n");

    let (status, list) = daemon.call(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        list["snapshots"]
            .as_array()
            .expect("list")
            .iter()
            .any(|s| s["id"] == snap_id.as_str()),
        "{list}"
    );
    let (status, got) = daemon
        .call(Method::GET, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["id"], snap_id.as_str());

    // A sandbox made from it sees the files as they were, deletions too,
    // and writes only to its own layer.
    let child = daemon.create(json!({"image": snap_id})).await;
    let run = daemon
        .sh(&child, "cat /data/file; test -e /bin/vi && echo vi-is-back; echo child > /data/file; echo done")
        .await;
    assert_eq!(run.out(), "before\ndone\n", "{}", run.err());
    let run = daemon.sh(&source, "cat /data/file").await;
    assert_eq!(run.out(), "after\n");
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{child}"), None)
        .await;
    assert_eq!(view["image"], snap_id.as_str(), "{view}");

    // Snapshots chain: one of the child stacks on the first.
    let (status, second) = snapshot(&daemon, &child, "filesystem").await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    let second_id = second["id"].as_str().expect("id").to_string();
    let grandchild = daemon.create(json!({"image": second_id})).await;
    let run = daemon
        .sh(
            &grandchild,
            "cat /data/file; ls /bin/vi 2>&1 | grep -c 'No such'",
        )
        .await;
    assert_eq!(run.out(), "child\n1\n", "{}", run.err());

    // Deleting snapshots that sandboxes stand on is safe: they are gone for
    // the API at once and their data stays until nothing uses it.
    for id in [&snap_id, &second_id] {
        let (status, v) = daemon
            .call(Method::DELETE, &format!("/v1/snapshots/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
        let (status, _) = daemon
            .call(Method::GET, &format!("/v1/snapshots/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": snap_id})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(snapshot_dirs(&daemon).len(), 2);
    let run = daemon.sh(&grandchild, "cat /data/file").await;
    assert_eq!(run.out(), "child\n");
    daemon.delete(&grandchild).await;
    // The second snapshot went with its last user; the first is still the
    // child's base.
    assert_eq!(snapshot_dirs(&daemon), vec![snap_id.clone()]);
    daemon.delete(&child).await;
    assert!(
        snapshot_dirs(&daemon).is_empty(),
        "{:?}",
        snapshot_dirs(&daemon)
    );
    daemon.delete(&source).await;
}

#[tokio::test]
async fn snapshot_errors_are_clear() {
    require_host!();
    let daemon = Daemon::start();
    let (status, v) = daemon
        .call(Method::GET, "/v1/snapshots/snap-0000000000000000", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "snapshot_not_found", "{v}");
    let (status, v) = daemon
        .call(Method::DELETE, "/v1/snapshots/snap-0000000000000000", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = snapshot(&daemon, "sb-000000000000", "filesystem").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let id = daemon.create(json!({"image": "busybox"})).await;
    let (status, v) = snapshot(&daemon, &id, "everything").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("kind"), "{v}");
    // Memory snapshots are not built yet, and say so.
    let (status, v) = snapshot(&daemon, &id, "memory").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "not_implemented", "{v}");
    daemon.delete(&id).await;
}

#[tokio::test]
async fn sandboxctl_takes_lists_and_removes_snapshots() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(common::CTL)
            .arg("--socket")
            .arg(&daemon.socket)
            .args(args)
            .output()
            .expect("run sandboxctl");
        assert!(
            out.status.success(),
            "sandboxctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let snap = ctl(&["snapshot", &id, "--filesystem"]);
    assert!(snap.starts_with("snap-"), "{snap}");
    let listed = ctl(&["snapshots"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&snap) && l.contains("filesystem") && l.contains(&id)),
        "{listed}"
    );
    assert_eq!(ctl(&["rm-snapshot", &snap]), snap);
    assert!(!ctl(&["snapshots"]).contains(&snap));
    daemon.delete(&id).await;
}
