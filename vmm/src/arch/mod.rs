//! Architecture-specific machine setup: memory layout, boot page tables, GDT,
//! CPUID, MSRs and the boot vCPU registers. Only x86_64 exists; the rest of
//! the crate reaches the architecture through the re-exports below.

#[cfg(target_arch = "x86_64")]
pub mod x86_64;

#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the vmm crate only supports x86_64 hosts");
