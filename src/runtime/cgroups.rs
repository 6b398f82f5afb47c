//! Host-side cgroup work that libcontainer does not do for us: one child
//! cgroup per sandbox process (so a timeout or kill ends the whole tree, even
//! descendants that called setsid), a limited group per pod container root
//! that has limits of its own, OOM counters, and final removal.
//!
//! Works on cgroup v1 (separate hierarchies; per-process groups live in the
//! `pids` and `freezer` hierarchies) and on the v2 unified hierarchy.
//!
//! The layout under a sandbox's group: `p<N>` per process; with a limited
//! root, `root-<name>` holding that root's `p<N>` (and, on v1, its memory,
//! cpu and cpuacct group); on v2, once a root is limited, `init` holding
//! the agent, as a group that hands controllers to children may hold no
//! process itself.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("cgroup {path} still has processes after {waited_ms} ms of killing")]
    Stuck { path: String, waited_ms: u128 },
    #[error("cgroup {path} did not freeze within {waited_ms} ms (a task in uninterruptible I/O?); try again")]
    NotFrozen { path: String, waited_ms: u128 },
}

/// How long a sandbox may take to freeze.
const FREEZE_DEADLINE: Duration = Duration::from_secs(5);

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `value` into the kernel's file at `path`, which must exist.
fn write_existing(path: &Path, value: &str) -> Result<(), CgroupError> {
    use std::io::Write;
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(io_err(path))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    V1,
    V2,
}

impl Layout {
    /// A host whose /sys/fs/cgroup is itself cgroup2 is v2; anything else
    /// (legacy or hybrid, like the development hosts) is driven as v1.
    /// Looked at once per process: a host does not change it under a
    /// running daemon, and a claim would pay a statfs for each ask.
    pub fn detect() -> Self {
        static LAYOUT: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();
        *LAYOUT.get_or_init(|| match nix::sys::statfs::statfs(CGROUP_ROOT) {
            Ok(s) if s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => Layout::V2,
            _ => Layout::V1,
        })
    }
}

/// The huge page sizes a container sandbox is to be denied, each as
/// libcgroups names it (`2MB`): every size the host has where a hugetlb
/// controller reaches the sandbox's group (v2's where the root offers it:
/// libcgroups hands every controller the root offers down to the group it
/// makes, as it does cpu and memory; a v1 `hugetlb` hierarchy where
/// libcgroups' own lookup finds one); none where it does not, as on a v1
/// host whose hugetlb sits on the v2 hierarchy (naming sizes there would
/// fail every create: libcgroups refuses limits for a controller it
/// cannot find). Sandboxes are given no huge pages, so a host that
/// reserves some keeps them for itself. Worked out once per process (v1's
/// lookup reads the whole mount table).
pub fn huge_page_sizes_to_deny() -> Vec<String> {
    static SIZES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SIZES
        .get_or_init(|| {
            let reachable = match Layout::detect() {
                Layout::V1 => libcgroups::v1::util::get_subsystem_mount_point(
                    &libcgroups::v1::ControllerType::HugeTlb,
                )
                .is_ok(),
                Layout::V2 => fs::read_to_string(Path::new(CGROUP_ROOT).join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb")),
            };
            if !reachable {
                return Vec::new();
            }
            // A host without huge page support has no such directory:
            // nothing to deny.
            let mut sizes = libcgroups::stats::supported_page_sizes().unwrap_or_default();
            sizes.sort();
            sizes
        })
        .clone()
}

/// The cgroups of one sandbox, at `path` (e.g. `/sandboxd/<id>`) in every
/// hierarchy libcontainer placed it in.
#[derive(Debug, Clone)]
pub struct SandboxCgroups {
    layout: Layout,
    path: String,
    /// Where the hierarchies are mounted: [`CGROUP_ROOT`], except in unit
    /// tests, which stand a plain directory in for cgroupfs.
    root: PathBuf,
    /// v1 OOM kills of limited roots since removed: v1 counts a kill in
    /// the killing group only, so a removed root's would drop out of the
    /// sandbox's total (v2's counts descendants, removed ones included).
    retired_oom_kills: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// v1 hierarchies that hold per-process groups: `pids` lists and counts the
/// tree; `freezer` stops it from forking while it is killed.
const V1_PROCESS_HIERARCHIES: [&str; 2] = ["pids", "freezer"];
/// The v1 controllers whose sandbox groups hold what sandboxd limits,
/// meters, freezes or dumps.
pub const V1_SANDBOX_CONTROLLERS: [&str; 8] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
];
/// Named v1 hierarchies where a sandbox's tasks sit in groups it does not
/// own, but where a CRIU restore may still make groups for a fork.
const V1_NAMED_HIERARCHIES: [&str; 2] = ["systemd", "unified"];
/// v1 controllers sandboxd sets nothing in, where libcontainer still
/// makes a sandbox's group when the host mounts them (its manager joins
/// every mounted one of its 12): a teardown removes those groups too.
/// `net_cls,net_prio` is where a host mounts those two together, for one
/// without the usual symlinks named after each.
const V1_LIBCONTAINER_ONLY_CONTROLLERS: [&str; 5] = [
    "hugetlb",
    "perf_event",
    "net_cls",
    "net_prio",
    "net_cls,net_prio",
];

/// The ceilings of one pod container root, as its group spells them;
/// `None` leaves that one to the sandbox's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootLimits {
    pub cpu_quota_us: Option<i64>,
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<i64>,
    /// Its weight against the sandbox's other groups, in v1 shares (v2's
    /// `cpu.weight` by [`cpu_weight_of_shares`]).
    pub cpu_shares: Option<u64>,
    /// v2's `memory.oom.group`: an OOM kill ends all of the root's
    /// processes. v1 has no such file.
    pub oom_group: bool,
}

/// v1 hierarchies where a limited root has a group beside its processes'
/// (which are in [`V1_PROCESS_HIERARCHIES`]): its ceilings and weight, and
/// its CPU time (`cpuacct`, one hierarchy with `cpu` where the host
/// mounts them together; see [`SandboxCgroups::v1_root_hierarchies`]).
const V1_ROOT_LIMIT_HIERARCHIES: [&str; 3] = ["memory", "cpu", "cpuacct"];
/// The v2 controllers a limited root's group sets.
const V2_ROOT_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// The v2 group the agent moves to when the sandbox's group starts handing
/// controllers to limited roots.
const V2_INIT_GROUP: &str = "init";

/// cgroup v2's `cpu.weight` (1-10000, default 100) for a weight given in
/// v1 `cpu.shares` (2-262144, default 1024), by the curve crun and runc
/// use and libcgroups follows for a container's, so a microVM and a
/// container asked for the same shares get the same weight. The curve
/// maps both ends and the defaults onto each other.
pub fn cpu_weight_of_shares(shares: u64) -> u64 {
    const MAX_WEIGHT: u64 = 10_000;
    match shares {
        0..=2 => 1,
        262_144.. => MAX_WEIGHT,
        _ => {
            let l = (shares as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            (10f64.powf(exponent).ceil() as u64).clamp(1, MAX_WEIGHT)
        }
    }
}

/// The group of pod container root `name` under a sandbox's.
pub fn root_group(name: &str) -> String {
    format!("root-{name}")
}

/// A sandbox's ceilings as its cgroups spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupLimits {
    pub cpu_quota_us: i64,
    pub memory_bytes: u64,
    pub pids_max: i64,
}

impl SandboxCgroups {
    pub fn new(layout: Layout, path: &str) -> Self {
        Self::under(Path::new(CGROUP_ROOT), layout, path)
    }

    /// The same handle over hierarchies mounted at `root`: the supervisor's
    /// unit tests use a temp directory, so they never touch the host's
    /// cgroups. A plain directory has none of the kernel's files; the test
    /// creates those it needs (`cgroup.procs`, `memory.events`).
    pub(crate) fn under(root: &Path, layout: Layout, path: &str) -> Self {
        Self {
            layout,
            path: path.trim_start_matches('/').to_string(),
            root: root.to_path_buf(),
            retired_oom_kills: Default::default(),
        }
    }

    fn dir(&self, hierarchy: &str) -> PathBuf {
        match self.layout {
            Layout::V1 => self.root.join(hierarchy).join(&self.path),
            Layout::V2 => self.root.join(&self.path),
        }
    }

    /// Where process groups sit: the sandbox's group, or limited root
    /// `root`'s.
    fn parent_dir(&self, hierarchy: &str, root: Option<&str>) -> PathBuf {
        match root {
            Some(name) => self.dir(hierarchy).join(root_group(name)),
            None => self.dir(hierarchy),
        }
    }

    /// The groups of process `proc`, started in limited root `root` if any.
    fn process_dirs(&self, proc: u64, root: Option<&str>) -> Vec<PathBuf> {
        let name = format!("p{proc}");
        match self.layout {
            Layout::V1 => V1_PROCESS_HIERARCHIES
                .iter()
                .map(|h| self.parent_dir(h, root).join(&name))
                .collect(),
            Layout::V2 => vec![self.parent_dir("", root).join(name)],
        }
    }

    /// Makes the child group(s) of process `proc` (under limited root
    /// `root`'s group if given) and opens their `cgroup.procs` for writing,
    /// with, on v1, those of the root's memory, cpu and cpuacct groups. The agent's
    /// child writes `0` into each before it execs; the open-time
    /// credentials (ours) authorise the move.
    pub fn create_process_group(
        &self,
        proc: u64,
        root: Option<&str>,
    ) -> Result<Vec<File>, CgroupError> {
        let mut files = Vec::new();
        let mut procs_files: Vec<PathBuf> = Vec::new();
        for dir in self.process_dirs(proc, root) {
            // Under a root, its group must exist: a root removed since the
            // caller chose it is an error, not a new group without limits.
            let made = match root {
                Some(_) => fs::create_dir(&dir),
                None => fs::create_dir_all(&dir),
            };
            made.map_err(io_err(&dir))?;
            procs_files.push(dir.join("cgroup.procs"));
        }
        if let (Some(_), Layout::V1) = (root, self.layout) {
            procs_files.extend(
                self.v1_root_hierarchies()
                    .into_iter()
                    .map(|h| self.parent_dir(h, root).join("cgroup.procs")),
            );
        }
        for procs in procs_files {
            files.push(
                OpenOptions::new()
                    .write(true)
                    .open(&procs)
                    .map_err(io_err(&procs))?,
            );
        }
        Ok(files)
    }

    /// Kills every process in the group and waits until it is empty.
    pub fn kill_process_group(&self, proc: u64, root: Option<&str>) -> Result<(), CgroupError> {
        let dirs = self.process_dirs(proc, root);
        match self.layout {
            Layout::V2 => kill_v2(&dirs[0]),
            Layout::V1 => kill_v1(&dirs[0], &dirs[1]),
        }
    }

    /// Removes the (empty) group of an ended process.
    pub fn remove_process_group(&self, proc: u64, root: Option<&str>) {
        for dir in self.process_dirs(proc, root) {
            let _ = fs::remove_dir(dir);
        }
    }

    /// The groups of limited root `name`, in every hierarchy it has one.
    fn root_dirs(&self, name: &str) -> Vec<PathBuf> {
        match self.layout {
            Layout::V1 => V1_PROCESS_HIERARCHIES
                .into_iter()
                .chain(self.v1_root_hierarchies())
                .map(|h| self.parent_dir(h, Some(name)))
                .collect(),
            Layout::V2 => vec![self.parent_dir("", Some(name))],
        }
    }

    /// [`V1_ROOT_LIMIT_HIERARCHIES`] less `cpuacct` where it is the `cpu`
    /// hierarchy under another name (mounted as `cpu,cpuacct`, the two
    /// names links to it or mounts of it): one group there, made and
    /// removed once.
    fn v1_root_hierarchies(&self) -> Vec<&'static str> {
        use std::os::unix::fs::MetadataExt;
        let identity = |h: &str| {
            fs::metadata(self.root.join(h))
                .ok()
                .map(|m| (m.dev(), m.ino()))
        };
        let comounted = identity("cpu").is_some_and(|cpu| Some(cpu) == identity("cpuacct"));
        V1_ROOT_LIMIT_HIERARCHIES
            .into_iter()
            .filter(|h| !(comounted && *h == "cpuacct"))
            .collect()
    }

    /// Makes the group of pod container root `name` with its own ceilings,
    /// under (and so within) the sandbox's. Processes started in the root
    /// afterwards are placed in it ([`Self::create_process_group`]).
    pub fn create_root_group(&self, name: &str, limits: &RootLimits) -> Result<(), CgroupError> {
        if self.layout == Layout::V2 {
            self.hand_controllers_to_children()?;
        }
        let made = self.write_root_group(name, limits);
        if made.is_err() {
            self.remove_root_group(name);
        }
        made
    }

    fn write_root_group(&self, name: &str, limits: &RootLimits) -> Result<(), CgroupError> {
        if limits.oom_group && self.layout == Layout::V1 {
            return Err(CgroupError::Io {
                path: self.dir("memory").display().to_string(),
                source: io::Error::other("cgroup v1 has no memory.oom.group"),
            });
        }
        for dir in self.root_dirs(name) {
            fs::create_dir(&dir).map_err(io_err(&dir))?;
        }
        let dir = |hierarchy: &str| self.parent_dir(hierarchy, Some(name));
        let mut writes: Vec<(PathBuf, String)> = Vec::new();
        if let Some(bytes) = limits.memory_bytes {
            match self.layout {
                Layout::V1 => {
                    writes.push((
                        dir("memory").join("memory.limit_in_bytes"),
                        bytes.to_string(),
                    ));
                    // Absent where the kernel does no swap accounting; after
                    // the memory limit, which it may never be below.
                    let memsw = dir("memory").join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        writes.push((memsw, bytes.to_string()));
                    }
                }
                Layout::V2 => writes.push((dir("").join("memory.max"), bytes.to_string())),
            }
        }
        if let Some(quota) = limits.cpu_quota_us {
            writes.push(match self.layout {
                // v1 refuses a child's quota above its parent's (v2 takes
                // the lower of the two); the parent's is the ceiling anyway.
                Layout::V1 => {
                    let parent = fs::read_to_string(self.dir("cpu").join("cpu.cfs_quota_us"))
                        .ok()
                        .and_then(|q| q.trim().parse::<i64>().ok())
                        .filter(|q| *q > 0);
                    let quota = parent.map_or(quota, |p| quota.min(p));
                    (dir("cpu").join("cpu.cfs_quota_us"), quota.to_string())
                }
                Layout::V2 => (
                    dir("").join("cpu.max"),
                    format!("{quota} {}", super::spec::CPU_PERIOD_US),
                ),
            });
        }
        if let Some(max) = limits.pids_max {
            let hierarchy = match self.layout {
                Layout::V1 => "pids",
                Layout::V2 => "",
            };
            writes.push((dir(hierarchy).join("pids.max"), max.to_string()));
        }
        if limits.oom_group {
            writes.push((dir("").join("memory.oom.group"), "1".into()));
        }
        if let Some(shares) = limits.cpu_shares {
            writes.push(match self.layout {
                Layout::V1 => (dir("cpu").join("cpu.shares"), shares.to_string()),
                Layout::V2 => (
                    dir("").join("cpu.weight"),
                    cpu_weight_of_shares(shares).to_string(),
                ),
            });
        }
        for (file, value) in writes {
            fs::write(&file, value).map_err(io_err(&file))?;
        }
        Ok(())
    }

    /// v2 only: moves the sandbox's own tasks (its agent) into [`V2_INIT_GROUP`]
    /// and has the sandbox's group hand its cpu, memory and pids controllers
    /// to its children, which v2 allows only to a group with no task of its
    /// own. Done once; the sandbox's totals still count every child.
    fn hand_controllers_to_children(&self) -> Result<(), CgroupError> {
        let top = self.dir("");
        let control = top.join("cgroup.subtree_control");
        let wanted = self.v2_root_controllers()?;
        let enabled = fs::read_to_string(&control).map_err(io_err(&control))?;
        if wanted
            .iter()
            .all(|c| enabled.split_whitespace().any(|e| e == c))
        {
            return Ok(());
        }
        let init = top.join(V2_INIT_GROUP);
        match fs::create_dir(&init) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(&init)(e)),
        }
        let value = subtree_control_value('+', &wanted);
        // A child the agent forked a moment ago is in the top group until
        // it moves itself into its own: moved again until none is left.
        let mut attempts = 0;
        loop {
            move_tasks(&top, &init)?;
            match fs::write(&control, &value) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempts < 10 => {
                    attempts += 1;
                }
                Err(e) => return Err(io_err(&control)(e)),
            }
        }
    }

    /// The controllers a v2 root group sets that the sandbox's group has.
    fn v2_root_controllers(&self) -> Result<Vec<String>, CgroupError> {
        let available = self.dir("").join("cgroup.controllers");
        let text = fs::read_to_string(&available).map_err(io_err(&available))?;
        Ok(V2_ROOT_CONTROLLERS
            .iter()
            .filter(|c| text.split_whitespace().any(|a| a == **c))
            .map(|c| c.to_string())
            .collect())
    }

    /// v2 only, once no limited root is left: the sandbox's group stops
    /// handing controllers down and takes its agent back, so the layout is
    /// the one every other sandbox has (what a snapshot's CRIU dump sees).
    pub fn take_controllers_back(&self) -> Result<(), CgroupError> {
        if self.layout != Layout::V2 {
            return Ok(());
        }
        let top = self.dir("");
        let init = top.join(V2_INIT_GROUP);
        if !init.exists() {
            return Ok(());
        }
        let control = top.join("cgroup.subtree_control");
        let value = subtree_control_value('-', &self.v2_root_controllers()?);
        fs::write(&control, value).map_err(io_err(&control))?;
        move_tasks(&init, &top)?;
        fs::remove_dir(&init).map_err(io_err(&init))
    }

    /// Kills every process of limited root `name` (those of processes
    /// already forgotten included) and removes its groups; an error when
    /// one stays.
    pub fn kill_root_group(&self, name: &str) -> Result<(), CgroupError> {
        match self.layout {
            Layout::V2 => kill_v2(&self.parent_dir("", Some(name)))?,
            Layout::V1 => kill_v1(
                &self.parent_dir("pids", Some(name)),
                &self.parent_dir("freezer", Some(name)),
            )?,
        }
        self.remove_root_group(name);
        match self.root_dirs(name).into_iter().find(|d| d.exists()) {
            Some(left) => Err(CgroupError::Io {
                path: left.display().to_string(),
                source: io::Error::other("the root's group could not be removed"),
            }),
            None => Ok(()),
        }
    }

    /// Removes limited root `name`'s groups (empty by then: its processes
    /// were killed and their groups removed), keeping its OOM kills in the
    /// sandbox's count.
    pub fn remove_root_group(&self, name: &str) {
        if self.layout == Layout::V1 {
            let counter = self
                .parent_dir("memory", Some(name))
                .join("memory.oom_control");
            if let Some(kills) = read_key(&counter, "oom_kill") {
                self.retired_oom_kills
                    .fetch_add(kills, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // Called on the supervisor's event loop: one try, no waiting.
        let now = Instant::now();
        for dir in self.root_dirs(name) {
            remove_tree(&dir, now);
        }
    }

    /// Puts the sandbox's init into the v1 `cpuacct` hierarchy, which
    /// libcontainer leaves alone, so CPU time can be metered; everything
    /// the agent starts afterwards inherits it. v2 meters in the unified group.
    pub fn join_accounting(&self, pid: i32) -> Result<(), CgroupError> {
        if self.layout == Layout::V2 {
            return Ok(());
        }
        let dir = self.dir("cpuacct");
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let procs = dir.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(io_err(&procs))
    }

    /// CPU time used by the whole sandbox so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        match self.layout {
            Layout::V1 => fs::read_to_string(self.dir("cpuacct").join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
                .map(|ns| ns as f64 / 1e9),
            Layout::V2 => {
                read_key(&self.dir("").join("cpu.stat"), "usage_usec").map(|us| us as f64 / 1e6)
            }
        }
    }

    /// Lowers the running sandbox's ceilings to `limits` (a pooled sandbox
    /// handed to a request that asks for less than it was made with). The
    /// same knobs the spec set at create: CFS quota over a 100 ms period,
    /// memory with no swap on top, pids. The caller checks that the memory
    /// in use is below the new limit: on v2 a lower `memory.max` reclaims
    /// and, failing that, OOM-kills inside the sandbox.
    pub fn lower_limits(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        let memory = limits.memory_bytes.to_string();
        let writes: Vec<(PathBuf, String)> = match self.layout {
            Layout::V1 => {
                // Memory first: the one write that can be refused (EBUSY
                // when the kernel cannot reclaim down to it), before
                // anything else changed. Lowered before memory+swap, which
                // may never be below it.
                let mut writes = vec![(
                    self.dir("memory").join("memory.limit_in_bytes"),
                    memory.clone(),
                )];
                let memsw = self.dir("memory").join("memory.memsw.limit_in_bytes");
                // Absent where the kernel does no swap accounting.
                if memsw.exists() {
                    writes.push((memsw, memory));
                }
                writes.push(self.cpu_quota_write(limits.cpu_quota_us));
                writes.push((
                    self.dir("pids").join("pids.max"),
                    limits.pids_max.to_string(),
                ));
                writes
            }
            Layout::V2 => vec![
                (self.dir("").join("memory.max"), memory),
                self.cpu_quota_write(limits.cpu_quota_us),
                (self.dir("").join("pids.max"), limits.pids_max.to_string()),
            ],
        };
        for (file, value) in writes {
            fs::write(&file, value).map_err(io_err(&file))?;
        }
        Ok(())
    }

    /// Sets the CFS quota (over the 100 ms period the spec set) alone: a
    /// pooled microVM's other ceilings are its guest's size.
    pub fn set_cpu_quota(&self, quota_us: i64) -> Result<(), CgroupError> {
        let (file, value) = self.cpu_quota_write(quota_us);
        fs::write(&file, value).map_err(io_err(&file))
    }

    /// The file and value that set the CFS quota.
    fn cpu_quota_write(&self, quota_us: i64) -> (PathBuf, String) {
        match self.layout {
            Layout::V1 => (
                self.dir("cpu").join("cpu.cfs_quota_us"),
                quota_us.to_string(),
            ),
            Layout::V2 => (
                self.dir("").join("cpu.max"),
                format!("{quota_us} {}", super::spec::CPU_PERIOD_US),
            ),
        }
    }

    /// Whether the group exists (a limited root's, say, until it goes).
    pub fn exists(&self) -> bool {
        match self.layout {
            Layout::V1 => self.dir("pids").is_dir(),
            Layout::V2 => self.dir("").is_dir(),
        }
    }

    /// The group's own memory ceiling, if it has one.
    pub fn memory_limit_bytes(&self) -> Option<u64> {
        let file = match self.layout {
            Layout::V1 => self.dir("memory").join("memory.limit_in_bytes"),
            Layout::V2 => self.dir("").join("memory.max"),
        };
        // "max" (v2) does not parse; v1's "unlimited" is near i64::MAX.
        fs::read_to_string(file)
            .ok()?
            .trim()
            .parse()
            .ok()
            .filter(|b| *b < (i64::MAX as u64 & !4095))
    }

    /// The group's own pids ceiling, if it has one.
    pub fn pids_max(&self) -> Option<u64> {
        let file = match self.layout {
            Layout::V1 => self.dir("pids").join("pids.max"),
            Layout::V2 => self.dir("").join("pids.max"),
        };
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// Memory charged to the sandbox now.
    pub fn memory_bytes(&self) -> Option<u64> {
        Self::memory_bytes_in(&self.open_memory_usage().ok()?)
    }

    fn memory_usage_path(&self) -> PathBuf {
        match self.layout {
            Layout::V1 => self.dir("memory").join("memory.usage_in_bytes"),
            Layout::V2 => self.dir("").join("memory.current"),
        }
    }

    /// The file [`Self::memory_bytes`] reads, opened to be read again and
    /// again with [`memory_bytes_in`] (no path lookup each time).
    pub fn open_memory_usage(&self) -> std::io::Result<fs::File> {
        fs::File::open(self.memory_usage_path())
    }

    /// Memory charged to a group now, read from its usage file as
    /// [`Self::open_memory_usage`] opened it: each read from the start
    /// gives the kernel's figure of that moment.
    pub fn memory_bytes_in(usage: &fs::File) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let len = usage.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(buf.get(..len)?)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Tasks (processes and threads) in the sandbox now.
    pub fn pids_current(&self) -> Option<u64> {
        let file = match self.layout {
            Layout::V1 => self.dir("pids").join("pids.current"),
            Layout::V2 => self.dir("").join("pids.current"),
        };
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// OOM kills counted for the whole sandbox, its limited roots' included.
    pub fn oom_kills(&self) -> u64 {
        match self.layout {
            // v2's `memory.events` counts the group's descendants too.
            Layout::V2 => read_key(&self.dir("").join("memory.events"), "oom_kill").unwrap_or(0),
            // v1's counter is the group's own: a limited root's kills are
            // in its group's.
            Layout::V1 => {
                let top = self.dir("memory");
                let roots = fs::read_dir(&top)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("root-"))
                    .map(|e| e.path());
                let live: u64 = std::iter::once(top.clone())
                    .chain(roots)
                    .map(|dir| read_key(&dir.join("memory.oom_control"), "oom_kill").unwrap_or(0))
                    .sum();
                live + self
                    .retired_oom_kills
                    .load(std::sync::atomic::Ordering::Relaxed)
            }
        }
    }

    /// The sandbox's group in every hierarchy it may have one in.
    fn tops(&self) -> Vec<PathBuf> {
        match self.layout {
            Layout::V1 => V1_SANDBOX_CONTROLLERS
                .iter()
                .chain(V1_NAMED_HIERARCHIES.iter())
                .chain(V1_LIBCONTAINER_ONLY_CONTROLLERS.iter())
                .map(|h| self.dir(h))
                .collect(),
            Layout::V2 => vec![self.dir("")],
        }
    }

    /// The group whose freezing stops the whole sandbox (CRIU's
    /// `--freeze-cgroup`).
    pub fn freezer_dir(&self) -> PathBuf {
        match self.layout {
            Layout::V1 => self.dir("freezer"),
            Layout::V2 => self.dir(""),
        }
    }

    /// The file that freezes the whole sandbox, and what to write to it to
    /// freeze and to thaw.
    fn freeze_control(&self) -> (PathBuf, &'static str, &'static str) {
        match self.layout {
            Layout::V1 => (self.freezer_dir().join("freezer.state"), "FROZEN", "THAWED"),
            Layout::V2 => (self.freezer_dir().join("cgroup.freeze"), "1", "0"),
        }
    }

    /// Stops every task of the sandbox (per-process groups included) and
    /// waits until all are stopped, so its memory and files hold still.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        let start = Instant::now();
        let (path, frozen_value, _) = self.freeze_control();
        fs::write(&path, frozen_value).map_err(io_err(&path))?;
        let mut backoff = Duration::from_micros(100);
        loop {
            let frozen = match self.layout {
                Layout::V1 => fs::read_to_string(&path)
                    .map(|s| s.trim() == "FROZEN")
                    .unwrap_or(false),
                Layout::V2 => {
                    read_key(&self.freezer_dir().join("cgroup.events"), "frozen") == Some(1)
                }
            };
            if frozen {
                return Ok(());
            }
            if start.elapsed() > FREEZE_DEADLINE {
                let _ = self.thaw();
                return Err(CgroupError::NotFrozen {
                    path: self.freezer_dir().display().to_string(),
                    waited_ms: start.elapsed().as_millis(),
                });
            }
            // Freezing completes in microseconds to milliseconds; v1 gives
            // no event for it.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(10));
        }
    }

    /// Sets a limit of 0 on each huge page size of `sizes` (named as
    /// [`huge_page_sizes_to_deny`] names them), reservations included where
    /// the kernel counts them, in a CRIU fork's groups: what libcontainer
    /// sets at a create, and what CRIU, which makes the fork's groups anew,
    /// leaves out. The fork is frozen, so nothing in it runs unlimited.
    ///
    /// v2: the sandbox's group; where CRIU made it under a parent that
    /// does not hand hugetlb down (no create since boot enabled it), the
    /// controller is enabled down from the root first, as libcgroups does.
    /// v1: hugetlb is a hierarchy of its own that CRIU does not restore a
    /// fork into (it is not among the controllers dumped), so the group is
    /// made there and the fork's processes are moved into it. A size the
    /// group then has no file for is an error, not a fork without the
    /// limit.
    pub fn deny_huge_pages(&self, sizes: &[String]) -> Result<(), CgroupError> {
        if sizes.is_empty() {
            return Ok(());
        }
        let (group, max, reserved) = match self.layout {
            Layout::V2 => (self.dir(""), "max", "rsvd.max"),
            Layout::V1 => (self.dir("hugetlb"), "limit_in_bytes", "rsvd.limit_in_bytes"),
        };
        match self.layout {
            Layout::V2 if !group.join(format!("hugetlb.{}.{max}", sizes[0])).exists() => {
                self.hand_down_v2("hugetlb")
            }
            Layout::V2 => {}
            Layout::V1 => fs::create_dir_all(&group).map_err(io_err(&group))?,
        }
        for size in sizes {
            write_existing(&group.join(format!("hugetlb.{size}.{max}")), "0")?;
            let reserved = group.join(format!("hugetlb.{size}.{reserved}"));
            if reserved.exists() {
                write_existing(&reserved, "0")?;
            }
        }
        if self.layout == Layout::V1 {
            // After the limits: each process moved is limited at once.
            let mut pids = Vec::new();
            read_pids_recursive(&self.dir("pids"), &mut pids);
            move_pids(pids, &group)?;
        }
        Ok(())
    }

    /// Enables v2 `controller` in the `cgroup.subtree_control` of every
    /// group from the root down to the sandbox's parent, so it reaches the
    /// sandbox's group. Best effort at each, as libcgroups does: one that
    /// refuses (a group above that holds processes) is passed by, and the
    /// caller finds out from the files the controller should have made.
    fn hand_down_v2(&self, controller: &str) {
        let mut dir = self.root.clone();
        let mut parts: Vec<&str> = self.path.split('/').filter(|p| !p.is_empty()).collect();
        parts.pop();
        for part in std::iter::once("").chain(parts) {
            if !part.is_empty() {
                dir.push(part);
            }
            let control = dir.join("cgroup.subtree_control");
            if let Err(e) = write_existing(&control, &format!("+{controller}")) {
                tracing::debug!("handing {controller} down: {e}");
            }
        }
    }

    /// Lets a frozen sandbox run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        let (path, _, thawed_value) = self.freeze_control();
        fs::write(&path, thawed_value).map_err(io_err(&path))
    }

    /// Kills every process of the sandbox, in every per-process group too.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        match self.layout {
            Layout::V2 => {
                let top = self.dir("");
                if top.exists() {
                    kill_v2(&top)?;
                }
            }
            Layout::V1 => {
                let pids = self.dir("pids");
                if pids.exists() {
                    kill_v1(&pids, &self.dir("freezer"))?;
                }
            }
        }
        Ok(())
    }

    /// Removes the per-process groups, retrying a busy one until `until`
    /// (see [`remove_tree`]).
    pub fn remove_process_groups(&self, until: Instant) {
        for top in self.tops() {
            if let Ok(entries) = fs::read_dir(&top) {
                for entry in entries.flatten() {
                    if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        remove_tree(&entry.path(), until);
                    }
                }
            }
        }
    }

    /// Kills everything and removes the sandbox's groups in every hierarchy,
    /// retrying a busy one until `until`. Idempotent: the teardown path
    /// calls it whatever state the sandbox was left in.
    pub fn destroy(&self, until: Instant) -> Result<(), CgroupError> {
        self.kill_all()?;
        for top in self.tops() {
            remove_tree(&top, until);
        }
        Ok(())
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn read_key(file: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(file).ok().and_then(|text| {
        text.lines().find_map(|l| {
            let mut parts = l.split_whitespace();
            (parts.next() == Some(key))
                .then(|| parts.next().and_then(|v| v.parse().ok()))
                .flatten()
        })
    })
}

/// Moves the calling process (a sandbox supervisor) into `sandboxd/supervisors`
/// in every hierarchy that tracks it, so it is neither inside the daemon's
/// service cgroup (systemd would count it as part of the service) nor
/// inside a sandbox's cgroup (the sandbox's OOM killer must not reach it).
pub fn join_supervisors_group(parent: &str) -> Result<(), CgroupError> {
    let group = Path::new(parent.trim_matches('/')).join("supervisors");
    let dirs: Vec<PathBuf> = match Layout::detect() {
        Layout::V2 => vec![Path::new(CGROUP_ROOT).join(&group)],
        // cpuset is left out: a new v1 cpuset group has no cpus until set.
        Layout::V1 => [
            "systemd", "unified", "pids", "memory", "cpu", "cpuacct", "blkio", "devices", "freezer",
        ]
        .iter()
        .map(|h| Path::new(CGROUP_ROOT).join(h))
        .filter(|h| h.join("cgroup.procs").exists())
        .map(|h| h.join(&group))
        .collect(),
    };
    let me = std::process::id().to_string();
    for dir in dirs {
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let procs = dir.join("cgroup.procs");
        fs::write(&procs, &me).map_err(io_err(&procs))?;
    }
    Ok(())
}

/// Pids in `<parent>/supervisors`: every supervisor of this daemon's
/// sandboxes that got as far as joining it.
pub fn supervisor_pids(parent: &str) -> Vec<i32> {
    let group = Path::new(parent.trim_matches('/')).join("supervisors");
    match Layout::detect() {
        Layout::V2 => read_pids(&Path::new(CGROUP_ROOT).join(group)),
        Layout::V1 => read_pids(&Path::new(CGROUP_ROOT).join("pids").join(group)),
    }
}

/// Sandbox ids that have a cgroup under `parent` (for recovery to find
/// groups no record owns).
pub fn sandbox_group_ids(parent: &str) -> Vec<String> {
    let parent = parent.trim_matches('/');
    let parent = match Layout::detect() {
        Layout::V2 => Path::new(CGROUP_ROOT).join(parent),
        Layout::V1 => Path::new(CGROUP_ROOT).join("pids").join(parent),
    };
    fs::read_dir(parent)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("sb-"))
                .collect()
        })
        .unwrap_or_default()
}

/// What enables (`+`) or disables (`-`) `controllers` in a v2
/// `cgroup.subtree_control`.
fn subtree_control_value(sign: char, controllers: &[String]) -> String {
    controllers
        .iter()
        .map(|c| format!("{sign}{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Moves every task of group `from` into group `to` (v2); one that ended
/// meanwhile is skipped.
fn move_tasks(from: &Path, to: &Path) -> Result<(), CgroupError> {
    move_pids(read_pids(from), to)
}

/// Moves each process of `pids` into group `to`; one that ended meanwhile
/// is skipped.
fn move_pids(pids: impl IntoIterator<Item = i32>, to: &Path) -> Result<(), CgroupError> {
    let procs = to.join("cgroup.procs");
    for pid in pids {
        match fs::write(&procs, pid.to_string()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(io_err(&procs)(e)),
        }
    }
    Ok(())
}

fn read_pids(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Reads every pid of `dir` and its descendants.
fn read_pids_recursive(dir: &Path, out: &mut Vec<i32>) {
    out.extend(read_pids(dir));
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                read_pids_recursive(&entry.path(), out);
            }
        }
    }
}

const KILL_DEADLINE: Duration = Duration::from_secs(5);

/// Polls until `dir` and its descendants list no task or `until` passes
/// (v1, whose `tasks` files are all it has).
fn poll_empty(dir: &Path, until: Instant) -> bool {
    poll_until(until, || {
        let mut pids = Vec::new();
        read_pids_recursive(dir, &mut pids);
        pids.is_empty()
    })
}

/// Polls `done` until it holds or `until` passes, with a short, growing
/// backoff: the kernel gives no event when a killed task leaves a v1
/// cgroup, and v2's `cgroup.events`, which poll(2) could wait on, is
/// served well enough this way for the few milliseconds it takes.
fn poll_until(until: Instant, mut done: impl FnMut() -> bool) -> bool {
    let mut backoff = Duration::from_micros(200);
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(20));
    }
}

fn stuck(dir: &Path, start: Instant) -> CgroupError {
    CgroupError::Stuck {
        path: dir.display().to_string(),
        waited_ms: start.elapsed().as_millis(),
    }
}

fn kill_v2(dir: &Path) -> Result<(), CgroupError> {
    let start = Instant::now();
    let kill = dir.join("cgroup.kill");
    match fs::write(&kill, "1") {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(&kill)(e)),
    }
    if poll_unpopulated(dir, start + KILL_DEADLINE) {
        Ok(())
    } else {
        Err(stuck(dir, start))
    }
}

/// Polls until `cgroup.events` says `populated 0` (or the group is gone)
/// or `until` passes. Unlike `cgroup.procs`, which hides a process once
/// all its threads are exiting, this counts a task until it has left the
/// group at the end of its exit (a VMM freeing its guest's memory can
/// take a while there), so the group's rmdir then succeeds.
fn poll_unpopulated(dir: &Path, until: Instant) -> bool {
    let events = dir.join("cgroup.events");
    poll_until(until, || {
        read_key(&events, "populated").is_none_or(|n| n == 0)
    })
}

fn kill_v1(pids_dir: &Path, freezer_dir: &Path) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        // Freezing first means nothing can fork between reading the pids and
        // killing them; SIGKILL is delivered as soon as the group thaws.
        let frozen = freezer_dir.exists() && write_freezer(freezer_dir, "FROZEN").is_ok();
        let mut pids = Vec::new();
        read_pids_recursive(pids_dir, &mut pids);
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if frozen {
            let _ = write_freezer(freezer_dir, "THAWED");
        }
        if pids.is_empty() || poll_empty(pids_dir, Instant::now() + Duration::from_millis(100)) {
            return Ok(());
        }
        if start.elapsed() > KILL_DEADLINE {
            return Err(stuck(pids_dir, start));
        }
    }
}

fn write_freezer(dir: &Path, state: &str) -> io::Result<()> {
    let path = dir.join("freezer.state");
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(state.as_bytes())
}

/// Removes a cgroup directory tree bottom-up (cgroupfs only allows rmdir);
/// whether it is gone. A group whose last task was killed a moment ago
/// refuses its rmdir (EBUSY) until that task has finished exiting, which
/// on v1 nothing tells (its `tasks` and `cgroup.procs` hide an exiting
/// process already; v2's kill waits on `cgroup.events` instead). Such a
/// refusal is retried with a short, growing backoff until `until`; a group
/// whose child stayed is not retried (it cannot go before the child).
/// What is left stays (the daemon's own pass after the supervisor exited
/// tries again).
fn remove_tree(dir: &Path, until: Instant) -> bool {
    let mut children_gone = true;
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                children_gone &= remove_tree(&entry.path(), until);
            }
        }
    }
    let mut backoff = Duration::from_micros(500);
    loop {
        let e = match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            Err(e) => e,
        };
        if !children_gone || e.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= until {
            return false;
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(50));
    }
}

/// How long a teardown retries busy groups, all of them together, after
/// a kill that emptied them ([`remove_tree`]).
pub const RMDIR_PATIENCE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_map_onto_weights_ends_and_defaults_alike() {
        for (shares, weight) in [
            (2, 1),
            (3, 2),
            (512, 59),
            (1024, 100),
            (2048, 174),
            (262_144, 10_000),
        ] {
            assert_eq!(cpu_weight_of_shares(shares), weight, "{shares} shares");
        }
    }

    #[test]
    fn process_groups_live_under_the_sandbox_in_each_hierarchy() {
        let v1 = SandboxCgroups::new(Layout::V1, "/sandboxd/abc");
        assert_eq!(
            v1.process_dirs(7, None),
            vec![
                PathBuf::from("/sys/fs/cgroup/pids/sandboxd/abc/p7"),
                PathBuf::from("/sys/fs/cgroup/freezer/sandboxd/abc/p7"),
            ]
        );
        let v2 = SandboxCgroups::new(Layout::V2, "sandboxd/abc");
        assert_eq!(
            v2.process_dirs(7, None),
            vec![PathBuf::from("/sys/fs/cgroup/sandboxd/abc/p7")]
        );
    }

    /// libcontainer makes the sandbox's group in every v1 controller the
    /// host mounts; a teardown must reach all of them. The names are
    /// libcgroups 0.7's `v1::controller_type::CONTROLLERS` (not public):
    /// check them again when libcgroups changes.
    #[test]
    fn a_v1_teardown_reaches_every_controller_libcontainer_joins() {
        let v1 = SandboxCgroups::new(Layout::V1, "/sandboxd/abc");
        let tops = v1.tops();
        for controller in [
            "cpu",
            "cpuacct",
            "cpuset",
            "devices",
            "hugetlb",
            "memory",
            "pids",
            "perf_event",
            "blkio",
            "net_prio",
            "net_cls",
            "freezer",
        ] {
            let group = PathBuf::from(format!("/sys/fs/cgroup/{controller}/sandboxd/abc"));
            assert!(tops.contains(&group), "{group:?} missing from {tops:?}");
        }
        let v2 = SandboxCgroups::new(Layout::V2, "sandboxd/abc");
        assert_eq!(
            v2.tops(),
            vec![PathBuf::from("/sys/fs/cgroup/sandboxd/abc")]
        );
    }

    #[test]
    fn a_limited_roots_processes_live_under_its_group() {
        let v1 = SandboxCgroups::new(Layout::V1, "/sandboxd/abc");
        assert_eq!(
            v1.process_dirs(7, Some("app")),
            vec![
                PathBuf::from("/sys/fs/cgroup/pids/sandboxd/abc/root-app/p7"),
                PathBuf::from("/sys/fs/cgroup/freezer/sandboxd/abc/root-app/p7"),
            ]
        );
        // A host with cpu and cpuacct apart, and one with them mounted
        // together (`cpu` and `cpuacct` links to `cpu,cpuacct`).
        let apart = tempfile::tempdir().expect("tempdir");
        for h in ["cpu", "cpuacct"] {
            fs::create_dir(apart.path().join(h)).expect("hierarchy");
        }
        let v1 = SandboxCgroups::under(apart.path(), Layout::V1, "/sandboxd/abc");
        assert_eq!(
            v1.root_dirs("app"),
            ["pids", "freezer", "memory", "cpu", "cpuacct"]
                .map(|h| apart.path().join(h).join("sandboxd/abc/root-app"))
        );
        let together = tempfile::tempdir().expect("tempdir");
        fs::create_dir(together.path().join("cpu,cpuacct")).expect("hierarchy");
        for h in ["cpu", "cpuacct"] {
            std::os::unix::fs::symlink("cpu,cpuacct", together.path().join(h)).expect("link");
        }
        let v1 = SandboxCgroups::under(together.path(), Layout::V1, "/sandboxd/abc");
        assert_eq!(
            v1.root_dirs("app"),
            ["pids", "freezer", "memory", "cpu"]
                .map(|h| together.path().join(h).join("sandboxd/abc/root-app"))
        );
        let v2 = SandboxCgroups::new(Layout::V2, "sandboxd/abc");
        assert_eq!(
            v2.process_dirs(7, Some("app")),
            vec![PathBuf::from("/sys/fs/cgroup/sandboxd/abc/root-app/p7")]
        );
    }

    /// A plain directory stands in for cgroupfs: the files the kernel would
    /// make are made by hand, and what the module writes is read back.
    #[test]
    fn a_v2_root_group_moves_the_agent_out_and_sets_its_ceilings() {
        let fake = tempfile::tempdir().expect("tempdir");
        let top = fake.path().join("sandboxd/abc");
        fs::create_dir_all(top.join(V2_INIT_GROUP)).expect("dirs");
        fs::write(top.join("cgroup.subtree_control"), "").expect("control");
        fs::write(top.join("cgroup.controllers"), "cpuset cpu io memory pids")
            .expect("controllers");
        fs::write(top.join("cgroup.procs"), "").expect("procs");
        let cgroups = SandboxCgroups::under(fake.path(), Layout::V2, "sandboxd/abc");
        let limits = RootLimits {
            cpu_quota_us: Some(50_000),
            memory_bytes: Some(64 << 20),
            pids_max: Some(32),
            cpu_shares: Some(2048),
            oom_group: true,
        };
        cgroups
            .create_root_group("app", &limits)
            .expect("root group");
        assert_eq!(
            fs::read_to_string(top.join("cgroup.subtree_control")).unwrap(),
            "+cpu +memory +pids"
        );
        let group = top.join("root-app");
        assert_eq!(
            fs::read_to_string(group.join("memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(
            fs::read_to_string(group.join("cpu.max")).unwrap(),
            "50000 100000"
        );
        assert_eq!(fs::read_to_string(group.join("pids.max")).unwrap(), "32");
        assert_eq!(fs::read_to_string(group.join("cpu.weight")).unwrap(), "174");
        assert_eq!(
            fs::read_to_string(group.join("memory.oom.group")).unwrap(),
            "1"
        );
        // Only what was asked for is written.
        cgroups
            .create_root_group(
                "small",
                &RootLimits {
                    pids_max: Some(8),
                    ..Default::default()
                },
            )
            .expect("root group");
        assert!(!top.join("root-small/memory.max").exists());
        assert!(!top.join("root-small/cpu.weight").exists());
        assert!(!top.join("root-small/memory.oom.group").exists());
        assert_eq!(
            fs::read_to_string(top.join("root-small/pids.max")).unwrap(),
            "8"
        );
    }

    #[test]
    fn a_forks_v2_group_is_denied_every_huge_page_size_and_its_reservations() {
        let fake = tempfile::tempdir().expect("tempdir");
        let top = fake.path().join("sandboxd/abc");
        fs::create_dir_all(&top).expect("dirs");
        for file in ["hugetlb.2MB.max", "hugetlb.2MB.rsvd.max", "hugetlb.1GB.max"] {
            // cgroupfs files take a write whole; a plain file keeps what
            // is past it, so the stand-ins start empty.
            fs::write(top.join(file), "").expect("limit file");
        }
        let cgroups = SandboxCgroups::under(fake.path(), Layout::V2, "sandboxd/abc");
        let sizes = ["1GB".to_string(), "2MB".to_string()];
        cgroups.deny_huge_pages(&sizes).expect("denied");
        for file in ["hugetlb.2MB.max", "hugetlb.2MB.rsvd.max", "hugetlb.1GB.max"] {
            assert_eq!(fs::read_to_string(top.join(file)).unwrap(), "0", "{file}");
        }
        assert!(!top.join("hugetlb.1GB.rsvd.max").exists(), "none made");
        // No file yet: the controller is handed down from the root, and a
        // size still without one fails the fork rather than leaving it
        // unlimited.
        for dir in [fake.path(), &fake.path().join("sandboxd")] {
            fs::write(dir.join("cgroup.subtree_control"), "").expect("control");
        }
        let missing = cgroups.deny_huge_pages(&["16GB".to_string()]);
        assert!(
            matches!(&missing, Err(CgroupError::Io { path, .. }) if path.ends_with("hugetlb.16GB.max")),
            "{missing:?}"
        );
        for dir in [fake.path(), &fake.path().join("sandboxd")] {
            let control = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap();
            assert_eq!(control, "+hugetlb", "{}", dir.display());
        }
        assert!(
            !top.join("cgroup.subtree_control").exists(),
            "not below the sandbox"
        );
        // No sizes to deny (the host has no hugetlb reaching sandboxes):
        // nothing is touched.
        cgroups.deny_huge_pages(&[]).expect("nothing to set");
    }

    #[test]
    fn a_forks_v1_processes_are_moved_into_a_hugetlb_group_denied_every_size() {
        let fake = tempfile::tempdir().expect("tempdir");
        let pids = fake.path().join("pids/sandboxd/abc");
        fs::create_dir_all(pids.join("p3")).expect("dirs");
        fs::write(pids.join("cgroup.procs"), "10\n11\n").expect("procs");
        fs::write(pids.join("p3/cgroup.procs"), "12\n").expect("procs");
        let hugetlb = fake.path().join("hugetlb/sandboxd/abc");
        fs::create_dir_all(&hugetlb).expect("dirs");
        for file in [
            "hugetlb.2MB.limit_in_bytes",
            "hugetlb.2MB.rsvd.limit_in_bytes",
            "cgroup.procs",
        ] {
            fs::write(hugetlb.join(file), "").expect("file");
        }
        let cgroups = SandboxCgroups::under(fake.path(), Layout::V1, "sandboxd/abc");
        cgroups
            .deny_huge_pages(&["2MB".to_string()])
            .expect("denied");
        for file in [
            "hugetlb.2MB.limit_in_bytes",
            "hugetlb.2MB.rsvd.limit_in_bytes",
        ] {
            assert_eq!(
                fs::read_to_string(hugetlb.join(file)).unwrap(),
                "0",
                "{file}"
            );
        }
        // A plain file keeps the last write: the last of the three pids.
        assert_eq!(
            fs::read_to_string(hugetlb.join("cgroup.procs")).unwrap(),
            "12"
        );
    }

    #[test]
    fn a_v1_root_group_takes_its_weight_in_the_cpu_hierarchy() {
        let fake = tempfile::tempdir().expect("tempdir");
        for hierarchy in ["pids", "freezer", "memory", "cpu", "cpuacct"] {
            fs::create_dir_all(fake.path().join(hierarchy).join("sandboxd/abc")).expect("dirs");
        }
        let cgroups = SandboxCgroups::under(fake.path(), Layout::V1, "sandboxd/abc");
        cgroups
            .create_root_group(
                "app",
                &RootLimits {
                    cpu_shares: Some(2),
                    ..Default::default()
                },
            )
            .expect("root group");
        let group = fake.path().join("cpu/sandboxd/abc/root-app");
        assert_eq!(fs::read_to_string(group.join("cpu.shares")).unwrap(), "2");
        assert!(!group.join("cpu.cfs_quota_us").exists());
        // Its CPU time is metered apart from the pod's others'.
        assert!(fake.path().join("cpuacct/sandboxd/abc/root-app").is_dir());
        assert!(fake.path().join("pids/sandboxd/abc/root-app").is_dir());
        // v1 has no whole-group OOM kill: refused, and nothing left.
        let refused = cgroups.create_root_group(
            "grouped",
            &RootLimits {
                oom_group: true,
                ..Default::default()
            },
        );
        assert!(
            refused.is_err_and(|e| e.to_string().contains("memory.oom.group")),
            "refused"
        );
        assert!(!fake.path().join("cpu/sandboxd/abc/root-grouped").exists());
    }
}
