//! The agent protocol: the messages exchanged between a sandbox's supervisor
//! (the host side, `sandboxd shim`) and the in-sandbox agent, and their framing.
//!
//! One byte stream (a socketpair for containers, vsock for microVMs) carries
//! length-delimited frames: a little-endian `u32` length followed by a postcard
//! encoded message. The host sends [`Request`]s, each with an id it chose; the
//! agent answers each with an [`AgentMessage::Reply`] carrying the same id and
//! sends process output and exits unsolicited. Every frame is bounded by
//! [`MAX_FRAME`] in both directions, because either side may be hostile to the
//! other: the host never trusts what the agent says.
//!
//! The crate has no I/O of its own so that the agent, the supervisor and a
//! freestanding test guest can share the same codec. It also names the
//! sandbox's default confinement ([`confinement`]) and the bounds of its
//! limits ([`limits`]), which the daemon and the containerd shim share.

pub mod confinement;
mod frame;
pub mod limits;

pub use frame::{decode, encode, FrameDecoder, FrameError};

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change to the messages below, and when an
/// agent starts to apply a field that an older one would read past.
/// (Fields added at the very end of a frame, as `SpawnRequest::root` was,
/// decode either way: postcard reads the fields its own build knows and
/// leaves the rest. A field added inside a frame, before others, does
/// not: an older reader takes its bytes for the next field's. The agent
/// and its host come from one build, and the freestanding test guest
/// reads only what it needs. But an agent restored from a memory
/// snapshot of an earlier build reads past trailing fields too, so a
/// field it must not ignore needs a bump.)
///
/// 3: the agent applies [`SpawnRequest::groups`] and
/// [`SpawnRequest::confinement`]; a host must not send either to an
/// older agent, which would run the process without them.
pub const PROTOCOL_VERSION: u32 = 3;

/// The oldest agent a host still talks to: one restored from a snapshot
/// that an earlier build made, or the freestanding test guest.
pub const OLDEST_PROTOCOL_VERSION: u32 = 2;

/// The first version whose agent applies [`SpawnRequest::groups`] and
/// [`SpawnRequest::confinement`].
pub const CONFINEMENT_PROTOCOL_VERSION: u32 = 3;

/// Largest frame either side accepts, header excluded.
pub const MAX_FRAME: usize = 1 << 20;

/// Largest payload of one output or file data message. Kept well under
/// [`MAX_FRAME`] so a frame with its envelope always fits.
pub const MAX_CHUNK: usize = 256 * 1024;

/// The file descriptor on which a container agent finds its link to the host.
pub const AGENT_LINK_FD: i32 = 3;

/// Environment variable that tells the agent which descriptor is its link.
pub const AGENT_LINK_ENV: &str = "SANDBOX_AGENT_FD";

/// The vsock port on the host (CID 2, `VMADDR_CID_HOST`) that a microVM's
/// agent connects to when it has built its root: it then sends `Hello` and
/// serves requests exactly as on a container's fd-3 link. Descriptors cannot
/// cross vsock, so spawns on this link carry `cgroup_fds: 0`.
pub const AGENT_VSOCK_PORT: u32 = 1025;

/// A microVM's network, the same in every VM (forks need no change): the
/// guest's `eth0` (virtio-net) has this address in a /30 whose other end,
/// the default gateway, is the host's tap in the sandbox's namespace, where
/// every TCP connection is redirected to the egress proxy and DNS to the
/// sandbox's resolver.
pub const VM_GUEST_V4: [u8; 4] = [10, 201, 0, 2];
/// The host end of the guest's link: its default gateway and resolver.
pub const VM_GATEWAY_V4: [u8; 4] = [10, 201, 0, 1];
pub const VM_PREFIX_V4: u8 = 30;

/// Put `SANDBOX_AGENT_VM=1` on the guest kernel's command line: the kernel
/// hands unknown `key=value` words to init as environment variables, and this
/// one tells the agent it is PID 1 of a microVM (mount the disks, build the
/// overlay root, connect over vsock) rather than of a container, which also
/// starts it as PID 1 without [`AGENT_LINK_ENV`].
pub const AGENT_VM_ENV: &str = "SANDBOX_AGENT_VM";

/// Optional command-line word `SANDBOX_RNG_SEED=<hex>` (up to
/// [`MAX_RNG_SEED`] bytes): random bytes from the host that the agent mixes
/// into the guest kernel's RNG before anything else runs, so a guest without
/// virtio-rng or RDRAND does not start with a predictable pool. It is visible
/// in the guest's /proc/cmdline, so it is entropy, not a secret.
pub const AGENT_RNG_SEED_ENV: &str = "SANDBOX_RNG_SEED";

/// Optional command-line word `SANDBOX_PIDS_MAX=<n>`: the sandbox's pids
/// limit, which a microVM's agent puts on the cgroup that holds every
/// process it starts (the agent itself and kernel threads are outside it).
/// Root inside the guest can raise it, as it can do anything there: the
/// limit keeps a runaway process tree from starving the agent, and the VM
/// boundary, not this, is what holds hostile code.
pub const AGENT_PIDS_MAX_ENV: &str = "SANDBOX_PIDS_MAX";

/// Optional command-line word `SANDBOX_HOSTNAME=<name>`: the guest's
/// hostname (a CRI pod's name), set by the agent at boot.
pub const AGENT_HOSTNAME_ENV: &str = "SANDBOX_HOSTNAME";

/// Largest seed the agent accepts in [`AGENT_RNG_SEED_ENV`], in bytes.
pub const MAX_RNG_SEED: usize = 256;

/// Where the agent lies on a microVM's agent disk (the guest kernel's root,
/// `root=/dev/vdc`): the kernel command line says `init=` this.
pub const VM_AGENT_INIT: &str = "/sandbox-agent";

/// Directories the agent disk must hold, since it is mounted read-only: the
/// agent mounts /proc, /sys, /dev there, then the image (`vm/lower`), the
/// scratch disk (`vm/scratch`) and the overlay root (`vm/root`).
pub const VM_AGENT_DISK_DIRS: &[&str] =
    &["proc", "sys", "dev", "vm/lower", "vm/scratch", "vm/root"];

/// A request from the host, answered by one [`AgentMessage::Reply`] with the same `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub body: RequestBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RequestBody {
    /// Liveness and version check. Reply: [`Reply::Health`].
    Health,
    /// Start a process. Reply: [`Reply::Spawned`].
    Spawn(SpawnRequest),
    /// Append bytes to a process's stdin. Reply: [`Reply::Ok`] once written.
    WriteStdin {
        proc: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Close a process's stdin. Reply: [`Reply::Ok`].
    CloseStdin { proc: u64 },
    /// Send a signal to a process (its process group when it has one).
    /// Reply: [`Reply::Ok`]. Hard kills go through the cgroup, not here.
    Signal { proc: u64, signal: i32 },
    /// Change a PTY's window size. Reply: [`Reply::Ok`].
    ResizePty { proc: u64, size: PtySize },
    /// Open (create or truncate) a file for writing. Reply: [`Reply::Opened`].
    OpenWrite { path: String, mode: u32 },
    /// Open a file for reading. Reply: [`Reply::Opened`] with its size.
    OpenRead { path: String },
    /// Write to a handle from [`RequestBody::OpenWrite`]. Reply: [`Reply::Ok`].
    Write {
        handle: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Read up to `max` bytes (at most [`MAX_CHUNK`]). Reply: [`Reply::Data`], empty at EOF.
    Read { handle: u64, max: u32 },
    /// Close a handle. Written files are not fsynced: the writable layer does
    /// not outlive the sandbox. Reply: [`Reply::Ok`].
    Close { handle: u64 },
    /// Reply: [`Reply::Stat`]. Does not follow a final symlink.
    Stat { path: String },
    /// Reply: [`Reply::Entries`], sorted by name.
    ListDir { path: String },
    /// Reply: [`Reply::Ok`].
    Mkdir {
        path: String,
        parents: bool,
        mode: u32,
    },
    /// Reply: [`Reply::Ok`].
    Remove { path: String, recursive: bool },
    /// Sent once to a microVM's agent after its VM was restored from a memory
    /// snapshot (every fork), before the fork is reported ready: mix `seed`
    /// (fresh host randomness, at most [`MAX_RNG_SEED`] bytes) into the guest
    /// kernel's RNG and set the realtime clock to `unix_time_ns`, so forks
    /// neither share the snapshot's entropy nor its wall time. A container's
    /// agent refuses it (the host kernel's RNG and clock are already shared).
    /// Reply: [`Reply::Ok`].
    Reseed {
        #[serde(with = "serde_bytes")]
        seed: Vec<u8>,
        unix_time_ns: u64,
    },
    /// The TCP sockets listening in the sandbox's network namespace (the
    /// kernel's `/proc/net/tcp` and `tcp6` as the agent sees them).
    /// Reply: [`Reply::Listening`], sorted by port, then address.
    ListeningPorts,
    /// A microVM only: make `max` the most tasks that the processes the
    /// agent starts may hold at once, all of them together (what a
    /// container's pids cgroup does on the host). Sent when a pooled VM is
    /// claimed with another limit than it booted with
    /// ([`AGENT_PIDS_MAX_ENV`]). A container's agent refuses it: there the
    /// host sets the limit. Reply: [`Reply::Ok`].
    LimitPids { max: u64 },
    /// The host gave up on the spawn of `proc` (written, but its reply did
    /// not come in time) and lists no such process: kill its tree if it
    /// runs or has run, and make the spawn fail if it has not started yet,
    /// so nothing runs that the host cannot see or end. Reply: [`Reply::Ok`].
    Abandon { proc: u64 },
    /// A microVM only: how many tasks the processes the agent started hold
    /// now, all together (what [`RequestBody::LimitPids`] limits). A
    /// container's are counted by the host. Reply: [`Reply::Pids`].
    GuestPids,
    /// Start `argv` (an interpreter as run-code starts it, `python3 -u`)
    /// with `env` as `uid`:`gid` and keep it ready: later run-code of that
    /// interpreter runs in a fork of it rather than a fresh start, where
    /// the agent finds that the fork runs it as a fresh start would (the
    /// same user and start-up environment). Sent to a pooled sandbox
    /// before it joins its pool; replaces an interpreter started before.
    /// Reply: [`Reply::Ok`] once it is ready to serve.
    WarmInterpreter {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        uid: u32,
        gid: u32,
    },
    /// A microVM only: the host has just put a read-only ext4 disk in a
    /// slot whose virtio-blk GET_ID is `disk_id`; make container root
    /// `name` of it (at [`container_root`], with a writable layer of its
    /// own on the scratch disk and the VM's /proc, /dev, /sys and /etc
    /// files bound in), as the host does inside a container sandbox.
    /// `sectors` is the disk's size, by which the agent tells it from the
    /// slot's previous disk. Reply: [`Reply::Ok`] once spawns may name the
    /// root.
    MountRoot {
        name: String,
        disk_id: String,
        sectors: u64,
        /// Ceilings of the root's own, over every process started in it
        /// (a group under the one that holds all the agent starts), as a
        /// container root's host group has.
        limits: Option<GuestRootLimits>,
        /// Volumes written by [`RequestBody::WriteVolume`] to bind into
        /// the root, in order.
        volumes: Vec<GuestVolume>,
    },
    /// A microVM only: unmount container root `name` and drop its writable
    /// layer, so its slot can be emptied; the host has killed what ran
    /// there. Reply: [`Reply::Ok`] once nothing holds the root's disk, an
    /// error while something still does (the slot then stays in use).
    UnmountRoot { name: String },
    /// A microVM only: the app on `port` may listen on the guest's loopback
    /// only, out of reach of the host's ingress, which dials the guest's
    /// address through the tap. Connect to it (127.0.0.1, then ::1) and
    /// forward one connection to it from a port of the guest's address,
    /// which the reply names; that port takes one connection, from port
    /// `from_port` of the host's end of the tap ([`VM_GATEWAY_V4`]), for a
    /// few seconds. A container's agent refuses it (there the host dials
    /// the loopback itself), and an agent with many forwarders open
    /// refuses more. Reply: [`Reply::Forwarding`]; an error of kind
    /// `NotFound` when nothing listens on the loopback either.
    ForwardLoopback { port: u16, from_port: u16 },
    /// A microVM only: what container root `name`, one with limits of its
    /// own (see [`RequestBody::MountRoot`]), uses now, read from its
    /// group in the guest. Reply: [`Reply::RootUsage`]; an error of kind
    /// `NotFound` when the root has no group of its own.
    RootUsage { name: String },
    /// A microVM only: the guest cannot see the host's files, so a pod
    /// container's host volume (a service account's token, a ConfigMap, an
    /// emptyDir) is copied into it: write `entries` into the guest's copy
    /// `key` (a [`valid_root_name`]) on the scratch disk, starting it afresh
    /// when `fresh` (a large volume comes in several requests, each within
    /// [`MAX_FRAME`]). Reply: [`Reply::Ok`] once written.
    WriteVolume {
        key: String,
        fresh: bool,
        entries: Vec<VolumeEntry>,
    },
    /// A microVM only: bind copies written by [`RequestBody::WriteVolume`]
    /// into the VM's own root, in order (a microVM task's volumes, before
    /// it is ready). Reply: [`Reply::Ok`] once bound.
    BindVolumes { volumes: Vec<GuestVolume> },
    /// A microVM only: bring copy `key` up to date with copy `from`, which
    /// [`RequestBody::WriteVolume`] wrote just before (a read-only host
    /// volume that changed: a ConfigMap the kubelet updated, a token it
    /// rotated). `key`'s directories stay the ones its roots have bound,
    /// so they see the change: entries only `from` has move in first, then
    /// each that both have is swapped by one rename (a reader sees the old
    /// or the new, as the kubelet's own swap of `..data` promises), then
    /// those only `key` has go. `from` is removed, replaced or not. A copy
    /// bound writable into a root is the guest's own, and refused. Reply:
    /// [`Reply::Ok`].
    ReplaceVolume { key: String, from: String },
}

/// One piece of a volume copied into a microVM (see
/// [`RequestBody::WriteVolume`]). `path` is relative to the volume's top,
/// `/`-separated, without `.` or `..` components; the empty path is the top
/// itself, which is a directory or a file. Parents come before their
/// children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeEntry {
    Dir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// A file, made (or emptied) with `data` in it.
    File {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// More of a file an earlier entry made: one larger than a request.
    Append {
        path: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
        uid: u32,
        gid: u32,
    },
}

impl VolumeEntry {
    /// Where the entry goes, relative to the volume's top.
    pub fn path(&self) -> &str {
        match self {
            VolumeEntry::Dir { path, .. }
            | VolumeEntry::File { path, .. }
            | VolumeEntry::Append { path, .. }
            | VolumeEntry::Symlink { path, .. } => path,
        }
    }
}

/// A volume the guest holds (see [`RequestBody::WriteVolume`]) bound into a
/// container root at `destination` (absolute, inside the root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolume {
    pub key: String,
    pub destination: String,
    pub read_only: bool,
    /// The part of the copy bound (a [`valid_volume_path`]; empty for all
    /// of it): a kubelet `subPath` of a volume the pod shares.
    pub within: String,
}

/// Whether `path` may name an entry of a volume: relative, `/`-separated
/// normal components (or empty, the volume's top).
pub fn valid_volume_path(path: &str) -> bool {
    path.is_empty()
        || path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

/// A microVM container root's own ceilings (see [`RequestBody::MountRoot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRootLimits {
    /// CPU time per `cpu_period_us`, in microseconds.
    pub cpu_quota_us: Option<u64>,
    pub cpu_period_us: u64,
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<u64>,
    /// Its `cpu.weight` (1-10000) against the guest's other groups.
    ///
    /// This and `oom_group` came without a protocol bump although they sit
    /// inside [`RequestBody::MountRoot`], before its `volumes`, where an
    /// older agent would misread them: `MountRoot` only ever reaches an
    /// agent of the host's own build, as only a CRI pod's microVM takes
    /// roots, and a pod's VM is never forked, pooled or made from a boot
    /// template, and a daemon adopts only supervisors of its own version.
    /// Pods forked from snapshots would have to gate these on the agent's
    /// version.
    pub cpu_weight: Option<u64>,
    /// `memory.oom.group`: an OOM kill ends all of the root's processes.
    pub oom_group: bool,
}

/// Where the host attaches the roots of a pod's containers inside the
/// sandbox (each an overlay with the sandbox's /proc, /dev, /sys and /etc
/// files bound in); a spawn naming one in [`SpawnRequest::root`] runs there.
pub const CONTAINER_ROOTS_DIR: &str = "/run/sandboxd/containers";

/// The attach point of container root `name` inside the sandbox.
pub fn container_root(name: &str) -> String {
    format!("{CONTAINER_ROOTS_DIR}/{name}/rootfs")
}

/// Whether `name` may name a container root: 1 to 128 of `[A-Za-z0-9_.-]`,
/// not starting with a dot (so it is one path component, never `..`).
pub fn valid_root_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// A TCP socket in the LISTEN state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ListeningSocket {
    pub port: u16,
    /// The address it is bound to, as text (`0.0.0.0`, `::`, `127.0.0.1`).
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// Id chosen by the host; output and exit messages carry it.
    pub proc: u64,
    /// Program and arguments. `argv[0]` is looked up in `PATH` when it has no `/`.
    pub argv: Vec<String>,
    /// Source code to run: the agent writes it to a private file and appends
    /// that file's path to `argv` (run-code).
    #[serde(with = "serde_bytes")]
    pub code: Option<Vec<u8>>,
    /// The complete environment of the process.
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Keep a stdin pipe open for [`RequestBody::WriteStdin`]; otherwise stdin is /dev/null.
    pub stdin: bool,
    /// Run on a pseudo-terminal of this size (stdout carries everything).
    pub pty: Option<PtySize>,
    /// How many descriptors were passed with this frame (SCM_RIGHTS): each is an
    /// open `cgroup.procs` file the child writes `0` into before it execs, so
    /// the host can kill its whole tree through the cgroup.
    pub cgroup_fds: u8,
    /// Run in the container root of this name (at [`container_root`]): the
    /// child chroots there and gives up CAP_SYS_CHROOT, and `cwd` is taken
    /// inside it. `None`: the sandbox's root.
    pub root: Option<String>,
    /// Supplementary groups of the process (the primary is `gid`); empty
    /// for none.
    pub groups: Vec<u32>,
    /// Its capabilities, seccomp filter and OOM score, where they differ
    /// from the sandbox's.
    pub confinement: confinement::ProcessConfinement,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Health {
        version: u32,
    },
    /// `pid` is the process id inside the sandbox.
    Spawned {
        pid: i32,
    },
    Opened {
        handle: u64,
        size: u64,
    },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Stat(FileStat),
    Entries(Vec<FileStat>),
    Error(AgentError),
    Listening(Vec<ListeningSocket>),
    Pids {
        current: u64,
    },
    /// The guest's port that forwards one connection (see
    /// [`RequestBody::ForwardLoopback`]).
    Forwarding {
        port: u16,
    },
    /// A container root's use (see [`RequestBody::RootUsage`]).
    RootUsage(GuestRootUsage),
}

/// What a microVM container root's own group uses, and its ceilings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRootUsage {
    /// CPU time of its processes so far (`cpu.stat`'s `usage_usec`).
    pub cpu_usec: u64,
    pub memory_bytes: u64,
    /// `None`: no memory limit of its own.
    pub memory_max: Option<u64>,
    pub pids: u64,
    /// `None`: no pids limit of its own.
    pub pids_max: Option<u64>,
    pub oom_kills: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// First message on a new link.
    Hello {
        version: u32,
    },
    Reply {
        id: u64,
        reply: Reply,
    },
    Output {
        proc: u64,
        stream: Stream,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Exit {
        proc: u64,
        status: ExitStatus,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a process ended: exactly one of `code` and `signal` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// An OOM kill happened in the process's group while it ran. Only an
    /// agent that keeps a cgroup per process itself (a microVM's, in the
    /// guest) can know; a container's supervisor reads the host's groups.
    pub oom_killed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileStat {
    /// Final path component (the requested path itself for `Stat`).
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, including setuid/setgid/sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_secs: i64,
    pub link_target: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    PermissionDenied,
    InvalidInput,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    /// The sandbox's disk limit was reached (ENOSPC or EDQUOT).
    NoSpace,
    UnknownProcess,
    UnknownHandle,
    Other,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::valid_volume_path;

    #[test]
    fn a_volume_path_stays_beneath_its_top() {
        for good in ["", "token", "..data", "..2026_12_06/token", "a/b/c"] {
            assert!(valid_volume_path(good), "{good:?}");
        }
        for bad in ["/etc", "..", "a/../b", "./a", "a//b", "a/", "a\0b"] {
            assert!(!valid_volume_path(bad), "{bad:?}");
        }
    }
}
