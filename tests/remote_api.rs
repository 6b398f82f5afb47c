//! Root-only: the API over TCP + TLS (`api_listen`) with named bearer
//! tokens, reached with sandboxctl (pinned self-signed certificate, or the
//! certificate as a CA) and with curl for the raw answers.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{Daemon, CTL, DAEMON};
use hyper::{Method, StatusCode};
use serde_json::Value;

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env_remove("SANDBOXD_URL")
        .env_remove("SANDBOXD_TOKEN")
        .env_remove("SANDBOXD_TLS_FINGERPRINT")
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn make_token(tokens: &Path, name: &str) -> String {
    let out = run(
        DAEMON,
        &[
            "--api-tokens-file",
            &tokens.display().to_string(),
            "token",
            "create",
            name,
        ],
    );
    assert!(out.status.success(), "token create {name}: {}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("sbd_"), "{token}");
    token
}

/// `curl` of `path` with `token` (or none): the status and the body.
fn curl(url: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut args = vec![
        "-sk".to_string(),
        "-o".into(),
        "-".into(),
        "-w".into(),
        "\n%{http_code}".into(),
    ];
    if let Some(token) = token {
        args.push("-H".into());
        args.push(format!("Authorization: Bearer {token}"));
    }
    args.push(format!("{url}{path}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("curl", &args);
    let all = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = all.rsplit_once('\n').expect("curl's status line");
    (code.trim().parse().expect("status"), body.to_string())
}

#[tokio::test]
async fn the_remote_api_serves_token_holders_over_tls_and_refuses_everyone_else() {
    require_host!();
    let secrets = tempfile::tempdir().expect("tempdir");
    let tokens = secrets.path().join("api-tokens");
    let tokens_arg = tokens.display().to_string();

    // No token yet: a listener that would refuse everyone does not start.
    let (status, said) = Daemon::refused_start(&[
        "--api-listen",
        "127.0.0.1:0",
        "--api-tokens-file",
        &tokens_arg,
    ]);
    assert!(!status.success());
    assert!(
        said.contains("holds no token") && said.contains("sandboxd token create"),
        "{said}"
    );

    let scheduler = make_token(&tokens, "scheduler");
    let operator = make_token(&tokens, "operator");
    let mode = std::fs::metadata(&tokens)
        .expect("tokens file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let file = std::fs::read_to_string(&tokens).expect("tokens file");
    assert!(
        file.contains("scheduler sha256:") && file.contains("operator sha256:"),
        "{file}"
    );
    assert!(
        !file.contains(&scheduler[4..]) && !file.contains(&operator[4..]),
        "{file}"
    );
    let listed = run(DAEMON, &["--api-tokens-file", &tokens_arg, "token", "ls"]);
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "scheduler\noperator\n"
    );

    let mut daemon = Daemon::start_with(&[
        "--api-listen",
        "127.0.0.1:0",
        "--api-tokens-file",
        &tokens_arg,
    ]);
    let started = daemon.await_log("serving the API over TLS").await;
    let field = |name: &str| {
        started
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in {started:?}"))
            .to_string()
    };
    let url = format!("https://{}", field("address"));
    let fingerprint = field("fingerprint");
    let printed = run(
        DAEMON,
        &[
            "--state-dir",
            &daemon.state_dir().display().to_string(),
            "--print-fingerprint",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), fingerprint);

    // Raw answers: 401 with the API's error shape, then 200 with a token.
    let (code, body) = curl(&url, "/v1/health", None);
    assert_eq!(code, 401, "{body}");
    let error: Value = serde_json::from_str(&body).expect("error JSON");
    assert_eq!(error["error"]["code"], "unauthorized", "{body}");
    let (code, body) = curl(&url, "/v1/sandboxes", Some("sbd_not-a-token"));
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl(&url, "/v1/health", Some(&scheduler));
    assert_eq!(code, 200, "{body}");
    // The Unix socket needs no token, as before.
    let (status, _) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, StatusCode::OK);

    // sandboxctl, pinning the self-signed certificate: a whole sandbox's life.
    let scheduler_file = secrets.path().join("scheduler.token");
    std::fs::write(&scheduler_file, format!("{scheduler}\n")).expect("token file");
    let scheduler_arg = scheduler_file.display().to_string();
    let remote = |extra: &[&str]| -> Output {
        let mut args = vec!["--url", url.as_str()];
        args.extend_from_slice(extra);
        run(CTL, &args)
    };
    let pinned = [
        "--token-file",
        scheduler_arg.as_str(),
        "--tls-fingerprint",
        fingerprint.as_str(),
    ];
    let created = remote(&[&pinned[..], &["create", "--image", "busybox"]].concat());
    assert!(created.status.success(), "{}", text(&created));
    let id = String::from_utf8_lossy(&created.stdout).trim().to_string();
    // Host paths are for callers on the host: 403 over the network.
    let host_root = remote(&[&pinned[..], &["create", "--host-rootfs", "/"]].concat());
    assert!(!host_root.status.success());
    assert!(
        text(&host_root).contains("only on its Unix socket"),
        "{}",
        text(&host_root)
    );
    let echoed = remote(&[&pinned[..], &["exec", &id, "--", "echo", "over-tls"]].concat());
    assert!(echoed.status.success(), "{}", text(&echoed));
    assert_eq!(String::from_utf8_lossy(&echoed.stdout), "over-tls\n");
    // The fingerprint in the colon form people copy from other tools.
    let colons: Vec<String> = fingerprint
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).to_uppercase())
        .collect();
    let colons = format!("sha256:{}", colons.join(":"));
    let listed = remote(&[
        "--token-file",
        &scheduler_arg,
        "--tls-fingerprint",
        &colons,
        "ls",
    ]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&id));

    // Refusals, each saying why.
    let no_token = remote(&["--tls-fingerprint", &fingerprint, "ls"]);
    assert!(!no_token.status.success());
    assert!(
        text(&no_token).contains("Authorization: Bearer"),
        "{}",
        text(&no_token)
    );
    let wrong_pin = remote(&[
        "--token-file",
        &scheduler_arg,
        "--tls-fingerprint",
        &"0".repeat(64),
        "ls",
    ]);
    assert!(!wrong_pin.status.success());
    assert!(
        text(&wrong_pin).contains("not the pinned"),
        "{}",
        text(&wrong_pin)
    );
    let unpinned = remote(&["--token-file", &scheduler_arg, "ls"]);
    assert!(
        !unpinned.status.success(),
        "a self-signed certificate passed CA checks"
    );
    assert!(text(&unpinned).contains("TLS"), "{}", text(&unpinned));
    // The certificate itself as the CA: verified, names included.
    let cert = daemon.state_dir().join("api-tls.crt").display().to_string();
    let as_ca = remote(&["--token-file", &scheduler_arg, "--ca-file", &cert, "ls"]);
    assert!(as_ca.status.success(), "{}", text(&as_ca));

    // Revocation: the file changes, SIGHUP, the operator's token is refused
    // and the scheduler's still works.
    let (code, _) = curl(&url, "/v1/health", Some(&operator));
    assert_eq!(code, 200);
    let removed = run(
        DAEMON,
        &["--api-tokens-file", &tokens_arg, "token", "rm", "operator"],
    );
    assert!(removed.status.success(), "{}", text(&removed));
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.await_log("tokens=1").await;
    let (code, _) = curl(&url, "/v1/health", Some(&operator));
    assert_eq!(code, 401);
    let (code, _) = curl(&url, "/v1/health", Some(&scheduler));
    assert_eq!(code, 200);
    // A file others could read is refused on reload; the tokens in force stay.
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon
        .await_log("the tokens loaded before stay in force")
        .await;
    let (code, _) = curl(&url, "/v1/health", Some(&scheduler));
    assert_eq!(code, 200);

    let deleted = remote(&[&pinned[..], &["rm", &id]].concat());
    assert!(deleted.status.success(), "{}", text(&deleted));

    // Who did what is logged by token name; no token, nor the header, ever is.
    let log = daemon.log();
    assert!(log.contains("token=scheduler"), "{log}");
    for needle in [&scheduler[4..], &operator[4..], "Bearer", "authorization"] {
        assert!(!log.contains(needle), "the daemon's log holds {needle:?}");
    }
    assert_eq!(
        daemon
            .stop(nix::sys::signal::Signal::SIGTERM)
            .map(|s| s.success()),
        Some(true)
    );
}
