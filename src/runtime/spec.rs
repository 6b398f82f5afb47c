//! The OCI runtime spec of a container sandbox: the one place that decides what
//! libcontainer (youki 0.7) is asked to build — namespaces, id mappings, mounts,
//! masked paths, capabilities, rlimits, cgroup limits and device rules. The
//! seccomp profile ([`super::seccomp`]) is left out of the spec: the init
//! installs it precompiled ([`super::seccomp_filter`]), so libcontainer does
//! not compile it in every create.
//!
//! [`build_spec`] is pure: it validates its input and returns a [`Spec`]; it touches
//! nothing on the host. [`enter_netns`] is the one runtime helper that goes with
//! it, because of how libcontainer joins namespaces (see below).
//!
//! What the caller must arrange before handing the spec to libcontainer, and why:
//!
//! - **Network namespace.** libcontainer 0.7 creates the user namespace first and
//!   joins namespaces given by path from inside it. The kernel refuses `setns` into
//!   a network namespace owned by the host user namespace from there (EPERM: it
//!   wants CAP_SYS_ADMIN over the netns's owner). So the spec names no network
//!   namespace at all and the container inherits the network namespace of the
//!   thread that calls `ContainerBuilder::build()` (libcontainer clones from the
//!   calling thread). Call [`enter_netns`] with [`ContainerSpecInput::netns_path`]
//!   on that thread first — a dedicated thread, never a shared async worker. If it
//!   is skipped the sandbox shares the caller's network namespace.
//! - **Ownership.** The init process sets up mounts as the sandbox's root, which on
//!   the host is `host_uid_base`: it has no privilege over files whose owner is not
//!   mapped. The rootfs (overlay upper dir, hence the merged root) and the image's
//!   files must be owned inside the mapped range (shifted by `host_uid_base`), or
//!   at least `/` and `/etc` must be writable by the mapped root, since mount
//!   targets are created there. Every directory on the way to the rootfs, the agent
//!   binary and the three `/etc` source files must be searchable by others (o+x),
//!   and those files readable by others (agent 0755, `/etc` files 0644).
//! - **Mount targets.** libcontainer creates `/.sandboxd/` and an empty
//!   `/.sandboxd/agent` in the rootfs to bind the agent onto (as for any file bind
//!   mount), so the image needs nothing. The same holds for `/etc/hosts`,
//!   `/etc/resolv.conf` and `/etc/hostname`, but an image symlink there is followed
//!   (within the rootfs) and a dangling one makes the start fail ("pathrs
//!   create_file ... File exists"); writing these three as regular files into the
//!   overlay upper dir before the start avoids both.
//! - **rlimits.** libcontainer sets them from inside the new user namespace, where
//!   raising a hard limit is refused: `nofile` must not exceed the caller's hard
//!   RLIMIT_NOFILE.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use oci_spec::runtime::{
    Capabilities, Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder,
    LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxHugepageLimitBuilder,
    LinuxIdMappingBuilder, LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use crate::gpu::DeviceGrant;

/// Where the agent binary appears inside every container sandbox.
pub const AGENT_PATH_IN_SANDBOX: &str = "/.sandboxd/agent";

/// CFS period for the CPU limit, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Smallest CFS quota the kernel accepts, in microseconds.
pub const MIN_CPU_QUOTA_US: i64 = 1_000;

/// Largest CPU limit accepted, so the quota arithmetic cannot overflow.
pub const MAX_CPU_CORES: f64 = 65_536.0;

/// Annotation recording the network namespace the sandbox is meant to run in,
/// for whoever reads the bundle later; libcontainer ignores it.
pub const NETNS_ANNOTATION: &str = "dev.sandboxd.netns";

/// OCI runtime spec version written into the spec.
const OCI_VERSION: &str = "1.2.0";

/// Size of the tmpfs on /dev: device nodes and symlinks only.
const DEV_TMPFS_SIZE: &str = "size=65536k";

/// Docker's default capability set, granted in the bounding, effective and
/// permitted sets. Within the user namespace they only act on the sandbox's own
/// objects. The same set as `sandbox_proto::confinement::CAPABILITIES`, by
/// name (a test holds the two together).
const CAPABILITIES: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// The default masked and read-only paths, shared with the containerd shim.
pub use sandbox_proto::confinement::{MASKED_PATHS, READONLY_PATHS};

/// Character devices the sandbox may use (type, major, minor; None = any minor):
/// null, zero, full, random, urandom, tty, ptmx and the devpts ptys, as Docker.
/// libcgroups appends its own defaults after these on v1 and v2 alike (mknod of
/// any node, /dev/console, tun); device nodes cannot be created in a user
/// namespace, so those grant nothing here.
const ALLOWED_CHAR_DEVICES: [(i64, Option<i64>); 8] = [
    (1, Some(3)),
    (1, Some(5)),
    (1, Some(7)),
    (1, Some(8)),
    (1, Some(9)),
    (5, Some(0)),
    (5, Some(2)),
    (136, None),
];

/// Everything that varies between container sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpecInput {
    /// Hostname inside the sandbox (its own UTS namespace).
    pub hostname: String,
    /// Overlay merged directory, already mounted nosuid,nodev by the caller and
    /// owned by the mapped root (see the module docs).
    pub rootfs: PathBuf,
    /// Host path of the static sandbox-agent, bind-mounted read-only at
    /// [`AGENT_PATH_IN_SANDBOX`].
    pub agent_binary: PathBuf,
    /// Network namespace made by the daemon in the host user namespace. Not put in
    /// the spec: the caller enters it with [`enter_netns`] (see the module docs).
    pub netns_path: PathBuf,
    /// Absolute cgroup path, e.g. `/sandboxd/<id>`; libcontainer uses it as is
    /// under each v1 hierarchy or under the v2 root.
    pub cgroups_path: String,
    /// CPU limit in cores, fractions allowed.
    pub cpu_cores: f64,
    /// CPU weight in cgroup v1 shares (libcgroups writes v2's `cpu.weight`
    /// from it); `None` leaves the kernel's default.
    pub cpu_shares: Option<u64>,
    /// Huge page sizes the sandbox may not use (a limit of 0 each): those
    /// of [`super::cgroups::huge_page_sizes_to_deny`].
    pub denied_huge_page_sizes: Vec<String>,
    /// Memory hard limit in bytes; swap is not allowed on top of it.
    pub memory_bytes: u64,
    /// Most tasks (processes and threads) in the sandbox.
    pub pids_max: i64,
    /// Host uid that the sandbox's uid 0 maps to.
    pub host_uid_base: u32,
    /// Host gid that the sandbox's gid 0 maps to.
    pub host_gid_base: u32,
    /// Number of ids mapped, from 0 inside.
    pub id_map_size: u32,
    /// Size of /dev/shm in bytes.
    pub shm_bytes: u64,
    /// Environment of the agent, `KEY=VALUE`; must contain `PATH`.
    pub env: Vec<String>,
    /// Host file bind-mounted read-only on /etc/hosts.
    pub etc_hosts: PathBuf,
    /// Host file bind-mounted read-only on /etc/resolv.conf.
    pub etc_resolv_conf: PathBuf,
    /// Host file bind-mounted read-only on /etc/hostname.
    pub etc_hostname: PathBuf,
    /// RLIMIT_NOFILE, soft and hard.
    pub nofile: u64,
    /// Extra devices (bind-mounted nodes + device cgroup rules), read-only
    /// host files and masked paths: a GPU sandbox's (see [`crate::gpu`]).
    pub grant: DeviceGrant,
}

/// Why a spec could not be built, or the network namespace not entered.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(
        "invalid hostname {hostname:?}: {reason}; use 1-64 letters, digits, '-' and '.', \
         not starting with '-' or '.'"
    )]
    Hostname {
        hostname: String,
        reason: &'static str,
    },
    #[error("{field} must be an absolute path without '.' or '..' components, got {path:?}")]
    NotAbsolute { field: &'static str, path: PathBuf },
    #[error(
        "invalid cgroups_path {path:?}: it must be absolute, like \"/sandboxd/<id>\", \
         with no empty, '.' or '..' components"
    )]
    CgroupsPath { path: String },
    #[error("cpu_cores must be a finite number above 0 and at most {MAX_CPU_CORES}, got {0}")]
    CpuCores(f64),
    #[error("{field} must be greater than 0")]
    Zero { field: &'static str },
    #[error("memory_bytes {0} is too large; the limit is {max} bytes", max = i64::MAX)]
    MemoryTooLarge(u64),
    #[error(
        "{kind} mapping is unsafe or invalid: base {base}, size {size}; the base must not \
         be 0 (that would map the sandbox's root to the host's) and base + size must \
         stay below {max}",
        max = u32::MAX
    )]
    IdMapping {
        kind: &'static str,
        base: u32,
        size: u32,
    },
    #[error("environment entry {entry:?} is invalid: {reason}")]
    Env { entry: String, reason: &'static str },
    #[error("the environment has no PATH entry; pass e.g. \"PATH=/usr/local/bin:/usr/bin:/bin\"")]
    MissingPath,
    #[error("granted {what} {path:?} is refused: {reason}")]
    Grant {
        what: &'static str,
        path: PathBuf,
        reason: &'static str,
    },
    #[error(
        "internal error while assembling the OCI spec: {0}; this is a bug in sandboxd, \
         please report it"
    )]
    Build(#[from] oci_spec::OciSpecError),
    #[error("cannot open network namespace {path:?}: {source}; was it created and bind-mounted?")]
    OpenNetns {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path:?}: {source}; the daemon must run as root")]
    EnterNetns { path: PathBuf, source: nix::Error },
    #[error(
        "after setns the thread is not in network namespace {path:?}; is the path a \
         network namespace file?"
    )]
    NetnsMismatch { path: PathBuf },
}

/// CFS quota in microseconds per [`CPU_PERIOD_US`] for a limit of `cores`.
pub fn cpu_quota_us(cores: f64) -> Result<i64, SpecError> {
    if !(cores.is_finite() && cores > 0.0 && cores <= MAX_CPU_CORES) {
        return Err(SpecError::CpuCores(cores));
    }
    // Bounded above by MAX_CPU_CORES * CPU_PERIOD_US, far inside i64.
    let quota = (cores * CPU_PERIOD_US as f64).round() as i64;
    Ok(quota.max(MIN_CPU_QUOTA_US))
}

/// The spec libcontainer runs for one container sandbox.
pub fn build_spec(input: &ContainerSpecInput) -> Result<Spec, SpecError> {
    validate(input)?;

    let caps: Capabilities = CAPABILITIES.into_iter().collect();
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(0u32)
                .gid(0u32)
                .umask(sandbox_proto::confinement::UMASK)
                .build()?,
        )
        .args(vec![AGENT_PATH_IN_SANDBOX.to_owned()])
        .env(input.env.clone())
        .cwd("/")
        .no_new_privileges(true)
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(caps.clone())
                .effective(caps.clone())
                .permitted(caps)
                .inheritable(Capabilities::new())
                .ambient(Capabilities::new())
                .build()?,
        )
        .rlimits(vec![
            PosixRlimitBuilder::default()
                .typ(PosixRlimitType::RlimitNofile)
                .soft(input.nofile)
                .hard(input.nofile)
                .build()?,
            PosixRlimitBuilder::default()
                .typ(PosixRlimitType::RlimitCore)
                .soft(0u64)
                .hard(0u64)
                .build()?,
        ])
        .build()?;

    let memory_limit = i64::try_from(input.memory_bytes)
        .map_err(|_| SpecError::MemoryTooLarge(input.memory_bytes))?;
    let resources = LinuxResourcesBuilder::default()
        .devices(device_rules(&input.grant)?)
        .cpu({
            let cpu = LinuxCpuBuilder::default()
                .quota(cpu_quota_us(input.cpu_cores)?)
                .period(CPU_PERIOD_US);
            match input.cpu_shares {
                Some(shares) => cpu.shares(shares),
                None => cpu,
            }
            .build()?
        })
        .memory(
            LinuxMemoryBuilder::default()
                .limit(memory_limit)
                // memory+swap == memory: no swap (v2: memory.swap.max = 0).
                .swap(memory_limit)
                // Only cgroup v1 has a per-cgroup knob; libcgroups ignores it on v2.
                .swappiness(0u64)
                .build()?,
        )
        .pids(LinuxPidsBuilder::default().limit(input.pids_max).build()?);
    // Only where there are some: libcgroups' v1 manager fails a create
    // that names huge pages on a host without a hugetlb hierarchy.
    let resources = if input.denied_huge_page_sizes.is_empty() {
        resources
    } else {
        resources.hugepage_limits(
            input
                .denied_huge_page_sizes
                .iter()
                .map(|size| {
                    LinuxHugepageLimitBuilder::default()
                        .page_size(size.clone())
                        .limit(0i64)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?,
        )
    }
    .build()?;

    let linux = LinuxBuilder::default()
        .uid_mappings(vec![LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(input.host_uid_base)
            .size(input.id_map_size)
            .build()?])
        .gid_mappings(vec![LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(input.host_gid_base)
            .size(input.id_map_size)
            .build()?])
        .namespaces(namespaces()?)
        .cgroups_path(PathBuf::from(&input.cgroups_path))
        .resources(resources)
        .rootfs_propagation("private")
        .masked_paths(
            MASKED_PATHS
                .iter()
                .map(|p| (*p).to_owned())
                .chain(input.grant.masked_paths.iter().cloned())
                .collect::<Vec<_>>(),
        )
        .readonly_paths(
            READONLY_PATHS
                .iter()
                .map(|p| (*p).to_owned())
                .collect::<Vec<_>>(),
        )
        .build()?;

    let annotations = HashMap::from([(
        NETNS_ANNOTATION.to_owned(),
        input.netns_path.display().to_string(),
    )]);

    Ok(SpecBuilder::default()
        .version(OCI_VERSION)
        .root(
            RootBuilder::default()
                .path(input.rootfs.clone())
                .readonly(false)
                .build()?,
        )
        .mounts(mounts(input)?)
        .process(process)
        .hostname(input.hostname.clone())
        .annotations(annotations)
        .linux(linux)
        .build()?)
}

/// Joins the calling thread (only) to the network namespace at `netns_path` and
/// checks that it took. Call it on the thread that will run
/// `ContainerBuilder::build()`, before that call; the thread stays in that
/// namespace, even when this fails after joining it, until it joins its own
/// again (or ends).
pub fn enter_netns(netns_path: &Path) -> Result<(), SpecError> {
    let file = File::open(netns_path).map_err(|source| SpecError::OpenNetns {
        path: netns_path.to_owned(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| SpecError::EnterNetns {
        path: netns_path.to_owned(),
        source,
    })?;
    let want = file.metadata().map_err(|source| SpecError::OpenNetns {
        path: netns_path.to_owned(),
        source,
    })?;
    let have =
        std::fs::metadata("/proc/thread-self/ns/net").map_err(|source| SpecError::OpenNetns {
            path: netns_path.to_owned(),
            source,
        })?;
    if (want.dev(), want.ino()) != (have.dev(), have.ino()) {
        return Err(SpecError::NetnsMismatch {
            path: netns_path.to_owned(),
        });
    }
    Ok(())
}

fn validate(input: &ContainerSpecInput) -> Result<(), SpecError> {
    validate_hostname(&input.hostname)?;
    for (field, path) in [
        ("rootfs", &input.rootfs),
        ("agent_binary", &input.agent_binary),
        ("netns_path", &input.netns_path),
        ("etc_hosts", &input.etc_hosts),
        ("etc_resolv_conf", &input.etc_resolv_conf),
        ("etc_hostname", &input.etc_hostname),
    ] {
        if !is_clean_absolute(path) {
            return Err(SpecError::NotAbsolute {
                field,
                path: path.clone(),
            });
        }
    }
    let cg = Path::new(&input.cgroups_path);
    if !is_clean_absolute(cg) || cg.components().count() < 2 || input.cgroups_path.ends_with('/') {
        return Err(SpecError::CgroupsPath {
            path: input.cgroups_path.clone(),
        });
    }
    cpu_quota_us(input.cpu_cores)?;
    for (field, zero) in [
        ("memory_bytes", input.memory_bytes == 0),
        ("pids_max", input.pids_max <= 0),
        ("shm_bytes", input.shm_bytes == 0),
        ("nofile", input.nofile == 0),
        ("id_map_size", input.id_map_size == 0),
    ] {
        if zero {
            return Err(SpecError::Zero { field });
        }
    }
    if i64::try_from(input.memory_bytes).is_err() {
        return Err(SpecError::MemoryTooLarge(input.memory_bytes));
    }
    for (kind, base) in [("uid", input.host_uid_base), ("gid", input.host_gid_base)] {
        // u32::MAX is the kernel's "no id"; the mapped range must end below it.
        let fits = base
            .checked_add(input.id_map_size)
            .is_some_and(|end| end < u32::MAX);
        if base == 0 || !fits {
            return Err(SpecError::IdMapping {
                kind,
                base,
                size: input.id_map_size,
            });
        }
    }
    let mut has_path = false;
    for entry in &input.env {
        let bad = |reason| SpecError::Env {
            entry: entry.clone(),
            reason,
        };
        if entry.contains('\0') {
            return Err(bad("it contains a NUL byte"));
        }
        match entry.split_once('=') {
            None => return Err(bad("it has no '=' (use KEY=VALUE)")),
            Some(("", _)) => return Err(bad("the name before '=' is empty")),
            Some((key, _)) => has_path |= key == "PATH",
        }
    }
    if !has_path {
        return Err(SpecError::MissingPath);
    }
    validate_grant(&input.grant)
}

/// Granted nodes appear only under /dev, files nowhere the sandbox's own
/// mounts live, masks only under /proc; every path clean and absolute.
fn validate_grant(grant: &DeviceGrant) -> Result<(), SpecError> {
    let refuse = |what, path: &Path, reason| SpecError::Grant {
        what,
        path: path.to_owned(),
        reason,
    };
    for device in &grant.devices {
        if !is_clean_absolute(&device.host_path) {
            return Err(refuse(
                "device",
                &device.host_path,
                "not a clean absolute path",
            ));
        }
        if !is_clean_absolute(&device.path) || device.path.parent() != Some(Path::new("/dev")) {
            return Err(refuse("device", &device.path, "it must be /dev/NAME"));
        }
    }
    for file in &grant.files {
        if !is_clean_absolute(&file.host_path) || !is_clean_absolute(&file.path) {
            return Err(refuse("file", &file.path, "not a clean absolute path"));
        }
        if ["/proc", "/sys", "/dev", "/etc", "/.sandboxd"]
            .iter()
            .any(|top| file.path.starts_with(top))
            || file.path.parent().is_none()
        {
            return Err(refuse(
                "file",
                &file.path,
                "it would cover a path the sandbox's own mounts use",
            ));
        }
    }
    for masked in &grant.masked_paths {
        let path = Path::new(masked);
        if !is_clean_absolute(path) || !path.starts_with("/proc/") {
            return Err(refuse(
                "masked path",
                path,
                "it must be a clean path under /proc",
            ));
        }
    }
    Ok(())
}

fn validate_hostname(hostname: &str) -> Result<(), SpecError> {
    let err = |reason| SpecError::Hostname {
        hostname: hostname.to_owned(),
        reason,
    };
    if hostname.is_empty() || hostname.len() > 64 {
        return Err(err("it must be 1 to 64 characters long"));
    }
    if hostname.starts_with(['-', '.']) {
        return Err(err("it starts with '-' or '.'"));
    }
    if !hostname
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(err(
            "it contains a character other than a letter, digit, '-' or '.'",
        ));
    }
    Ok(())
}

/// Absolute, with only normal components after the root (no `.`/`..`), and no NUL.
fn is_clean_absolute(path: &Path) -> bool {
    let mut comps = path.components();
    comps.next() == Some(Component::RootDir)
        && comps.all(|c| matches!(c, Component::Normal(_)))
        && !path.as_os_str().as_encoded_bytes().contains(&0)
}

/// New pid, mount, ipc, uts, cgroup and user namespaces. Network is inherited
/// from the calling thread (module docs); time is left shared.
fn namespaces() -> Result<Vec<LinuxNamespace>, SpecError> {
    [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Cgroup,
    ]
    .into_iter()
    .map(|typ| Ok(LinuxNamespaceBuilder::default().typ(typ).build()?))
    .collect()
}

/// Deny all, then the usual character devices, then exactly the granted
/// nodes (read and write; never mknod).
fn device_rules(grant: &DeviceGrant) -> Result<Vec<LinuxDeviceCgroup>, SpecError> {
    let mut rules = vec![LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .typ(LinuxDeviceType::A)
        .access("rwm")
        .build()?];
    for (major, minor) in ALLOWED_CHAR_DEVICES {
        let rule = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(LinuxDeviceType::C)
            .major(major)
            .access("rwm");
        let rule = match minor {
            Some(m) => rule.minor(m),
            None => rule,
        };
        rules.push(rule.build()?);
    }
    for device in &grant.devices {
        rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(LinuxDeviceType::C)
                .major(i64::from(device.major))
                .minor(i64::from(device.minor))
                .access("rw")
                .build()?,
        );
    }
    Ok(rules)
}

fn mount(
    destination: &str,
    typ: &str,
    source: impl Into<PathBuf>,
    options: &[&str],
) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(source.into())
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()?)
}

/// The sandbox's mounts, in the order libcontainer must make them (/dev before
/// what goes in it). There is deliberately no cgroup mount (libcontainer would
/// bind the host's v1 hierarchies read-write) and no sysfs (it cannot be mounted
/// from a user namespace that does not own the network namespace, and binding the
/// host's would expose it): /sys is an empty read-only tmpfs.
fn mounts(input: &ContainerSpecInput) -> Result<Vec<Mount>, SpecError> {
    let shm_size = format!("size={}", input.shm_bytes);
    let ro_file = ["bind", "ro", "nosuid", "nodev", "noexec"];
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", DEV_TMPFS_SIZE],
        )?,
        // gid=5 (tty) is mapped in the user namespace, so devpts accepts it.
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", &shm_size],
        )?,
        // The sandbox's user namespace owns its IPC namespace, so mqueue mounts.
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "tmpfs",
            "sysfs-placeholder",
            &["ro", "nosuid", "noexec", "nodev", "mode=555", "size=4k"],
        )?,
        mount("/etc/hosts", "bind", input.etc_hosts.clone(), &ro_file)?,
        mount(
            "/etc/resolv.conf",
            "bind",
            input.etc_resolv_conf.clone(),
            &ro_file,
        )?,
        mount(
            "/etc/hostname",
            "bind",
            input.etc_hostname.clone(),
            &ro_file,
        )?,
        mount(
            AGENT_PATH_IN_SANDBOX,
            "bind",
            input.agent_binary.clone(),
            &["bind", "ro", "nosuid", "nodev"],
        )?,
    ];
    // Granted nodes come from the host's device filesystem (a tmpfs mounted
    // in the user namespace cannot hold usable nodes); the cgroup rules
    // decide what may be opened. Files are read-only but executable.
    for device in &input.grant.devices {
        mounts.push(mount(
            &device.path.to_string_lossy(),
            "bind",
            device.host_path.clone(),
            &["bind", "nosuid", "noexec"],
        )?);
    }
    for file in &input.grant.files {
        mounts.push(mount(
            &file.path.to_string_lossy(),
            "bind",
            file.host_path.clone(),
            &["bind", "ro", "nosuid", "nodev"],
        )?);
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> ContainerSpecInput {
        ContainerSpecInput {
            hostname: "sbx-1".to_owned(),
            rootfs: "/var/lib/sandboxd/sandboxes/abc/rootfs".into(),
            agent_binary: "/usr/lib/sandboxd/sandbox-agent".into(),
            netns_path: "/run/sandboxd/netns/abc".into(),
            cgroups_path: "/sandboxd/abc".to_owned(),
            cpu_cores: 0.5,
            cpu_shares: None,
            denied_huge_page_sizes: Vec::new(),
            memory_bytes: 512 << 20,
            pids_max: 256,
            host_uid_base: 100_000,
            host_gid_base: 100_000,
            id_map_size: 65_536,
            shm_bytes: 1 << 30,
            env: vec![
                "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
                "HOME=/root".to_owned(),
                "LANG=C.UTF-8".to_owned(),
                "TZ=UTC".to_owned(),
            ],
            etc_hosts: "/var/lib/sandboxd/sandboxes/abc/hosts".into(),
            etc_resolv_conf: "/var/lib/sandboxd/sandboxes/abc/resolv.conf".into(),
            etc_hostname: "/var/lib/sandboxd/sandboxes/abc/hostname".into(),
            nofile: 65_536,
            grant: DeviceGrant::default(),
        }
    }

    fn spec() -> Spec {
        match build_spec(&input()) {
            Ok(s) => s,
            Err(e) => panic!("build_spec: {e}"),
        }
    }

    fn find_mount<'a>(spec: &'a Spec, dest: &str) -> &'a Mount {
        match spec
            .mounts()
            .iter()
            .flatten()
            .find(|m| m.destination() == Path::new(dest))
        {
            Some(m) => m,
            None => panic!("no mount at {dest}"),
        }
    }

    fn opts(m: &Mount) -> Vec<&str> {
        m.options().iter().flatten().map(String::as_str).collect()
    }

    #[test]
    fn user_namespace_maps_root_to_the_host_range() {
        let s = spec();
        let linux = s.linux().as_ref().expect("linux");
        for maps in [linux.uid_mappings(), linux.gid_mappings()] {
            let maps = maps.as_ref().expect("mappings");
            assert_eq!(maps.len(), 1, "one range: no newuidmap needed");
            assert_eq!(maps[0].container_id(), 0);
            assert_eq!(maps[0].host_id(), 100_000);
            assert_eq!(maps[0].size(), 65_536);
        }
        let ns = linux.namespaces().as_ref().expect("namespaces");
        let types: Vec<_> = ns.iter().map(|n| n.typ()).collect();
        for t in [
            LinuxNamespaceType::User,
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Mount,
            LinuxNamespaceType::Ipc,
            LinuxNamespaceType::Uts,
            LinuxNamespaceType::Cgroup,
        ] {
            assert!(types.contains(&t), "{t:?} missing");
        }
        assert!(ns.iter().all(|n| n.path().is_none()), "all new namespaces");
        assert!(
            !types.contains(&LinuxNamespaceType::Network),
            "network is inherited from the thread that entered the netns"
        );
        assert_eq!(
            s.annotations()
                .as_ref()
                .and_then(|a| a.get(NETNS_ANNOTATION)),
            Some(&"/run/sandboxd/netns/abc".to_owned())
        );
    }

    #[test]
    fn no_cgroup_or_sysfs_mount_and_sys_is_an_empty_readonly_tmpfs() {
        let s = spec();
        for m in s.mounts().iter().flatten() {
            assert_ne!(m.typ().as_deref(), Some("cgroup"), "{m:?}");
            assert_ne!(m.typ().as_deref(), Some("cgroup2"), "{m:?}");
            assert_ne!(m.typ().as_deref(), Some("sysfs"), "{m:?}");
            assert!(!m.destination().starts_with("/sys/fs/cgroup"), "{m:?}");
            if let Some(src) = m.source() {
                assert!(
                    !src.starts_with("/sys"),
                    "host /sys must not be bound: {m:?}"
                );
            }
        }
        let sys = find_mount(&s, "/sys");
        assert_eq!(sys.typ().as_deref(), Some("tmpfs"));
        assert!(opts(sys).contains(&"ro"));
    }

    #[test]
    fn mounts_are_in_order_with_safe_options() {
        let s = spec();
        let dests: Vec<_> = s
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.destination().to_string_lossy().into_owned())
            .collect();
        let pos = |d: &str| dests.iter().position(|x| x == d).expect(d);
        assert!(pos("/dev") < pos("/dev/pts"));
        assert!(pos("/dev") < pos("/dev/shm"));
        assert!(pos("/dev") < pos("/dev/mqueue"));

        let proc_ = find_mount(&s, "/proc");
        assert_eq!(proc_.typ().as_deref(), Some("proc"));
        let shm = find_mount(&s, "/dev/shm");
        for o in ["nosuid", "nodev", "noexec", "mode=1777", "size=1073741824"] {
            assert!(opts(shm).contains(&o), "/dev/shm lacks {o}");
        }
        let pts = find_mount(&s, "/dev/pts");
        for o in ["newinstance", "ptmxmode=0666", "mode=0620"] {
            assert!(opts(pts).contains(&o), "/dev/pts lacks {o}");
        }
        for (dest, src) in [
            ("/etc/hosts", "/var/lib/sandboxd/sandboxes/abc/hosts"),
            (
                "/etc/resolv.conf",
                "/var/lib/sandboxd/sandboxes/abc/resolv.conf",
            ),
            ("/etc/hostname", "/var/lib/sandboxd/sandboxes/abc/hostname"),
            (AGENT_PATH_IN_SANDBOX, "/usr/lib/sandboxd/sandbox-agent"),
        ] {
            let m = find_mount(&s, dest);
            assert_eq!(m.source().as_deref(), Some(Path::new(src)));
            let o = opts(m);
            assert!(o.contains(&"bind") && o.contains(&"ro") && o.contains(&"nosuid"));
            assert!(!o.contains(&"rbind"));
        }
        assert!(!opts(find_mount(&s, AGENT_PATH_IN_SANDBOX)).contains(&"noexec"));
        let root = s.root().as_ref().expect("root");
        assert_eq!(
            root.path(),
            Path::new("/var/lib/sandboxd/sandboxes/abc/rootfs")
        );
        assert_eq!(root.readonly(), Some(false));
        assert_eq!(
            s.linux()
                .as_ref()
                .and_then(|l| l.rootfs_propagation().clone()),
            Some("private".to_owned())
        );
    }

    #[test]
    fn masked_and_readonly_paths_are_dockers() {
        let s = spec();
        let linux = s.linux().as_ref().expect("linux");
        let masked = linux.masked_paths().as_ref().expect("masked");
        for p in MASKED_PATHS {
            assert!(masked.iter().any(|m| m == p), "{p} not masked");
        }
        assert!(masked.iter().any(|m| m == "/proc/kcore"));
        let ro = linux.readonly_paths().as_ref().expect("readonly");
        assert!(ro.iter().any(|m| m == "/proc/sys"));
        assert!(ro.iter().any(|m| m == "/proc/sysrq-trigger"));
    }

    #[test]
    fn process_is_unprivileged_agent() {
        let s = spec();
        let p = s.process().as_ref().expect("process");
        assert_eq!(
            p.args().as_deref(),
            Some(&[AGENT_PATH_IN_SANDBOX.to_owned()][..])
        );
        assert_eq!(p.cwd(), Path::new("/"));
        assert_eq!(p.user().uid(), 0);
        assert_eq!(p.user().gid(), 0);
        assert_eq!(p.terminal(), Some(false));
        assert_eq!(p.no_new_privileges(), Some(true));
        assert!(p.apparmor_profile().is_none());
        assert!(p.selinux_label().is_none());
        assert!(
            p.oom_score_adj().is_none(),
            "libcontainer would write it into the caller"
        );
        assert!(p
            .env()
            .as_ref()
            .expect("env")
            .contains(&"HOME=/root".to_owned()));
        let caps = p.capabilities().as_ref().expect("caps");
        let want: Capabilities = CAPABILITIES.into_iter().collect();
        assert_eq!(caps.bounding().as_ref(), Some(&want));
        assert_eq!(caps.effective().as_ref(), Some(&want));
        assert_eq!(caps.permitted().as_ref(), Some(&want));
        assert_eq!(caps.inheritable().as_ref(), Some(&Capabilities::new()));
        assert_eq!(caps.ambient().as_ref(), Some(&Capabilities::new()));
        let names: Vec<String> = CAPABILITIES
            .iter()
            .map(|c| {
                serde_json::to_value(c)
                    .expect("a capability's name")
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            sandbox_proto::confinement::CAPABILITIES,
            "the shared names"
        );
        assert!(!want.contains(&Capability::SysAdmin));
        assert!(!want.contains(&Capability::NetAdmin));
        let rl = p.rlimits().as_ref().expect("rlimits");
        let get = |t| {
            rl.iter()
                .find(|r| r.typ() == t)
                .map(|r| (r.soft(), r.hard()))
        };
        assert_eq!(get(PosixRlimitType::RlimitNofile), Some((65_536, 65_536)));
        assert_eq!(get(PosixRlimitType::RlimitCore), Some((0, 0)));
        assert_eq!(s.hostname().as_deref(), Some("sbx-1"));
    }

    #[test]
    fn resources_limit_cpu_memory_pids_and_devices() {
        let s = spec();
        let linux = s.linux().as_ref().expect("linux");
        assert_eq!(
            linux.cgroups_path().as_deref(),
            Some(Path::new("/sandboxd/abc"))
        );
        let r = linux.resources().as_ref().expect("resources");
        let cpu = r.cpu().as_ref().expect("cpu");
        assert_eq!(cpu.quota(), Some(50_000));
        assert_eq!(cpu.period(), Some(100_000));
        let mem = r.memory().as_ref().expect("memory");
        assert_eq!(mem.limit(), Some(512 << 20));
        assert_eq!(mem.swap(), mem.limit(), "memory+swap == memory: no swap");
        assert_eq!(mem.swappiness(), Some(0));
        assert_ne!(mem.disable_oom_killer(), Some(true));
        assert_eq!(r.pids().as_ref().map(|p| p.limit()), Some(256));
        assert_eq!(
            r.hugepage_limits(),
            &None,
            "none named where no hugetlb controller reaches the sandbox"
        );
        let denied = build_spec(&ContainerSpecInput {
            denied_huge_page_sizes: vec!["1GB".into(), "2MB".into()],
            ..input()
        })
        .expect("spec");
        let limits: Vec<(String, i64)> = denied
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.hugepage_limits().clone())
            .expect("huge page limits")
            .iter()
            .map(|h| (h.page_size().clone(), h.limit()))
            .collect();
        assert_eq!(limits, [("1GB".to_owned(), 0), ("2MB".to_owned(), 0)]);
        let dev = r.devices().as_ref().expect("devices");
        let first = &dev[0];
        assert!(!first.allow());
        assert_eq!(first.typ(), Some(LinuxDeviceType::A));
        assert_eq!(first.access().as_deref(), Some("rwm"));
        let allowed: Vec<String> = dev
            .iter()
            .filter(|d| d.allow())
            .map(|d| d.to_string())
            .collect();
        for want in [
            "c 1:3 rwm",
            "c 1:5 rwm",
            "c 1:9 rwm",
            "c 5:2 rwm",
            "c 136:* rwm",
        ] {
            assert!(
                allowed.iter().any(|a| a == want),
                "{want} not allowed: {allowed:?}"
            );
        }
        assert!(
            !allowed.iter().any(|a| a.starts_with("b ")),
            "no block devices"
        );
        assert!(linux.sysctl().as_ref().is_none_or(|m| m.is_empty()));
        assert!(linux.devices().as_ref().is_none_or(|d| d.is_empty()));
    }

    fn gpu_grant() -> DeviceGrant {
        use crate::gpu::{GrantedDevice, GrantedFile};
        DeviceGrant {
            devices: vec![
                GrantedDevice {
                    host_path: "/dev/nvidia1".into(),
                    path: "/dev/nvidia1".into(),
                    major: 195,
                    minor: 1,
                },
                GrantedDevice {
                    host_path: "/dev/nvidiactl".into(),
                    path: "/dev/nvidiactl".into(),
                    major: 195,
                    minor: 255,
                },
            ],
            files: vec![GrantedFile {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
                path: "/usr/local/nvidia/lib64/libcuda.so.1".into(),
            }],
            masked_paths: vec!["/proc/driver/nvidia/gpus/0000:10:00.0".into()],
        }
    }

    #[test]
    fn a_grant_allows_exactly_its_nodes_and_binds_them_after_dev() {
        let mut i = input();
        i.grant = gpu_grant();
        let s = build_spec(&i).expect("spec");
        let linux = s.linux().as_ref().expect("linux");
        let rules = linux
            .resources()
            .as_ref()
            .and_then(|r| r.devices().as_ref())
            .expect("devices");
        let allowed: Vec<String> = rules
            .iter()
            .filter(|d| d.allow())
            .map(|d| d.to_string())
            .collect();
        assert!(allowed.contains(&"c 195:1 rw".to_owned()), "{allowed:?}");
        assert!(allowed.contains(&"c 195:255 rw".to_owned()), "{allowed:?}");
        assert!(
            !allowed
                .iter()
                .any(|a| a.starts_with("c 195:0") || a == "c 195:* rw"),
            "only the granted GPU: {allowed:?}"
        );
        let dests: Vec<_> = s
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.destination().to_string_lossy().into_owned())
            .collect();
        let pos = |d: &str| dests.iter().position(|x| x == d).expect(d);
        assert!(pos("/dev") < pos("/dev/nvidia1"));
        let node = find_mount(&s, "/dev/nvidia1");
        assert_eq!(node.source().as_deref(), Some(Path::new("/dev/nvidia1")));
        assert!(
            !opts(node).contains(&"nodev"),
            "a node mount must allow devices"
        );
        assert!(opts(node).contains(&"nosuid"));
        let lib = find_mount(&s, "/usr/local/nvidia/lib64/libcuda.so.1");
        assert!(opts(lib).contains(&"ro"));
        assert!(
            !opts(lib).contains(&"noexec"),
            "libraries are mapped executable"
        );
        let masked = linux.masked_paths().as_ref().expect("masked");
        assert!(masked.contains(&"/proc/driver/nvidia/gpus/0000:10:00.0".to_owned()));
        assert!(
            masked.contains(&"/proc/kcore".to_owned()),
            "Docker's masks stay"
        );

        // Without a grant: no nvidia rule, no extra mount.
        let plain = spec();
        let json = serde_json::to_string(&plain).expect("json");
        assert!(!json.contains("nvidia"));
    }

    #[test]
    fn a_grant_cannot_reach_outside_its_places() {
        type Mutation = fn(&mut DeviceGrant);
        let cases: Vec<(Mutation, &str)> = vec![
            (|g| g.devices[0].path = "/etc/nvidia1".into(), "/dev/NAME"),
            (|g| g.devices[0].path = "/dev/a/b".into(), "/dev/NAME"),
            (|g| g.devices[0].host_path = "dev/x".into(), "absolute"),
            (|g| g.files[0].path = "/.sandboxd/agent".into(), "cover"),
            (|g| g.files[0].path = "/etc/passwd".into(), "cover"),
            (|g| g.files[0].path = "/usr/../etc/x".into(), "absolute"),
            (|g| g.masked_paths[0] = "/home".into(), "/proc"),
        ];
        for (mutate, needle) in cases {
            let mut i = input();
            i.grant = gpu_grant();
            mutate(&mut i.grant);
            match build_spec(&i) {
                Ok(_) => panic!("accepted {:?}", i.grant),
                Err(e) => assert!(e.to_string().contains(needle), "{e} lacks {needle}"),
            }
        }
    }

    #[test]
    fn cpu_quota_is_fractional_with_a_floor() {
        assert_eq!(cpu_quota_us(0.5).ok(), Some(50_000));
        assert_eq!(cpu_quota_us(2.0).ok(), Some(200_000));
        assert_eq!(cpu_quota_us(1.234).ok(), Some(123_400));
        assert_eq!(cpu_quota_us(0.001).ok(), Some(MIN_CPU_QUOTA_US));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_CPU_CORES * 2.0] {
            assert!(
                matches!(cpu_quota_us(bad), Err(SpecError::CpuCores(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_spec_leaves_seccomp_to_the_precompiled_filter() {
        // libcontainer would compile a profile found here in every create,
        // on top of the one the init installs.
        let s = spec();
        assert!(s.linux().as_ref().expect("linux").seccomp().is_none());
        assert_eq!(
            s.process().as_ref().expect("process").no_new_privileges(),
            Some(true)
        );
    }

    /// A teardown removes libcontainer's state without its delete
    /// (`container::remove_state`), which would run poststop hooks and
    /// clean Intel RDT groups up: the spec must ask for neither.
    #[test]
    fn the_spec_has_no_hooks_or_rdt_for_a_delete_to_undo() {
        let s = spec();
        assert!(s.hooks().is_none());
        assert!(s.linux().as_ref().expect("linux").intel_rdt().is_none());
        assert!(s.linux().as_ref().expect("linux").resources().is_some());
    }

    #[test]
    fn json_round_trips() {
        let s = spec();
        let json = serde_json::to_string_pretty(&s).expect("serialize");
        let back: Spec = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, s);
        // Spot-check the wire names libcontainer reads.
        let v: serde_json::Value = serde_json::from_str(&json).expect("value");
        assert_eq!(v["linux"]["uidMappings"][0]["hostID"], 100_000);
        assert_eq!(v["linux"]["resources"]["memory"]["swap"], 512 << 20);
        assert_eq!(v["process"]["noNewPrivileges"], true);
        assert!(v["linux"]["seccomp"].is_null());
        assert!(json.contains("\"/proc/kcore\""));
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        type Mutation = fn(&mut ContainerSpecInput);
        let cases: Vec<(Mutation, &str)> = vec![
            (|i| i.hostname = String::new(), "hostname"),
            (|i| i.hostname = "a b".to_owned(), "hostname"),
            (|i| i.hostname = "x".repeat(65), "hostname"),
            (|i| i.rootfs = "relative/rootfs".into(), "rootfs"),
            (|i| i.agent_binary = "/a/../b".into(), "agent_binary"),
            (
                |i| i.cgroups_path = "sandboxd/abc".to_owned(),
                "cgroups_path",
            ),
            (|i| i.cgroups_path = "/".to_owned(), "cgroups_path"),
            (
                |i| i.cgroups_path = "/sandboxd/../x".to_owned(),
                "cgroups_path",
            ),
            (|i| i.cpu_cores = 0.0, "cpu_cores"),
            (|i| i.memory_bytes = 0, "memory_bytes"),
            (|i| i.memory_bytes = u64::MAX, "memory_bytes"),
            (|i| i.pids_max = 0, "pids_max"),
            (|i| i.shm_bytes = 0, "shm_bytes"),
            (|i| i.nofile = 0, "nofile"),
            (|i| i.host_uid_base = 0, "uid mapping"),
            (|i| i.host_gid_base = u32::MAX - 10, "gid mapping"),
            (|i| i.id_map_size = 0, "id_map_size"),
            (|i| i.env.push("NOEQUALS".to_owned()), "NOEQUALS"),
            (|i| i.env.push("=x".to_owned()), "empty"),
            (|i| i.env.retain(|e| !e.starts_with("PATH=")), "PATH"),
        ];
        for (mutate, needle) in cases {
            let mut i = input();
            mutate(&mut i);
            match build_spec(&i) {
                Ok(_) => panic!("accepted bad input ({needle}): {i:?}"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(needle),
                        "error {msg:?} does not mention {needle}"
                    );
                }
            }
        }
    }
}
