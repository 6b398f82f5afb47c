//! File calls through the real daemon: a 100 MiB binary round trip (streamed
//! both ways, checked by sha256 on both sides), list/stat/mkdir/remove, path
//! escapes refused with a 400, symlinks resolved inside the sandbox (never on
//! the host), and the plain 400/404 cases.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

/// Deterministic pseudo-random chunks (xorshift64*), so the data can be
/// generated twice instead of held in memory.
fn random_chunks(seed: u64, chunks: usize) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
    let mut state = seed | 1;
    (0..chunks).map(move |_| {
        let mut chunk = Vec::with_capacity(MIB);
        while chunk.len() < MIB {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            chunk.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        chunk
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_binary_round_trip() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let mut hasher = Sha256::new();
    for chunk in random_chunks(0x5eed, 100) {
        hasher.update(&chunk);
    }
    let expected = hex::encode(hasher.finalize());

    let (status, info) = daemon
        .upload_stream(&id, "/root/random.bin", random_chunks(0x5eed, 100))
        .await
        .expect("upload answered");
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(info["size"].as_u64(), Some(100 * MIB as u64), "{info}");
    assert_eq!(info["kind"], "file");

    let mut hasher = Sha256::new();
    let (status, total) = daemon
        .download_with(&id, "/root/random.bin", |data| hasher.update(data))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(total, 100 * MIB as u64);
    assert_eq!(
        hex::encode(hasher.finalize()),
        expected,
        "downloaded bytes differ"
    );

    // The sandbox sees the same bytes.
    let run = daemon.exec(&id, &["sha256sum", "/root/random.bin"]).await;
    assert_eq!(
        run.out().split_whitespace().next(),
        Some(expected.as_str()),
        "{}",
        run.err()
    );
}

#[tokio::test]
async fn list_stat_mkdir_remove() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let files = format!("/v1/sandboxes/{id}/files");

    // mkdir without parents fails under a missing parent; with parents works.
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("{files}/mkdir?path=/tmp/a/b/c"),
            None,
        )
        .await;
    assert!(
        status.is_client_error(),
        "mkdir without parents: {status} {body}"
    );
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("{files}/mkdir?path=/tmp/a/b/c&parents=true"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["kind"], "dir");
    // A well-formed request the files' state refuses is a conflict.
    let (again, refusal) = daemon
        .call(
            Method::POST,
            &format!("{files}/mkdir?path=/tmp/a/b/c"),
            None,
        )
        .await;
    assert_eq!(
        again,
        StatusCode::CONFLICT,
        "mkdir of an existing folder: {refusal}"
    );
    assert_eq!(refusal["error"]["code"], "file_error", "{refusal}");
    assert!(
        body["name"].as_str().is_some_and(|n| n.ends_with('c')),
        "{body}"
    );
    // It exists for processes in the sandbox too.
    assert_eq!(
        daemon
            .exec(&id, &["test", "-d", "/tmp/a/b/c"])
            .await
            .exit_code(),
        Some(0)
    );

    let (status, body) = daemon
        .raw(
            Method::PUT,
            &format!("{files}?path=/tmp/a/b/c/hello.txt&mode=384"),
            b"hello world\n".to_vec(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, stat) = daemon
        .call(
            Method::GET,
            &format!("{files}/stat?path=/tmp/a/b/c/hello.txt"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{stat}");
    assert_eq!(stat["kind"], "file");
    assert_eq!(stat["size"], 12);
    assert_eq!(
        stat["mode"].as_u64().map(|m| m & 0o7777),
        Some(0o600),
        "{stat}"
    );
    assert_eq!(
        daemon
            .exec(&id, &["cat", "/tmp/a/b/c/hello.txt"])
            .await
            .out(),
        "hello world\n"
    );

    // A file made inside shows up in the listing.
    assert_eq!(
        daemon
            .sh(
                &id,
                "ln -s hello.txt /tmp/a/b/c/link && mkdir /tmp/a/b/c/sub"
            )
            .await
            .exit_code(),
        Some(0)
    );
    let (status, list) = daemon
        .call(Method::GET, &format!("{files}/list?path=/tmp/a/b/c"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["path"], "/tmp/a/b/c");
    let mut entries: Vec<(String, String)> = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("").to_string(),
                e["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        vec![
            ("hello.txt".to_string(), "file".to_string()),
            ("link".to_string(), "symlink".to_string()),
            ("sub".to_string(), "dir".to_string()),
        ]
    );
    let link = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["name"] == "link")
        .expect("link");
    assert_eq!(link["link_target"], "hello.txt");

    // Listing a file or stat of nothing.
    let (status, body) = daemon
        .call(
            Method::GET,
            &format!("{files}/list?path=/tmp/a/b/c/hello.txt"),
            None,
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
    let (status, body) = daemon
        .call(
            Method::GET,
            &format!("{files}/stat?path=/tmp/nothing"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Remove: a non-empty directory needs recursive.
    let (status, body) = daemon
        .call(Method::DELETE, &format!("{files}?path=/tmp/a"), None)
        .await;
    assert!(
        status.is_client_error(),
        "non-recursive remove of a full dir: {status} {body}"
    );
    assert_eq!(
        daemon
            .exec(&id, &["test", "-f", "/tmp/a/b/c/hello.txt"])
            .await
            .exit_code(),
        Some(0)
    );
    let (status, body) = daemon
        .call(
            Method::DELETE,
            &format!("{files}?path=/tmp/a&recursive=true"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = daemon
        .call(Method::GET, &format!("{files}/stat?path=/tmp/a"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "file_not_found");
    assert_eq!(
        daemon
            .exec(&id, &["test", "-e", "/tmp/a"])
            .await
            .exit_code(),
        Some(1)
    );
    // The root itself cannot be removed.
    let (status, body) = daemon
        .call(
            Method::DELETE,
            &format!("{files}?path=/&recursive=true"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(daemon.exec(&id, &["true"]).await.exit_code(), Some(0));
}

#[tokio::test]
async fn path_escapes_are_refused() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let files = format!("/v1/sandboxes/{id}/files");
    for path in [
        "../../etc/shadow",
        "/tmp/../../etc/shadow",
        "/../etc/shadow",
        "/tmp/../..",
    ] {
        let q = common::query_escape(path);
        for (method, url, body) in [
            (Method::GET, format!("{files}?path={q}"), Vec::new()),
            (Method::GET, format!("{files}/stat?path={q}"), Vec::new()),
            (Method::GET, format!("{files}/list?path={q}"), Vec::new()),
            (Method::PUT, format!("{files}?path={q}"), b"pwned".to_vec()),
            (Method::POST, format!("{files}/mkdir?path={q}"), Vec::new()),
            (Method::DELETE, format!("{files}?path={q}"), Vec::new()),
        ] {
            let (status, body) = daemon.raw(method.clone(), &url, body).await;
            let body: serde_json::Value = serde_json::from_slice(&body).expect("json error");
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {body}");
            let code = body["error"]["code"].as_str().unwrap_or("");
            assert!(
                code == "path_escape" || code == "invalid_path",
                "{method} {path}: {body}"
            );
        }
    }
    // `..` that stays inside is fine.
    let (status, body) = daemon
        .call(
            Method::GET,
            &format!("{files}/stat?path=/tmp/../etc/../tmp"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "dir");
}

#[tokio::test]
async fn symlinks_resolve_inside_the_sandbox() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let files = format!("/v1/sandboxes/{id}/files");
    let marker = format!("sandboxd-test-marker-{id}");
    assert!(!std::path::Path::new("/etc").join(&marker).exists());

    let setup = "echo 'sandbox-own-shadow' > /etc/shadow && ln -s /etc/shadow /tmp/link && ln -s ../../../../etc /tmp/up";
    let run = daemon.sh(&id, setup).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());

    // Reading through an absolute link gives the sandbox's file.
    let inside = daemon.exec(&id, &["cat", "/etc/shadow"]).await.stdout;
    assert_eq!(inside, b"sandbox-own-shadow\n");
    let (status, body) = daemon
        .raw(Method::GET, &format!("{files}?path=/tmp/link"), Vec::new())
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, inside);

    // Writing through a link that climbs "above" the root lands in the
    // sandbox's /etc, not the host's.
    let (status, body) = daemon
        .raw(
            Method::PUT,
            &format!("{files}?path=/tmp/up/{marker}"),
            b"inside\n".to_vec(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        !std::path::Path::new("/etc").join(&marker).exists(),
        "the write escaped to the host's /etc"
    );
    assert_eq!(
        daemon
            .exec(&id, &["cat", &format!("/etc/{marker}")])
            .await
            .out(),
        "inside\n"
    );
    let (status, list) = daemon
        .call(Method::GET, &format!("{files}/list?path=/tmp/up"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let names: Vec<&str> = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        names.contains(&marker.as_str()) && names.contains(&"shadow"),
        "{names:?}"
    );
    // The host's /etc/hostname is not what the sandbox sees through the link.
    let (status, body) = daemon
        .raw(
            Method::GET,
            &format!("{files}?path=/tmp/up/hostname"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&body).trim(), id);
}

#[tokio::test]
async fn bad_paths_and_missing_files() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let files = format!("/v1/sandboxes/{id}/files");
    for url in [
        format!("{files}?path=tmp/x"),
        format!("{files}/stat?path=etc"),
        format!("{files}/list?path=."),
    ] {
        let (status, body) = daemon.call(Method::GET, &url, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid_path", "{url}: {body}");
    }
    let (status, body) = daemon
        .call(Method::GET, &format!("{files}?path=/no/such/file"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "file_not_found");
    let (status, body) = daemon.raw(Method::PUT, &files, b"data".to_vec()).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("path"),
        "{body}"
    );
    // Uploading onto a directory is a client error, not a crash.
    let (status, body) = daemon
        .raw(Method::PUT, &format!("{files}?path=/tmp"), b"x".to_vec())
        .await;
    assert!(
        status.is_client_error(),
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
    // Files of an unknown sandbox are a 404.
    let (status, body) = daemon
        .call(
            Method::GET,
            "/v1/sandboxes/sb-000000000000/files/stat?path=/",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_not_found");
}
