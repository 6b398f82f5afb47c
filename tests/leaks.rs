//! After many create/delete cycles nothing is left behind: no mount, cgroup,
//! network namespace, process, btrfs subvolume, run file or store record.
//! Runs alone in its own binary so other tests' sandboxes do not blur the
//! before/after comparison.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{cgroup, Daemon};
use hyper::Method;
use serde_json::json;

/// Everything on the host a sandbox could leave behind, as comparable sets.
#[derive(Debug, PartialEq, Eq)]
struct HostSnapshot {
    mounts: BTreeSet<String>,
    cgroups: BTreeSet<String>,
    netns: BTreeSet<String>,
    processes: BTreeSet<String>,
    run_entries: BTreeSet<String>,
    subvolumes: BTreeSet<String>,
}

fn dir_names(path: &Path) -> BTreeSet<String> {
    std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Pids in a cgroup directory and all groups below it.
fn pids_below(dir: &Path, out: &mut BTreeSet<String>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().map(String::from));
    }
    for child in dir_names(dir) {
        let path = dir.join(child);
        if path.is_dir() {
            pids_below(&path, out);
        }
    }
}

/// Network slots are made ahead of creates and renamed into sandboxes, so
/// their names move on from cycle to cycle: they are counted apart.
fn is_slot(entry: &str) -> bool {
    entry.contains(".slot-")
}

/// The nsfs mounts of this daemon's ready network slots.
fn slot_mounts(daemon: &Daemon) -> Vec<String> {
    let ours = daemon.dir.path().display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&ours) && is_slot(m))
        .map(String::from)
        .collect()
}

/// Only what this daemon could own, so other tests running at the same
/// time on this host do not blur the comparison.
fn snapshot(daemon: &Daemon) -> HostSnapshot {
    let ours = daemon.dir.path().display().to_string();
    let own = common::mounts::own_namespace();
    // The host's mounts under the daemon's directories, and anything of
    // them mounted in another namespace (a container's root is mounted in
    // its own alone: one kept alive past its sandbox would be there).
    let mounts = common::mounts::everywhere()
        .into_iter()
        .filter_map(|m| {
            if m.namespace == own {
                (m.point.starts_with(&ours) && !is_slot(&m.point)).then_some(m.point)
            } else {
                m.super_options.contains(&ours).then(|| {
                    format!(
                        "{} at {} elsewhere: {}",
                        m.fs_type, m.point, m.super_options
                    )
                })
            }
        })
        .collect();
    let parent = daemon.cgroup_parent();
    let mut cgroups = BTreeSet::new();
    let mut pids = BTreeSet::new();
    // With no cgroup root (or none holding this daemon's group, which its
    // supervisors group makes on the first create) both snapshots would be
    // empty and equal: that is a failure, not a pass.
    let mut found = Vec::new();
    for hierarchy in cgroup::hierarchies_or_fail() {
        let dir = cgroup::daemon_group(&hierarchy, &parent);
        if dir.is_dir() {
            found.push(dir.display().to_string());
        }
        let name = hierarchy
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for group in dir_names(&dir) {
            if group.starts_with("sb-") {
                cgroups.insert(format!("{name}/{group}"));
            }
        }
        pids_below(&dir, &mut pids);
    }
    assert!(
        !found.is_empty(),
        "no cgroup group {parent} in any hierarchy of {:?}: the leak check would compare nothing",
        cgroup::hierarchies()
    );
    let run = daemon.run_dir().display().to_string();
    let mut netns = BTreeSet::new();
    let mut processes = BTreeSet::new();
    let candidates: Vec<String> = dir_names(Path::new("/proc"))
        .into_iter()
        .filter(|p| p.parse::<u32>().is_ok())
        .collect();
    // Listed after the processes: a standby started since is one too.
    let standbys: BTreeSet<String> = daemon
        .standby_pids()
        .iter()
        .map(|p| p.to_string())
        .collect();
    for pid in candidates {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let supervisor = String::from_utf8_lossy(&cmdline).contains(&run);
        // Standby supervisors are started ahead of creates: counted apart.
        if standbys.contains(&pid) {
            continue;
        }
        if supervisor || pids.contains(&pid) {
            processes.insert(format!("{pid} {}", String::from_utf8_lossy(&cmdline)));
            if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
                netns.insert(ns.display().to_string());
            }
        }
    }
    let subvolumes = std::process::Command::new("btrfs")
        .args(["subvolume", "list", "-o"])
        .arg(daemon.state_dir().join("disk"))
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    HostSnapshot {
        mounts,
        cgroups,
        netns,
        processes,
        run_entries: dir_names(&daemon.run_dir().join("sandboxes"))
            .into_iter()
            .filter(|e| !is_slot(e))
            .collect(),
        subvolumes,
    }
}

#[tokio::test]
async fn hundred_create_delete_cycles_leave_nothing() {
    require_host!();
    let mut daemon = Daemon::start_with(&["--net-slots", "4", "--standby-supervisors", "2"]);
    // One warm-up cycle so one-time state (image build, pool) exists before "before".
    let id = daemon.create(json!({"image": "busybox"})).await;
    daemon.delete(&id).await;
    let before = snapshot(&daemon);
    for _ in 0..100 {
        let id = daemon.create(json!({"image": "busybox"})).await;
        let run = daemon
            .sh(&id, "echo hi > /tmp/f; sleep 100 & echo started")
            .await;
        assert_eq!(run.out(), "started\n");
        daemon.delete(&id).await;
    }
    let after = snapshot(&daemon);
    assert_eq!(before, after);
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));
    // Slots are used once: at most the 4 kept, each a mount of its own.
    let slots = slot_mounts(&daemon);
    assert!(slots.len() <= 4, "{slots:?}");
    let entries: Vec<String> = dir_names(&daemon.run_dir().join("sandboxes"))
        .into_iter()
        .filter(|e| is_slot(e))
        .collect();
    assert_eq!(entries.len(), slots.len(), "{entries:?} vs {slots:?}");
    assert!(daemon.standby_pids().len() <= 2);
    // A clean stop removes the ready ones (made while the daemon idles:
    // the positive control waits until they are all there).
    daemon.made_ahead(4, 2).await;
    assert_eq!(slot_mounts(&daemon).len(), 4);
    daemon.stop(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(slot_mounts(&daemon), Vec::<String>::new());
    // Standbys end when the stopped daemon's pipes close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !daemon.standby_pids().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "standby supervisors left after a clean stop: {:?}",
            daemon.standby_pids()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        !dir_names(&daemon.run_dir().join("sandboxes"))
            .iter()
            .any(|e| is_slot(e)),
        "slot directories left after a clean stop"
    );
}
