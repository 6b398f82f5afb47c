//! Root-only: filesystem snapshots of running container sandboxes, used as
//! images by new sandboxes (stacked read-only under a fresh writable layer),
//! chained, and deleted while sandboxes still stand on them.

mod common;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

/// What a sandbox's `/dev` looks like from inside: each entry's type, mode
/// and owner, the links, and the mounts of /dev and /dev/shm (point,
/// options, type, filesystem options). Not /dev/mqueue's root: CRIU
/// remakes that kernel view itself, owned by the sandbox's root.
const DEV_VIEW: &str = "stat -c '%n %F %a %u %g' $(ls -d /dev /dev/* | grep -v mqueue) 2>&1; \
    readlink /dev/fd /dev/ptmx /dev/stdin; \
    awk '$5 == \"/dev\" || $5 == \"/dev/shm\" { print $5, $6, $(NF-2), $NF }' /proc/self/mountinfo";

async fn snapshot(daemon: &Daemon, id: &str, kind: &str) -> (StatusCode, Value) {
    daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({ "kind": kind })),
        )
        .await
}

/// How many tmpfs mounts CRIU saved with tar in a memory snapshot.
fn tar_saved_tmpfs(daemon: &Daemon, snapshot: &str) -> usize {
    let images = daemon.state_dir().join("snapshot-images").join(snapshot);
    std::fs::read_dir(&images)
        .unwrap_or_else(|e| panic!("{}: {e}", images.display()))
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tmpfs-dev-"))
        .count()
}

fn snapshot_dirs(daemon: &Daemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(daemon.state_dir().join("disk/snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_filesystem_snapshot_becomes_an_image() {
    require_host!();
    let daemon = Daemon::start();
    let source = daemon.create(json!({"image": "busybox"})).await;
    let run = daemon
        .sh(
            &source,
            "mkdir -p /data && echo before > /data/file && rm /bin/vi && echo ok",
        )
        .await;
    assert_eq!(run.out(), "ok\n", "{}", run.err());

    let (status, snap) = snapshot(&daemon, &source, "filesystem").await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert!(snap_id.starts_with("snap-"), "{snap}");
    assert_eq!(snap["kind"], "filesystem");
    assert_eq!(snap["sandbox"], source.as_str());
    assert_eq!(snap["image"], "busybox");
    // The directory holding snapshots is the daemon's alone.
    let mode = std::fs::metadata(daemon.state_dir().join("disk/snapshots"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("snapshots dir");
    assert_eq!(mode, 0o700);

    // The source keeps running; what it writes now is not in the snapshot.
    let run = daemon
        .sh(&source, "echo after > /data/file; cat /data/file")
        .await;
    assert_eq!(run.out(), "after\n");

    let (status, list) = daemon.call(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        list["snapshots"]
            .as_array()
            .expect("list")
            .iter()
            .any(|s| s["id"] == snap_id.as_str()),
        "{list}"
    );
    let (status, got) = daemon
        .call(Method::GET, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["id"], snap_id.as_str());

    // A sandbox made from it sees the files as they were, deletions too,
    // and writes only to its own layer.
    let child = daemon.create(json!({"image": snap_id})).await;
    let run = daemon
        .sh(&child, "cat /data/file; test -e /bin/vi && echo vi-is-back; echo child > /data/file; echo done")
        .await;
    assert_eq!(run.out(), "before\ndone\n", "{}", run.err());
    let run = daemon.sh(&source, "cat /data/file").await;
    assert_eq!(run.out(), "after\n");
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{child}"), None)
        .await;
    assert_eq!(view["image"], snap_id.as_str(), "{view}");

    // Snapshots chain: one of the child stacks on the first.
    let (status, second) = snapshot(&daemon, &child, "filesystem").await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    let second_id = second["id"].as_str().expect("id").to_string();
    let grandchild = daemon.create(json!({"image": second_id})).await;
    let run = daemon
        .sh(
            &grandchild,
            "cat /data/file; ls /bin/vi 2>&1 | grep -c 'No such'",
        )
        .await;
    assert_eq!(run.out(), "child\n1\n", "{}", run.err());

    // Deleting snapshots that sandboxes stand on is safe: they are gone for
    // the API at once and their data stays until nothing uses it.
    for id in [&snap_id, &second_id] {
        let (status, v) = daemon
            .call(Method::DELETE, &format!("/v1/snapshots/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
        let (status, _) = daemon
            .call(Method::GET, &format!("/v1/snapshots/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": snap_id})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(snapshot_dirs(&daemon).len(), 2);
    let run = daemon.sh(&grandchild, "cat /data/file").await;
    assert_eq!(run.out(), "child\n");
    daemon.delete(&grandchild).await;
    // The second snapshot went with its last user; the first is still the
    // child's base.
    assert_eq!(snapshot_dirs(&daemon), vec![snap_id.clone()]);
    daemon.delete(&child).await;
    assert!(
        snapshot_dirs(&daemon).is_empty(),
        "{:?}",
        snapshot_dirs(&daemon)
    );
    daemon.delete(&source).await;
}

#[tokio::test]
async fn snapshot_errors_are_clear() {
    require_host!();
    let mut daemon = Daemon::start();
    // Checkpoint images no snapshot owns (a crash mid-snapshot) go at start.
    let stray = daemon
        .state_dir()
        .join("snapshot-images/snap-00000000deadbeef");
    std::fs::create_dir_all(&stray).expect("stray images");
    std::fs::write(stray.join("pages-1.img"), b"x").expect("stray image");
    daemon.restart();
    assert!(!stray.exists(), "{} survived a restart", stray.display());
    let (status, v) = daemon
        .call(Method::GET, "/v1/snapshots/snap-0000000000000000", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "snapshot_not_found", "{v}");
    let (status, v) = daemon
        .call(Method::DELETE, "/v1/snapshots/snap-0000000000000000", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = snapshot(&daemon, "sb-000000000000", "filesystem").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let id = daemon.create(json!({"image": "busybox"})).await;
    let (status, v) = snapshot(&daemon, &id, "everything").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("kind"), "{v}");
    // Snapshot kinds are not interchangeable.
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": "snap-0000000000000000"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, fs_snap) = snapshot(&daemon, &id, "filesystem").await;
    assert_eq!(status, StatusCode::CREATED, "{fs_snap}");
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": fs_snap["id"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "invalid_snapshot", "{v}");
    if common::criu_missing().is_none() {
        let (status, mem_snap) = snapshot(&daemon, &id, "memory").await;
        assert_eq!(status, StatusCode::CREATED, "{mem_snap}");
        let (status, v) = daemon
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"image": mem_snap["id"]})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert!(v.to_string().contains("from_snapshot"), "{v}");
    }
    daemon.delete(&id).await;
}

#[tokio::test]
async fn sandboxctl_takes_lists_and_removes_snapshots() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(common::CTL)
            .arg("--socket")
            .arg(&daemon.socket)
            .args(args)
            .output()
            .expect("run sandboxctl");
        assert!(
            out.status.success(),
            "sandboxctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let snap = ctl(&["snapshot", &id, "--filesystem"]);
    assert!(snap.starts_with("snap-"), "{snap}");
    let listed = ctl(&["snapshots"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&snap) && l.contains("filesystem") && l.contains(&id)),
        "{listed}"
    );
    assert_eq!(ctl(&["rm-snapshot", &snap]), snap);
    assert!(!ctl(&["snapshots"]).contains(&snap));
    daemon.delete(&id).await;
}

/// Holds state in memory (a counter), an open file and a listening socket;
/// each `get` answers with the counter, the file's size, fresh kernel
/// randomness and its monotonic clock, then counts up.
const SERVER: &str = r#"
import os, socket, time
counter = 0
journal = open('/tmp/journal', 'a+')
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('127.0.0.1', 7000))
server.listen(16)
print('ready', flush=True)
while True:
    conn, _ = server.accept()
    conn.recv(16)
    journal.write('x')
    journal.flush()
    conn.sendall(('%d %d %s %.6f' % (counter, journal.tell(), os.urandom(8).hex(), time.monotonic())).encode())
    conn.close()
    counter += 1
"#;

const CLIENT: &str = "import socket\n\
    s = socket.create_connection(('127.0.0.1', 7000), timeout=10)\n\
    s.sendall(b'get')\n\
    print(s.recv(100).decode())";

/// What the server in a sandbox answered.
struct Answer {
    counter: u64,
    journal_bytes: u64,
    random: String,
    monotonic: f64,
}

async fn ask(daemon: &Daemon, id: &str) -> Answer {
    let run = daemon.exec(id, &["python3", "-c", CLIENT]).await;
    let out = run.out();
    let words: Vec<&str> = out.split_whitespace().collect();
    let answer = match words.as_slice() {
        [counter, size, random, monotonic] => (|| {
            Some(Answer {
                counter: counter.parse().ok()?,
                journal_bytes: size.parse().ok()?,
                random: random.to_string(),
                monotonic: monotonic.parse().ok()?,
            })
        })(),
        _ => None,
    };
    answer.unwrap_or_else(|| panic!("server in {id} answered {out:?}: {}", run.err()))
}

/// A fork where the run directory's file system is mounted nosuid, nodev
/// and noexec, as a systemd host's `/run` (the default run directory's
/// home) is: a bind carries its source's flags, which CRIU cannot clear
/// in the sandbox's user namespace, so the placeholders of the masked
/// `/proc` directories (recorded without them) failed every such fork
/// until they were bound from a tmpfs of the fork's own.
#[tokio::test]
async fn a_fork_starts_with_the_run_directory_on_a_tmpfs_like_systemds_run() {
    require_host!();
    if let Some(why) = common::criu_missing() {
        common::skip!(common::Reason::OldCriu, "{why}");
    }
    let run = RestrictedTmpfs::mount();
    let run_dir = run.dir.path().join("run").display().to_string();
    let daemon = Daemon::start_with(&["--run-dir", &run_dir]);
    let source = daemon.create(json!({"image": "busybox"})).await;
    // What failed: a masked /proc directory, its tmpfs recorded read-only
    // without nosuid, nodev or noexec (libcontainer masks /proc/acpi where
    // the host has it, as this one does).
    let masked = "awk '$5 == \"/proc/acpi\" { print $6, $(NF-2) }' /proc/self/mountinfo";
    let run_masked = daemon.sh(&source, masked).await;
    assert_eq!(
        run_masked.out(),
        "ro,relatime tmpfs\n",
        "no masked /proc/acpi in the source: {}",
        run_masked.err()
    );
    let sandboxes = daemon.run_dir().join("sandboxes");
    // The positive control: the source's run directory is on that tmpfs.
    use nix::sys::statvfs::FsFlags;
    let flags = nix::sys::statvfs::statvfs(&sandboxes.join(&source))
        .expect("statvfs")
        .flags();
    assert!(
        flags.contains(FsFlags::ST_NOSUID | FsFlags::ST_NODEV | FsFlags::ST_NOEXEC),
        "{flags:?}"
    );
    let (status, snap) = snapshot(&daemon, &source, "memory").await;
    assert_eq!(status, StatusCode::CREATED, "{snap}\n{}", daemon.log());
    let fork = daemon
        .create(json!({"from_snapshot": snap["id"].as_str().expect("id")}))
        .await;
    let probe = "ls -A /sys | wc -l; ls -A /proc/acpi | wc -l; stat -f -c %T /proc/acpi; \
        touch /proc/acpi/x 2>&1";
    let run_probe = daemon.sh(&fork, probe).await;
    assert_eq!(
        run_probe.out(),
        "0\n0\ntmpfs\ntouch: /proc/acpi/x: Read-only file system\n",
        "{}",
        run_probe.err()
    );
    daemon.delete(&fork).await;
    daemon.delete(&source).await;
}

/// A tmpfs mounted nosuid, nodev and noexec in a temporary directory,
/// detached when dropped (after the daemon using it, declared later).
struct RestrictedTmpfs {
    dir: tempfile::TempDir,
}

impl RestrictedTmpfs {
    fn mount() -> Self {
        use nix::mount::MsFlags;
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=755"),
        )
        .expect("mount a tmpfs");
        Self { dir }
    }
}

impl Drop for RestrictedTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn a_memory_snapshot_forks_running_processes() {
    require_host!();
    if let Some(why) = common::criu_missing() {
        common::skip!(common::Reason::OldCriu, "{why}");
    }
    let daemon = Daemon::start();
    let source = daemon.create(json!({"image": "python"})).await;
    let (status, _) = daemon
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{source}/files?path=/srv.py"),
            SERVER.as_bytes().to_vec(),
        )
        .await;
    assert!(status.is_success());
    let server = daemon
        .start_process(&source, json!({"argv": ["python3", "/srv.py"]}))
        .await;
    daemon
        .follow_output(&source, server)
        .await
        .until(std::time::Duration::from_secs(30), |e| {
            e["type"] == "stdout"
        })
        .await;
    let first = ask(&daemon, &source).await;
    assert_eq!(first.counter, 0);
    let run = daemon
        .sh(&source, "echo kept > /before; echo shared > /dev/shm/kept")
        .await;
    assert_eq!(run.exit_code(), Some(0));
    let source_dev = daemon.sh(&source, DEV_VIEW).await;
    assert!(
        source_dev
            .out()
            .contains("/dev/null character special file"),
        "{}",
        source_dev.err()
    );

    let (status, snap) = snapshot(&daemon, &source, "memory").await;
    assert_eq!(status, StatusCode::CREATED, "{snap}\n{}", daemon.log());
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert_eq!(snap["kind"], "memory");
    // /dev/shm holds a file, so CRIU keeps it (tar); /dev is listed instead.
    assert_eq!(tar_saved_tmpfs(&daemon, &snap_id), 1);
    // The source keeps running where it was.
    assert_eq!(ask(&daemon, &source).await.counter, 1);

    let mut forks = Vec::new();
    let mut randoms = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let fork = daemon.create(json!({"from_snapshot": snap_id})).await;
        // Each fork starts from the snapshot: counter 1, journal of 1 byte.
        let answer = ask(&daemon, &fork).await;
        assert_eq!(
            (answer.counter, answer.journal_bytes),
            (1, 2),
            "fork {fork}"
        );
        // The monotonic clock went on from where the source's was.
        assert!(
            answer.monotonic > first.monotonic,
            "fork {fork}: monotonic {} went back from {}",
            answer.monotonic,
            first.monotonic
        );
        randoms.insert(answer.random);
        let run = daemon.sh(&fork, "cat /before; hostname").await;
        assert_eq!(run.out(), format!("kept\n{fork}\n"), "{}", run.err());
        forks.push(fork);
    }
    assert_eq!(randoms.len(), 10, "forks read the same kernel randomness");
    // The empty read-only placeholder over /sys is not restored through
    // CRIU (a read-only tmpfs of the fork's stands in for it) but looks
    // the same; a tmpfs with something in it (/dev/shm) keeps it.
    let run = daemon
        .sh(
            &forks[0],
            "ls -A /sys; stat -c '%u %a' /sys; touch /sys/x 2>/dev/null && echo writable; cat /dev/shm/kept",
        )
        .await;
    assert_eq!(run.out(), "0 555\nshared\n", "{}", run.err());
    // The tmpfs made for its /dev, and the placeholders' one, are mounted
    // nowhere but in the fork (at /dev, /sys...) once CRIU bound them, in
    // no mount namespace. The positive controls: the scan sees the fork's
    // network namespace pin on the host, and its root in the fork.
    let fork_dir = daemon.run_dir().join("sandboxes").join(&forks[0]);
    let mounts = common::mounts::everywhere();
    let under = |dir: &str| {
        let prefix = format!("{}/{dir}", fork_dir.display());
        mounts.iter().any(|m| m.point.starts_with(&prefix))
    };
    assert!(
        under("netns"),
        "no mount of {} seen: {mounts:?}",
        fork_dir.display()
    );
    let fork_upper = daemon
        .state_dir()
        .join("disk")
        .join(&forks[0])
        .join("upper");
    assert_eq!(
        common::mounts::overlays_over(&fork_upper).len(),
        1,
        "the fork's root is not mounted once: {mounts:?}"
    );
    assert!(
        !under("fresh") && !under("placeholder"),
        "a fork's fresh or placeholder tmpfs is still mounted somewhere: {mounts:?}"
    );
    // /dev holds only mount points and links, so a fork gets it made
    // afresh (not through CRIU's tar) and sees it as the source did.
    assert_eq!(daemon.sh(&forks[0], DEV_VIEW).await.out(), source_dev.out());
    // A fork's own memory snapshot forks again (its /sys is a bind of its
    // placeholder tmpfs now, which the next checkpoint must also leave to the fork;
    // its /dev a bind of the tmpfs made for it). With /dev/shm emptied, the
    // grandchild gets that made afresh too: empty, writable, as mounted.
    let run = daemon.sh(&forks[0], "rm /dev/shm/kept").await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    let (status, second) = snapshot(&daemon, &forks[0], "memory").await;
    assert_eq!(status, StatusCode::CREATED, "{second}\n{}", daemon.log());
    let second_id = second["id"].as_str().expect("id").to_string();
    assert_eq!(tar_saved_tmpfs(&daemon, &second_id), 0);
    let grandchild = daemon.create(json!({"from_snapshot": second_id})).await;
    let run = daemon
        .sh(
            &grandchild,
            "ls -A /sys; ls -A /dev/shm | wc -l; echo new > /dev/shm/x && cat /dev/shm/x",
        )
        .await;
    assert_eq!(run.out(), "0\nnew\n", "{}", run.err());
    let run = daemon.sh(&grandchild, "rm /dev/shm/x").await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(
        daemon.sh(&grandchild, DEV_VIEW).await.out(),
        source_dev.out()
    );
    daemon.delete(&grandchild).await;
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{second_id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Each fork has its own groups and nothing more: a restore must not
    // copy other groups of a hierarchy under the fork's.
    for hierarchy in common::cgroup::hierarchies_or_fail() {
        let parent = common::cgroup::daemon_group(&hierarchy, &daemon.cgroup_parent());
        let groups = walkdir_count(&parent);
        assert!(
            groups < 200,
            "{groups} groups under {} for 11 sandboxes",
            parent.display()
        );
    }
    // They diverge independently.
    assert_eq!(ask(&daemon, &forks[0]).await.counter, 2);
    assert_eq!(ask(&daemon, &forks[0]).await.counter, 3);
    assert_eq!(ask(&daemon, &forks[1]).await.counter, 2);
    assert_eq!(ask(&daemon, &source).await.counter, 2);
    // A fork lists the processes it inherited, and can end them.
    let (status, list) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes", forks[4]),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let inherited = list["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["id"] == server)
        .cloned()
        .unwrap_or_else(|| panic!("the server is not listed in the fork: {list}"));
    assert_eq!(inherited["state"], "running", "{inherited}");
    assert_eq!(inherited["sandbox_id"], forks[4].as_str(), "{inherited}");
    let (status, v) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{server}/kill", forks[4]),
            None,
        )
        .await;
    assert!(status.is_success(), "{v}");
    let (_, ended) = daemon
        .call(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/processes/{server}/wait?timeout_seconds=10",
                forks[4]
            ),
            None,
        )
        .await;
    assert_ne!(ended["state"], "running", "{ended}");
    // The source's server is untouched.
    assert_eq!(ask(&daemon, &forks[5]).await.counter, 2);
    // New processes in a fork work as anywhere.
    let run = daemon
        .exec(&forks[2], &["python3", "-c", "print(6 * 7)"])
        .await;
    assert_eq!(run.out(), "42\n");

    // Deleting the snapshot while forks run is safe.
    let (status, _) = daemon
        .call(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(ask(&daemon, &forks[3]).await.counter, 2);
    for fork in &forks {
        daemon.delete(fork).await;
    }
    // Nothing of the forks is left in any cgroup hierarchy, the ones CRIU
    // recreated included.
    for hierarchy in common::cgroup::hierarchies_or_fail() {
        for fork in &forks {
            let group =
                common::cgroup::daemon_group(&hierarchy, &daemon.cgroup_parent()).join(fork);
            assert!(!group.exists(), "{} is left", group.display());
        }
    }
    assert!(
        snapshot_dirs(&daemon).is_empty(),
        "{:?}",
        snapshot_dirs(&daemon)
    );

    // A corrupted snapshot is refused before CRIU sees it.
    let (status, snap) = snapshot(&daemon, &source, "memory").await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    let images = daemon.state_dir().join("snapshot-images").join(&snap_id);
    let victim = std::fs::read_dir(&images)
        .expect("images")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("pages-"))
        .expect("a pages image");
    let mut bytes = std::fs::read(&victim).expect("read");
    bytes[0] ^= 0xff;
    std::fs::write(&victim, bytes).expect("write");
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": snap_id})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "snapshot_corrupted", "{v}");
    // Asking a fork for other limits is a 400.
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"from_snapshot": snap_id, "memory_mib": 64})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    daemon.delete(&source).await;
}

/// Directories at or below `dir` (0 when it does not exist).
fn walkdir_count(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    1 + entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| walkdir_count(&e.path()))
        .sum::<usize>()
}
