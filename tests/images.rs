//! Root-only: the image cache through the API: listing, and pruning trees
//! no recipe names any more while current images keep working.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn stale_images_are_pruned_and_current_ones_kept() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;

    let (status, list) = daemon.call(Method::GET, "/v1/images", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let busybox = list["images"]
        .as_array()
        .expect("images")
        .iter()
        .find(|i| i["name"] == "busybox")
        .cloned()
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(busybox["built"], true, "{busybox}");

    // A tree left by a recipe that has since changed (its digest with it),
    // and one a forced rebuild moved aside.
    let images = common::images_dir();
    let stale = images.join(format!("sha256-{}", "0".repeat(64)));
    std::fs::create_dir_all(stale.join("rootfs/bin")).expect("stale image");
    std::fs::write(
        stale.join("meta.json"),
        r#"{"name":"old","digest":"sha256:0","size_bytes":4096,"entries":1,"build_seconds":1.0,"built_at_unix":0}"#,
    )
    .expect("meta");
    let trashed = images.join("trash/sha256-test-prune");
    std::fs::create_dir_all(&trashed).expect("trash");

    let (status, report) = daemon.call(Method::POST, "/v1/images/prune", None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let removed: Vec<&str> = report["removed"]
        .as_array()
        .expect("removed")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        removed.contains(&stale.file_name().unwrap().to_str().unwrap()),
        "{report}"
    );
    assert!(removed.contains(&"trash/sha256-test-prune"), "{report}");
    assert!(report["freed_bytes"].as_u64() >= Some(4096), "{report}");
    assert!(!stale.exists() && !trashed.exists());

    // The running sandbox and new ones still have their image.
    assert_eq!(daemon.sh(&id, "echo alive").await.out(), "alive\n");
    let other = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(daemon.sh(&other, "echo new").await.out(), "new\n");
    daemon.delete(&other).await;
    daemon.delete(&id).await;
}
