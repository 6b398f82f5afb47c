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

/// The built-in python image can install packages: pip (system-wide, as
/// the image is the sandbox's own) and venv, and the CA roots pip's HTTPS
/// needs. A wheel the test makes in the sandbox stands in for an index.
#[tokio::test]
async fn the_python_image_ships_pip_venv_and_the_ca_roots() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "python"})).await;
    let make_wheel = r#"
import zipfile, hashlib, base64
files = {
    "hello_sbx.py": "GREETING = 'installed by pip'\n",
    "hello_sbx-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello-sbx\nVersion: 1.0\n",
    "hello_sbx-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(text):
    raw = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
record = "".join(f"{n},{digest(t)},{len(t.encode())}\n" for n, t in files.items())
record += "hello_sbx-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile("/tmp/hello_sbx-1.0-py3-none-any.whl", "w") as z:
    for n, t in files.items():
        z.writestr(n, t)
    z.writestr("hello_sbx-1.0.dist-info/RECORD", record)
"#;
    let made = daemon.exec(&id, &["python3", "-c", make_wheel]).await;
    assert_eq!(made.exit_code(), Some(0), "{}{}", made.out(), made.err());
    let script = "set -e
        python3 -m pip --version
        test -s /etc/ssl/certs/ca-certificates.crt
        python3 -c 'import ssl; assert ssl.create_default_context().cert_store_stats()[\"x509_ca\"] > 0'
        ! python3 -c 'import hello_sbx' 2>/dev/null
        python3 -m pip install --no-index /tmp/hello_sbx-1.0-py3-none-any.whl
        python3 -c 'import hello_sbx; print(\"system:\", hello_sbx.GREETING)'
        python3 -m venv /tmp/venv
        /tmp/venv/bin/pip install --no-index /tmp/hello_sbx-1.0-py3-none-any.whl
        /tmp/venv/bin/python -c 'import sys, hello_sbx; print(\"venv:\", sys.prefix, hello_sbx.GREETING)'";
    let run = daemon.sh(&id, script).await;
    assert_eq!(run.exit_code(), Some(0), "{}{}", run.out(), run.err());
    let out = run.out();
    assert!(out.contains("system: installed by pip"), "{out}");
    assert!(out.contains("venv: /tmp/venv installed by pip"), "{out}");
    daemon.delete(&id).await;
}
