//! Bad input through the real daemon: unknown images, impossible limits,
//! malformed or unknown JSON, unknown sandboxes, unsupported runtimes and bad
//! process requests each get a 4xx that names what to fix, and afterwards the
//! daemon is healthy and nothing was left behind.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

async fn create_fails(daemon: &Daemon, body: Vec<u8>) -> (StatusCode, Value) {
    let (status, bytes) = daemon.raw(Method::POST, "/v1/sandboxes", body).await;
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "error body is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, value)
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_leave_nothing() {
    require_host!();
    let daemon = Daemon::start();

    // Unknown image: 404 at once, no build attempted.
    let (status, body) = create_fails(
        &daemon,
        json!({"image": "no-such-image-xyz"})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "image_not_found", "{body}");
    assert!(message(&body).contains("no-such-image-xyz"), "{body}");

    // Impossible limits: 400, and the message names the field.
    let cases = [
        (json!({"image": "busybox", "cpu": -1}), "cpu"),
        (json!({"image": "busybox", "cpu": 1000}), "cpu"),
        (json!({"image": "busybox", "cpu": 0}), "cpu"),
        (json!({"image": "busybox", "memory_mib": 0}), "memory_mib"),
        (
            json!({"image": "busybox", "memory_mib": 1_000_000_000_000u64}),
            "memory_mib",
        ),
        (json!({"image": "busybox", "disk_mib": 0}), "disk_mib"),
        (json!({"image": "busybox", "pids": 0}), "pids"),
        (json!({"image": "busybox", "cpu_shares": 1}), "cpu_shares"),
        (json!({"image": "busybox", "ttl_seconds": 0}), "ttl_seconds"),
        (
            json!({"image": "busybox", "ttl_seconds": -7}),
            "ttl_seconds",
        ),
        (json!({"image": "busybox", "env": {"A=B": "x"}}), "A=B"),
    ];
    for (request, field) in cases {
        let (status, body) = create_fails(&daemon, request.to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        assert!(
            message(&body).contains(field),
            "{request}: message does not name {field}: {body}"
        );
        // The field at fault is also said apart, for SDKs to expose.
        let named = if field == "A=B" { "env" } else { field };
        assert_eq!(body["error"]["field"], named, "{request}: {body}");
    }

    // Malformed JSON and unknown fields.
    for raw in [&b"{\"image\": "[..], b"not json", b"[1,2,3]", b"\xff\xfe"] {
        let (status, body) = create_fails(&daemon, raw.to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["code"], "invalid_json", "{body}");
    }
    let (status, body) = create_fails(
        &daemon,
        json!({"image": "busybox", "memroy_mib": 64})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("memroy_mib"), "{body}");

    // Runtimes.
    let (status, body) = create_fails(
        &daemon,
        json!({"image": "busybox", "runtime": "vm"})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("vm"), "{body}");
    // It says what this host's virtualisation is, as /v1/health does.
    let (_, health) = daemon.call(Method::GET, "/v1/health", None).await;
    let expected = match health["virtualization"].as_str() {
        Some("hardware") => "VMX/SVM",
        Some("pvm") => "kvm_pvm",
        Some("none") => "no usable /dev/kvm",
        other => panic!("virtualization is {other:?} in {health}"),
    };
    assert!(message(&body).contains(expected), "{body}");
    let (status, body) = create_fails(
        &daemon,
        json!({"image": "busybox", "runtime": "docker"})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("runtime"), "{body}");

    // Unknown sandbox on every route that takes one.
    let ghost = "/v1/sandboxes/sb-0123456789ab";
    for (method, path, body) in [
        (Method::GET, ghost.to_string(), None),
        (Method::DELETE, ghost.to_string(), None),
        (
            Method::PUT,
            format!("{ghost}/ttl"),
            Some(json!({"ttl_seconds": 5})),
        ),
        (
            Method::POST,
            format!("{ghost}/processes"),
            Some(json!({"argv": ["true"]})),
        ),
        (Method::GET, format!("{ghost}/processes"), None),
        (Method::GET, format!("{ghost}/files/list?path=/"), None),
    ] {
        let (status, response) = daemon.call(method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {response}");
        assert_eq!(
            response["error"]["code"], "sandbox_not_found",
            "{method} {path}: {response}"
        );
    }

    // Bad process requests against a real sandbox.
    let id = daemon.create(json!({"image": "busybox"})).await;
    let processes = format!("/v1/sandboxes/{id}/processes");
    for (request, code) in [
        (json!({"argv": []}), "invalid_argv"),
        (json!({"argv": [""]}), "invalid_argv"),
        (
            json!({"argv": ["true"], "code": "print(1)"}),
            "invalid_request",
        ),
        (json!({}), "invalid_request"),
        (
            json!({"argv": ["true"], "timeout_seconds": -1}),
            "invalid_timeout",
        ),
        (json!({"argv": ["true"], "cwd": "relative"}), "invalid_path"),
        (json!({"argv": ["true"], "bogus": 1}), "invalid_json"),
    ] {
        let (status, body) = daemon
            .call(Method::POST, &processes, Some(request.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        assert_eq!(body["error"]["code"], code, "{request}: {body}");
    }
    // A program that does not exist is a client error too, and the sandbox lives on.
    let (status, body) = daemon
        .call(
            Method::POST,
            &processes,
            Some(json!({"argv": ["/no/such/program"]})),
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
    assert_eq!(daemon.exec(&id, &["true"]).await.exit_code(), Some(0));
    daemon.delete(&id).await;

    // The daemon is healthy and nothing is left.
    let (status, health) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["sandboxes"], 0, "{health}");
    let (status, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    let left = daemon.sandbox_run_dirs();
    assert!(left.is_empty(), "run dir still holds {left:?}");
}

#[tokio::test]
async fn a_create_body_that_is_not_an_object_is_refused_and_makes_nothing() {
    require_host!();
    let daemon = Daemon::start();
    for raw in [&b"[null, null]"[..], b"\"x\"", b"42"] {
        let (status, body) = create_fails(&daemon, raw.to_vec()).await;
        let raw = String::from_utf8_lossy(raw);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{raw}: {body}");
        assert_eq!(body["error"]["code"], "invalid_json", "{raw}: {body}");
        assert!(
            message(&body).contains("must be a JSON object"),
            "{raw}: {body}"
        );
    }
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    // The daemon still creates from an object.
    let id = daemon.create(json!({"image": "busybox"})).await;
    daemon.delete(&id).await;
}

#[tokio::test]
async fn negative_unsigned_limits_name_the_field() {
    require_host!();
    let daemon = Daemon::start();
    for field in ["memory_mib", "disk_mib", "pids"] {
        let request = json!({"image": "busybox", field: -5});
        let (status, body) = create_fails(&daemon, request.to_string().into_bytes()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        assert!(
            message(&body).contains(field),
            "{request}: message does not name {field}: {body}"
        );
        assert_eq!(body["error"]["field"], field, "{request}: {body}");
    }
}

#[tokio::test]
async fn malformed_paths_and_queries_get_the_api_error_shape() {
    require_host!();
    let daemon = Daemon::start();
    for (path, code) in [
        ("/v1/sandboxes/sb-x/processes/-1", "invalid_path_parameter"),
        (
            "/v1/sandboxes/sb-x/processes/1/output?stdout_offset=x",
            "invalid_query",
        ),
        (
            "/v1/sandboxes/sb-x/processes/1/output?nonsense=1",
            "invalid_query",
        ),
        (
            "/v1/sandboxes/sb-x/files/mkdir?path=/a&parents=1",
            "invalid_query",
        ),
    ] {
        let method = if path.contains("mkdir") {
            Method::POST
        } else {
            Method::GET
        };
        let (status, body) = daemon.raw(method, path, Vec::new()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let body: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("{path}: not JSON: {}", String::from_utf8_lossy(&body)));
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
    }
}
