//! Sandbox runtimes: how a sandbox's isolation is made. Containers through
//! youki's libcontainer ([`container`]), with the OCI spec built in [`spec`];
//! checkpoints and forks of them through CRIU ([`criu`]). [`virt`] says
//! what virtualisation the host offers microVMs; [`microvm`] starts a
//! microVM sandbox's VMM, in the groups [`vm_cgroups`] makes. [`traverse`]
//! checks at start that sandboxes' shifted ids can reach their run directory
//! and agent.

pub mod agent_binary;
pub mod cgroups;
pub mod container;
pub mod criu;
pub mod microvm;
pub mod reaped;
pub mod seccomp;
pub mod spec;
pub mod traverse;
pub mod virt;
pub mod vm_cgroups;
