//! The agent as init of a microVM: everything a container runtime would have
//! done before starting the agent, done by the agent itself.
//!
//! The guest kernel boots with the agent disk as its root (read-only, holding
//! this binary and empty mount points; see rootfs/README.md) and
//! `init=/sandbox-agent SANDBOX_AGENT_VM=1`. The agent then
//!
//! 1. mounts /proc, /sys and devtmpfs on /dev (the kernel may already have
//!    mounted /dev: CONFIG_DEVTMPFS_MOUNT);
//! 2. mixes the host's seed (`SANDBOX_RNG_SEED`) into the kernel RNG;
//! 3. mounts `/dev/vda` (the image, read-only ext4) and `/dev/vdb` (this
//!    sandbox's scratch disk, ext4 formatted by the host) and builds an overlay
//!    root over them (lower = vda, upper and work on vdb);
//! 4. moves /proc, /sys and /dev into it and makes it the root (pivot_root,
//!    then detaches the agent disk);
//! 5. mounts devpts, /dev/shm and the cgroup2 hierarchy that holds a group
//!    per process (guest_groups.rs) under one limited to `SANDBOX_PIDS_MAX`
//!    tasks, brings up `lo` and, when the VMM offers a network card, eth0;
//! 6. connects to the host over AF_VSOCK (CID 2, [`AGENT_VSOCK_PORT`]) and
//!    returns that stream as the link, served exactly like a container's.
//!
//! A failure at any step is written to /dev/console and the VM is shut down
//! with reboot(2) (see [`shut_down`]): init exiting would panic the kernel.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, VsockAddr};
use sandbox_proto::{
    AGENT_HOSTNAME_ENV, AGENT_PIDS_MAX_ENV, AGENT_RNG_SEED_ENV, AGENT_VM_ENV, AGENT_VSOCK_PORT,
    MAX_RNG_SEED,
};

/// `VMADDR_CID_HOST`: the host end of every guest's vsock.
const HOST_CID: u32 = 2;

/// Where the image and scratch disks appear: virtio-blk devices are named in
/// the order the VMM lists them, and the VMM lists the image first.
const IMAGE_DISK: &str = "/dev/vda";
pub(crate) const SCRATCH_DISK: &str = "/dev/vdb";

/// Mount points on the agent disk (made when the host builds it, since that
/// disk is read-only, from `VM_AGENT_DISK_DIRS`; created here only if
/// missing and possible).
const LOWER: &str = "/vm/lower";
const SCRATCH: &str = "/vm/scratch";
const NEW_ROOT: &str = "/vm/root";

/// The virtio bus in sysfs: one directory per device the VMM offers, driver
/// or not, whose `device` file holds its virtio device ID.
const VIRTIO_DEVICES: &str = "/sys/bus/virtio/devices";
/// The virtio device ID of a network card.
const VIRTIO_ID_NET: u32 = 1;

/// Connect attempts and the pause between them: the host's listener should
/// be up before the VM starts, but a busy host may be a moment late.
const CONNECT_ATTEMPTS: u32 = 5;
const CONNECT_PAUSE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum VmInitError {
    #[error("setting the hostname the host gave ({AGENT_HOSTNAME_ENV}): {0}")]
    Hostname(nix::Error),
    #[error("writing /etc/hostname: {0}")]
    EtcHostname(io::Error),
    #[error("mounting {fstype} {source_name} on {target}: {error}; the guest kernel needs this file system built in (rootfs/kernel/config.fragment)")]
    Mount {
        fstype: &'static str,
        source_name: String,
        target: String,
        error: nix::Error,
    },
    #[error("mounting the {what} disk {device} on {target}: {error}; the VMM must attach the image as the first disk and the ext4-formatted scratch disk as the second")]
    Disk {
        what: &'static str,
        device: &'static str,
        target: &'static str,
        error: nix::Error,
    },
    #[error("creating {path}: {error}; the agent disk must provide the mount points /proc /sys /dev {LOWER} {SCRATCH} {NEW_ROOT}")]
    Mkdir { path: String, error: io::Error },
    #[error("moving {from} to {to}: {error}")]
    Move {
        from: String,
        to: String,
        error: nix::Error,
    },
    #[error("switching the root to {NEW_ROOT}: {step}: {error}")]
    SwitchRoot {
        step: &'static str,
        error: io::Error,
    },
    #[error("{AGENT_RNG_SEED_ENV} is not usable: {0}; pass an even number of hex digits, at most {MAX_RNG_SEED} bytes")]
    BadSeed(&'static str),
    #[error("{AGENT_PIDS_MAX_ENV} is not usable: {0:?} is not a whole number of at least 1")]
    BadPidsMax(String),
    #[error("seeding the kernel RNG: {0}")]
    Seed(io::Error),
    #[error("the VMM offers a virtio-net device but the guest has no eth0; the guest kernel needs CONFIG_VIRTIO_NET (rootfs/kernel/config.fragment)")]
    NoEth0,
    #[error("configuring eth0: {0}")]
    Eth0(io::Error),
    #[error("turning on the memory and pids controllers for process groups: {0}; the guest kernel needs CONFIG_MEMCG and CONFIG_CGROUP_PIDS")]
    ProcessGroups(io::Error),
    #[error("connecting to the host on vsock CID {HOST_CID} port {port}: {error} (after {attempts} attempts); the VMM needs a vsock device and the host a listener on that port")]
    Connect {
        port: u32,
        attempts: u32,
        error: nix::Error,
    },
}

/// True when the kernel command line asked for VM mode. Containers also run
/// the agent as PID 1 with no descriptor variable, so the absence of
/// `SANDBOX_AGENT_FD` cannot tell the two apart; only the guest kernel puts
/// this variable in init's environment.
pub fn requested() -> bool {
    flag_set(
        std::env::var_os(AGENT_VM_ENV)
            .as_deref()
            .map(OsStrExt::as_bytes),
    )
}

fn flag_set(value: Option<&[u8]>) -> bool {
    matches!(value, Some(v) if !v.is_empty() && v != b"0")
}

/// Steps 1-6 of the module comment. Returns the connected vsock stream.
pub fn boot() -> Result<OwnedFd, VmInitError> {
    mount_api_filesystems()?;
    if let Some(hex) = std::env::var_os(AGENT_RNG_SEED_ENV) {
        let seed = parse_seed(hex.as_bytes())?;
        add_entropy(&seed).map_err(VmInitError::Seed)?;
    }
    build_root()?;
    if let Some(name) = std::env::var_os(AGENT_HOSTNAME_ENV) {
        nix::unistd::sethostname(&name).map_err(VmInitError::Hostname)?;
        // What the pod's containers are shown (guest_roots.rs binds it).
        let mut line = name.into_vec();
        line.push(b'\n');
        std::fs::create_dir_all("/etc")
            .and_then(|()| std::fs::write("/etc/hostname", line))
            .map_err(VmInitError::EtcHostname)?;
    }
    mount_dev_extras()?;
    mount_process_groups()?;
    // Two lines per boot on the console: enough for an operator (and
    // scripts/check-guest-kernel.sh) to see how far the guest got.
    console(&format!(
        "sandbox-agent: root is an overlay of {IMAGE_DISK} (image) and {SCRATCH_DISK} (scratch)"
    ));
    // Loopback is a convenience for programs, not needed for the link: a
    // failure is reported and boot goes on.
    if let Err(e) = set_flags_up("lo") {
        console(&format!("sandbox-agent: cannot bring up lo: {e}"));
    }
    // A VM without a network device has no egress, and that is its policy;
    // one that was given a device and has no working eth0 would have its
    // egress silently fail, so that is a boot error.
    if net_device_offered(Path::new(VIRTIO_DEVICES)) {
        if !Path::new("/sys/class/net/eth0").exists() {
            return Err(VmInitError::NoEth0);
        }
        configure_eth0().map_err(VmInitError::Eth0)?;
        console("sandbox-agent: eth0 is up");
    }
    console(&format!(
        "sandbox-agent: connecting to the host on vsock port {AGENT_VSOCK_PORT}"
    ));
    connect_host(AGENT_VSOCK_PORT)
}

fn mount_api_filesystems() -> Result<(), VmInitError> {
    for (fstype, target) in [("proc", "/proc"), ("sysfs", "/sys"), ("devtmpfs", "/dev")] {
        mkdir(target)?;
        if is_mount_point(Path::new(target)) {
            continue;
        }
        let flags = if fstype == "devtmpfs" {
            MsFlags::MS_NOSUID
        } else {
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC
        };
        do_mount(fstype, fstype, target, flags, None)?;
    }
    Ok(())
}

fn build_root() -> Result<(), VmInitError> {
    for dir in [LOWER, SCRATCH, NEW_ROOT] {
        mkdir(dir)?;
    }
    let disk = |what, device, target, flags| {
        mount(Some(device), target, Some("ext4"), flags, None::<&str>).map_err(|error| {
            VmInitError::Disk {
                what,
                device,
                target,
                error,
            }
        })
    };
    disk("image", IMAGE_DISK, LOWER, MsFlags::MS_RDONLY)?;
    disk("scratch", SCRATCH_DISK, SCRATCH, MsFlags::empty())?;
    let upper = format!("{SCRATCH}/upper");
    let work = format!("{SCRATCH}/work");
    mkdir(&upper)?;
    mkdir(&work)?;
    let options = overlay_options(LOWER, &upper, &work);
    do_mount(
        "overlay",
        "overlay",
        NEW_ROOT,
        MsFlags::empty(),
        Some(&options),
    )?;
    for dir in ["proc", "sys", "dev"] {
        let from = format!("/{dir}");
        let to = format!("{NEW_ROOT}/{dir}");
        // The overlay is writable, so a missing mount point (an image without
        // /sys, say) is made in the upper layer.
        mkdir(&to)?;
        mount(
            Some(from.as_str()),
            to.as_str(),
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|error| VmInitError::Move { from, to, error })?;
    }
    switch_root(Path::new(NEW_ROOT))
}

/// The overlay's mount data. Paths come from constants here, never from the
/// image, so they need no escaping of ',' or ':'.
fn overlay_options(lower: &str, upper: &str, work: &str) -> String {
    format!("lowerdir={lower},upperdir={upper},workdir={work}")
}

/// pivot_root(".", ".") stacks the old root on top of the new one at "/";
/// detaching it then leaves the new root alone, and the agent disk becomes
/// unreachable from inside the sandbox (the running binary keeps its mapping).
fn switch_root(new_root: &Path) -> Result<(), VmInitError> {
    let step = |step: &'static str| move |error: io::Error| VmInitError::SwitchRoot { step, error };
    std::env::set_current_dir(new_root).map_err(step("chdir"))?;
    let dot = c".";
    // SAFETY: pivot_root takes two NUL-terminated paths that outlive the call.
    if unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } != 0 {
        return Err(step("pivot_root")(io::Error::last_os_error()));
    }
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| step("detaching the old root")(e.into()))?;
    std::env::set_current_dir("/").map_err(step("chdir /"))?;
    Ok(())
}

fn mount_dev_extras() -> Result<(), VmInitError> {
    mkdir("/dev/pts")?;
    if !is_mount_point(Path::new("/dev/pts")) {
        // gid 5 is "tty" in Debian's base files, as a container runtime sets it.
        do_mount(
            "devpts",
            "devpts",
            "/dev/pts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("gid=5,mode=620,ptmxmode=666"),
        )?;
    }
    mkdir("/dev/shm")?;
    if !is_mount_point(Path::new("/dev/shm")) {
        do_mount(
            "tmpfs",
            "shm",
            "/dev/shm",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        )?;
    }
    Ok(())
}

/// The guest's cgroup2 hierarchy, home of one group per process
/// (guest_groups.rs): tree kills and OOM reports need it.
fn mount_process_groups() -> Result<(), VmInitError> {
    let pids_max = match std::env::var_os(AGENT_PIDS_MAX_ENV) {
        Some(value) => Some(parse_pids_max(value.as_bytes())?),
        None => None,
    };
    let at = crate::guest_groups::MOUNT_POINT;
    do_mount(
        "cgroup2",
        "cgroup2",
        at,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    crate::guest_groups::install(Path::new(at), pids_max).map_err(VmInitError::ProcessGroups)
}

fn parse_pids_max(value: &[u8]) -> Result<u64, VmInitError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|max| *max > 0)
        .ok_or_else(|| VmInitError::BadPidsMax(String::from_utf8_lossy(value).into_owned()))
}

fn do_mount(
    fstype: &'static str,
    source: &str,
    target: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), VmInitError> {
    mount(Some(source), target, Some(fstype), flags, data).map_err(|error| VmInitError::Mount {
        fstype,
        source_name: source.to_owned(),
        target: target.to_owned(),
        error,
    })
}

fn mkdir(path: &str) -> Result<(), VmInitError> {
    match std::fs::create_dir_all(path) {
        Ok(()) => Ok(()),
        // create_dir_all fails on a read-only file system even when the
        // directory exists; only a missing one is an error.
        Err(_) if Path::new(path).is_dir() => Ok(()),
        Err(error) => Err(VmInitError::Mkdir {
            path: path.to_owned(),
            error,
        }),
    }
}

/// A directory whose device differs from its parent's is a mount point (also
/// true for "/"'s own mounts, which is all this is used for).
pub(crate) fn is_mount_point(path: &Path) -> bool {
    let parent = path.parent().unwrap_or(Path::new("/"));
    match (std::fs::metadata(path), std::fs::metadata(parent)) {
        (Ok(dir), Ok(up)) => dir.dev() != up.dev() || dir.ino() == up.ino(),
        _ => false,
    }
}

/// Hex digits to bytes, bounded.
fn parse_seed(hex: &[u8]) -> Result<Vec<u8>, VmInitError> {
    if hex.len() % 2 == 1 {
        return Err(VmInitError::BadSeed("odd number of hex digits"));
    }
    if hex.len() / 2 > MAX_RNG_SEED {
        return Err(VmInitError::BadSeed("too long"));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(VmInitError::BadSeed("not a hex digit")),
    };
    hex.chunks_exact(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// After a restore from a memory snapshot (a fork): fresh entropy from the
/// host into the guest kernel's pool, and the host's wall time. Only in a
/// microVM: a container shares the host kernel's RNG and clock.
pub fn reseed(seed: &[u8], unix_time_ns: u64) -> io::Result<()> {
    let reseeded = take_seed(seed, unix_time_ns);
    if requested() {
        // A fork of a fork that failed takes its own seed: it is judged
        // by that one alone.
        RESEED_FAILED.store(reseeded.is_err(), std::sync::atomic::Ordering::Release);
    }
    reseeded
}

/// Set once a fork's guest failed to take its fresh seed and clock: its
/// agent then starts no process (see `dispatch`), since the host no longer
/// waits for the reseed's reply before it calls the fork ready.
static RESEED_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this guest failed to take a fork's fresh seed and clock.
pub fn reseed_failed() -> bool {
    RESEED_FAILED.load(std::sync::atomic::Ordering::Acquire)
}

fn take_seed(seed: &[u8], unix_time_ns: u64) -> io::Result<()> {
    if !requested() {
        return Err(io::Error::other(
            "reseeding is for a microVM's agent; a container shares the host's RNG and clock",
        ));
    }
    if seed.len() > MAX_RNG_SEED {
        return Err(io::Error::other(format!(
            "a seed of {} bytes is over the {MAX_RNG_SEED}-byte limit",
            seed.len()
        )));
    }
    add_entropy(seed)?;
    reseed_crng()?;
    let now = libc::timespec {
        tv_sec: (unix_time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads the timespec it is given for the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Makes the CRNG take its next output from the input pool now. A fork's
/// guest comes out of the snapshot with the source's CRNG state: entropy
/// credited with RNDADDENTROPY reaches it only at the next scheduled
/// reseed (up to a minute on 6.1), so two forks would draw the same bytes
/// until then.
fn reseed_crng() -> io::Result<()> {
    let random = OpenOptions::new().write(true).open("/dev/urandom")?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mixes `seed` into the kernel's input pool and credits it as entropy: the
/// host drew it from its own CRNG for this VM alone.
fn add_entropy(seed: &[u8]) -> io::Result<()> {
    if seed.is_empty() {
        return Ok(());
    }
    let random = OpenOptions::new().write(true).open("/dev/urandom")?;
    let request = rand_pool_info(seed);
    // SAFETY: `request` is a `struct rand_pool_info` (two ints, then
    // `buf_size` bytes) built by `rand_pool_info`; the kernel reads exactly
    // that many bytes from it during the call.
    let rc = unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, request.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }`
/// in native byte order, with the buffer padded to whole words.
fn rand_pool_info(seed: &[u8]) -> Vec<u32> {
    let bits = i32::try_from(seed.len() * 8).unwrap_or(i32::MAX);
    let bytes = i32::try_from(seed.len()).unwrap_or(i32::MAX);
    let mut words = vec![bits as u32, bytes as u32];
    words.extend(seed.chunks(4).map(|chunk| {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        u32::from_ne_bytes(word)
    }));
    words
}

/// An `ifreq` naming `name` (shorter than IFNAMSIZ), the rest zero.
/// Whether the VMM offers a network card, whether or not the kernel has
/// its driver (the transport lists every device).
fn net_device_offered(bus: &Path) -> bool {
    let Ok(devices) = std::fs::read_dir(bus) else {
        return false;
    };
    devices.flatten().any(|dev| {
        std::fs::read_to_string(dev.path().join("device"))
            .ok()
            .and_then(|id| u32::from_str_radix(id.trim().trim_start_matches("0x"), 16).ok())
            == Some(VIRTIO_ID_NET)
    })
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    req
}

fn inet_socket() -> io::Result<OwnedFd> {
    Ok(socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A `sockaddr_in` for `addr`, as the interface ioctls take it.
fn sockaddr(addr: [u8; 4]) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data; the
    // kernel reads this one as a sockaddr_in because of its family.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// The guest's side of its link to the host's tap: address, up, default
/// route via the gateway, and the gateway as resolver (DNS to any address
/// is redirected to the sandbox's resolver anyway).
fn configure_eth0() -> io::Result<()> {
    use sandbox_proto::{VM_GATEWAY_V4, VM_GUEST_V4, VM_PREFIX_V4};
    let sock = inet_socket()?;
    let mut req = ifreq("eth0");
    req.ifr_ifru.ifru_addr = sockaddr(VM_GUEST_V4);
    // SAFETY: SIOCSIFADDR reads the ifreq, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mask = u32::MAX << (32 - u32::from(VM_PREFIX_V4));
    req.ifr_ifru.ifru_netmask = sockaddr(mask.to_be_bytes());
    // SAFETY: as above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK, &req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    set_flags_up("eth0")?;
    // SAFETY: rtentry is plain data; all zeroes is a valid value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr([0; 4]);
    route.rt_genmask = sockaddr([0; 4]);
    route.rt_gateway = sockaddr(VM_GATEWAY_V4);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT reads the rtentry, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &route) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [a, b, c, d] = VM_GATEWAY_V4;
    // An image without /etc (a pod's pause image) gets one.
    std::fs::create_dir_all("/etc")?;
    std::fs::write("/etc/resolv.conf", format!("nameserver {a}.{b}.{c}.{d}\n"))
}

fn set_flags_up(name: &str) -> io::Result<()> {
    let sock = inet_socket()?;
    let mut req = ifreq(name);
    // SAFETY: SIOCGIFFLAGS fills the flags of the named interface in `req`,
    // which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new link after the last one ended: a restored snapshot's guest finds
/// its connection reset (vsock TRANSPORT_RESET) and dials the host that
/// restored it. When no host answers, the VM is being stopped.
pub fn redial() -> io::Result<OwnedFd> {
    console("sandbox-agent: the link to the host ended; dialling again");
    connect_host(AGENT_VSOCK_PORT).map_err(|e| io::Error::other(e.to_string()))
}

fn connect_host(port: u32) -> Result<OwnedFd, VmInitError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = socket::socket(
            AddressFamily::Vsock,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .and_then(|fd| {
            socket::connect(fd.as_raw_fd(), &VsockAddr::new(HOST_CID, port))?;
            Ok(fd)
        });
        match result {
            Ok(fd) => return Ok(fd),
            // No transport (no vsock device) will not appear later.
            Err(error) if attempt >= CONNECT_ATTEMPTS || error == nix::Error::ENODEV => {
                return Err(VmInitError::Connect {
                    port,
                    attempts: attempt,
                    error,
                })
            }
            Err(_) => std::thread::sleep(CONNECT_PAUSE),
        }
    }
}

/// Writes one line to the console, falling back to stderr (which the
/// kernel also opened on the console, if /dev existed on the root).
///
/// Never blocks: init must not hang on its console. (A restored guest's
/// serial port may not take output until its transmitter interrupt comes
/// again; such a line is dropped.)
pub fn console(line: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let written = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/console")
        .and_then(|mut c| writeln!(c, "{line}"));
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(_) => eprintln!("{line}"),
    }
}

/// Ends the VM. Init must never exit (the kernel would panic), and
/// reboot(RB_POWER_OFF) only halts the CPUs when there is no ACPI to power
/// off through, which leaves the VMM waiting for its timeout. A reset is what
/// every VMM here turns into a clean exit: ours exits 0 on the guest's i8042
/// reset, QEMU with `-no-reboot` on any reset, Firecracker likewise.
pub fn shut_down() -> ! {
    // SAFETY: sync has no arguments and cannot fail.
    unsafe { libc::sync() };
    // SAFETY: reboot with a valid command; on success it does not return.
    unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    let error = io::Error::last_os_error();
    console(&format!("sandbox-agent: reboot failed: {error}; halting"));
    // Still init: waiting forever is all that is left that does not panic.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_disk_holds_every_mount_point_used_here() {
        for dir in [LOWER, SCRATCH, NEW_ROOT, "/proc", "/sys", "/dev"] {
            let relative = dir.trim_start_matches('/');
            assert!(
                sandbox_proto::VM_AGENT_DISK_DIRS.contains(&relative),
                "{dir} is missing from VM_AGENT_DISK_DIRS"
            );
        }
    }

    #[test]
    fn a_net_device_is_found_by_its_virtio_id() {
        let bus = std::env::temp_dir().join(format!("vm-init-bus-{}", std::process::id()));
        let device = |name: &str, id: &str| {
            std::fs::create_dir_all(bus.join(name)).expect("dir");
            std::fs::write(bus.join(name).join("device"), id).expect("write");
        };
        assert!(!net_device_offered(&bus), "no bus at all");
        device("virtio0", "0x0002\n");
        device("virtio1", "0x0013\n");
        assert!(!net_device_offered(&bus), "block and vsock only");
        device("virtio2", "0x0001\n");
        assert!(net_device_offered(&bus), "a net device");
        std::fs::remove_dir_all(&bus).expect("clean up");
    }

    #[test]
    fn flag_needs_a_non_zero_value() {
        assert!(!flag_set(None));
        assert!(!flag_set(Some(b"")));
        assert!(!flag_set(Some(b"0")));
        assert!(flag_set(Some(b"1")));
        assert!(flag_set(Some(b"yes")));
    }

    #[test]
    fn pids_max_is_a_positive_whole_number() {
        assert_eq!(parse_pids_max(b"1024").expect("valid"), 1024);
        for bad in [&b""[..], b"0", b"-1", b"12k", b"max", b"\xff"] {
            let error = parse_pids_max(bad).expect_err("refused").to_string();
            assert!(error.contains(AGENT_PIDS_MAX_ENV), "{error}");
        }
    }

    #[test]
    fn seed_parses_hex_and_refuses_the_rest() {
        assert_eq!(parse_seed(b"00ffA5").expect("hex"), vec![0x00, 0xff, 0xa5]);
        assert_eq!(parse_seed(b"").expect("empty"), Vec::<u8>::new());
        assert!(matches!(parse_seed(b"abc"), Err(VmInitError::BadSeed(_))));
        assert!(matches!(parse_seed(b"zz"), Err(VmInitError::BadSeed(_))));
        let long = vec![b'a'; (MAX_RNG_SEED + 1) * 2];
        assert!(matches!(parse_seed(&long), Err(VmInitError::BadSeed(_))));
        let max = vec![b'a'; MAX_RNG_SEED * 2];
        assert_eq!(parse_seed(&max).expect("max").len(), MAX_RNG_SEED);
    }

    #[test]
    fn rand_pool_info_layout() {
        let words = rand_pool_info(&[1, 2, 3, 4, 5]);
        assert_eq!(words[0], 40, "entropy bits");
        assert_eq!(words[1], 5, "buffer bytes");
        assert_eq!(words.len(), 2 + 2, "padded to whole words");
        assert_eq!(words[2], u32::from_ne_bytes([1, 2, 3, 4]));
        assert_eq!(words[3], u32::from_ne_bytes([5, 0, 0, 0]));
    }

    #[test]
    fn overlay_options_name_all_three_dirs() {
        assert_eq!(
            overlay_options("/l", "/s/upper", "/s/work"),
            "lowerdir=/l,upperdir=/s/upper,workdir=/s/work"
        );
    }

    #[test]
    fn mount_points_are_recognised() {
        assert!(is_mount_point(Path::new("/proc")));
        assert!(is_mount_point(Path::new("/")));
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!is_mount_point(dir.path()));
        assert!(!is_mount_point(&dir.path().join("absent")));
    }

    #[test]
    fn mkdir_accepts_existing_and_reports_impossible() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a/b");
        let path = path.to_str().expect("utf-8 path");
        mkdir(path).expect("create");
        mkdir(path).expect("exists");
        let under_file = dir.path().join("file");
        std::fs::write(&under_file, b"").expect("write");
        let bad = under_file.join("x");
        assert!(matches!(
            mkdir(bad.to_str().expect("utf-8 path")),
            Err(VmInitError::Mkdir { .. })
        ));
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = VmInitError::Connect {
            port: AGENT_VSOCK_PORT,
            attempts: 1,
            error: nix::Error::ENODEV,
        };
        let text = e.to_string();
        assert!(text.contains("port 1025"), "{text}");
        assert!(text.contains("vsock device"), "{text}");
    }
}
