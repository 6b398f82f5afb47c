//! Concurrency through the real daemon: many sandboxes created at once get
//! distinct ids, each one really is its own (hostname), and deleting them all
//! at once leaves no run dir and no cgroup behind.

mod common;

use std::collections::BTreeSet;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;

const SANDBOXES: usize = 20;

/// v1 hierarchies a sandbox may have a cgroup in.
const HIERARCHIES: [&str; 8] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_sandboxes() {
    require_host!();
    let daemon = Daemon::start();

    let creates = (0..SANDBOXES).map(|i| {
        let daemon = &daemon;
        async move {
            daemon
                .create(json!({"image": "busybox", "labels": {"n": i.to_string()}}))
                .await
        }
    });
    let ids: Vec<String> = futures::future::join_all(creates).await;
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), SANDBOXES, "ids are not distinct: {ids:?}");

    let (status, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: BTreeSet<String> = list["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(listed, ids.iter().cloned().collect::<BTreeSet<_>>());

    // Each sandbox is its own: its hostname is its id, and a file written in
    // one is not seen by the others.
    let checks = ids.iter().map(|id| {
        let daemon = &daemon;
        async move {
            let run = daemon
                .sh(
                    id,
                    "hostname; cat /etc/hostname; ls /tmp; echo mine > /tmp/$(hostname)",
                )
                .await;
            (id.clone(), run)
        }
    });
    for (id, run) in futures::future::join_all(checks).await {
        assert_eq!(run.exit_code(), Some(0), "{id}: {}", run.err());
        assert_eq!(run.out(), format!("{id}\n{id}\n"), "{id}");
    }
    let peeks = ids.iter().map(|id| {
        let daemon = &daemon;
        async move { (id.clone(), daemon.exec(id, &["ls", "/tmp"]).await) }
    });
    for (id, run) in futures::future::join_all(peeks).await {
        assert_eq!(
            run.out(),
            format!("{id}\n"),
            "{id} sees other sandboxes' files"
        );
    }

    let deletes = ids.iter().map(|id| {
        let daemon = &daemon;
        async move { daemon.delete(id).await }
    });
    futures::future::join_all(deletes).await;

    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    let left = daemon.sandbox_run_dirs();
    assert!(left.is_empty(), "run dir still holds {left:?}");
    for id in &ids {
        for hierarchy in HIERARCHIES {
            let dir = common::cgroup::sandbox_dir(hierarchy, id);
            assert!(!dir.exists(), "{} left behind", dir.display());
        }
    }
}
