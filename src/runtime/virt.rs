//! What hardware virtualisation this host offers microVMs, found once at
//! start: `/dev/kvm` from VMX or SVM runs any guest kernel; from `kvm_pvm`
//! (a host that is itself a VM without nested VMX) only guest kernels built
//! for PVM run, and stock ones fail in KVM's instruction emulator.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Virtualization {
    /// Intel VT-x or AMD-V under KVM.
    Hardware,
    /// KVM from the `kvm_pvm` module: PVM guest kernels only.
    Pvm,
    /// No usable `/dev/kvm`.
    None,
}

impl Virtualization {
    /// Looks at `/dev/kvm`, the loaded KVM modules and the CPU flags.
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Self::from_facts(
            Path::new("/dev/kvm").exists(),
            Path::new("/sys/module/kvm_pvm").exists(),
            &cpuinfo,
        )
    }

    fn from_facts(dev_kvm: bool, pvm_module: bool, cpuinfo: &str) -> Self {
        if !dev_kvm {
            return Virtualization::None;
        }
        let hardware = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
        match (hardware, pvm_module) {
            (true, _) => Virtualization::Hardware,
            (false, true) => Virtualization::Pvm,
            // /dev/kvm without VMX/SVM or PVM: nothing that boots a guest.
            (false, false) => Virtualization::None,
        }
    }

    /// Why a microVM cannot run here, in the user's terms.
    pub fn explain(self) -> &'static str {
        match self {
            Virtualization::Hardware => "this host has hardware virtualisation (VMX/SVM)",
            Virtualization::Pvm => {
                "this host's /dev/kvm comes from kvm_pvm (no VMX/SVM): only a PVM-enabled guest kernel would run"
            }
            Virtualization::None => "this host has no usable /dev/kvm",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_follows_the_facts() {
        let vmx = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n";
        let plain = "flags\t\t: fpu vme hypervisor sse\n";
        assert_eq!(
            Virtualization::from_facts(true, false, vmx),
            Virtualization::Hardware
        );
        assert_eq!(
            Virtualization::from_facts(true, true, plain),
            Virtualization::Pvm
        );
        assert_eq!(
            Virtualization::from_facts(true, false, plain),
            Virtualization::None
        );
        assert_eq!(
            Virtualization::from_facts(false, true, vmx),
            Virtualization::None
        );
    }
}
