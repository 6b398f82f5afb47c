//! What a VM is asked to be, and the checks on it that need no KVM: sizes of
//! zero, memory beyond what the host has, command lines that do not fit. These
//! run first, so bad input fails in microseconds with a message saying what to
//! change.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::io::FromRawFd;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::arch::layout::{CMDLINE_MAX_LEN, MAX_VIRTIO_DEVICES, MIN_MEM_MIB};
use crate::devices::serial::DEFAULT_SERIAL_CAP_BYTES;
use crate::devices::virtio::net::tap::{check_name, TapError};
use crate::devices::virtio::net::{Mac, DEFAULT_GUEST_MAC};
use crate::devices::virtio::vsock::{MAX_GUEST_CID, MIN_GUEST_CID};
use crate::vstate::memory::MIB;

/// Where a disk comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskSource {
    /// A file the VMM opens (read-only for a read-only disk).
    Path(PathBuf),
    /// A descriptor the VMM inherited (the daemon opens disks for an
    /// unprivileged VMM); the VMM duplicates it and leaves it open.
    Fd(i32),
    /// No medium yet: a read-only slot of 0 sectors that the control
    /// socket's `attach-disk` fills while the guest runs (a pod's
    /// container roots arrive after boot).
    Empty,
}

impl std::fmt::Display for DiskSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskSource::Path(p) => write!(f, "{}", p.display()),
            DiskSource::Fd(fd) => write!(f, "fd={fd}"),
            DiskSource::Empty => write!(f, "empty"),
        }
    }
}

/// The `--disk` word for an empty slot.
pub const EMPTY_DISK: &str = "empty";

/// A virtio-blk disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// The backing file.
    pub source: DiskSource,
    /// Refuse every write, whatever the guest negotiates.
    pub read_only: bool,
}

impl FromStr for DiskConfig {
    type Err = ConfigError;

    /// `PATH[,ro]`, `fd=N[,ro]` or `empty` (the `--disk` flag's syntax; a
    /// path may not contain a comma). An empty slot is always read-only.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::DiskSpec(s.to_owned());
        if s.split(',').next() == Some(EMPTY_DISK) {
            // A slot is read-only to the guest; `ro` may be said, `rw` not.
            return match s {
                "empty" | "empty,ro" => Ok(DiskConfig {
                    source: DiskSource::Empty,
                    read_only: true,
                }),
                _ => Err(bad()),
            };
        }
        let mut parts = s.split(',');
        let source = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
        let source = match source.strip_prefix("fd=") {
            Some(n) => DiskSource::Fd(n.parse().ok().filter(|&fd: &i32| fd >= 0).ok_or_else(bad)?),
            None => DiskSource::Path(PathBuf::from(source)),
        };
        let mut read_only = false;
        for opt in parts {
            match opt {
                "ro" => read_only = true,
                "rw" => read_only = false,
                _ => return Err(bad()),
            }
        }
        Ok(DiskConfig { source, read_only })
    }
}

/// The virtio-vsock device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VsockConfig {
    /// The guest's context ID (3 or more).
    pub cid: u64,
    /// The host-side Unix socket (see `devices::virtio::vsock`).
    pub uds_path: PathBuf,
}

/// The virtio-net device: the daemon's persistent tap, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The tap's interface name (in the vmm's network namespace).
    pub tap: String,
    /// The guest's MAC.
    pub mac: Mac,
}

impl FromStr for NetConfig {
    type Err = ConfigError;

    /// `TAP[,mac=xx:xx:xx:xx:xx:xx]` (the `--net` flag's syntax).
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut parts = s.split(',');
        let tap = parts.next().unwrap_or_default().to_owned();
        check_name(&tap)?;
        let mut mac = DEFAULT_GUEST_MAC;
        for opt in parts {
            match opt.strip_prefix("mac=") {
                Some(m) => {
                    mac = m
                        .parse()
                        .map_err(|e: crate::devices::virtio::net::MacError| {
                            ConfigError::NetSpec(e.to_string())
                        })?
                }
                None => {
                    return Err(ConfigError::NetSpec(format!(
                        "unknown option `{opt}` in `{s}`: use --net TAP[,mac=xx:xx:xx:xx:xx:xx]"
                    )))
                }
            }
        }
        Ok(NetConfig { tap, mac })
    }
}

/// Most vCPUs a VM may have: APIC IDs are 8 bits and 0xff is broadcast.
pub const MAX_VCPUS: u8 = 254;

/// A VM's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmConfig {
    /// Kernel to boot: an ELF vmlinux, a bzImage, or the test guest.
    pub kernel: PathBuf,
    /// Read the kernel from this inherited descriptor instead of `kernel`
    /// (a seekable file: the loader reads headers, then segments). The VMM
    /// duplicates it and leaves it open.
    pub kernel_fd: Option<RawFd>,
    /// Initramfs (a cpio archive) for a Linux kernel.
    pub initrd: Option<PathBuf>,
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// Kernel command line.
    pub cmdline: String,
    /// Most serial output bytes kept; the rest is dropped.
    pub serial_cap_bytes: u64,
    /// The KVM device.
    pub kvm_device: PathBuf,
    /// Use this inherited descriptor of the KVM device instead of opening
    /// `kvm_device` (an unprivileged VMM that cannot open /dev/kvm). The VMM
    /// duplicates it and leaves it open.
    pub kvm_fd: Option<RawFd>,
    /// Stop the VM (as an error) if the guest has not finished by then.
    pub timeout: Option<Duration>,
    /// virtio-blk disks, in order (the guest sees them in this order).
    pub disks: Vec<DiskConfig>,
    /// The virtio-vsock device, if any.
    pub vsock: Option<VsockConfig>,
    /// The virtio-net device, if any.
    pub net: Option<NetConfig>,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            kernel: PathBuf::new(),
            kernel_fd: None,
            initrd: None,
            mem_mib: 128,
            vcpus: 1,
            cmdline: String::new(),
            serial_cap_bytes: DEFAULT_SERIAL_CAP_BYTES,
            kvm_device: PathBuf::from("/dev/kvm"),
            kvm_fd: None,
            timeout: None,
            disks: Vec::new(),
            vsock: None,
            net: None,
        }
    }
}

/// Configuration errors: each says which setting to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No kernel given.
    #[error("no kernel image given: pass --kernel PATH or --kernel-fd N")]
    NoKernel,
    /// A negative descriptor number.
    #[error(
        "descriptor {fd} given for {what} is negative: pass the number of an inherited descriptor"
    )]
    NegativeFd {
        /// The flag.
        what: &'static str,
        /// Its value.
        fd: RawFd,
    },
    /// Memory below the minimum (zero included).
    #[error("guest memory of {mib} MiB is too small: --mem-mib must be at least {min}")]
    MemTooSmall {
        /// Requested.
        mib: u64,
        /// Minimum.
        min: u64,
    },
    /// More memory than the host has.
    #[error(
        "guest memory of {mib} MiB exceeds this host's {host_mib} MiB of RAM: lower --mem-mib"
    )]
    MemExceedsHost {
        /// Requested.
        mib: u64,
        /// Host RAM.
        host_mib: u64,
    },
    /// The host's RAM size could not be read.
    #[error("cannot read the host's RAM size (sysinfo): {0}")]
    HostMem(#[source] io::Error),
    /// Zero vCPUs.
    #[error("a VM needs at least one vCPU: --vcpus must be 1 or more")]
    NoVcpus,
    /// More vCPUs than the VMM or the host's KVM allows.
    #[error("{vcpus} vCPUs requested, but at most {max} are possible here: lower --vcpus")]
    TooManyVcpus {
        /// Requested.
        vcpus: u8,
        /// Limit.
        max: usize,
    },
    /// Command line too long.
    #[error("kernel command line is {len} bytes, the limit is {max}: shorten --cmdline")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Command line contains a NUL byte, which would end it early.
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    /// A `--disk` value that does not parse.
    #[error("bad disk `{0}`: use --disk PATH[,ro], --disk fd=N[,ro] or --disk empty")]
    DiskSpec(String),
    /// More virtio devices than the machine has slots for.
    #[error(
        "{count} virtio devices requested (disks plus vsock and net), at most {max} fit: \
         use fewer --disk flags"
    )]
    TooManyDevices {
        /// Requested.
        count: usize,
        /// Limit.
        max: usize,
    },
    /// A reserved or out-of-range vsock CID.
    #[error(
        "vsock CID {0} is invalid: --vsock-cid must be between {MIN_GUEST_CID} and {MAX_GUEST_CID}"
    )]
    VsockCid(u64),
    /// A bad `--net` tap name.
    #[error(transparent)]
    NetTap(#[from] TapError),
    /// A bad `--net` value.
    #[error("bad --net value: {0}")]
    NetSpec(String),
}

/// This host's RAM in MiB.
pub fn host_ram_mib() -> Result<u64, ConfigError> {
    // SAFETY: `sysinfo` is plain old data; all-zero is a valid value.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable `sysinfo` for the call to fill.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return Err(ConfigError::HostMem(io::Error::last_os_error()));
    }
    // `totalram` is a c_ulong, i.e. u64 on the 64-bit hosts this crate builds for.
    Ok(info.totalram.saturating_mul(u64::from(info.mem_unit)) / MIB)
}

impl VmConfig {
    /// Checks everything that can be checked without KVM or the kernel file.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kernel.as_os_str().is_empty() && self.kernel_fd.is_none() {
            return Err(ConfigError::NoKernel);
        }
        for (what, fd) in [("--kernel-fd", self.kernel_fd), ("--kvm-fd", self.kvm_fd)] {
            if let Some(fd) = fd.filter(|&fd| fd < 0) {
                return Err(ConfigError::NegativeFd { what, fd });
            }
        }
        if self.mem_mib < MIN_MEM_MIB {
            return Err(ConfigError::MemTooSmall {
                mib: self.mem_mib,
                min: MIN_MEM_MIB,
            });
        }
        let host_mib = host_ram_mib()?;
        if self.mem_mib > host_mib {
            return Err(ConfigError::MemExceedsHost {
                mib: self.mem_mib,
                host_mib,
            });
        }
        if self.vcpus == 0 {
            return Err(ConfigError::NoVcpus);
        }
        if self.vcpus > MAX_VCPUS {
            return Err(ConfigError::TooManyVcpus {
                vcpus: self.vcpus,
                max: usize::from(MAX_VCPUS),
            });
        }
        if self.cmdline.len() > CMDLINE_MAX_LEN {
            return Err(ConfigError::CmdlineTooLong {
                len: self.cmdline.len(),
                max: CMDLINE_MAX_LEN,
            });
        }
        if self.cmdline.contains('\0') {
            return Err(ConfigError::CmdlineNul);
        }
        let count =
            self.disks.len() + usize::from(self.vsock.is_some()) + usize::from(self.net.is_some());
        if count > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::TooManyDevices {
                count,
                max: MAX_VIRTIO_DEVICES,
            });
        }
        if let Some(v) = &self.vsock {
            if !(MIN_GUEST_CID..=MAX_GUEST_CID).contains(&v.cid) {
                return Err(ConfigError::VsockCid(v.cid));
            }
        }
        if let Some(n) = &self.net {
            check_name(&n.tap)?;
        }
        Ok(())
    }
}

/// Duplicates the inherited descriptor `fd` (close-on-exec), so the VMM owns
/// its copy and the caller's stays open; fails with EBADF if `fd` is not open.
pub fn dup_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` (an invalid one fails with
    // EBADF) and returns a new descriptor or -1.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> VmConfig {
        VmConfig {
            kernel: PathBuf::from("/some/vmlinux"),
            mem_mib: 64,
            ..Default::default()
        }
    }

    #[test]
    fn accepts_a_sane_config() {
        config().validate().expect("valid");
    }

    #[test]
    fn refuses_absurd_sizes() {
        let check = |c: VmConfig| c.validate().unwrap_err();
        assert!(matches!(
            check(VmConfig {
                mem_mib: 0,
                ..config()
            }),
            ConfigError::MemTooSmall { mib: 0, .. }
        ));
        let err = check(VmConfig {
            mem_mib: u64::MAX / MIB,
            ..config()
        });
        assert!(matches!(err, ConfigError::MemExceedsHost { .. }), "{err}");
        assert!(err.to_string().contains("--mem-mib"));
        assert!(matches!(
            check(VmConfig {
                vcpus: 0,
                ..config()
            }),
            ConfigError::NoVcpus
        ));
        assert!(matches!(
            check(VmConfig {
                vcpus: 255,
                ..config()
            }),
            ConfigError::TooManyVcpus { .. }
        ));
        assert!(matches!(
            check(VmConfig {
                kernel: PathBuf::new(),
                ..config()
            }),
            ConfigError::NoKernel
        ));
        assert!(matches!(
            check(VmConfig {
                cmdline: "x".repeat(CMDLINE_MAX_LEN + 1),
                ..config()
            }),
            ConfigError::CmdlineTooLong { .. }
        ));
        assert!(matches!(
            check(VmConfig {
                cmdline: "a\0b".into(),
                ..config()
            }),
            ConfigError::CmdlineNul
        ));
        assert!(matches!(
            check(VmConfig {
                disks: vec!["/d".parse().expect("disk"); MAX_VIRTIO_DEVICES + 1],
                ..config()
            }),
            ConfigError::TooManyDevices { count: 20, max: 19 }
        ));
        VmConfig {
            disks: vec!["/d".parse().expect("disk"); MAX_VIRTIO_DEVICES],
            ..config()
        }
        .validate()
        .expect("as many devices as IOAPIC pins from the first free one");
        assert!(matches!(
            check(VmConfig {
                vsock: Some(VsockConfig {
                    cid: 2,
                    uds_path: "/tmp/v.sock".into()
                }),
                ..config()
            }),
            ConfigError::VsockCid(2)
        ));
    }

    #[test]
    fn disk_flags_parse() {
        let d: DiskConfig = "/img/base.ext4,ro".parse().expect("parse");
        assert_eq!(d.source, DiskSource::Path("/img/base.ext4".into()));
        assert!(d.read_only);
        let d: DiskConfig = "scratch.img".parse().expect("parse");
        assert!(!d.read_only);
        let d: DiskConfig = "fd=3,ro".parse().expect("parse");
        assert_eq!(d.source, DiskSource::Fd(3));
        assert_eq!(d.source.to_string(), "fd=3");
        for slot in ["empty", "empty,ro"] {
            let d: DiskConfig = slot.parse().expect("parse");
            assert_eq!((d.source, d.read_only), (DiskSource::Empty, true), "{slot}");
        }
        let d: DiskConfig = "./empty".parse().expect("parse");
        assert_eq!(d.source, DiskSource::Path("./empty".into()));
        for bad in ["", ",ro", "x,rx", "fd=-1", "fd=abc", "x,ro,zz", "empty,rw"] {
            let err = bad.parse::<DiskConfig>().unwrap_err();
            assert!(err.to_string().contains("--disk PATH[,ro]"), "{bad}: {err}");
        }
    }
}
