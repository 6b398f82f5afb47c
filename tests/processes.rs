//! Processes through the real daemon: output order and exit codes, binary-safe
//! output, stdin round trips, timeouts and kills that end the whole process
//! tree (descendants that called setsid included), signals, the wait route,
//! run-code, and 404s for unknown processes and deleted sandboxes.

mod common;

use std::os::fd::{FromRawFd, OwnedFd};

use base64::Engine;
use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

/// How long a test waits for the next line of a stream.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads an output stream to its end and returns the process from its
/// closing `exit` event.
async fn final_state(stream: &mut common::NdjsonStream) -> Value {
    let mut exit = None;
    while let Some(event) = stream.next(WAIT).await {
        if event["type"] == "exit" {
            exit = Some(event["process"].clone());
        }
    }
    exit.expect("exit event")
}

fn decode(event: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(event["data"].as_str().expect("data"))
        .expect("base64")
}

/// A pidfd for a host pid: it turns readable once that process has exited.
fn pidfd(pid: i32) -> OwnedFd {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        fd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the fd was just returned to us and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Whether the process behind `fd` exits within `timeout_ms` (0 = now).
fn exits_within(fd: &OwnedFd, timeout_ms: u16) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(timeout_ms)).expect("poll") == 1
}

/// Session id of host process `pid`.
fn session_of(pid: i32) -> Option<i32> {
    common::proc_stat_field(pid, 6)?.parse().ok()
}

/// Waits for the stream to carry `expected` (on stdout) and returns the host
/// pids of the process's cgroup at that moment, with a pidfd for each.
async fn pids_when_ready(
    stream: &mut common::NdjsonStream,
    id: &str,
    proc: u64,
    expected: &[u8],
) -> Vec<(i32, OwnedFd)> {
    let mut seen = Vec::new();
    while !seen.ends_with(expected) {
        let event = stream
            .next(WAIT)
            .await
            .expect("stream ended before the tree was ready");
        assert_eq!(event["type"], "stdout", "unexpected event {event}");
        seen.extend(decode(&event));
    }
    common::process_host_pids(id, proc)
        .into_iter()
        .map(|p| (p, pidfd(p)))
        .collect()
}

/// Script that starts a background `sleep` and a `setsid` grandchild running
/// `sleep`, prints `ready` once both sleeps run, and waits.
const TREE: &str = "setsid sh -c 'sleep 1000' & sleep 1000 & \
    while [ \"$(pidof sleep | wc -w)\" -lt 2 ]; do :; done; echo ready; wait";

fn assert_tree_was_running(id: &str, proc: u64, tree: &[(i32, OwnedFd)]) {
    // sh, sleep, and the setsid'd sleep (its sh may have exec'd it or not).
    assert!(
        tree.len() >= 3,
        "expected sh + 2 sleeps in p{proc}, got {:?}",
        tree.iter().map(|t| t.0).collect::<Vec<_>>()
    );
    for (pid, fd) in tree {
        assert!(!exits_within(fd, 0), "host pid {pid} ended before the kill");
    }
    let sessions: std::collections::BTreeSet<i32> =
        tree.iter().filter_map(|(p, _)| session_of(*p)).collect();
    assert!(
        sessions.len() >= 2,
        "the grandchild did not get its own session: {sessions:?} (sandbox {id})"
    );
}

fn assert_tree_gone(id: &str, proc: u64, tree: &[(i32, OwnedFd)]) {
    for (pid, fd) in tree {
        // The cgroup kill is synchronous, but the exit event may reach us a
        // moment before a sibling's SIGKILL has finished: the pidfd is the
        // event for that; 5 s is the supervisor's own kill deadline.
        assert!(
            exits_within(fd, 5000),
            "host pid {pid} of sandbox {id} p{proc} survived"
        );
    }
    assert!(
        common::process_host_pids(id, proc).is_empty(),
        "p{proc} cgroup still lists {:?}",
        common::process_host_pids(id, proc)
    );
}

#[tokio::test]
async fn stdout_and_stderr_interleave_in_order_and_exit_codes_are_kept() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;

    // Each line of stdin makes one line of output, alternating streams; the
    // next line is only sent once the previous output arrived, so the order
    // of events on the stream is known exactly.
    let script = "while read n; do if [ $((n % 2)) = 0 ]; then echo out$n; else echo err$n >&2; fi; done; exit 5";
    let proc = daemon
        .start_process(&id, json!({"argv": ["sh", "-c", script], "stdin": true}))
        .await;
    let mut stream = daemon.follow_output(&id, proc).await;
    let mut offsets = [0u64; 2];
    for n in 0..8u32 {
        daemon
            .write_stdin(&id, proc, format!("{n}\n").as_bytes())
            .await;
        let event = stream.next(WAIT).await.expect("an output event");
        let (kind, text, i) = if n % 2 == 0 {
            ("stdout", format!("out{n}\n"), 0)
        } else {
            ("stderr", format!("err{n}\n"), 1)
        };
        assert_eq!(event["type"], kind, "event {n}: {event}");
        assert_eq!(String::from_utf8(decode(&event)).expect("utf8"), text);
        assert_eq!(
            event["offset"].as_u64(),
            Some(offsets[i]),
            "offset of event {n}"
        );
        offsets[i] += text.len() as u64;
    }
    daemon.close_stdin(&id, proc).await;
    let exit = stream.next(WAIT).await.expect("exit event");
    assert_eq!(exit["type"], "exit", "{exit}");
    assert_eq!(exit["process"]["exit_code"], 5);
    assert_eq!(exit["process"]["state"], "exited");
    assert!(
        stream.next(WAIT).await.is_none(),
        "the stream ends with the exit"
    );

    // Order within one stream over many chunks, nothing lost.
    let run = daemon.exec(&id, &["seq", "1", "30000"]).await;
    let expected: String = (1..=30000).map(|i| format!("{i}\n")).collect();
    assert!(
        run.out() == expected,
        "seq output differs (got {} bytes)",
        run.stdout.len()
    );
    assert_eq!(run.exit_code(), Some(0));

    for (script, code) in [
        ("exit 0", 0),
        ("false", 1),
        ("exit 42", 42),
        ("exit 255", 255),
    ] {
        let run = daemon.sh(&id, script).await;
        assert_eq!(run.exit_code(), Some(code), "{script}: {}", run.process);
        assert!(run.process["signal"].is_null(), "{script}: {}", run.process);
    }
    let run = daemon.sh(&id, "kill -9 $$").await;
    assert_eq!(run.process["signal"], 9, "{}", run.process);
    assert!(run.process["exit_code"].is_null(), "{}", run.process);
    assert_eq!(run.process["timed_out"], false);
    assert_eq!(run.process["oom_killed"], false);
}

#[tokio::test]
async fn output_is_binary_safe() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let bytes: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
    let (status, body) = daemon
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/all-bytes"),
            bytes.clone(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let run = daemon.exec(&id, &["cat", "/tmp/all-bytes"]).await;
    assert_eq!(run.stdout, bytes);
    assert!(run.stderr.is_empty());
    let run = daemon.sh(&id, "cat /tmp/all-bytes >&2").await;
    assert_eq!(run.stderr, bytes);
    assert!(run.stdout.is_empty());
}

#[tokio::test]
async fn stdin_round_trips_through_cat() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(&id, json!({"argv": ["cat"], "stdin": true}))
        .await;
    let first: Vec<u8> = b"hello\n".to_vec();
    let second: Vec<u8> = (0..=255u8).rev().collect();
    for chunk in [&first, &second] {
        let (status, _) = daemon
            .raw(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
                chunk.clone(),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let (status, _) = daemon
        .raw(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let run = daemon.output(&id, proc).await;
    assert_eq!(run.stdout, [first, second].concat());
    assert_eq!(run.exit_code(), Some(0));

    // Without `stdin: true` the process reads /dev/null and ends at once.
    let run = daemon.exec(&id, &["cat"]).await;
    assert!(run.stdout.is_empty());
    assert_eq!(run.exit_code(), Some(0));
}

#[tokio::test]
async fn timeout_kills_the_whole_tree_even_after_setsid() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(
            &id,
            json!({"argv": ["sh", "-c", TREE], "timeout_seconds": 2}),
        )
        .await;
    let mut stream = daemon.follow_output(&id, proc).await;
    let tree = pids_when_ready(&mut stream, &id, proc, b"ready\n").await;
    assert_tree_was_running(&id, proc, &tree);

    // The stream ends with the exit the timeout caused.
    let process = final_state(&mut stream).await;
    assert_eq!(process["timed_out"], true, "{process}");
    assert_eq!(process["signal"], 9, "{process}");
    assert_eq!(process["oom_killed"], false, "{process}");
    assert_tree_gone(&id, proc, &tree);

    // And inside: no live sleep is left (a zombie the agent has not reaped
    // yet is already dead, so state Z is skipped).
    let run = daemon
        .sh(&id, "ps -o stat,comm | awk '$2 == \"sleep\" && $1 !~ /^Z/'")
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(run.out(), "", "sleeps left in the sandbox");
}

#[tokio::test]
async fn kill_route_kills_the_tree() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(&id, json!({"argv": ["sh", "-c", TREE]}))
        .await;
    let mut stream = daemon.follow_output(&id, proc).await;
    let tree = pids_when_ready(&mut stream, &id, proc, b"ready\n").await;
    assert_tree_was_running(&id, proc, &tree);

    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/kill"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_tree_gone(&id, proc, &tree);
    let process = final_state(&mut stream).await;
    assert_eq!(process["signal"], 9, "{process}");
    assert_eq!(process["timed_out"], false, "{process}");
    assert_eq!(process["oom_killed"], false, "{process}");
}

#[tokio::test]
async fn signal_by_name_ends_sleep() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(&id, json!({"argv": ["sleep", "1000"]}))
        .await;
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/signal"),
            Some(json!({"signal": "TERM"})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let run = daemon.output(&id, proc).await;
    assert_eq!(run.process["signal"], 15, "{}", run.process);
    assert!(run.process["exit_code"].is_null());

    // A signal to an ended process is a conflict, a bad name a 400.
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/signal"),
            Some(json!({"signal": "TERM"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/signal"),
            Some(json!({"signal": "NOPE"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_signal");
}

#[tokio::test]
async fn wait_reports_running_then_exited() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(&id, json!({"argv": ["sleep", "1000"]}))
        .await;
    let wait = format!("/v1/sandboxes/{id}/processes/{proc}/wait");
    let (status, process) = daemon
        .call(Method::GET, &format!("{wait}?timeout_seconds=0.2"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{process}");
    assert_eq!(process["state"], "running");
    assert!(process["pid"].as_i64().expect("pid") > 1, "{process}");

    let (status, _) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/kill"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, process) = daemon
        .call(Method::GET, &format!("{wait}?timeout_seconds=30"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{process}");
    assert_eq!(process["state"], "exited");
    assert_eq!(process["signal"], 9);
    assert!(process["ended_at"].is_string());

    // The list route shows it too.
    let (status, list) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}/processes"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let entry = list["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["id"] == proc)
        .expect("listed");
    assert_eq!(entry["state"], "exited");
}

#[tokio::test]
async fn run_code_in_python_and_sh() {
    require_host!();
    let daemon = Daemon::start();
    let py = daemon.create(json!({"image": "python"})).await;
    let proc = daemon
        .start_process(
            &py,
            json!({"code": "import sys\nprint('hello', 6 * 7)\nsys.stderr.write('warn\\n')\nsys.exit(4)\n", "language": "python"}),
        )
        .await;
    let run = daemon.output(&py, proc).await;
    assert_eq!(run.out(), "hello 42\n");
    assert_eq!(run.err(), "warn\n");
    assert_eq!(run.exit_code(), Some(4));
    // python is the default language.
    let proc = daemon
        .start_process(&py, json!({"code": "print(sum(range(10)))"}))
        .await;
    assert_eq!(daemon.output(&py, proc).await.out(), "45\n");

    let bb = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon
        .start_process(
            &bb,
            json!({"code": "echo $((6 * 7)); echo \"$0\" >/dev/null; exit 3", "language": "sh"}),
        )
        .await;
    let run = daemon.output(&bb, proc).await;
    assert_eq!(run.out(), "42\n");
    assert_eq!(run.exit_code(), Some(3));
    // A language the image lacks fails to start or exits non-zero; either way no success.
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{bb}/processes"),
            Some(json!({"code": "1", "language": "cobol"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_language");
}

#[tokio::test]
async fn unknown_process_is_404() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let base = format!("/v1/sandboxes/{id}/processes/999");
    for (method, path) in [
        (Method::GET, base.clone()),
        (Method::GET, format!("{base}/output")),
        (Method::GET, format!("{base}/wait?timeout_seconds=0")),
        (Method::POST, format!("{base}/kill")),
        (Method::DELETE, format!("{base}/stdin")),
    ] {
        let (status, body) = daemon.call(method.clone(), &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        assert_eq!(
            body["error"]["code"], "process_not_found",
            "{method} {path}: {body}"
        );
    }
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("{base}/signal"),
            Some(json!({"signal": 15})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn exec_in_a_deleted_sandbox_is_404() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let proc = daemon.start_process(&id, json!({"argv": ["true"]})).await;
    daemon.delete(&id).await;
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"argv": ["true"]})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_not_found");
    let (status, body) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{proc}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_not_found");
    // Nothing of it is left on the host.
    assert!(!daemon.run_dir().join("sandboxes").join(&id).exists());
    assert!(!common::cgroup::sandbox_dir("pids", &id).exists());
}
