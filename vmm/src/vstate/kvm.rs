//! Opening /dev/kvm and checking, before anything is built, that this KVM has
//! what the VMM relies on, so an unusable host fails at once with a reason
//! rather than midway through building a VM.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use kvm_bindings::{CpuId, KVM_API_VERSION, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm};

/// Capabilities the VMM cannot run without.
const REQUIRED_CAPS: [(Cap, &str); 8] = [
    (Cap::Irqchip, "in-kernel irqchip (KVM_CAP_IRQCHIP)"),
    (Cap::UserMemory, "user memory regions (KVM_CAP_USER_MEMORY)"),
    (Cap::SetTssAddr, "TSS address (KVM_CAP_SET_TSS_ADDR)"),
    (Cap::Pit2, "in-kernel PIT (KVM_CAP_PIT2)"),
    (Cap::Irqfd, "irqfd (KVM_CAP_IRQFD)"),
    (
        Cap::ImmediateExit,
        "immediate exit (KVM_CAP_IMMEDIATE_EXIT)",
    ),
    (Cap::ExtCpuid, "KVM_GET_SUPPORTED_CPUID (KVM_CAP_EXT_CPUID)"),
    (Cap::MpState, "MP state (KVM_CAP_MP_STATE)"),
];

/// Why KVM cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// The device node does not exist.
    #[error(
        "{path} does not exist: this host has no KVM. Run on a host with hardware \
         virtualisation (load kvm_intel or kvm_amd) or with the kvm_pvm module loaded"
    )]
    NotFound {
        /// The device path.
        path: PathBuf,
    },
    /// The device node exists but this user may not open it.
    #[error(
        "permission denied opening {path}: run the vmm as a user in the device's group \
         (usually `kvm`) or as root"
    )]
    PermissionDenied {
        /// The device path.
        path: PathBuf,
    },
    /// Opening failed for another reason.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The device path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The device answered with an unexpected API version: not KVM, or too old.
    #[error(
        "{path} reports KVM API version {found}, expected {expected}: it is not a usable KVM device"
    )]
    ApiVersion {
        /// The device path.
        path: PathBuf,
        /// Reported version.
        found: i32,
        /// Expected version.
        expected: u32,
    },
    /// A capability the VMM needs is missing.
    #[error("this host's KVM lacks {0}, which the vmm needs; use a newer host kernel")]
    MissingCap(&'static str),
    /// An inherited KVM descriptor is not open.
    #[error("cannot use --kvm-fd {fd}: {source}; pass a descriptor of /dev/kvm the vmm inherits")]
    Fd {
        /// The descriptor.
        fd: RawFd,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
}

/// An open, checked /dev/kvm and what the VMM needs to know about it.
#[derive(Debug)]
pub struct KvmContext {
    kvm: Kvm,
    max_vcpus: usize,
    supported_cpuid: CpuId,
}

impl KvmContext {
    /// Opens the KVM device at `path` (normally /dev/kvm) and checks it.
    pub fn open(path: &Path) -> Result<Self, KvmError> {
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| KvmError::Open {
            path: path.to_owned(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let kvm = Kvm::new_with_path(c_path).map_err(|e| {
            let source = io::Error::from_raw_os_error(e.errno());
            match source.kind() {
                io::ErrorKind::NotFound => KvmError::NotFound {
                    path: path.to_owned(),
                },
                io::ErrorKind::PermissionDenied => KvmError::PermissionDenied {
                    path: path.to_owned(),
                },
                _ => KvmError::Open {
                    path: path.to_owned(),
                    source,
                },
            }
        })?;
        Self::check(kvm, path)
    }

    /// Uses the inherited KVM descriptor `fd` (duplicated; the caller's
    /// stays open) and checks it like [`KvmContext::open`].
    pub fn from_fd(fd: RawFd) -> Result<Self, KvmError> {
        let owned =
            crate::config::dup_inherited(fd).map_err(|source| KvmError::Fd { fd, source })?;
        // SAFETY: `owned` is a descriptor nothing else owns; `Kvm` takes it
        // over (and closes it on drop). A descriptor that is not KVM is
        // caught by the API version check below.
        let kvm = unsafe { Kvm::from_raw_fd(owned.into_raw_fd()) };
        Self::check(kvm, &PathBuf::from(format!("--kvm-fd {fd}")))
    }

    /// Checks the API version and capabilities; `path` names the device in
    /// errors.
    fn check(kvm: Kvm, path: &Path) -> Result<Self, KvmError> {
        let found = kvm.get_api_version();
        if u32::try_from(found) != Ok(KVM_API_VERSION) {
            return Err(KvmError::ApiVersion {
                path: path.to_owned(),
                found,
                expected: KVM_API_VERSION,
            });
        }
        for (cap, what) in REQUIRED_CAPS {
            if !kvm.check_extension(cap) {
                return Err(KvmError::MissingCap(what));
            }
        }
        let mut supported_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(KvmError::SupportedCpuid)?;
        if kvm.check_extension(Cap::TscDeadlineTimer) {
            crate::arch::cpuid::offer_tsc_deadline_timer(&mut supported_cpuid);
        }
        let max_vcpus = kvm.get_max_vcpus();
        Ok(KvmContext {
            kvm,
            max_vcpus,
            supported_cpuid,
        })
    }

    /// The KVM handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// Most vCPUs one VM may have on this host.
    pub fn max_vcpus(&self) -> usize {
        self.max_vcpus
    }

    /// CPUID KVM can offer guests on this host.
    pub fn supported_cpuid(&self) -> &CpuId {
        &self.supported_cpuid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_is_reported_as_such() {
        let err = KvmContext::open(Path::new("/nonexistent/kvm")).unwrap_err();
        assert!(matches!(err, KvmError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("kvm_pvm"));
    }

    #[test]
    fn non_kvm_device_is_refused() {
        // /dev/null opens but answers the KVM ioctl with an error.
        let err = KvmContext::open(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(err, KvmError::ApiVersion { .. }), "{err}");
    }
}
