//! MicroVM sandboxes with a real Linux guest, through the real daemon: the
//! project's guest kernel (scripts/build-guest-kernel.sh) booted by our VMM
//! with the static agent as its init and the python image as its disk.
//! Linux needs a KVM with VMX or SVM, so these are `#[ignore]`d in a plain
//! `cargo test`; scripts/nested-tests.sh runs them, in the nested host
//! (QEMU TCG with AMD SVM) where this host's KVM is kvm_pvm.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::time::{Duration, Instant};

use base64::Engine;
use common::linux_vm::{assert_nothing_left, linux_vm_daemon};
use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use upstream::{Upstream, BODY};

/// Every wait here allows for the nested host, 10-20x slower than KVM.
const WAIT: Duration = Duration::from_secs(120);

/// A microVM of the python image (asserting 201).
async fn python_vm(daemon: &Daemon, extra: Value) -> String {
    let mut body = json!({"runtime": "vm", "image": "python", "memory_mib": 256});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    daemon.create(body).await
}

fn decode(event: &Value) -> String {
    let data = event["data"]
        .as_str()
        .unwrap_or_else(|| panic!("an output event with data, got {event}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    String::from_utf8(bytes).expect("utf-8")
}

/// Live (not zombie) processes named `sleep` in the guest, counted by
/// Python from /proc.
async fn sleeps_in_guest(daemon: &Daemon, id: &str) -> String {
    let count = "import os\n\
        def live_sleep(p):\n\
        \x20   try:\n\
        \x20       stat = open('/proc/%s/stat' % p).read()\n\
        \x20   except OSError:\n\
        \x20       return False\n\
        \x20   return '(sleep)' in stat and stat.rsplit(')', 1)[1].split()[0] != 'Z'\n\
        print(sum(live_sleep(p) for p in os.listdir('/proc') if p.isdigit()))";
    let run = daemon.exec(id, &["python3", "-c", count]).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    run.out()
}

/// How many children a Python process in the guest could fork (each
/// sleeping, all alive at once) before a fork failed, and that failure's
/// errno; at most 64 are tried.
async fn forks_until_refused(daemon: &Daemon, id: &str) -> String {
    let forks = "import os, time\n\
        children, refused = [], None\n\
        for _ in range(64):\n\
        \x20   try:\n\
        \x20       pid = os.fork()\n\
        \x20   except OSError as e:\n\
        \x20       refused = e.errno\n\
        \x20       break\n\
        \x20   if pid == 0:\n\
        \x20       time.sleep(60)\n\
        \x20       os._exit(0)\n\
        \x20   children.append(pid)\n\
        for pid in children:\n\
        \x20   os.kill(pid, 9)\n\
        \x20   os.waitpid(pid, 0)\n\
        print(len(children), refused)";
    let run = daemon.exec(id, &["python3", "-c", forks]).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    run.out()
}

#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_runs_processes_as_a_container_does() {
    let Some(daemon) = linux_vm_daemon(&[]) else {
        return;
    };
    let id = python_vm(&daemon, json!({"cpu": 2})).await;
    let run = daemon.exec(&id, &["python3", "-c", "print(6*7)"]).await;
    assert_eq!(run.out(), "42\n", "{}\n{}", run.err(), daemon.log());
    assert_eq!(run.exit_code(), Some(0));

    // stdin in, stdout and stderr out, in the order they were written: each
    // line sent is answered on one stream before the next is sent.
    let script = "while read n; do if [ $((n % 2)) = 0 ]; then echo out$n; else echo err$n >&2; fi; done; exit 5";
    let proc = daemon
        .start_process(&id, json!({"argv": ["sh", "-c", script], "stdin": true}))
        .await;
    let mut stream = daemon.follow_output(&id, proc).await;
    for n in 0..6u32 {
        daemon
            .write_stdin(&id, proc, format!("{n}\n").as_bytes())
            .await;
        let event = stream.next(WAIT).await.expect("an output event");
        let (kind, text) = if n % 2 == 0 {
            ("stdout", format!("out{n}\n"))
        } else {
            ("stderr", format!("err{n}\n"))
        };
        assert_eq!(event["type"], kind, "event {n}: {event}");
        assert_eq!(decode(&event), text);
    }
    daemon.close_stdin(&id, proc).await;
    let exit = stream.next(WAIT).await.expect("exit event");
    assert_eq!(exit["process"]["exit_code"], 5, "{exit}");

    // A timeout kills the whole tree, the child that called setsid too.
    let tree = "setsid sh -c 'sleep 1000' & sleep 1000 & echo ready; wait";
    let proc = daemon
        .start_process(
            &id,
            json!({"argv": ["sh", "-c", tree], "timeout_seconds": 20}),
        )
        .await;
    let mut stream = daemon.follow_output(&id, proc).await;
    let ready = stream.next(WAIT).await.expect("ready");
    assert_eq!(decode(&ready), "ready\n", "{ready}");
    // The positive control: both sleeps are there to be found.
    assert_eq!(sleeps_in_guest(&daemon, &id).await, "2\n");
    let mut exit = None;
    while let Some(event) = stream.next(WAIT).await {
        if event["type"] == "exit" {
            exit = Some(event["process"].clone());
        }
    }
    let process = exit.expect("exit event");
    assert_eq!(process["timed_out"], true, "{process}");
    assert_eq!(process["signal"], 9, "{process}");
    assert_eq!(
        sleeps_in_guest(&daemon, &id).await,
        "0\n",
        "a sleep outlived the timeout"
    );

    // Files: 10 MiB up and back, byte for byte.
    let data: Vec<u8> = (0..10u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let chunks: Vec<Vec<u8>> = data.chunks(1 << 20).map(<[u8]>::to_vec).collect();
    let (status, body) = daemon
        .upload_stream(&id, "/root/ten.bin", chunks.into_iter())
        .await
        .expect("upload");
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut back = Vec::new();
    let (status, len) = daemon
        .download_with(&id, "/root/ten.bin", |chunk| back.extend_from_slice(chunk))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(len, 10 << 20);
    assert!(back == data, "the 10 MiB came back different");
    let run = daemon
        .exec(
            &id,
            &[
                "python3",
                "-c",
                "print(len(open('/root/ten.bin','rb').read()))",
            ],
        )
        .await;
    assert_eq!(
        run.out(),
        format!("{}\n", 10 << 20),
        "{} {}",
        run.process,
        run.err()
    );

    daemon.delete(&id).await;
    assert_nothing_left(&daemon, &[&id]).await;
}

/// A warm microVM pool of the python image: a create of its size gets a
/// Linux guest that booted before it asked, with the caller's environment
/// and egress policy.
#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_pooled_linux_guest_is_handed_out_with_the_callers_env_and_fewer_pids() {
    let flags = [
        "--vm-pool-size",
        "1",
        "--default-image",
        "python",
        "--default-memory-mib",
        "256",
    ]
    .map(String::from);
    let Some(daemon) = linux_vm_daemon(&flags) else {
        return;
    };
    // The first boot also exports the image's disk.
    daemon.pool_reaches_within(1, WAIT * 2).await;
    let id = daemon
        .create(
            json!({"runtime": "vm", "env": {"GREETING": "hi from the pool"},
            "allow_list": ["example.test"], "pids": 16}),
        )
        .await;
    let hit = "sandboxd_pool_claims_total{runtime=\"vm\",image=\"python\",result=\"hit\"} ";
    assert_eq!(daemon.metric(hit).await, 1.0);
    let run = daemon
        .exec(
            &id,
            &["python3", "-c", "import os; print(os.environ['GREETING'])"],
        )
        .await;
    assert_eq!(run.out(), "hi from the pool\n", "{}", run.err());
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        view["network"]["allow_list"],
        json!(["example.test"]),
        "{view}"
    );
    // The pool booted the VM with the default pids limit; the claim's
    // lower one holds inside the guest: the Python process and 15
    // children, then EAGAIN (11).
    assert_eq!(view["limits"]["pids"], 16, "{view}");
    assert_eq!(forks_until_refused(&daemon, &id).await, "15 11\n");
    daemon.delete(&id).await;
    assert_nothing_left(&daemon, &[&id]).await;
}

/// A create of an image and size booted before is a fork of the boot
/// template the daemon made of it meanwhile: the caller's environment and
/// pids limit hold inside the guest, and the first random bytes differ
/// between two forks.
#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_forks_from_its_boot_template_with_the_callers_env_pids_and_entropy() {
    let flags = ["--vm-boot-templates", "true"].map(String::from);
    let Some(daemon) = linux_vm_daemon(&flags) else {
        return;
    };
    let first = python_vm(&daemon, json!({})).await;
    daemon
        .await_metric_within("sandboxd_vm_boot_templates ", WAIT * 2)
        .await;
    let mut events = daemon.follow_events(0).await;
    let a = python_vm(
        &daemon,
        json!({"env": {"GREETING": "hi from the template"}, "pids": 16}),
    )
    .await;
    let b = python_vm(&daemon, json!({})).await;
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "ready" && e["sandbox_id"] == b.as_str()
        })
        .await;
    for id in [&a, &b] {
        assert!(
            seen.iter().any(|e| e["kind"] == "created"
                && e["sandbox_id"] == id.as_str()
                && e["detail"] == "from a boot template"),
            "{id}: {seen:?}"
        );
    }
    // The template ran python3 once (its files then sit in the guest's
    // page cache), which its forks do not list as theirs.
    let (_, list) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{a}/processes"), None)
        .await;
    assert_eq!(list["processes"], json!([]), "{list}");
    // The first random bytes each fork's first process draws differ: the
    // guest's CRNG was reseeded before that process started (the seed goes
    // first on the fork's link, which its agent reads in order).
    let draw = ["python3", "-c", "import os; print(os.urandom(16).hex())"];
    let (a_hex, b_hex) = (
        daemon.exec(&a, &draw).await.out(),
        daemon.exec(&b, &draw).await.out(),
    );
    assert_eq!(a_hex.len(), 33, "{a_hex:?}");
    assert_ne!(a_hex, b_hex, "two forks drew the same os.urandom(16)");
    let hit = "sandboxd_vm_boot_template_creates_total{result=\"hit\"} ";
    assert_eq!(daemon.metric(hit).await, 2.0);
    let run = daemon
        .exec(
            &a,
            &["python3", "-c", "import os; print(os.environ['GREETING'])"],
        )
        .await;
    assert_eq!(run.out(), "hi from the template\n", "{}", run.err());
    // The template booted with the default pids limit; the fork's lower
    // one holds inside its guest.
    assert_eq!(forks_until_refused(&daemon, &a).await, "15 11\n");
    let run = daemon.exec(&b, &["python3", "-c", "print(6*7)"]).await;
    assert_eq!(run.out(), "42\n", "{}", run.err());
    for id in [&first, &a, &b] {
        daemon.delete(id).await;
    }
    assert_nothing_left(&daemon, &[&first, &a, &b]).await;
}

#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_keeps_its_pids_limit_and_reports_an_oom_kill_inside_it() {
    let Some(daemon) = linux_vm_daemon(&[]) else {
        return;
    };
    let id = python_vm(&daemon, json!({"pids": 24})).await;
    // The limit counts every process the agent started (the Python
    // process, then its children) and not the agent: 1 + 23, then EAGAIN.
    assert_eq!(forks_until_refused(&daemon, &id).await, "23 11\n");
    // The children are gone, so the limit leaves room again.
    assert_eq!(forks_until_refused(&daemon, &id).await, "23 11\n");
    // A tree that holds the whole limit does not keep the agent from
    // starting or killing anything: the agent is outside the limited group,
    // and moving a new process into it is not a fork there.
    let fill = "import os, time\n\
        n = 0\n\
        while True:\n\
        \x20   try:\n\
        \x20       if os.fork() == 0:\n\
        \x20           time.sleep(600)\n\
        \x20           os._exit(0)\n\
        \x20   except OSError:\n\
        \x20       break\n\
        \x20   n += 1\n\
        print('full', n, flush=True)\n\
        time.sleep(600)";
    let bomb = daemon
        .start_process(&id, json!({"argv": ["python3", "-c", fill]}))
        .await;
    let mut stream = daemon.follow_output(&id, bomb).await;
    let full = stream.next(WAIT).await.expect("the limit filled");
    assert_eq!(decode(&full), "full 23\n", "{full}");
    let run = daemon
        .exec(&id, &["python3", "-c", "print('still served')"])
        .await;
    assert_eq!(run.out(), "still served\n", "{}", run.err());
    // The stats count the guest's tasks (the host group holds the VMM's
    // threads): the tree that holds the limit, all of it.
    let (status, stats) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}/stats"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(
        (stats["pids"].as_u64(), stats["pids_limit"].as_u64()),
        (Some(24), Some(24)),
        "{stats}"
    );
    let (status, _) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{bomb}/kill"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(daemon.output(&id, bomb).await.process["signal"], 9);
    // An allocation past the guest's memory is OOM-killed inside it, and
    // reported as such; the sandbox lives on.
    let hog = daemon
        .start_process(
            &id,
            json!({"code": "x = []\nwhile True:\n    x.append(b'\\x01' * (16 << 20))\n    print('survived', len(x) * 16, 'MiB', flush=True)\n"}),
        )
        .await;
    let run = daemon.output(&id, hog).await;
    // Chunks of 16 MiB, each within what the kernel's overcommit lets one
    // allocation have, until the guest runs out: its OOM killer ends it.
    assert!(run.out().contains("survived"), "{}", run.err());
    assert!(
        !run.out().contains("survived 256 MiB"),
        "256 MiB in a 256 MiB guest"
    );
    assert_eq!(
        run.process["oom_killed"],
        true,
        "{} {}",
        run.process,
        run.err()
    );
    assert_eq!(run.process["signal"], 9, "{}", run.process);
    assert_eq!(daemon.exec(&id, &["true"]).await.exit_code(), Some(0));

    daemon.delete(&id).await;
    assert_nothing_left(&daemon, &[&id]).await;
}

#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_reaches_allowed_hosts_only_through_its_proxy() {
    let upstream = Upstream::start();
    let Some(daemon) = linux_vm_daemon(&upstream.daemon_flags()) else {
        return;
    };
    let id = python_vm(&daemon, json!({"allow_list": ["allowed.example.test"]})).await;
    let fetch = |host: &str| {
        format!(
            "import time, urllib.request\n\
             begun = time.monotonic()\n\
             try:\n\
             \x20   print(urllib.request.urlopen('http://{host}/', timeout=60).read().decode())\n\
             except Exception as e:\n\
             \x20   print('refused', repr(e), round(time.monotonic() - begun))\n"
        )
    };
    let run = daemon
        .exec(&id, &["python3", "-c", &fetch("allowed.example.test")])
        .await;
    assert_eq!(run.out(), format!("{BODY}\n"), "{}", run.err());
    for host in ["denied.example.test", "private.example.test", "10.1.2.3"] {
        let started = Instant::now();
        let run = daemon.exec(&id, &["python3", "-c", &fetch(host)]).await;
        assert!(run.out().starts_with("refused"), "{host}: {}", run.out());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{host} took {:?} to fail",
            started.elapsed()
        );
    }
    let entries = daemon.egress_log(&id).await;
    assert!(
        entries
            .iter()
            .any(|e| e["verdict"] == "allowed" && e["host"] == "allowed.example.test"),
        "{entries:?}"
    );
    // A refused name never resolves (the sandbox's DNS answers only what
    // the policy allows); an address is dialled and refused by the proxy.
    assert!(
        entries
            .iter()
            .any(|e| e["verdict"] == "refused" && e["host"] == "10.1.2.3"),
        "{entries:?}"
    );
    assert!(
        entries.iter().all(|e| e["host"] != "denied.example.test"),
        "{entries:?}"
    );
    daemon.delete(&id).await;
    assert_nothing_left(&daemon, &[&id]).await;
}

/// A Python server in the guest that keeps a counter in memory and answers
/// each connection on its Unix socket with the next value and 16 fresh
/// bytes of `os.urandom`.
/// Writes `text` to /root/note in `id` and syncs it to the disk.
async fn write_note(daemon: &Daemon, id: &str, text: &str) {
    let run = daemon
        .exec(
            id,
            &["sh", "-c", &format!("echo {text} > /root/note && sync")],
        )
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
}

/// The rest of a sandbox's life on a Linux guest: a signal reaches a
/// process's handler, its stats and usage are counted, a filesystem
/// snapshot of its scratch disk starts new VMs with the files of that
/// moment, and its TTL removes it.
#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_takes_signals_counts_usage_snapshots_its_files_and_expires() {
    let Some(daemon) = linux_vm_daemon(&[]) else {
        return;
    };
    let source = python_vm(&daemon, json!({})).await;

    let handler = "import signal, sys, time\n\
        signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(3)))\n\
        print('ready', flush=True)\n\
        time.sleep(1000)";
    let proc = daemon
        .start_process(&source, json!({"argv": ["python3", "-c", handler]}))
        .await;
    let mut stream = daemon.follow_output(&source, proc).await;
    let ready = stream.next(WAIT).await.expect("ready");
    assert_eq!(decode(&ready), "ready\n", "{ready}");
    let (status, body) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{source}/processes/{proc}/signal"),
            Some(json!({"signal": "TERM"})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let term = stream.next(WAIT).await.expect("the handler's line");
    assert_eq!(decode(&term), "term\n", "{term}");
    let exit = stream.next(WAIT).await.expect("exit event");
    assert_eq!(exit["process"]["exit_code"], 3, "{exit}");

    let (status, stats) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{source}/stats"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert!(stats["cpu_seconds"].as_f64() > Some(0.0), "{stats}");
    assert!(stats["memory_bytes"].as_u64() > Some(0), "{stats}");
    assert_eq!(stats["oom_kills"], 0, "{stats}");

    // A filesystem snapshot: what was written before it is in it, what was
    // written after is not, and each VM started from it writes its own.
    write_note(&daemon, &source, "kept").await;
    let snap = daemon.snapshot(&source, "filesystem").await;
    write_note(&daemon, &source, "gone").await;
    let child = python_vm(&daemon, json!({"image": snap})).await;
    let read = daemon.exec(&child, &["cat", "/root/note"]).await;
    assert_eq!(read.out(), "kept\n", "{}", read.err());
    let run = daemon.exec(&child, &["python3", "-c", "print(6*7)"]).await;
    assert_eq!(
        run.out(),
        "42\n",
        "the image under the snapshot: {}",
        run.err()
    );
    write_note(&daemon, &child, "mine").await;
    let again = python_vm(&daemon, json!({"image": snap})).await;
    let read = daemon.exec(&again, &["cat", "/root/note"]).await;
    assert_eq!(
        read.out(),
        "kept\n",
        "the second VM of the snapshot (exit {:?}): {}",
        read.exit_code(),
        read.err()
    );
    assert_eq!(
        daemon.exec(&source, &["cat", "/root/note"]).await.out(),
        "gone\n"
    );

    // The TTL, shortened to a second, removes the VM; the other two are
    // deleted by hand.
    let mut events = daemon.follow_events(0).await;
    let (status, body) = daemon
        .call(
            Method::PUT,
            &format!("/v1/sandboxes/{source}/ttl"),
            Some(json!({"ttl_seconds": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = events
        .until(WAIT, |e| {
            e["kind"] == "deleted" && e["sandbox_id"] == source.as_str()
        })
        .await;
    assert!(
        seen.iter()
            .any(|e| e["kind"] == "expired" && e["sandbox_id"] == source.as_str()),
        "{seen:?}"
    );
    for id in [&child, &again] {
        daemon.delete(id).await;
    }
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_nothing_left(&daemon, &[&source, &child, &again]).await;
}

const COUNTER: &str = "import os, socket\n\
    s = socket.socket(socket.AF_UNIX)\n\
    s.bind('/run/counter.sock')\n\
    s.listen()\n\
    n = 0\n\
    print('listening', flush=True)\n\
    while True:\n\
    \x20   c, _ = s.accept()\n\
    \x20   n += 1\n\
    \x20   c.sendall(b'%d %s' % (n, os.urandom(16).hex().encode()))\n\
    \x20   c.close()\n";

/// The counter's next value and random hex.
async fn next_count(daemon: &Daemon, id: &str) -> (u64, String) {
    let ask = "import socket\n\
        c = socket.socket(socket.AF_UNIX)\n\
        c.connect('/run/counter.sock')\n\
        print(c.recv(100).decode())";
    let run = daemon.exec(id, &["python3", "-c", ask]).await;
    let out = run.out();
    let (n, hex) = out
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("counter answered {out:?} {}", run.err()));
    (n.parse().expect("count"), hex.to_string())
}

#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guest_forks_from_a_memory_snapshot_into_diverging_vms() {
    let Some(daemon) = linux_vm_daemon(&[]) else {
        return;
    };
    let source = python_vm(&daemon, json!({})).await;
    let server = daemon
        .start_process(&source, json!({"argv": ["python3", "-c", COUNTER]}))
        .await;
    let mut stream = daemon.follow_output(&source, server).await;
    let up = stream.next(WAIT).await.expect("listening");
    assert_eq!(decode(&up), "listening\n", "{up}");
    for n in 1..=3 {
        assert_eq!(next_count(&daemon, &source).await.0, n);
    }
    let snap = daemon.snapshot(&source, "memory").await;
    assert_eq!(next_count(&daemon, &source).await.0, 4);

    let fork_a = daemon.create(json!({"from_snapshot": snap})).await;
    let fork_b = daemon.create(json!({"from_snapshot": snap})).await;
    // Both continue from the snapshot's 3, and the first random bytes each
    // draws after the fork differ: the guest's CRNG was reseeded.
    let (a4, a_hex) = next_count(&daemon, &fork_a).await;
    let (b4, b_hex) = next_count(&daemon, &fork_b).await;
    assert_eq!((a4, b4), (4, 4));
    assert_ne!(a_hex, b_hex, "two forks drew the same os.urandom(16)");
    assert_eq!(next_count(&daemon, &fork_a).await.0, 5);
    assert_eq!(next_count(&daemon, &fork_a).await.0, 6);
    assert_eq!(next_count(&daemon, &fork_b).await.0, 5);
    assert_eq!(next_count(&daemon, &source).await.0, 5);

    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for id in [&source, &fork_a, &fork_b] {
        daemon.delete(id).await;
    }
    assert_nothing_left(&daemon, &[&source, &fork_a, &fork_b]).await;
}

/// A server in a Linux guest is reached through its preview URL: the
/// ingress dials through the VM's tap to the guest's address, and one
/// bound to the guest's loopback only through a forwarder its agent opens
/// for the connection; a port nothing serves gets a 502 saying so.
#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_linux_guests_server_is_reached_through_its_preview_url() {
    let ingress = common::free_loopback_addr();
    let flags = [
        "--ingress-listen".to_string(),
        ingress.to_string(),
        "--ingress-domain".to_string(),
        "sbx.test".to_string(),
    ];
    let Some(daemon) = linux_vm_daemon(&flags) else {
        return;
    };
    let id = python_vm(&daemon, json!({})).await;
    daemon
        .start_process(
            &id,
            json!({"argv": ["sh", "-c", "mkdir -p /tmp/www && echo hello-from-the-guest > /tmp/www/index.html \
                && cd /tmp/www && exec python3 -m http.server 8000 --bind 0.0.0.0"]}),
        )
        .await;
    daemon
        .start_process(
            &id,
            json!({"argv": ["python3", "-m", "http.server", "8001", "--bind", "127.0.0.1"]}),
        )
        .await;
    for port in [8000, 8001] {
        daemon.expose_public(&id, port).await;
    }
    // Both listen (the agent reads the guest's /proc/net/tcp).
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, view) = daemon
            .call(
                Method::GET,
                &format!("/v1/sandboxes/{id}/ports?listening=true"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        let listening = view["listening"].as_array().cloned().unwrap_or_default();
        if [8000, 8001]
            .iter()
            .all(|p| listening.iter().any(|l| l["port"] == *p))
        {
            break;
        }
        assert!(Instant::now() < deadline, "not listening: {view}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let served = common::ingress_get(ingress, &format!("{id}-8000.sbx.test"), WAIT).await;
    assert!(served.starts_with("HTTP/1.0 200"), "{served}");
    assert!(served.ends_with("hello-from-the-guest\n"), "{served}");
    let on_loopback = common::ingress_get(ingress, &format!("{id}-8001.sbx.test"), WAIT).await;
    assert!(on_loopback.starts_with("HTTP/1.0 200"), "{on_loopback}");
    assert!(on_loopback.contains("Directory listing"), "{on_loopback}");
    // Twice: each connection gets a forwarder of its own.
    let again = common::ingress_get(ingress, &format!("{id}-8001.sbx.test"), WAIT).await;
    assert!(again.starts_with("HTTP/1.0 200"), "{again}");
    daemon.expose_public(&id, 8002).await;
    let refused = common::ingress_get(ingress, &format!("{id}-8002.sbx.test"), WAIT).await;
    assert!(refused.starts_with("HTTP/1.1 502"), "{refused}");
    assert!(
        refused.contains("not on the guest's address (10.201.0.2:8002: Connection refused")
            && refused.contains("nothing listens on port 8002 of the guest's loopback"),
        "{refused}"
    );
    daemon.delete(&id).await;
    assert_nothing_left(&daemon, &[&id]).await;
}
