//! A microVM sandbox's cgroups. No container runtime makes them, so they are
//! made here: the groups a container sandbox gets (cpu quota and weight,
//! memory with no swap, pids, and the freezer and accounting groups the rest of the daemon
//! reads), at the same path, so usage, OOM counting, kill and teardown in
//! [`super::cgroups::SandboxCgroups`] work unchanged. The VMM is put in them
//! before it execs (it writes `0` to each `cgroup.procs`), so no guest page
//! is ever charged elsewhere.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use super::cgroups::{CgroupError, Layout};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What the VMM's groups allow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmLimits {
    /// CFS quota and period, in microseconds.
    pub cpu_quota_us: i64,
    pub cpu_period_us: u64,
    /// CPU weight in cgroup v1 shares; `None` leaves the kernel's default.
    pub cpu_shares: Option<u64>,
    /// Guest RAM plus the VMM's own overhead.
    pub memory_bytes: u64,
    /// Threads of the VMM (vCPUs, device workers, its main thread).
    pub pids: u64,
}

/// v1 hierarchies a VM gets groups in. Not cpuset: a new cpuset group
/// starts with no CPUs, and the VM needs no pinning.
const V1_VM_HIERARCHIES: [&str; 6] = ["cpu", "cpuacct", "memory", "freezer", "pids", "blkio"];

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn write(path: PathBuf, value: &str) -> Result<(), CgroupError> {
    fs::write(&path, value).map_err(io_err(&path))
}

/// Makes the groups at `path` (e.g. `/sandboxd/<id>`) with `limits`, and
/// opens each group's `cgroup.procs` for the VMM to join.
pub fn create(layout: Layout, path: &str, limits: &VmLimits) -> Result<Vec<File>, CgroupError> {
    let path = path.trim_start_matches('/');
    let dirs: Vec<PathBuf> = match layout {
        Layout::V1 => V1_VM_HIERARCHIES
            .iter()
            .map(|h| Path::new(CGROUP_ROOT).join(h).join(path))
            .collect(),
        Layout::V2 => vec![Path::new(CGROUP_ROOT).join(path)],
    };
    if layout == Layout::V2 {
        enable_v2_controllers(Path::new(CGROUP_ROOT), path)?;
    }
    for dir in &dirs {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let quota = limits.cpu_quota_us;
    let period = limits.cpu_period_us;
    let memory = limits.memory_bytes.to_string();
    let pids = limits.pids.to_string();
    match layout {
        Layout::V1 => {
            let dir = |h: &str| Path::new(CGROUP_ROOT).join(h).join(path);
            write(dir("cpu").join("cpu.cfs_period_us"), &period.to_string())?;
            write(dir("cpu").join("cpu.cfs_quota_us"), &quota.to_string())?;
            if let Some(shares) = limits.cpu_shares {
                write(dir("cpu").join("cpu.shares"), &shares.to_string())?;
            }
            write(dir("memory").join("memory.limit_in_bytes"), &memory)?;
            // memsw exists only with swap accounting; without it there is
            // no swap to limit.
            let memsw = dir("memory").join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(memsw, &memory)?;
            }
            write(dir("pids").join("pids.max"), &pids)?;
        }
        Layout::V2 => {
            let dir = Path::new(CGROUP_ROOT).join(path);
            let cpu_max = if quota < 0 {
                format!("max {period}")
            } else {
                format!("{quota} {period}")
            };
            write(dir.join("cpu.max"), &cpu_max)?;
            if let Some(shares) = limits.cpu_shares {
                let weight = super::cgroups::cpu_weight_of_shares(shares);
                write(dir.join("cpu.weight"), &weight.to_string())?;
            }
            write(dir.join("memory.max"), &memory)?;
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                write(swap, "0")?;
            }
            write(dir.join("pids.max"), &pids)?;
        }
    }
    dirs.iter()
        .map(|dir| {
            let procs = dir.join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .open(&procs)
                .map_err(io_err(&procs))
        })
        .collect()
}

/// v2: a group's controllers must be enabled in the `cgroup.subtree_control`
/// of every ancestor, from the root down to its parent.
fn enable_v2_controllers(root: &Path, path: &str) -> Result<(), CgroupError> {
    let group = root.join(path);
    let parent = group.parent().unwrap_or(root);
    fs::create_dir_all(parent).map_err(io_err(parent))?;
    let mut ancestors: Vec<&Path> = parent
        .ancestors()
        .filter(|dir| dir.starts_with(root))
        .collect();
    ancestors.reverse();
    for dir in ancestors {
        let control = dir.join("cgroup.subtree_control");
        // Already enabled is fine; a controller the host lacks shows when
        // its limit file is written.
        for controller in ["+cpu", "+memory", "+pids"] {
            let _ = fs::write(&control, controller);
        }
    }
    Ok(())
}
