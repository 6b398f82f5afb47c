//! The host's view of sandbox cgroups, on cgroup v1 (one hierarchy per
//! controller, `/sys/fs/cgroup/<controller>/...`; hybrid hosts like the dev
//! box) and v2 (one unified hierarchy at `/sys/fs/cgroup`; most production
//! hosts). Tests read limits, counters and members through here, so what
//! they assert means the same on both.

use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// v2 when the root itself is a cgroup2 mount, as the daemon decides it
/// (src/runtime/cgroups.rs `Layout::detect`); a hybrid host's `unified/`
/// subfolder holds no controllers, so it is v1 for every file read here.
pub fn version() -> Version {
    match nix::sys::statfs::statfs(ROOT) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => Version::V2,
        _ => Version::V1,
    }
}

/// Where `controller`'s groups live.
pub fn hierarchy(controller: &str) -> PathBuf {
    match version() {
        Version::V1 => Path::new(ROOT).join(controller),
        Version::V2 => PathBuf::from(ROOT),
    }
}

/// Every hierarchy a daemon's groups may be in: each mounted v1 hierarchy
/// (named ones such as `systemd` included), or the one v2 root. Empty when
/// there is no cgroup filesystem at all; a check over them must then fail,
/// not pass over nothing (see [`hierarchies_or_fail`]).
pub fn hierarchies() -> Vec<PathBuf> {
    match version() {
        Version::V2 => vec![PathBuf::from(ROOT)],
        Version::V1 => {
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(ROOT)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            dirs.sort();
            dirs
        }
    }
}

/// [`hierarchies`], asserting there is at least one: a leak check that
/// found no cgroup root would compare two empty sets and pass.
pub fn hierarchies_or_fail() -> Vec<PathBuf> {
    let found = hierarchies();
    assert!(
        !found.is_empty(),
        "no cgroup hierarchy under {ROOT}: the cgroup checks would see nothing"
    );
    found
}

/// A daemon's own group (its `--cgroup-parent`) in `hierarchy`.
pub fn daemon_group(hierarchy: &Path, cgroup_parent: &str) -> PathBuf {
    hierarchy.join(cgroup_parent.trim_start_matches('/'))
}

/// The sandbox's group in `controller`'s hierarchy (each test daemon has its
/// own cgroup parent, so this looks under every top-level group). When no
/// group exists it names where the default parent would put it, so
/// `!sandbox_dir(..).exists()` reads as "gone".
pub fn sandbox_dir(controller: &str, id: &str) -> PathBuf {
    let root = hierarchy(controller);
    std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(id))
        .find(|p| p.exists())
        .unwrap_or_else(|| root.join("sandboxd").join(id))
}

fn read(controller: &str, id: &str, file: &str) -> String {
    let path = sandbox_dir(controller, id).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The pids in the sandbox's group of `controller` (empty when it is gone).
pub fn procs(controller: &str, id: &str) -> Vec<i32> {
    procs_in(&sandbox_dir(controller, id))
}

/// The pids in the group at `dir` (empty when it is gone).
pub fn procs_in(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The memory limit in bytes (`None`: unlimited).
/// v1 `memory.limit_in_bytes`, v2 `memory.max`.
pub fn memory_limit(id: &str) -> Option<u64> {
    let text = match version() {
        Version::V1 => read("memory", id, "memory.limit_in_bytes"),
        Version::V2 => read("memory", id, "memory.max"),
    };
    let text = text.trim();
    // v1 spells "unlimited" as the largest page-aligned i64.
    match text {
        "max" => None,
        _ => {
            let bytes: u64 = text
                .parse()
                .unwrap_or_else(|e| panic!("memory limit {text:?}: {e}"));
            (bytes < (i64::MAX as u64 & !4095)).then_some(bytes)
        }
    }
}

/// `pids.max` (same file on v1 and v2): a number or `max`.
pub fn pids_max(id: &str) -> String {
    read("pids", id, "pids.max").trim().to_string()
}

/// `pids.current` (same file on v1 and v2).
pub fn pids_current(id: &str) -> u64 {
    let text = read("pids", id, "pids.current");
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("pids.current {text:?}: {e}"))
}

/// The CFS bandwidth as (quota, period) in microseconds, the quota `None`
/// when unlimited. v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, v2 `cpu.max`.
pub fn cpu_max(id: &str) -> (Option<u64>, u64) {
    let (quota, period) = match version() {
        Version::V1 => (
            read("cpu", id, "cpu.cfs_quota_us").trim().to_string(),
            read("cpu", id, "cpu.cfs_period_us").trim().to_string(),
        ),
        Version::V2 => {
            let text = read("cpu", id, "cpu.max");
            let mut words = text.split_whitespace();
            let quota = words.next().unwrap_or("").to_string();
            let period = words.next().unwrap_or("").to_string();
            (quota, period)
        }
    };
    let quota = match quota.as_str() {
        "max" | "-1" => None,
        q => Some(q.parse().unwrap_or_else(|e| panic!("cpu quota {q:?}: {e}"))),
    };
    let period = period
        .parse()
        .unwrap_or_else(|e| panic!("cpu period {period:?}: {e}"));
    (quota, period)
}

/// The group's CPU weight as its file says it: v1 `cpu.shares`, v2
/// `cpu.weight`.
pub fn cpu_weight(id: &str) -> u64 {
    let file = match version() {
        Version::V1 => "cpu.shares",
        Version::V2 => "cpu.weight",
    };
    let text = read("cpu", id, file);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{file} {text:?}: {e}"))
}

/// What [`cpu_weight`] reads for a sandbox asked for `shares`: the shares
/// on v1, and on v2 the weight crun's curve gives them (the values the
/// tests ask for, worked out by hand: 1024 is 100, the default of each).
pub fn weight_of_shares(shares: u64) -> u64 {
    match (version(), shares) {
        (Version::V1, shares) => shares,
        (Version::V2, 512) => 59,
        (Version::V2, 1024) => 100,
        (Version::V2, 2048) => 174,
        (Version::V2, other) => panic!("no v2 weight worked out for {other} shares"),
    }
}

/// How often and how long the group was throttled: (periods throttled,
/// nanoseconds throttled), from `cpu.stat` (v1 `throttled_time` in ns, v2
/// `throttled_usec`).
pub fn cpu_throttling(id: &str) -> (u64, u64) {
    let stat = read("cpu", id, "cpu.stat");
    let periods = field(&stat, "nr_throttled").unwrap_or_else(|| panic!("cpu.stat: {stat}"));
    let nanos = match version() {
        Version::V1 => field(&stat, "throttled_time"),
        Version::V2 => field(&stat, "throttled_usec").map(|us| us * 1000),
    }
    .unwrap_or_else(|| panic!("cpu.stat: {stat}"));
    (periods, nanos)
}

/// OOM kills in the group: `oom_kill` of v1 `memory.oom_control` or v2
/// `memory.events`.
pub fn oom_kills(id: &str) -> u64 {
    let text = match version() {
        Version::V1 => read("memory", id, "memory.oom_control"),
        Version::V2 => read("memory", id, "memory.events"),
    };
    field(&text, "oom_kill").unwrap_or_else(|| panic!("no oom_kill in {text}"))
}
