//! Root-only: a sandbox whose root is directories on the host owned by
//! host ids (`host_rootfs`, what the containerd shim hands over): seen
//! under the sandbox's own ids without a copy, left unchanged by the
//! sandbox's writes, nothing left mounted, and refused where it cannot
//! work.

mod common;

use std::path::Path;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::json;

/// The mount points at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn host_owned_layers_are_the_root_under_the_sandbox_ids_and_stay_unchanged() {
    require_host!();
    // Under /var/tmp: the idmapped mounts need ext4, xfs or btrfs.
    let host = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let lower = common::root_owned_busybox(host.path());
    let upper = host.path().join("upper");
    std::fs::create_dir_all(upper.join("etc")).unwrap();
    std::fs::create_dir_all(upper.join("home/user")).unwrap();
    std::fs::write(upper.join("etc/motd"), "from the upper layer\n").unwrap();
    std::os::unix::fs::chown(upper.join("home/user"), Some(1000), Some(1000)).unwrap();
    let passwd_before = std::fs::read(lower.join("etc/passwd")).unwrap();

    let daemon = Daemon::start();
    let id = daemon
        .create(json!({"host_rootfs": [upper.display().to_string(), lower.display().to_string()]}))
        .await;
    let (status, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["image"], "host-rootfs", "{view}");

    let seen = daemon
        .sh(
            &id,
            "cat /etc/motd; id -u; stat -c '%u:%g' /bin/busybox /home/user; \
             echo new > /bin/new && echo changed >> /etc/passwd && echo wrote",
        )
        .await;
    assert_eq!(
        seen.out(),
        "from the upper layer\n0\n0:0\n1000:1000\nwrote\n",
        "{}",
        seen.err()
    );
    // The sandbox's writes went to its own layer: the host's trees are as
    // they were, and the sandbox sees its own writes.
    assert!(!lower.join("bin/new").exists() && !upper.join("bin").exists());
    assert_eq!(
        std::fs::read(lower.join("etc/passwd")).unwrap(),
        passwd_before
    );
    assert_eq!(
        daemon.sh(&id, "cat /bin/new").await.out(),
        "new\n",
        "the sandbox keeps its writes"
    );
    // The idmapped mounts were detached once the overlay held them; the
    // overlay itself is the positive control.
    let run = daemon.run_dir().join("sandboxes").join(&id);
    let held = mounts_under(&run);
    assert!(
        held.contains(&run.join("rootfs").display().to_string()),
        "{held:?}"
    );
    assert!(!held.iter().any(|p| p.contains("/idmapped")), "{held:?}");

    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"kind": "filesystem"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["code"], "host_rootfs_snapshot_unsupported",
        "{body}"
    );

    daemon.delete(&id).await;
    assert!(mounts_under(&run).is_empty(), "{:?}", mounts_under(&run));
    assert!(mounts_under(host.path()).is_empty());
    assert!(lower.join("bin/busybox").exists(), "the host tree is kept");
}

#[tokio::test]
async fn a_host_root_that_cannot_work_is_refused_naming_the_field() {
    require_host!();
    let host = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let file = host.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let dir = host.path().display().to_string();
    let daemon = Daemon::start();
    for (body, says) in [
        (
            json!({"host_rootfs": ["relative/dir"]}),
            "not an absolute path",
        ),
        (
            json!({"host_rootfs": [host.path().join("nope").display().to_string()]}),
            "No such file",
        ),
        (
            json!({"host_rootfs": [file.display().to_string()]}),
            "not a directory",
        ),
        (
            json!({"host_rootfs": [dir], "image": "busybox"}),
            "without image",
        ),
        (
            json!({"host_rootfs": [dir], "runtime": "vm"}),
            "container only",
        ),
    ] {
        let (status, answer) = daemon
            .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], "invalid_host_rootfs", "{answer}");
        assert_eq!(answer["error"]["field"], "host_rootfs", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body} -> {message}");
    }
    let left = daemon.sandboxes().await;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn only_root_on_the_socket_may_name_host_directories() {
    require_host!();
    use std::os::unix::fs::PermissionsExt;
    let daemon = Daemon::start();
    // Open the socket to everyone, as a socket_group would to its members.
    let dir = daemon.socket.parent().expect("socket dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let ask = |body: &str, as_nobody: bool| {
        let mut command = std::process::Command::new("setpriv");
        if as_nobody {
            command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        }
        let out = command
            .args([
                "curl",
                "-s",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "--unix-socket",
            ])
            .arg(&daemon.socket)
            .args([
                "-X",
                "POST",
                "-H",
                "content-type: application/json",
                "-d",
                body,
            ])
            .arg("http://sandboxd/v1/sandboxes")
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let host_root = r#"{"host_rootfs": ["/"]}"#;
    let refused = ask(host_root, true);
    assert!(refused.ends_with("403"), "{refused}");
    assert!(refused.contains("host_rootfs_not_allowed"), "{refused}");
    // The positive control: the same socket serves that user otherwise,
    // and root with the same body gets past the check (to validation).
    let allowed = ask(r#"{"image": "busybox"}"#, true);
    assert!(allowed.ends_with("201"), "{allowed}");
    let as_root = ask(r#"{"host_rootfs": ["relative"]}"#, false);
    assert!(
        as_root.ends_with("400") && as_root.contains("invalid_host_rootfs"),
        "{as_root}"
    );
}
