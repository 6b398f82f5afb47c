//! Resource limits through the real daemon, checked both inside the sandbox and
//! in the host's cgroups: memory (OOM report), pids (fork failures, the
//! counter stays under the limit), disk (dd and uploads hit the quota), CPU
//! (CFS quota, throttling and weights), huge pages (none, in the nested
//! host), and the TTL (expiry, and changing it live).

mod common;

use std::time::Duration;

use common::{cgroup, Daemon, Reason};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

/// Awaits, on `/v1/events` (replayed from cursor 0, so nothing emitted
/// before the call is missed), the reaper's `expired` and then `deleted`
/// event for `id`; true when both came within `deadline` and the sandbox
/// is then a 404.
async fn gone_within(daemon: &Daemon, id: &str, deadline: Duration) -> bool {
    let mut events = daemon.follow_events(0).await;
    let ended = |e: &Value| e["kind"] == "deleted" && e["sandbox_id"] == id;
    let Ok(seen) = tokio::time::timeout(deadline, events.until(deadline, ended)).await else {
        return false;
    };
    let kinds: Vec<&str> = seen
        .iter()
        .filter(|e| e["sandbox_id"] == id)
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.ends_with(&["expired", "deleted"]),
        "a TTL end is `expired` then `deleted`: {kinds:?}"
    );
    let (status, _) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    status == StatusCode::NOT_FOUND
}

#[tokio::test]
async fn memory_limit_reports_an_oom_kill() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon
        .create(json!({"image": "python", "memory_mib": 64}))
        .await;
    assert_eq!(cgroup::memory_limit(&id), Some(64u64 << 20));
    // bytes * n writes every page, so the memory is really used.
    let proc = daemon
        .start_process(
            &id,
            json!({"code": "x = b'\\x01' * (256 * 1024 * 1024)\nprint('survived', len(x))\n"}),
        )
        .await;
    let run = daemon.output(&id, proc).await;
    assert!(
        !run.out().contains("survived"),
        "allocated 256 MiB under a 64 MiB limit"
    );
    assert_eq!(
        run.process["oom_killed"],
        true,
        "{} stderr: {}",
        run.process,
        run.err()
    );
    assert_eq!(run.process["signal"], 9, "{}", run.process);
    // A scheduler learns of it from the event log: an `oom` event naming
    // the process.
    let mut events = daemon.follow_events(0).await;
    let seen = events
        .until(Duration::from_secs(30), |e| {
            e["kind"] == "oom" && e["sandbox_id"] == id.as_str()
        })
        .await;
    let oom = seen.last().expect("the oom event");
    assert_eq!(oom["process_id"], proc, "{oom}");
    let (status, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        sandbox["oom_kills"].as_u64().expect("oom_kills") >= 1,
        "{sandbox}"
    );
    assert_eq!(
        sandbox["state"], "ready",
        "an OOM kill of one process leaves the sandbox up: {sandbox}"
    );
    // And the sandbox still runs things.
    assert_eq!(
        daemon.exec(&id, &["python3", "-c", "print(1)"]).await.out(),
        "1\n"
    );
    // A process the daemon kills is not counted as an OOM kill.
    let proc = daemon
        .start_process(&id, json!({"argv": ["sleep", "1000"]}))
        .await;
    let (status, _) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/kill"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let run = daemon.output(&id, proc).await;
    assert_eq!(run.process["oom_killed"], false, "{}", run.process);
}

#[tokio::test]
async fn pids_limit_stops_a_fork_loop() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox", "pids": 16})).await;
    assert_eq!(cgroup::pids_max(&id), "16");
    let proc = daemon
        .start_process(
            &id,
            json!({"argv": ["sh", "-c", "for i in $(seq 1 64); do sleep 100 & done; echo forked-all"]}),
        )
        .await;
    let run = daemon.output(&id, proc).await;
    let err = run.err();
    assert!(
        err.contains("can't fork") || err.contains("Resource temporarily unavailable"),
        "no fork failed: stdout {:?} stderr {err:?}",
        run.out()
    );
    assert!(!run.out().contains("forked-all"));
    assert_ne!(run.exit_code(), Some(0), "{}", run.process);
    // The sleeps that did start are still there, and the counter is capped.
    let current = cgroup::pids_current(&id);
    assert!(current <= 16, "pids.current {current} > 16");
    // (Counted from the host: inside, the full pids limit leaves no room to
    // start a counting process.)
    let sleeps = common::process_host_pids(&id, proc);
    assert!(!sleeps.is_empty(), "no sleep started at all");
    assert!(
        sleeps.len() < 64,
        "all 64 sleeps started under pids 16: {sleeps:?}"
    );
    // Killing the ended process still clears what it left behind.
    let (status, _) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/kill"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        daemon.sh(&id, "pidof sleep | wc -w").await.out().trim(),
        "0"
    );
}

#[tokio::test]
async fn disk_limit_stops_dd_and_uploads() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon
        .create(json!({"image": "busybox", "disk_mib": 64}))
        .await;
    let run = daemon
        .sh(&id, "dd if=/dev/zero of=/root/big bs=1M count=200")
        .await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "dd of 200 MiB succeeded under a 64 MiB disk"
    );
    let err = run.err();
    assert!(
        err.contains("No space left") || err.contains("Disk quota exceeded"),
        "dd failed for another reason: {err}"
    );
    let size: u64 = daemon
        .exec(&id, &["stat", "-c", "%s", "/root/big"])
        .await
        .out()
        .trim()
        .parse()
        .expect("size");
    assert!(
        size <= 70 << 20,
        "/root/big is {size} bytes under a 64 MiB limit"
    );
    assert!(size > 0);
    assert_eq!(
        daemon.exec(&id, &["rm", "/root/big"]).await.exit_code(),
        Some(0)
    );

    // The same through the upload API: an error status, and no partial file.
    let chunks = (0..200).map(|_| vec![0u8; 1 << 20]);
    let answer = daemon.upload_stream(&id, "/root/big", chunks).await;
    if let Some((status, body)) = &answer {
        assert!(
            !status.is_success(),
            "upload past the disk limit answered {status}: {body}"
        );
        assert!(
            status.is_client_error() || status.is_server_error(),
            "{status}"
        );
        assert_ne!(*status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    }
    let (status, body) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/stat?path=/root/big"),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a partial upload was left: {body}"
    );
    assert!(
        answer.is_some(),
        "the daemon answered no status to the oversized upload"
    );
    // The sandbox still has its disk once the file is gone.
    let run = daemon
        .sh(&id, "dd if=/dev/zero of=/root/small bs=1M count=8")
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
}

#[tokio::test]
async fn cpu_limit_throttles() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox", "cpu": 0.2})).await;
    let (quota, period) = cgroup::cpu_max(&id);
    assert_eq!(quota, Some(20000));
    assert_eq!(period, 100000);
    let run = daemon
        .exec(&id, &["timeout", "1", "sh", "-c", "while :; do :; done"])
        .await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "the busy loop should be ended by timeout: {}",
        run.process
    );
    let (periods, nanos) = cgroup::cpu_throttling(&id);
    assert!(periods > 0, "nr_throttled {periods}");
    assert!(nanos > 0, "throttled for {nanos} ns");
}

/// A sandbox's CPU weight against the others (what a Kubernetes pod's
/// requests become) is its group's, and only when asked: the default
/// sandbox beside it keeps the kernel's.
#[tokio::test]
async fn cpu_shares_weigh_a_sandbox_against_the_others() {
    require_host!();
    let daemon = Daemon::start();
    let heavy = daemon
        .create(json!({"image": "busybox", "cpu_shares": 2048}))
        .await;
    let plain = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(cgroup::cpu_weight(&heavy), cgroup::weight_of_shares(2048));
    assert_eq!(cgroup::cpu_weight(&plain), cgroup::weight_of_shares(1024));
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{heavy}"), None)
        .await;
    assert_eq!(view["limits"]["cpu_shares"], 2048, "{view}");
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{plain}"), None)
        .await;
    assert!(view["limits"].get("cpu_shares").is_none(), "{view}");
    // The default named is the default.
    let named_default = daemon
        .create(json!({"image": "busybox", "cpu_shares": 1024}))
        .await;
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{named_default}"), None)
        .await;
    assert!(view["limits"].get("cpu_shares").is_none(), "{view}");
    assert_eq!(
        cgroup::cpu_weight(&named_default),
        cgroup::weight_of_shares(1024)
    );
    for shares in [0, 1, 262_145] {
        let (status, body) = daemon
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"image": "busybox", "cpu_shares": shares})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shares}: {body}");
        assert_eq!(body["error"]["code"], "invalid_cpu_shares", "{body}");
    }

    // What the weights do: two sandboxes allowed every CPU, each busy on
    // CPU 0, share it as their weights say: 2048 to 512 is 4 to 1 on v1
    // and 174 to 59 on v2. The light one is busy first and for longer, so
    // both are busy over the whole of the heavy one's 3 s, the window both
    // are measured over.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let heavy = daemon
        .create(json!({"image": "busybox", "cpu": cpus, "cpu_shares": 2048}))
        .await;
    let light = daemon
        .create(json!({"image": "busybox", "cpu": cpus, "cpu_shares": 512}))
        .await;
    daemon
        .start_process(
            &light,
            json!({"argv": ["sh", "-c", common::busy_on_cpu_0(60)]}),
        )
        .await;
    let busy = daemon
        .start_process(
            &heavy,
            json!({"argv": ["sh", "-c", common::busy_on_cpu_0(3)]}),
        )
        .await;
    let (heavy_before, light_before) = (
        cpu_seconds(&daemon, &heavy).await,
        cpu_seconds(&daemon, &light).await,
    );
    let run = daemon.output(&heavy, busy).await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    let got_heavy = cpu_seconds(&daemon, &heavy).await - heavy_before;
    let got_light = cpu_seconds(&daemon, &light).await - light_before;
    daemon.delete(&light).await;
    eprintln!(
        "info: CPU seconds under contention, 2048 shares {got_heavy:.2}, 512 shares {got_light:.2}"
    );
    assert!(
        got_heavy > 2.0 * got_light,
        "2048 shares got {got_heavy:.2} s of CPU, 512 got {got_light:.2} s"
    );
}

/// The CPU time sandbox `id` has used, from its stats.
async fn cpu_seconds(daemon: &Daemon, id: &str) -> f64 {
    let (status, stats) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}/stats"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    stats["cpu_seconds"].as_f64().expect("cpu_seconds")
}

#[tokio::test]
async fn ttl_expiry_removes_the_sandbox() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon
        .create(json!({"image": "busybox", "ttl_seconds": 1}))
        .await;
    assert!(
        gone_within(&daemon, &id, Duration::from_secs(15)).await,
        "sandbox {id} outlived its TTL"
    );
    assert!(
        !daemon.run_dir().join("sandboxes").join(&id).exists(),
        "run dir left behind"
    );
    assert!(
        !cgroup::sandbox_dir("pids", &id).exists(),
        "cgroup left behind"
    );
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}

#[tokio::test]
async fn ttl_can_be_shortened_and_extended() {
    require_host!();
    let daemon = Daemon::start();
    // Shortened: 600 s becomes 1 s.
    let short = daemon
        .create(json!({"image": "busybox", "ttl_seconds": 600}))
        .await;
    let (status, body) = daemon
        .call(
            Method::PUT,
            &format!("/v1/sandboxes/{short}/ttl"),
            Some(json!({"ttl_seconds": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ttl_seconds"], 1);
    assert!(
        gone_within(&daemon, &short, Duration::from_secs(15)).await,
        "shortened TTL did not expire"
    );
    assert!(!daemon.run_dir().join("sandboxes").join(&short).exists());

    // Extended: a 2 s TTL becomes 600 s right after create. (2 s, not 1, so
    // that the create itself cannot outlast the original TTL.)
    let long = daemon
        .create(json!({"image": "busybox", "ttl_seconds": 2}))
        .await;
    let (status, body) = daemon
        .call(
            Method::PUT,
            &format!("/v1/sandboxes/{long}/ttl"),
            Some(json!({"ttl_seconds": 600})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ttl_seconds"], 600);
    // Nothing happens when a TTL does *not* expire, so await a witness
    // instead: a 2 s sandbox made after `long`, whose expiry the reaper
    // reports only once `long`'s original 2 s are over too.
    let witness = daemon
        .create(json!({"image": "busybox", "ttl_seconds": 2}))
        .await;
    assert!(
        gone_within(&daemon, &witness, Duration::from_secs(15)).await,
        "the witness did not expire"
    );
    let (status, body) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{long}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "extended sandbox expired: {body}");
    assert_eq!(body["state"], "ready");
    assert_eq!(daemon.exec(&long, &["true"]).await.exit_code(), Some(0));

    // -1 means no TTL; 0 is refused.
    let (status, body) = daemon
        .call(
            Method::PUT,
            &format!("/v1/sandboxes/{long}/ttl"),
            Some(json!({"ttl_seconds": -1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["expires_at"].is_null(), "{body}");
    let (status, body) = daemon
        .call(
            Method::PUT,
            &format!("/v1/sandboxes/{long}/ttl"),
            Some(json!({"ttl_seconds": 0})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("ttl_seconds"),
        "{body}"
    );
}

/// The host's pool of huge pages of the default size, grown for a test
/// and put back as it was when the guard drops.
struct ReservedHugePages {
    before: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn nr_hugepages() -> u64 {
    std::fs::read_to_string(NR_HUGEPAGES)
        .expect("nr_hugepages")
        .trim()
        .parse()
        .expect("a number")
}

impl ReservedHugePages {
    /// Adds `pages` to the pool (what the host had stays reserved).
    fn add(pages: u64) -> Self {
        let before = nr_hugepages();
        let guard = Self { before };
        std::fs::write(NR_HUGEPAGES, (before + pages).to_string()).expect("reserve huge pages");
        assert!(nr_hugepages() > before, "the kernel reserved no huge page");
        guard
    }
}

impl Drop for ReservedHugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.before.to_string());
    }
}

/// The default huge page size (`Hugepagesize` in /proc/meminfo), in KiB.
fn default_huge_page_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Sandboxes are given no huge pages: where a hugetlb controller reaches
/// a sandbox's group (cgroup v2, the nested host's), each size the host
/// has is limited to 0 there, reservations included, so a sandbox's
/// mapping of a huge page is refused (ENOMEM at `mmap`), the group
/// counting the refusal, while the host, which reserved the pool, maps
/// and touches the same page (the control). On this cgroup v1 host the
/// hugetlb controller sits on the v2 hierarchy, out of libcontainer's
/// reach, and no limit is set (see `cgroups::huge_page_sizes_to_deny`).
#[tokio::test]
#[ignore = "a hugetlb controller and reserved huge pages: scripts/nested-tests.sh runs it in the nested host (cgroup v2)"]
async fn a_sandbox_is_given_no_huge_pages_in_the_nested_host() {
    require_host!();
    let Some(kib) = default_huge_page_kib() else {
        common::skip!(Reason::NoKernelSupport, "the kernel has no huge pages");
    };
    // As libcgroups and the kernel's hugetlb files name it.
    let size = if kib >= 1 << 20 {
        format!("{}GB", kib >> 20)
    } else {
        format!("{}MB", kib >> 10)
    };
    if !sandboxd::runtime::cgroups::huge_page_sizes_to_deny().contains(&size) {
        common::skip!(
            Reason::NoKernelSupport,
            "no hugetlb controller reaches a sandbox's group here (cgroup v1 without a hugetlb hierarchy)"
        );
    }
    let _reserved = ReservedHugePages::add(1);
    // MAP_HUGETLB (0x40000 on x86-64), one page of the default size,
    // touched once.
    let touch = format!(
        "import mmap; m = mmap.mmap(-1, {} << 10, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000); m[0] = 1; print('touched')",
        kib
    );
    let host = std::process::Command::new("python3")
        .args(["-c", &touch])
        .output()
        .expect("python3 on the host");
    assert_eq!(
        String::from_utf8_lossy(&host.stdout),
        "touched\n",
        "the host maps its reserved huge page: {}",
        String::from_utf8_lossy(&host.stderr)
    );

    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "python"})).await;
    let group = cgroup::sandbox_dir("hugetlb", &id);
    let read = |file: String| {
        let path = group.join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    assert_eq!(read(format!("hugetlb.{size}.max")).trim(), "0");
    let run = daemon.exec(&id, &["python3", "-c", &touch]).await;
    assert_eq!(run.exit_code(), Some(1), "{} {}", run.process, run.err());
    assert!(
        run.err().contains("Cannot allocate memory"),
        "{}",
        run.err()
    );
    assert!(!run.out().contains("touched"), "{}", run.out());
    // Refused by the group's own limit: its count of refusals at it.
    let events = read(format!("hugetlb.{size}.events"));
    let at_max = events
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(at_max >= Some(1), "hugetlb.{size}.events: {events}");
    daemon.delete(&id).await;
}
