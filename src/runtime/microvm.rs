//! A microVM sandbox: one `vmm` process (the `vmm/` crate's binary) per
//! sandbox, started by the supervisor in the sandbox's network namespace and
//! cgroups, with the image's read-only ext4 and a per-sandbox scratch disk.
//! The guest's agent dials the host on vsock port
//! [`sandbox_proto::AGENT_VSOCK_PORT`]; the VMM turns that into a connection
//! to `<vsock socket>_<port>`, which this module listens on before the VMM
//! starts, so the link is an event, not a retry loop. From there the
//! supervisor drives the guest's agent exactly as a container's.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::cgroups::{CgroupError, Layout};
use super::paths::SandboxPaths;
use super::sandbox::{SandboxSpec, Started, VmSpec};
use super::vm_cgroups::{self, VmLimits};
use crate::net::netns;

/// The guest's vsock context ID; every VM has its own vsock device, so the
/// same number in all of them is no clash.
const GUEST_CID: u64 = 3;
/// Threads a VMM needs: main, one per vCPU, one per device worker, the
/// vsock listener, with room.
const VMM_PIDS: u64 = 512;
/// A microVM memory snapshot's copy of the scratch disk, in the snapshot's
/// directory in the disk pool (a reflink needs the same filesystem).
pub const SNAPSHOT_DISK: &str = "scratch.ext4";
/// The VMM runs chrooted in the VM's run directory, from which it was
/// started: it names these files relative to it, so they resolve the same
/// before and after the chroot.
const VSOCK_SOCKET: &str = "vsock.sock";
const CONTROL_SOCKET: &str = "control.sock";
const CONSOLE: &str = "console.log";
const SNAPSHOT_MOUNT: &str = "snapshot";
/// Serial console bytes kept per sandbox.
const CONSOLE_CAP_BYTES: u64 = 1 << 20;
/// The VMM's `--disk` word for an empty slot (vmm's `config::EMPTY_DISK`).
const EMPTY_DISK_SLOT: &str = "empty";
/// How much of the VMM's own log an error quotes.
const LOG_TAIL_BYTES: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum MicrovmError {
    #[error("preparing the microVM's {what}: {source}")]
    Prepare {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    #[error(transparent)]
    Egress(#[from] crate::net::proxy::EgressError),
    #[error("the microVM's tap: {0}")]
    Tap(#[from] crate::net::plumbing::PlumbingError),
    #[error("the microVM's cgroups: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("the microVM's scratch disk: {0}")]
    Scratch(String),
    #[error("cannot start the VMM {}: {source}; check the daemon's vmm_path", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the VMM exited before the guest's agent connected ({status}): {log}")]
    VmmExited { status: String, log: String },
    #[error(
        "the guest's agent did not connect within {waited:?}; the guest kernel may not have \
         booted. Console: {console}; VMM: {log}"
    )]
    AgentTimeout {
        waited: Duration,
        console: String,
        log: String,
    },
    #[error("the VMM's control socket: {0}")]
    Control(String),
}

fn prepare(what: &'static str) -> impl FnOnce(io::Error) -> MicrovmError {
    move |source| MicrovmError::Prepare { what, source }
}

/// Files of one microVM under the sandbox's run directory.
pub struct VmPaths {
    pub dir: PathBuf,
}

impl VmPaths {
    pub fn new(paths: &SandboxPaths) -> Self {
        Self {
            dir: paths.dir.join("vm"),
        }
    }
    /// The VMM's vsock socket (host-initiated connections).
    pub fn vsock(&self) -> PathBuf {
        self.dir.join(VSOCK_SOCKET)
    }
    /// Where guest-initiated connections to the agent port arrive.
    pub fn agent_socket(&self) -> PathBuf {
        self.dir.join(format!(
            "{VSOCK_SOCKET}_{}",
            sandbox_proto::AGENT_VSOCK_PORT
        ))
    }
    /// The guest's serial console.
    pub fn console(&self) -> PathBuf {
        self.dir.join(CONSOLE)
    }
    /// Where a snapshot's directory is bind-mounted for the jailed VMM to
    /// write into.
    pub fn snapshot_mount(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_MOUNT)
    }
    /// The VMM's own stderr.
    pub fn vmm_log(&self) -> PathBuf {
        self.dir.join("vmm.log")
    }
    /// The VMM's control socket (pause, resume, snapshot).
    pub fn control(&self) -> PathBuf {
        self.dir.join(CONTROL_SOCKET)
    }
    /// The per-sandbox writable disk (inside the sandbox's btrfs layer, so
    /// the disk quota covers it).
    pub fn scratch(layer_dir: &Path) -> PathBuf {
        layer_dir.join("scratch.ext4")
    }
}

/// The cgroup limits of a VM: the sandbox's CPU, and guest RAM plus the
/// VMM's overhead, so a guest that touches all its RAM is not OOM-killed.
pub fn limits(config: &SandboxSpec, vm: &VmSpec) -> Result<VmLimits, MicrovmError> {
    let quota = super::spec::cpu_quota_us(config.cpu)
        .map_err(|e| prepare("CPU limit")(io::Error::other(e.to_string())))?;
    Ok(VmLimits {
        cpu_quota_us: quota,
        cpu_period_us: super::spec::CPU_PERIOD_US,
        cpu_shares: config.cpu_shares,
        memory_bytes: (vm.mem_mib << 20).saturating_add(vm.overhead_bytes),
        pids: VMM_PIDS,
    })
}

/// The VMM's command line: boot, or restore a snapshot (which carries the
/// memory size, vCPUs and command line).
/// The kernel command line of a Linux guest whose init is the agent: the
/// agent disk (the third) as a read-only root, the agent as init, the flag
/// that tells it it runs in a VM, the host's RNG seed (hex) and the
/// sandbox's pids limit when there are, and the operator's `extra` words
/// last, so they can override. A `hostname` (checked by the daemon: letters,
/// digits, `-` and `.`) becomes the guest's.
pub fn guest_cmdline(
    seed_hex: Option<&str>,
    pids_max: Option<u64>,
    hostname: Option<&str>,
    extra: &str,
) -> String {
    let mut cmdline = format!(
        "console=ttyS0 quiet root=/dev/vdc ro rootfstype=ext4 init={} panic=-1 reboot=k {}=1",
        sandbox_proto::VM_AGENT_INIT,
        sandbox_proto::AGENT_VM_ENV,
    );
    if let Some(seed) = seed_hex {
        cmdline.push_str(&format!(" {}={seed}", sandbox_proto::AGENT_RNG_SEED_ENV));
    }
    if let Some(max) = pids_max {
        cmdline.push_str(&format!(" {}={max}", sandbox_proto::AGENT_PIDS_MAX_ENV));
    }
    if let Some(name) = hostname {
        cmdline.push_str(&format!(" {}={name}", sandbox_proto::AGENT_HOSTNAME_ENV));
    }
    if !extra.trim().is_empty() {
        cmdline.push(' ');
        cmdline.push_str(extra.trim());
    }
    cmdline
}

fn vmm_command(vm: &VmSpec, paths: &VmPaths, scratch: &Path) -> Command {
    let mut command = Command::new(&vm.vmm_path);
    match &vm.restore {
        Some(restore) => {
            command.arg("--restore").arg(&restore.dir);
        }
        None => {
            command
                .arg("--kernel")
                .arg(&vm.kernel)
                .arg("--mem-mib")
                .arg(vm.mem_mib.to_string())
                .arg("--vcpus")
                .arg(vm.vcpus.to_string())
                .arg("--cmdline")
                .arg(&vm.cmdline)
                .arg("--vsock-cid")
                .arg(GUEST_CID.to_string());
        }
    }
    command
        .current_dir(&paths.dir)
        .arg("--jail")
        .arg(&paths.dir)
        .arg("--uid")
        .arg(vm.uid.to_string())
        .arg("--gid")
        .arg(vm.uid.to_string())
        .arg("--control-sock")
        .arg(CONTROL_SOCKET)
        .arg("--serial-log")
        .arg(CONSOLE)
        .arg("--serial-log-cap")
        .arg(CONSOLE_CAP_BYTES.to_string())
        .arg("--disk")
        .arg(format!("{},ro", vm.base_disk.display()))
        .arg("--disk")
        .arg(scratch)
        .arg("--disk")
        .arg(format!("{},ro", vm.agent_disk.display()))
        .args((0..vm.root_slots).flat_map(|_| ["--disk", EMPTY_DISK_SLOT]))
        .arg("--vsock-uds")
        .arg(VSOCK_SOCKET)
        // The guest's MAC is the VMM's default, the one the tap's
        // neighbour entry names.
        .arg("--net")
        .arg(crate::net::plumbing::VM_TAP)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// Makes the microVM of `config` and waits for its agent to connect. On
/// error the caller runs the entry's `destroy_sandbox`, which removes what was made
/// (the cgroups, where the VMM dies, and the namespace).
pub fn start(
    config: &SandboxSpec,
    paths: &SandboxPaths,
    vm: &VmSpec,
) -> Result<Started, MicrovmError> {
    let mut laps = super::sandbox::Laps::start();
    let vm_paths = VmPaths::new(paths);
    fs::create_dir_all(&vm_paths.dir).map_err(prepare("run directory"))?;
    fs::set_permissions(&vm_paths.dir, fs::Permissions::from_mode(0o700))
        .map_err(prepare("run directory"))?;
    // The jailed VMM removes its sockets at stop: the directory is its own.
    std::os::unix::fs::chown(&vm_paths.dir, Some(vm.uid), Some(vm.uid))
        .map_err(prepare("run directory"))?;
    if let Some(pod_netns) = &config.joined_netns {
        // A CRI pod's: CNI gave it its interfaces; the tap joins them.
        netns::join(pod_netns, &paths.netns())?;
        crate::net::proxy::prepare_vm_pod(&paths.netns(), crate::net::rules::Loader::Binary)?;
    } else if !config.netns_ready {
        netns::create(&paths.netns())?;
        // The supervisor's own namespace: the nft binary (see `Loader`).
        crate::net::proxy::prepare_network(&paths.netns(), crate::net::rules::Loader::Binary)?;
    }
    crate::net::plumbing::setup_vm_tap(&paths.netns())?;
    let egress =
        crate::net::proxy::open_vm_sockets(&paths.netns(), sandbox_proto::VM_GATEWAY_V4.into())?;
    laps.lap("netns");

    let scratch = VmPaths::scratch(&config.layer_dir);
    let disk_from = vm
        .restore
        .as_ref()
        .map(|r| &r.scratch)
        .or(vm.scratch_from.as_ref());
    match disk_from {
        Some(from) => {
            crate::image::ext4::clone_disk(from, &scratch)
                .map_err(|e| MicrovmError::Scratch(e.to_string()))?;
        }
        None => {
            // Templates beside the layers, on the same btrfs, so each
            // scratch disk is a reflink of one formatted once.
            let templates = config
                .layer_dir
                .parent()
                .unwrap_or(&config.layer_dir)
                .join(crate::image::ext4::SCRATCH_TEMPLATE_DIR);
            crate::image::ext4::make_scratch_with(&scratch, vm.scratch_bytes, &templates)
                .map_err(|e| MicrovmError::Scratch(e.to_string()))?;
        }
    }
    let layout = Layout::detect();
    let cgroup_procs = vm_cgroups::create(layout, &config.cgroups_path, &limits(config, vm)?)?;
    let agent_listener =
        UnixListener::bind(vm_paths.agent_socket()).map_err(prepare("agent socket"))?;
    // The jailed VMM connects to it for the guest.
    std::os::unix::fs::chown(vm_paths.agent_socket(), Some(vm.uid), Some(vm.uid))
        .map_err(prepare("agent socket"))?;
    laps.lap("rootfs_and_spec");

    let netns_file = File::open(paths.netns()).map_err(prepare("network namespace"))?;
    let log = File::create(vm_paths.vmm_log()).map_err(prepare("VMM log"))?;
    let mut command = vmm_command(vm, &vm_paths, &scratch);
    command.stderr(log);
    let netns_fd = netns_file.as_raw_fd();
    let procs_fds: Vec<i32> = cgroup_procs.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (setns, write, prctl), on descriptors this process keeps open until
    // `spawn` returns.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            for &fd in &procs_fds {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            // The VM goes with its supervisor: nothing else holds its link.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|source| MicrovmError::Spawn {
        path: vm.vmm_path.clone(),
        source,
    })?;
    let pid = child.id() as i32;
    // The supervisor's reaper waits for it from here; `Child` is only a handle.
    drop(child);
    // It joined every group, cpuacct included, before it exec'd.
    drop(cgroup_procs);
    let link = await_agent(
        &agent_listener,
        pid,
        &vm_paths,
        Duration::from_millis(config.ready_timeout_ms),
    )?;
    laps.lap("runtime");
    Ok(Started {
        init_pid: pid,
        link,
        egress,
        phases: laps.phases,
    })
}

/// Waits for the guest's agent to connect, or for the VMM to exit first (a
/// kernel that does not boot, a bad disk), whichever comes first.
fn await_agent(
    listener: &UnixListener,
    vmm_pid: i32,
    paths: &VmPaths,
    deadline: Duration,
) -> Result<OwnedFd, MicrovmError> {
    let pidfd = crate::pidfd::open(vmm_pid).map_err(prepare("VMM pidfd"))?;
    let started = Instant::now();
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(timed_out(paths, deadline));
        }
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
        ];
        let timeout = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(timed_out(paths, deadline)),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(prepare("waiting for the agent")(e.into())),
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[0]) {
            let (stream, _) = listener.accept().map_err(prepare("agent link"))?;
            return Ok(stream.into());
        }
        if ready(&fds[1]) {
            // The supervisor's reaper does not run yet: this is the only waiter.
            let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(vmm_pid), None)
                .map(|s| format!("{s:?}"))
                .unwrap_or_else(|e| format!("exited ({e})"));
            return Err(MicrovmError::VmmExited {
                status,
                log: log_tail(&paths.vmm_log()),
            });
        }
    }
}

fn timed_out(paths: &VmPaths, waited: Duration) -> MicrovmError {
    MicrovmError::AgentTimeout {
        waited,
        console: log_tail(&paths.console()),
        log: log_tail(&paths.vmm_log()),
    }
}

/// The end of the VMM's log, where its error is.
fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    let tail = text[start..].trim();
    if tail.is_empty() {
        format!("no message; see {}", path.display())
    } else {
        tail.to_string()
    }
}

/// One command on the VMM's control socket; its `ok ...` answer.
fn control(paths: &VmPaths, command: &str) -> Result<String, MicrovmError> {
    control_with(paths, command, None)
}

/// One command, with `fd` sent along its line (SCM_RIGHTS) when given.
fn control_with(
    paths: &VmPaths,
    command: &str,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<String, MicrovmError> {
    use std::io::{BufRead, BufReader, IoSlice, Write};
    let failed = |e: io::Error| MicrovmError::Control(format!("{command}: {e}"));
    let mut stream = std::os::unix::net::UnixStream::connect(paths.control()).map_err(failed)?;
    stream
        .set_read_timeout(Some(CONTROL_DEADLINE))
        .map_err(failed)?;
    let line = format!("{command}\n");
    match fd {
        Some(fd) => {
            let fds = [fd.as_raw_fd()];
            let sent = nix::sys::socket::sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(line.as_bytes())],
                &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .map_err(|e| failed(e.into()))?;
            // The descriptor rode with the first bytes; the rest of a short
            // send goes as plain bytes.
            stream.write_all(&line.as_bytes()[sent..]).map_err(failed)?;
        }
        None => stream.write_all(line.as_bytes()).map_err(failed)?,
    }
    let mut line = String::new();
    BufReader::new(stream)
        .take(4096)
        .read_line(&mut line)
        .map_err(failed)?;
    let line = line.trim_end();
    match line.strip_prefix("ok") {
        Some(rest) => Ok(rest.trim().to_string()),
        None => Err(MicrovmError::Control(format!("{command}: {line}"))),
    }
}

/// The disk number (in `--disk` order) of the first root slot: after the
/// image, scratch and agent disks.
pub const FIRST_ROOT_SLOT_DISK: usize = 3;
/// Root slots of a pod's VM: the VMM's nineteen virtio devices (its
/// `MAX_VIRTIO_DEVICES`, IOAPIC pins 5..=23) less the three disks, the
/// vsock and the net device.
pub const POD_ROOT_SLOTS: u8 = 14;

/// Puts `disk` (opened read-only here, as the jailed VMM can open nothing)
/// into disk slot `disk_number` of the running VM; the guest sees it as
/// the virtio disk whose serial is `disk<disk_number>`, of the sectors
/// returned.
pub fn attach_disk(
    paths: &SandboxPaths,
    disk_number: usize,
    disk: &Path,
) -> Result<u64, MicrovmError> {
    let file = File::open(disk).map_err(prepare("root disk"))?;
    let vm_paths = VmPaths::new(paths);
    let command = format!("attach-disk {disk_number}");
    let answer = control_with(&vm_paths, &command, Some(file.as_fd()))?;
    answer
        .parse()
        .map_err(|_| MicrovmError::Control(format!("{command}: answered {answer:?}, not a size")))
}

/// Empties disk slot `disk_number` of the running VM.
pub fn detach_disk(paths: &SandboxPaths, disk_number: usize) -> Result<(), MicrovmError> {
    control_with(
        &VmPaths::new(paths),
        &format!("detach-disk {disk_number}"),
        None,
    )
    .map(drop)
}

/// Bound on one control command; a snapshot writes the guest's touched
/// memory, seconds for gigabytes.
const CONTROL_DEADLINE: Duration = Duration::from_secs(120);

/// Snapshots a running microVM: the VMM pauses it and writes its memory
/// and device state into `images_dir`; while it is paused its scratch disk
/// is cloned to `disk_copy`, so disk and memory agree; then it runs on,
/// whatever happened.
pub fn snapshot(
    paths: &SandboxPaths,
    uid: u32,
    layer_dir: &Path,
    images_dir: &Path,
    disk_copy: &Path,
) -> Result<(), MicrovmError> {
    let vm_paths = VmPaths::new(paths);
    let taken = with_snapshot_mount(&vm_paths, uid, images_dir, || {
        control(&vm_paths, &format!("snapshot /{SNAPSHOT_MOUNT}"))
    })
    .and_then(|_| {
        crate::image::ext4::clone_disk(&VmPaths::scratch(layer_dir), disk_copy)
            .map_err(|e| MicrovmError::Scratch(format!("copying it for the snapshot: {e}")))
    });
    let resumed = control(&vm_paths, "resume");
    taken.and(resumed.map(|_| ()))
}

/// Runs `write` with `images_dir` bind-mounted into the jail and writable by
/// the VMM's uid; afterwards the mount is gone and root owns every file.
fn with_snapshot_mount<T>(
    paths: &VmPaths,
    uid: u32,
    images_dir: &Path,
    write: impl FnOnce() -> Result<T, MicrovmError>,
) -> Result<T, MicrovmError> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let target = paths.snapshot_mount();
    let mount_err = |what: &'static str| move |e: nix::errno::Errno| prepare(what)(e.into());
    fs::create_dir_all(&target).map_err(prepare("snapshot mount point"))?;
    std::os::unix::fs::chown(images_dir, Some(uid), Some(uid))
        .map_err(prepare("snapshot directory"))?;
    mount(
        Some(images_dir),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(mount_err("snapshot mount"))?;
    let written = write();
    let unmounted = umount2(&target, MntFlags::MNT_DETACH).map_err(mount_err("snapshot unmount"));
    let owned = chown_tree_to_root(images_dir).map_err(prepare("snapshot directory"));
    let _ = fs::remove_dir(&target);
    let value = written?;
    unmounted?;
    owned?;
    Ok(value)
}

/// The snapshot's files become root's again: forks read them as root, and
/// the jailed VMM that wrote them must not change them later.
fn chown_tree_to_root(dir: &Path) -> io::Result<()> {
    std::os::unix::fs::chown(dir, Some(0), Some(0))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        std::os::unix::fs::lchown(entry.path(), Some(0), Some(0))?;
    }
    Ok(())
}

/// Clones the scratch disk to `to` while the guest is paused (a
/// filesystem snapshot: crash-consistent, the guest's unwritten cache aside).
pub fn clone_disk_paused(
    paths: &SandboxPaths,
    layer_dir: &Path,
    to: &Path,
) -> Result<(), MicrovmError> {
    let vm_paths = VmPaths::new(paths);
    let cloned = control(&vm_paths, "pause").and_then(|_| {
        crate::image::ext4::clone_disk(&VmPaths::scratch(layer_dir), to)
            .map_err(|e| MicrovmError::Scratch(format!("copying it for the snapshot: {e}")))
    });
    let resumed = control(&vm_paths, "resume");
    cloned.and(resumed.map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_command_line_carries_the_seed_the_pids_limit_and_the_operators_words_last() {
        assert_eq!(
            guest_cmdline(Some("00ff"), Some(64), Some("web-1"), "printk.time=1"),
            "console=ttyS0 quiet root=/dev/vdc ro rootfstype=ext4 init=/sandbox-agent \
             panic=-1 reboot=k SANDBOX_AGENT_VM=1 SANDBOX_RNG_SEED=00ff SANDBOX_PIDS_MAX=64 \
             SANDBOX_HOSTNAME=web-1 printk.time=1"
        );
        assert_eq!(
            guest_cmdline(None, None, None, " "),
            "console=ttyS0 quiet root=/dev/vdc ro rootfstype=ext4 init=/sandbox-agent \
             panic=-1 reboot=k SANDBOX_AGENT_VM=1"
        );
    }
}
