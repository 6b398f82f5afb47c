//! Container sandboxes through youki's libcontainer: the overlay root, the
//! host-side files, the network namespace, and the container whose PID 1 is
//! the agent with its link on fd 3. Runs in the sandbox's supervisor process
//! (libcontainer clones from the calling thread, marks the caller
//! non-dumpable, and leaves init as the caller's child to reap); the
//! runtime entry's `destroy_sandbox` undoes every step whoever calls it,
//! idempotently.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::cgroups::{Layout, SandboxCgroups};
use super::paths::SandboxPaths;
use super::sandbox::{Laps, SandboxSpec, Started};
use super::seccomp_filter::{sandbox_filter, SandboxExecutor};
use super::spec::{build_spec, enter_netns, ContainerSpecInput};
use crate::net::netns;
use sandbox_proto::AGENT_LINK_FD;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("preparing the sandbox's {what}: {source}")]
    Prepare {
        what: &'static str,
        source: io::Error,
    },
    #[error("mounting the sandbox's root filesystem: {0}")]
    Mount(nix::errno::Errno),
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    #[error(transparent)]
    Idmap(#[from] crate::runtime::idmap::IdmapError),
    #[error(transparent)]
    Egress(#[from] crate::net::proxy::EgressError),
    #[error("building the container spec: {0}")]
    Spec(String),
    #[error("the container runtime failed to {step}: {message}")]
    Runtime { step: &'static str, message: String },
    #[error(transparent)]
    Volume(#[from] crate::runtime::volumes::VolumeError),
}

fn prepare(what: &'static str) -> impl FnOnce(io::Error) -> ContainerError {
    move |source| ContainerError::Prepare { what, source }
}

/// Makes and starts the container of `config`. On error the caller runs
/// the runtime entry's `destroy_sandbox`, which removes whatever was made.
/// The caller has run [`prepare_netns`] (timed in `laps`).
pub fn start(
    config: &SandboxSpec,
    paths: &SandboxPaths,
    mut laps: Laps,
) -> Result<Started, ContainerError> {
    // A standby supervisor made it while it waited; this one was spawned
    // for the create.
    super::procfs_handle::prepare();
    // libcontainer enters the new user namespace before any other, and from
    // there a network namespace owned by the host user namespace cannot be
    // joined. So this thread joins it and the container inherits it; the
    // thread goes back to where it was afterwards. It joins it first, for
    // what the start opens there (the egress sockets, the agent link) too:
    // one visit, no thread of its own for them. Above 10: the agent's end
    // of the link goes on fd 3.
    let own_netns = File::open("/proc/thread-self/ns/net")
        .and_then(|f| move_above(f.into(), 10))
        .map_err(prepare("network namespace"))?;
    let started = enter_netns(&paths.netns())
        .map_err(|e| ContainerError::Spec(e.to_string()))
        .and_then(|()| start_in_netns(config, paths, &mut laps));
    nix::sched::setns(&own_netns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| prepare("network namespace")(e.into()))?;
    let (mut started, volumes) = started?;
    // The host's users and tools walking the run directory never reach a
    // volume (where the root is mounted in the host's namespace: a pod's;
    // elsewhere the start's namespace goes anyway). Nested ones go first.
    for (volume, bound) in config.volumes.iter().zip(volumes).rev() {
        bound.detach().map_err(|e| {
            prepare("volumes")(io::Error::other(format!(
                "unmounting volume {} from the supervisor's side of the root: {e}",
                volume.destination
            )))
        })?;
    }
    SandboxCgroups::new(Layout::detect(), &config.cgroups_path)
        .join_accounting(started.init_pid)
        .map_err(|e| prepare("CPU accounting")(std::io::Error::other(e.to_string())))?;
    laps.extend_last();
    started.phases = laps.phases;
    Ok(started)
}

/// [`start`]'s part inside the sandbox's network namespace, to the
/// container's init started (its phases timed in `laps`). Returns the
/// volumes still bound on the supervisor's side of the root too.
fn start_in_netns(
    config: &SandboxSpec,
    paths: &SandboxPaths,
    laps: &mut Laps,
) -> Result<(Started, Vec<crate::runtime::volumes::BoundVolume>), ContainerError> {
    let ends = open_netns_ends_here()?;
    laps.lap("netns");
    prepare_rootfs(config, paths)?;
    // On the supervisor's side of the root: libcontainer binds that root
    // into the container's mount namespace recursively, volumes and all.
    // They leave the supervisor's side once the container has its copy.
    let volumes = crate::runtime::volumes::bind_volumes(
        &paths.rootfs(),
        &config.volumes,
        config.id_map_base,
        config.id_map_size,
    )?;
    crate::runtime::volumes::warn_host_ids(&config.id, &config.volumes, &volumes);

    let nofile = usable_nofile(config.nofile).map_err(prepare("file descriptor limit"))?;
    let input = ContainerSpecInput {
        hostname: config.hostname.clone(),
        rootfs: paths.rootfs(),
        agent_binary: config.agent_path.clone(),
        netns_path: paths.netns(),
        cgroups_path: config.cgroups_path.clone(),
        cpu_cores: config.cpu,
        cpu_shares: config.cpu_shares,
        denied_huge_page_sizes: crate::runtime::cgroups::huge_page_sizes_to_deny(),
        memory_bytes: config.memory_bytes,
        pids_max: config.pids,
        host_uid_base: config.id_map_base,
        host_gid_base: config.id_map_base,
        id_map_size: config.id_map_size,
        shm_bytes: config.shm_bytes,
        env: config.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        etc_hosts: paths.etc().join("hosts"),
        etc_resolv_conf: paths.etc().join("resolv.conf"),
        etc_hostname: paths.etc().join("hostname"),
        nofile,
        grant: config.devices.clone(),
    };
    let spec = build_spec(&input).map_err(|e| ContainerError::Spec(e.to_string()))?;
    spec.save(paths.bundle().join("config.json"))
        .map_err(|e| ContainerError::Spec(e.to_string()))?;
    let link = move_above(ends.link_host, 10).map_err(prepare("agent link"))?;
    place_at_link_fd(ends.link_child).map_err(prepare("agent link"))?;
    laps.lap("rootfs_and_spec");

    let init_pid = create_and_start(config, paths)?;
    laps.lap("runtime");
    Ok((
        Started {
            init_pid,
            link,
            egress: ends.egress,
            phases: Vec::new(),
        },
        volumes,
    ))
}

/// What every sandbox start needs before its processes exist: the run
/// directories and the network namespace, with its interfaces and rules.
pub(crate) fn prepare_netns(
    config: &SandboxSpec,
    paths: &SandboxPaths,
) -> Result<(), ContainerError> {
    for dir in [
        paths.rootfs(),
        paths.bundle(),
        paths.container_root(),
        paths.etc(),
    ] {
        fs::create_dir_all(&dir).map_err(prepare("run directory"))?;
    }
    // A namespace made ahead (a network slot, moved in with the run
    // directory) has its interfaces and rules already. The supervisor
    // loads rules with the nft binary (see `rules::Loader::preferred`).
    let loader = crate::net::rules::Loader::Binary;
    if let Some(pod_netns) = &config.joined_netns {
        netns::join(pod_netns, &paths.netns())?;
        crate::net::proxy::prepare_pod_network(&paths.netns(), loader)?;
    } else if !config.netns_ready {
        netns::create(&paths.netns())?;
        crate::net::proxy::prepare_network(&paths.netns(), loader)?;
    }
    Ok(())
}

/// The overlay root and the host-side /etc files.
pub(crate) fn prepare_rootfs(
    config: &SandboxSpec,
    paths: &SandboxPaths,
) -> Result<(), ContainerError> {
    mount_root(config, paths)?;
    write_etc(config, &paths.etc())
}

/// What a sandbox's start opens inside its network namespace: the egress
/// proxy's and DNS sockets, and the agent link. A CRIU checkpoint runs in
/// that namespace and must find both ends of every unix socket of the tree
/// there.
pub(crate) struct NetnsEnds {
    pub egress: crate::net::proxy::Sockets,
    pub link_host: OwnedFd,
    pub link_child: OwnedFd,
}

/// Opens [`NetnsEnds`] in the calling thread's network namespace.
fn open_netns_ends_here() -> Result<NetnsEnds, ContainerError> {
    let egress = crate::net::proxy::open_sockets_here(None)
        .map_err(crate::net::proxy::EgressError::Socket)?;
    let (link_host, link_child) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| prepare("agent link")(e.into()))?;
    Ok(NetnsEnds {
        egress,
        link_host,
        link_child,
    })
}

/// [`open_netns_ends_here`] from any thread, in one visit to the namespace
/// at `netns`.
pub(crate) fn open_netns_ends(netns: &Path) -> Result<NetnsEnds, ContainerError> {
    crate::net::plumbing::in_netns(netns, open_netns_ends_here)
        .map_err(crate::net::proxy::EgressError::from)?
}

fn create_and_start(config: &SandboxSpec, paths: &SandboxPaths) -> Result<i32, ContainerError> {
    let null = || File::open("/dev/null").map(OwnedFd::from);
    let runtime_err = |step| {
        move |e: libcontainer::error::LibcontainerError| ContainerError::Runtime {
            step,
            message: e.to_string(),
        }
    };
    let filter = sandbox_filter().map_err(ContainerError::Spec)?;
    let built = ContainerBuilder::new(config.id.clone(), SyscallType::default())
        .with_root_path(paths.container_root())
        .map_err(runtime_err("set its state directory"))?
        .with_executor(SandboxExecutor { filter })
        .with_preserved_fds(1)
        .with_stdin(null().map_err(prepare("stdio"))?)
        .with_stdout(null().map_err(prepare("stdio"))?)
        .with_stderr(null().map_err(prepare("stdio"))?)
        .as_init(paths.bundle())
        .with_systemd(false)
        .with_detach(true)
        .build();
    // Our copy of the agent's end must not outlive the create: once the
    // agent is gone, the host end must see EOF.
    // SAFETY: AGENT_LINK_FD was placed by place_at_link_fd and is owned here.
    drop(unsafe { OwnedFd::from_raw_fd(AGENT_LINK_FD) });
    let mut container = built.map_err(runtime_err("create the container"))?;
    container
        .start()
        .map_err(runtime_err("start the container"))?;
    container
        .pid()
        .map(|p| p.as_raw())
        .ok_or(ContainerError::Runtime {
            step: "start the container",
            message: "no init pid recorded".into(),
        })
}

/// libcontainer sets rlimits after it entered the new user namespace, where
/// a hard limit cannot be raised; so ours is raised first, as far as this
/// host lets us (without CAP_SYS_RESOURCE, not above the current hard limit),
/// and the sandbox gets what we could get.
fn usable_nofile(wanted: u64) -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return Ok(wanted);
    }
    let usable = wanted.min(hard);
    setrlimit(Resource::RLIMIT_NOFILE, usable, usable)?;
    Ok(usable)
}

fn move_above(fd: OwnedFd, min: i32) -> io::Result<OwnedFd> {
    let raw = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Puts the agent's end on fd 3 without close-on-exec, as libcontainer's
/// `preserved_fds` expects the descriptors right after stdio.
fn place_at_link_fd(child: OwnedFd) -> io::Result<()> {
    if child.as_raw_fd() == AGENT_LINK_FD {
        fcntl(child.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
        let _ = child.into_raw_fd();
        return Ok(());
    }
    // SAFETY: dup2 onto fd 3; whatever fd 3 was is replaced. Nothing
    // long-lived holds it: the start opens the link first in its visit to
    // the namespace (the descriptors it keeps from before are above 10), so
    // the link's own ends held fd 3 until the host end moved above 10.
    if unsafe { libc::dup2(child.as_raw_fd(), AGENT_LINK_FD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mount_root(config: &SandboxSpec, paths: &SandboxPaths) -> Result<(), ContainerError> {
    let target = paths.rootfs();
    let upper = config.layer_dir.join("upper");
    let work = config.layer_dir.join("work");
    let mut lower: Vec<&Path> = config
        .image_layers
        .iter()
        .chain(std::iter::once(&config.image_rootfs))
        .map(|p| p.as_path())
        .collect();
    // Detached again once the overlay holds its own clones (on return).
    let idmapped;
    if config.host_owned_image {
        idmapped = crate::runtime::idmap::idmap_layers(
            &lower,
            &paths.idmapped_layers(),
            config.id_map_base,
            config.id_map_size,
        )?;
        lower = idmapped.paths();
    }
    mount_overlay(&target, &lower, &upper, &work).map_err(|e| match e.raw_os_error() {
        Some(errno) => ContainerError::Mount(nix::errno::Errno::from_raw(errno)),
        None => prepare("image layers")(e),
    })
}

/// Mounts an overlay of `lower` (top first) under `upper` at `target`,
/// nosuid and nodev, as every sandbox root is.
///
/// Volatile where the kernel has it (5.10): the overlay then never syncs
/// its upper layer, so the first write to an image's file does not wait
/// for a btrfs fsync of the copied-up file (2.7 ms for a 220 KB trust
/// bundle here, 0.5 ms volatile), nor does a program's fsync. Nothing is
/// lost by it: a sandbox's files live no longer than its processes (a
/// daemon restart keeps both; a host crash ends both), and the btrfs
/// snapshots that snapshots and forks are made of flush the layer's dirty
/// data before they are taken.
pub(crate) fn mount_overlay(
    target: &Path,
    lower: &[&Path],
    upper: &Path,
    work: &Path,
) -> io::Result<()> {
    clear_volatile_marker(work)?;
    // The descriptors a long stack is spelled with live until the mount is made.
    let (lower, _fds) = crate::image::lowerdir::lowerdir_value(lower)?;
    let options = format!(
        "lowerdir={lower},upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    let mount_with = |options: &str| {
        mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options),
        )
    };
    match mount_with(&format!("{options},volatile")) {
        // A kernel before 5.10 does not know the option.
        Err(nix::errno::Errno::EINVAL) => mount_with(&options),
        other => other,
    }
    .map_err(io::Error::from)
}

/// A volatile overlay leaves `work/incompat/volatile` in its workdir, and
/// the kernel refuses to mount that workdir again (it cannot know whether
/// the upper layer reached the disk). A fork's layer is a btrfs snapshot
/// of a mounted one, flushed when it was taken, so the marker can go.
fn clear_volatile_marker(work: &Path) -> io::Result<()> {
    match fs::remove_dir_all(work.join("work/incompat/volatile")) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn write_etc(config: &SandboxSpec, dir: &Path) -> Result<(), ContainerError> {
    let hosts = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{}\n",
        config.hostname
    );
    fs::write(dir.join("hosts"), hosts).map_err(prepare("/etc/hosts"))?;
    fs::write(dir.join("hostname"), format!("{}\n", config.hostname))
        .map_err(prepare("/etc/hostname"))?;
    fs::write(
        dir.join("resolv.conf"),
        // Any address works: the namespace's rules send every DNS query to
        // the supervisor's DNS server.
        format!("nameserver {}\n", crate::net::plumbing::PEER_V4),
    )
    .map_err(prepare("/etc/resolv.conf"))
}

/// Removes libcontainer's state of sandbox `id`, if there is any (a
/// microVM or a fork has none); returns what went wrong. The caller
/// ([`super::launch::destroy_sandbox`]) has killed the container's
/// processes and removes its groups in every hierarchy libcontainer put
/// them in, so libcontainer's own delete would only repeat that work, after
/// looking each of its 12 v1 controllers up in the host's mount table again
/// (deletes took 1.3-2.3 ms longer with it, 2026-12-06). The spec asks
/// for no hooks or RDT groups, which that delete would run or remove (a
/// test in `spec.rs` holds it to that).
pub(crate) fn remove_state(id: &str, paths: &SandboxPaths) -> Vec<String> {
    match fs::remove_dir_all(paths.container_root().join(id)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            vec![format!("removing container state: {e}")]
        }
        _ => Vec::new(),
    }
}
