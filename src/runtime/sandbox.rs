//! A sandbox as the runtimes see it: what to make ([`SandboxSpec`], whose
//! [`RuntimeSpec`] says which runtime makes it), what a checkpoint recorded
//! for its forks ([`Checkpoint`]), and what a start made ([`Started`]).
//! Plain data, decided by the daemon and carried to the supervisor in
//! `shim.json`; the runtimes read it and nothing here reads them.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything a runtime needs to make one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub id: String,
    pub hostname: String,
    pub image_rootfs: PathBuf,
    /// Read-only layers above the image (snapshots' writes), top first.
    #[serde(default)]
    pub image_layers: Vec<PathBuf>,
    /// The btrfs subvolume holding `upper/` and `work/`.
    pub layer_dir: PathBuf,
    pub agent_path: PathBuf,
    pub cgroups_path: String,
    pub cpu: f64,
    /// CPU weight in cgroup v1 shares; `None` leaves the kernel's default.
    #[serde(default)]
    pub cpu_shares: Option<u64>,
    pub memory_bytes: u64,
    pub pids: i64,
    pub id_map_base: u32,
    pub id_map_size: u32,
    pub shm_bytes: u64,
    pub nofile: u64,
    /// The environment every process starts with (sandbox defaults + create env).
    pub env: Vec<(String, String)>,
    /// Where processes start unless they say (the image's `WorkingDir`).
    #[serde(default)]
    pub default_cwd: Option<String>,
    /// How long the start may wait for the agent (a microVM's to connect;
    /// the supervisor's for its first answer).
    pub ready_timeout_ms: u64,
    /// Extra device nodes, files and masks (a GPU sandbox's).
    #[serde(default)]
    pub devices: crate::gpu::DeviceGrant,
    /// Which runtime makes the sandbox, and from what.
    pub kind: RuntimeSpec,
    /// The run directory came with its network namespace made, with
    /// interfaces and rules (a network slot): only the egress sockets (and
    /// a microVM's tap) are left to make.
    #[serde(default)]
    pub netns_ready: bool,
    /// The image and its layers are owned by host ids (a root filesystem
    /// containerd unpacked), not by the shifted range: the container's
    /// root mounts them idmapped. Containers only.
    #[serde(default)]
    pub host_owned_image: bool,
    /// A CRI pod's network namespace (CNI made it) to use instead of one
    /// of the sandbox's own. Containers only.
    #[serde(default)]
    pub joined_netns: Option<PathBuf>,
    /// Host files and directories bound into the root
    /// (`runtime::volumes`); a microVM's are copied into its guest
    /// (`runtime::guest_volumes`).
    #[serde(default)]
    pub volumes: Vec<crate::model::HostVolume>,
}

/// Which runtime makes a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeSpec {
    /// A fresh container (youki's libcontainer).
    Container,
    /// A fork of a container: its checkpoint restored by CRIU.
    ContainerRestore(RestoreSpec),
    /// A microVM, booted or (a fork) restored from a memory snapshot.
    Vm(VmSpec),
}

/// How a sandbox's agent comes up on its link, which tells the supervisor
/// how to know it is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStart {
    /// A new agent: it sends Hello.
    Fresh,
    /// A restored container's agent: it sends no Hello and must answer instead.
    Restored,
    /// A microVM fork's agent: it sends Hello, but the guest left the
    /// snapshot with the source's RNG state and wall time, so it is ready
    /// only once it has taken fresh ones.
    RestoredVm,
}

/// Who holds and kills a sandbox's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessControl {
    /// The host: each process gets its own cgroup, killed there, so a
    /// hostile or wedged agent cannot keep a process alive.
    HostCgroups,
    /// The guest: a microVM's processes live behind its kernel, where no
    /// host cgroup can hold them; its agent kills them.
    GuestAgent,
}

impl RuntimeSpec {
    pub fn agent_start(&self) -> AgentStart {
        match self {
            RuntimeSpec::Container => AgentStart::Fresh,
            RuntimeSpec::ContainerRestore(_) => AgentStart::Restored,
            RuntimeSpec::Vm(vm) if vm.restore.is_some() => AgentStart::RestoredVm,
            RuntimeSpec::Vm(_) => AgentStart::Fresh,
        }
    }

    pub fn process_control(&self) -> ProcessControl {
        match self {
            RuntimeSpec::Container | RuntimeSpec::ContainerRestore(_) => {
                ProcessControl::HostCgroups
            }
            RuntimeSpec::Vm(_) => ProcessControl::GuestAgent,
        }
    }

    /// A fork's first process id: the source's next one, since the agent
    /// still knows the source's processes by theirs.
    pub fn next_proc(&self) -> Option<u64> {
        match self {
            RuntimeSpec::Container => None,
            RuntimeSpec::ContainerRestore(r) => Some(r.next_proc),
            RuntimeSpec::Vm(vm) => vm.restore.as_ref().map(|r| r.next_proc),
        }
    }

    /// The processes a fork inherits running from its checkpoint.
    pub fn inherited_processes(&self) -> &[crate::model::Process] {
        match self {
            RuntimeSpec::ContainerRestore(r) => &r.processes,
            RuntimeSpec::Container | RuntimeSpec::Vm(_) => &[],
        }
    }
}

/// What a checkpoint records for its restores (empty for a microVM's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Inode of the agent's end of the link, as CRIU names the external
    /// socket (`socket:[inode]`).
    pub link_inode: u64,
    /// Mount points of the file bind mounts marked external.
    pub external_mounts: Vec<String>,
    /// Mount points of the empty read-only directory mounts (placeholders)
    /// marked external (none in checkpoints made before they were).
    #[serde(default)]
    pub empty_mounts: Vec<String>,
    /// The small tmpfs mounts (`/dev`, an unused `/dev/shm`) marked
    /// external and made afresh in a fork (none in older checkpoints).
    #[serde(default)]
    pub fresh_tmpfs: Vec<super::fresh_tmpfs::FreshTmpfs>,
}

/// What a fork's supervisor needs to restore a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreSpec {
    pub criu: PathBuf,
    pub images_dir: PathBuf,
    pub checkpoint: Checkpoint,
    /// The source supervisor's next process id: the fork continues above
    /// it, since the agent still knows the source's processes by theirs.
    pub next_proc: u64,
    /// The processes running at the checkpoint: they run on in the fork,
    /// whose supervisor lists them (with output from the restore on).
    #[serde(default)]
    pub processes: Vec<crate::model::Process>,
}

/// What the daemon decided about a microVM.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VmSpec {
    pub vmm_path: PathBuf,
    pub kernel: PathBuf,
    pub cmdline: String,
    pub vcpus: u8,
    pub mem_mib: u64,
    /// Memory the cgroup allows beyond guest RAM, for the VMM itself.
    pub overhead_bytes: u64,
    /// The image as a read-only ext4 file, shared by every VM of the image
    /// (`/dev/vda`).
    pub base_disk: PathBuf,
    /// The read-only disk holding the agent, the guest kernel's root
    /// (`/dev/vdc`; the scratch disk is `/dev/vdb`).
    pub agent_disk: PathBuf,
    /// Size of the sandbox's writable scratch disk.
    pub scratch_bytes: u64,
    /// Set for a fork: restore this memory snapshot instead of booting.
    #[serde(default)]
    pub restore: Option<VmRestore>,
    /// Start from a clone of this disk (a filesystem snapshot's) instead of
    /// an empty scratch disk.
    #[serde(default)]
    pub scratch_from: Option<PathBuf>,
    /// The uid and gid the VMM drops to once the VM is built, chrooted in
    /// the VM's run directory.
    pub uid: u32,
    /// Empty disk slots after the agent disk (`/dev/vdd` on), for the
    /// roots of a pod's containers, which arrive after boot.
    #[serde(default)]
    pub root_slots: u8,
}

/// A microVM memory snapshot a fork starts from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VmRestore {
    /// The VMM's snapshot directory (`memory`, `state`).
    pub dir: PathBuf,
    /// The scratch disk as it was at the snapshot (the fork gets a
    /// copy-on-write clone of it).
    pub scratch: PathBuf,
    /// The source supervisor's next process id.
    pub next_proc: u64,
}

/// A started sandbox: its init (the agent, or a microVM's VMM), the host end
/// of its link, and how long each phase of the start took (for the
/// create-latency breakdown).
pub struct Started {
    pub init_pid: i32,
    pub link: OwnedFd,
    /// The egress proxy's and DNS server's sockets, inside the sandbox's
    /// namespace, for the supervisor to serve.
    pub egress: crate::net::proxy::Sockets,
    pub phases: Vec<(&'static str, Duration)>,
}

/// A start's phases, timed lap by lap (see [`Started::phases`]).
pub struct Laps {
    clock: std::time::Instant,
    pub phases: Vec<(&'static str, Duration)>,
}

impl Laps {
    pub fn start() -> Laps {
        Laps {
            clock: std::time::Instant::now(),
            phases: Vec::new(),
        }
    }

    /// Ends the phase `name` now.
    pub fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.phases.push((name, now - self.clock));
        self.clock = now;
    }

    /// Counts the time since the last lap into that lap's phase.
    pub fn extend_last(&mut self) {
        let now = std::time::Instant::now();
        if let Some((_, took)) = self.phases.last_mut() {
            *took += now - self.clock;
        }
        self.clock = now;
    }
}
