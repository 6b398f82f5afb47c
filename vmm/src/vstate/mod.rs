//! KVM state of a VM: the /dev/kvm handle and what it supports, guest memory,
//! the VM (irqchip, PIT, memory slots) and its vCPUs (registers, saved state,
//! run loop, pausing).

pub mod kvm;
pub mod memory;
pub mod pause;
pub mod vcpu;
pub mod vm;
