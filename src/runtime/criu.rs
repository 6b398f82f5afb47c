//! Checkpoint and restore of a container sandbox's process tree with the
//! `criu` binary (4.2 or newer). CRIU runs inside the sandbox's network
//! namespace: that namespace belongs to the host's user namespace, which
//! CRIU refuses to dump or join from the container's, and a tree restored
//! there simply inherits it. The agent link (fd 3) is an external socket:
//! each restore is handed a new link of its own. Host files bind-mounted
//! over single files in the sandbox (`/etc/hosts`, the agent, `/dev` nodes,
//! masked `/proc` files) are external mounts, re-bound from the fork's own
//! files at restore. See docs/criu.md for why each option is there.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

use super::container::{open_netns_ends, ContainerError};
use super::fresh_tmpfs::{self, FreshTmpfs};
use super::paths::SandboxPaths;
use super::sandbox::{Checkpoint, RestoreSpec, SandboxSpec, Started};
use super::spec::AGENT_PATH_IN_SANDBOX;

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("running {binary}: {source}; install CRIU 4.2 or newer (scripts/install-criu.sh) or set criu_path")]
    Spawn { binary: String, source: io::Error },
    #[error("criu {action} failed ({status}): {detail} (full log: {log})")]
    Failed {
        action: &'static str,
        status: String,
        detail: String,
        log: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> CriuError {
    move |source| CriuError::Io { what, source }
}

/// The key CRIU files an external mount under, from its mount point.
fn mount_key(mount_point: &str) -> String {
    format!("m{}", mount_point.replace('/', "_"))
}

/// The mounts of a sandbox a checkpoint marks external, so that CRIU
/// neither dumps nor restores what they hold.
#[derive(Debug, Default, PartialEq)]
struct ExternalMounts {
    /// Bind mounts over something other than a directory (host files).
    files: Vec<String>,
    /// Empty read-only directory mounts: the tmpfs placeholders (`/sys`,
    /// masked `/proc` directories), which CRIU would save and restore each
    /// through `tar` and `gzip`, four processes per fork and snapshot (~3
    /// ms each way here), and in a fork the binds that stand for them. A
    /// fork gets a bind of an empty read-only tmpfs of its own there.
    empty: Vec<String>,
    /// Writable tmpfs mounts a fork gets made afresh from a listing.
    fresh: Vec<FreshTmpfs>,
}

/// Mounts that show the kernel's state rather than files, which CRIU
/// remakes itself, empty or not.
const KERNEL_VIEWS: &[&str] = &["proc", "sysfs", "cgroup", "cgroup2", "mqueue", "devpts"];

/// Reads [`ExternalMounts`] from the mount namespace of `init_pid`.
fn external_mounts(init_pid: i32) -> Result<ExternalMounts, CriuError> {
    let info = fs::read_to_string(format!("/proc/{init_pid}/mountinfo"))
        .map_err(io_err("reading the sandbox's mounts"))?;
    let root = PathBuf::from(format!("/proc/{init_pid}/root"));
    let mounts: Vec<MountLine> = info.lines().filter_map(MountLine::parse).collect();
    let mut found = ExternalMounts::default();
    for mount in &mounts {
        // mountinfo escapes spaces and the like as octal; ours have none.
        if mount.point == "/" || mount.point.contains('\\') {
            continue;
        }
        let inside = root.join(mount.point.trim_start_matches('/'));
        let is_dir = fs::symlink_metadata(&inside)
            .map(|m| m.is_dir())
            .unwrap_or(true);
        if !is_dir {
            found.files.push(mount.point.to_string());
        } else if mount.fstype == "tmpfs"
            && !mount.read_only
            && mount.root == "/"
            // Mounted once: a pod's container roots bind the sandbox's
            // /dev and /dev/shm, which must stay one filesystem in a fork.
            && mounts.iter().filter(|m| m.device == mount.device).count() == 1
        {
            found.fresh.extend(FreshTmpfs::read(
                mount.point,
                &inside,
                mount.options,
                mount.super_options,
            ));
        } else if mount.read_only
            && !KERNEL_VIEWS.contains(&mount.fstype)
            && fs::read_dir(&inside).is_ok_and(|mut entries| entries.next().is_none())
        {
            found.empty.push(mount.point.to_string());
        }
    }
    Ok(found)
}

/// What [`external_mounts`] needs of a mountinfo line.
struct MountLine<'a> {
    /// `major:minor` of the filesystem: the same in every bind of it.
    device: &'a str,
    /// The directory of the filesystem this mount shows (`/`: all of it).
    root: &'a str,
    point: &'a str,
    read_only: bool,
    /// The mount's own options (ro, nosuid...).
    options: &'a str,
    fstype: &'a str,
    /// The filesystem's options (a tmpfs's size, mode...).
    super_options: &'a str,
}

impl<'a> MountLine<'a> {
    /// `id parent dev root point options [optional...] - fstype source super`.
    fn parse(line: &'a str) -> Option<Self> {
        let (mine, theirs) = line.split_once(" - ")?;
        let mut fields = mine.split(' ');
        let device = fields.nth(2)?;
        let root = fields.next()?;
        let point = fields.next()?;
        let options = fields.next()?;
        let read_only = options.split(',').any(|o| o == "ro");
        let mut theirs = theirs.split(' ');
        let fstype = theirs.next()?;
        let super_options = theirs.nth(1).unwrap_or("");
        Some(Self {
            device,
            root,
            point,
            read_only,
            options,
            fstype,
            super_options,
        })
    }
}

/// The empty, read-only file system a fork's placeholder mounts bind
/// (read-only, as their checkpoint recorded them), owned by the sandbox's
/// root as the tmpfs it stands for was. Its own, in its run directory, so
/// nothing a sandbox could do to it reaches another. A tmpfs, not a plain
/// directory there: a bind carries the flags of the mount it comes from,
/// CRIU cannot clear those in the sandbox's user namespace, and where the
/// run directory's file system is mounted nosuid, nodev or noexec (a
/// systemd host's `/run`, the default run directory's home) the masked
/// `/proc` directories, recorded without them, failed every fork (EPERM
/// at CRIU's bind remount). Detached once CRIU has bound it
/// ([`fresh_tmpfs::unmount`]).
fn empty_placeholder(config: &SandboxSpec, paths: &SandboxPaths) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = paths.dir.join("placeholder");
    match fs::DirBuilder::new().mode(0o555).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let options = format!(
        "size=4k,mode=555,uid={root},gid={root}",
        root = config.id_map_base
    );
    fresh_tmpfs::mount_private(&dir, nix::mount::MsFlags::MS_RDONLY, &options)
        .map_err(|(_, e)| e)?;
    Ok(dir)
}

/// Where a fork's external mount comes from on the host.
fn external_source(point: &str, config: &SandboxSpec, paths: &SandboxPaths) -> PathBuf {
    match point {
        "/etc/hosts" | "/etc/resolv.conf" | "/etc/hostname" => {
            paths.etc().join(point.trim_start_matches("/etc/"))
        }
        _ if point == AGENT_PATH_IN_SANDBOX => config.agent_path.clone(),
        _ if point.starts_with("/dev/") => PathBuf::from(point),
        // A masked /proc or /sys file.
        _ => PathBuf::from("/dev/null"),
    }
}

/// Runs `criu` from inside the network namespace at `netns`, passing
/// `keep` open to it; fails with the log's error lines.
fn run_in_netns(
    criu: &Path,
    action: &'static str,
    args: &[String],
    netns: &Path,
    keep: Option<&OwnedFd>,
    log: &Path,
) -> Result<(), CriuError> {
    let netns_file =
        fs::File::open(netns).map_err(io_err("opening the sandbox's network namespace"))?;
    if let Some(fd) = keep {
        // Inherited by criu (and through it by the restored agent).
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| io_err("passing the agent link")(e.into()))?;
    }
    let mut command = Command::new(criu);
    command
        .arg(action)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let raw_netns = netns_file.as_raw_fd();
    // SAFETY: setns is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(raw_netns, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = super::children::spawn_own(&mut command).map_err(|source| CriuError::Spawn {
        binary: criu.display().to_string(),
        source,
    });
    if let Some(fd) = keep {
        let _ = fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
    let mut child = child?;
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    let status = child.wait().map_err(io_err("waiting for criu"))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    let mut detail: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error"))
        .take(5)
        .collect();
    if detail.is_empty() {
        detail = stderr.lines().take(5).collect();
    }
    Err(CriuError::Failed {
        action,
        status: status.to_string(),
        detail: detail.join(" | "),
        log: log.display().to_string(),
    })
}

/// Checkpoints the tree of `init_pid` (already frozen by the caller, and
/// left running) into `images_dir`; `work_dir` gets CRIU's log.
pub fn dump(
    criu: &Path,
    init_pid: i32,
    paths: &SandboxPaths,
    freezer: &Path,
    images_dir: &Path,
    work_dir: &Path,
) -> Result<Checkpoint, CriuError> {
    let link = fs::read_link(format!(
        "/proc/{init_pid}/fd/{}",
        sandbox_proto::AGENT_LINK_FD
    ))
    .map_err(io_err("finding the agent link"))?;
    let link_inode: u64 = link
        .to_string_lossy()
        .trim_start_matches("socket:[")
        .trim_end_matches(']')
        .parse()
        .map_err(|_| {
            io_err("finding the agent link")(io::Error::other(format!("{link:?} is not a socket")))
        })?;
    let external = external_mounts(init_pid)?;
    let mut args = vec![
        "--tree".into(),
        init_pid.to_string(),
        "--images-dir".into(),
        images_dir.display().to_string(),
        "--work-dir".into(),
        work_dir.display().to_string(),
        "--log-file".into(),
        "dump.log".into(),
        "--leave-running".into(),
        "--tcp-close".into(),
        "--freeze-cgroup".into(),
        freezer.display().to_string(),
        "--external".into(),
        format!("unix[{link_inode}]"),
    ];
    let fresh_points = external.fresh.iter().map(|t| &t.point);
    for point in external
        .files
        .iter()
        .chain(&external.empty)
        .chain(fresh_points)
    {
        args.push("--external".into());
        args.push(format!("mnt[{point}]:{}", mount_key(point)));
    }
    // Only the sandbox's own hierarchies. In the named v1 ones (systemd,
    // unified) its tasks sit in groups it does not own, and CRIU would dump
    // everything below them and recreate it under every fork's root, the
    // earlier forks' copies included.
    if super::cgroups::Layout::detect() == super::cgroups::Layout::V1 {
        for controller in super::cgroups::V1_SANDBOX_CONTROLLERS {
            args.push("--cgroup-dump-controller".into());
            args.push(controller.into());
        }
    }
    run_in_netns(
        criu,
        "dump",
        &args,
        &paths.netns(),
        None,
        &work_dir.join("dump.log"),
    )?;
    Ok(Checkpoint {
        link_inode,
        external_mounts: external.files,
        empty_mounts: external.empty,
        fresh_tmpfs: external.fresh,
    })
}

/// Makes a fork of `spec`'s checkpoint: the sandbox's network namespace
/// (with its egress sockets), its root over the snapshot's layers and a
/// fresh writable layer, a new agent link, then the restored tree in new
/// cgroups at `config.cgroups_path`, thawed. On error the caller runs
/// the entry's `destroy_sandbox`. The caller has run
/// `container::prepare_netns` (timed in `laps`).
pub fn restore(
    config: &SandboxSpec,
    paths: &SandboxPaths,
    spec: &RestoreSpec,
    mut laps: super::sandbox::Laps,
) -> Result<Started, ContainerError> {
    let ends = open_netns_ends(&paths.netns())?;
    laps.lap("netns");
    super::container::prepare_rootfs(config, paths)?;
    let (host, child) = (ends.link_host, ends.link_child);
    let work_dir = paths.dir.join("criu");
    fs::create_dir_all(&work_dir).map_err(|e| ContainerError::Prepare {
        what: "checkpoint work directory",
        source: e,
    })?;
    let pidfile = work_dir.join("init.pid");
    let mut args = vec![
        "--images-dir".into(),
        spec.images_dir.display().to_string(),
        "--work-dir".into(),
        work_dir.display().to_string(),
        "--log-file".into(),
        "restore.log".into(),
        "--root".into(),
        paths.rootfs().display().to_string(),
        "--restore-detached".into(),
        // The restored init becomes our child, to be reaped and watched.
        "--restore-sibling".into(),
        "--pidfile".into(),
        pidfile.display().to_string(),
        "--tcp-close".into(),
        "--cgroup-root".into(),
        format!("/{}", config.cgroups_path.trim_start_matches('/')),
        "--inherit-fd".into(),
        format!(
            "fd[{}]:socket:[{}]",
            child.as_raw_fd(),
            spec.checkpoint.link_inode
        ),
    ];
    for point in &spec.checkpoint.external_mounts {
        args.push("--external".into());
        args.push(format!(
            "mnt[{}]:{}",
            mount_key(point),
            external_source(point, config, paths).display()
        ));
    }
    let mut placeholder = None;
    if !spec.checkpoint.empty_mounts.is_empty() {
        let empty = empty_placeholder(config, paths).map_err(|e| ContainerError::Prepare {
            what: "the fork's empty placeholder file system",
            source: e,
        })?;
        for point in &spec.checkpoint.empty_mounts {
            args.push("--external".into());
            args.push(format!("mnt[{}]:{}", mount_key(point), empty.display()));
        }
        placeholder = Some(empty);
    }
    let fresh = match make_fresh_tmpfs(&spec.checkpoint.fresh_tmpfs, paths, &mut args) {
        Ok(fresh) => fresh,
        Err(e) => {
            if let Some(at) = &placeholder {
                fresh_tmpfs::unmount(at);
            }
            return Err(e);
        }
    };
    laps.lap("rootfs_and_spec");
    let restored = run_in_netns(
        &spec.criu,
        "restore",
        &args,
        &paths.netns(),
        Some(&child),
        &work_dir.join("restore.log"),
    );
    // The fork holds its binds of them; the host's table keeps none.
    for at in fresh.iter().chain(&placeholder) {
        fresh_tmpfs::unmount(at);
    }
    restored.map_err(|e| ContainerError::Runtime {
        step: "restore the checkpoint",
        message: e.to_string(),
    })?;
    drop(child);
    let init_pid: i32 = fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or(ContainerError::Runtime {
            step: "restore the checkpoint",
            message: format!("criu wrote no pid to {}", pidfile.display()),
        })?;
    // The checkpoint was taken frozen, so the fork comes back frozen: its
    // huge page limits go on before anything in it runs.
    let cgroups =
        super::cgroups::SandboxCgroups::new(super::cgroups::Layout::detect(), &config.cgroups_path);
    cgroups
        .deny_huge_pages(&super::cgroups::huge_page_sizes_to_deny())
        .map_err(|e| ContainerError::Runtime {
            step: "deny the fork huge pages",
            message: format!("{e}; the hugetlb controller must reach the sandboxes' cgroup parent (enable it in cgroup.subtree_control above it)"),
        })?;
    cgroups.thaw().map_err(|e| ContainerError::Runtime {
        step: "thaw the restored sandbox",
        message: e.to_string(),
    })?;
    set_hostname(init_pid, &config.hostname).map_err(|e| ContainerError::Prepare {
        what: "the fork's hostname",
        source: e,
    })?;
    laps.lap("runtime");
    Ok(Started {
        init_pid,
        link: host,
        egress: ends.egress,
        phases: laps.phases,
    })
}

/// Makes each listed tmpfs under the fork's run directory and names it as
/// its mount's external source; returns where they are mounted.
fn make_fresh_tmpfs(
    listed: &[FreshTmpfs],
    paths: &SandboxPaths,
    args: &mut Vec<String>,
) -> Result<Vec<PathBuf>, ContainerError> {
    let mut made: Vec<PathBuf> = Vec::new();
    for tmpfs in listed {
        let key = mount_key(&tmpfs.point);
        let at = paths.dir.join("fresh").join(&key);
        if let Err(e) = tmpfs.make(&at) {
            for at in &made {
                fresh_tmpfs::unmount(at);
            }
            return Err(ContainerError::Runtime {
                step: "remake the fork's tmpfs mounts",
                message: e.to_string(),
            });
        }
        args.push("--external".into());
        args.push(format!("mnt[{key}]:{}", at.display()));
        made.push(at);
    }
    Ok(made)
}

/// Gives the restored tree's UTS namespace (the source's name) the fork's.
fn set_hostname(init_pid: i32, name: &str) -> io::Result<()> {
    let uts = fs::File::open(format!("/proc/{init_pid}/ns/uts"))?;
    let name = name.to_string();
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> io::Result<()> {
                nix::sched::setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS)?;
                nix::unistd::sethostname(&name)?;
                Ok(())
            })
            .join()
            .map_err(|_| io::Error::other("the hostname thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_point_flags_and_type() {
        let sys = MountLine::parse(
            "2371 2350 0:181 / /sys ro,nosuid,nodev,noexec,relatime shared:9 - tmpfs sysfs-placeholder ro,size=4k,mode=555,uid=100000",
        )
        .unwrap();
        assert_eq!(
            (sys.device, sys.root, sys.point, sys.read_only, sys.fstype),
            ("0:181", "/", "/sys", true, "tmpfs")
        );
        // Positive control for the flag: the superblock's "ro" is not the mount's.
        let shm = MountLine::parse(
            "2372 2351 0:182 / /dev/shm rw,nosuid,nodev,noexec - tmpfs shm ro,size=65536k",
        )
        .unwrap();
        assert_eq!((shm.point, shm.read_only), ("/dev/shm", false));
        assert_eq!(
            (shm.options, shm.super_options),
            ("rw,nosuid,nodev,noexec", "ro,size=65536k")
        );
        assert!(MountLine::parse("garbage").is_none());
    }

    #[test]
    fn mount_keys_have_no_slashes() {
        assert_eq!(mount_key("/etc/hosts"), "m_etc_hosts");
        assert_eq!(mount_key("/.sandboxd/agent"), "m_.sandboxd_agent");
    }

    #[test]
    fn external_sources_are_the_forks_own_files() {
        let config: SandboxSpec = serde_json::from_value(serde_json::json!({
            "id": "sb-1", "hostname": "sb-1", "image_rootfs": "/img", "layer_dir": "/l",
            "agent_path": "/usr/lib/sandboxd/sandbox-agent", "cgroups_path": "/sandboxd/sb-1",
            "cpu": 1.0, "memory_bytes": 1, "pids": 8, "id_map_base": 100000, "id_map_size": 65536,
            "shm_bytes": 1, "nofile": 1024, "env": [], "ready_timeout_ms": 1, "kind": "container"
        }))
        .unwrap();
        let paths = SandboxPaths {
            dir: PathBuf::from("/run/sandboxd/sandboxes/sb-1"),
        };
        assert_eq!(
            external_source("/etc/resolv.conf", &config, &paths),
            PathBuf::from("/run/sandboxd/sandboxes/sb-1/etc/resolv.conf")
        );
        assert_eq!(
            external_source(AGENT_PATH_IN_SANDBOX, &config, &paths),
            PathBuf::from("/usr/lib/sandboxd/sandbox-agent")
        );
        assert_eq!(
            external_source("/dev/urandom", &config, &paths),
            PathBuf::from("/dev/urandom")
        );
        assert_eq!(
            external_source("/proc/keys", &config, &paths),
            PathBuf::from("/dev/null")
        );
    }
}
