//! Sandbox runtimes: how a sandbox's isolation is made. Containers through
//! youki's libcontainer ([`container`]), with the OCI spec built in [`spec`];
//! checkpoints and forks of them through CRIU ([`criu`]); a root owned by
//! host ids is shown under the sandbox's ids by [`idmap`], and so are the
//! separate roots of a pod's containers, made by [`pod_roots`]. [`virt`] says
//! what virtualisation the host offers microVMs; [`microvm`] starts a
//! microVM sandbox's VMM, in the groups [`vm_cgroups`] makes. What a runtime
//! is asked to make is a [`sandbox::SandboxSpec`], under the run dir's
//! [`paths::SandboxPaths`]; [`launch`] is the one entry that starts,
//! checkpoints and destroys a sandbox of any kind. [`traverse`] checks at
//! start that sandboxes' shifted ids can reach their run directory and agent;
//! [`cgroup_dynmods`] spares each create's cgroup move an RCU grace period.

pub mod agent_binary;
pub mod beneath;
pub mod cgroup_dynmods;
pub mod cgroups;
pub mod children;
pub mod container;
pub mod criu;
pub mod fresh_tmpfs;
pub mod guest_volumes;
pub mod idmap;
pub mod launch;
pub mod microvm;
pub mod mount_ns;
pub mod oom_score;
pub mod paths;
pub mod pod_roots;
pub mod procfs_handle;
pub mod sandbox;
pub mod seccomp;
pub mod seccomp_filter;
pub mod seccomp_shared;
pub mod spec;
pub mod subpaths;
pub mod traverse;
pub mod virt;
pub mod vm_cgroups;
pub mod volumes;

pub use launch::{checkpoint, clone_disk, destroy_sandbox, start, CheckpointTarget, RuntimeError};
