//! The snapshot's `state` file: everything but guest RAM, versioned and
//! checksummed, read with bounds.
//!
//! Layout (little endian):
//!
//! ```text
//! 0   8   magic "SBXVMSNP"
//! 8   4   format version (SNAPSHOT_VERSION)
//! 12  4   reserved, 0
//! 16  8   body length in bytes
//! 24  32  SHA-256 of the body
//! 56  ..  body: SnapshotState as JSON
//! ```
//!
//! A reader checks the file's size against [`MAX_STATE_BYTES`] before
//! reading it, then magic, version, length and checksum before parsing, and
//! the parsed state's own limits (vCPU and device counts, memory layout)
//! before anything is built from it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::memory::MemoryLayout;
use crate::arch::layout::MAX_VIRTIO_DEVICES;
use crate::config::MAX_VCPUS;
use crate::devices::serial::SerialDeviceState;
use crate::devices::virtio::persist::VirtioMmioState;
use crate::vstate::vcpu::VcpuState;
use crate::vstate::vm::VmState;

/// Version of the snapshot format (header and [`SnapshotState`]).
pub const SNAPSHOT_VERSION: u32 = 1;
/// First bytes of a state file.
pub const MAGIC: [u8; 8] = *b"SBXVMSNP";
/// Header bytes before the body.
pub const HEADER_LEN: usize = 56;
/// Largest state file read. A VM's state is ~15 KiB per vCPU plus a few KiB;
/// 254 vCPUs and 8 devices stay well below.
pub const MAX_STATE_BYTES: u64 = 16 << 20;

/// Why a state file could not be written or read. Messages say whether the
/// file is corrupt, from another vmm, or not a snapshot at all.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// I/O on the file failed.
    #[error("cannot {what} the snapshot state file {path}: {source}")]
    Io {
        /// "read" or "write".
        what: &'static str,
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Larger than any state this vmm writes.
    #[error("the snapshot state file {path} is {size} bytes, more than the {MAX_STATE_BYTES} a snapshot state can be: it is not a snapshot state file")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
    },
    /// Shorter than its header says.
    #[error("the snapshot state file {path} is truncated ({found} bytes, {expected} expected); take a new snapshot")]
    Truncated {
        /// The file.
        path: String,
        /// Bytes present.
        found: u64,
        /// Bytes the header promises.
        expected: u64,
    },
    /// Not a state file.
    #[error("{path} is not a vmm snapshot state file (bad magic)")]
    Magic {
        /// The file.
        path: String,
    },
    /// Written by an incompatible vmm.
    #[error("the snapshot {path} has format version {found}; this vmm reads version {SNAPSHOT_VERSION}: restore it with the vmm that wrote it")]
    Version {
        /// The file.
        path: String,
        /// Version in the file.
        found: u32,
    },
    /// The checksum does not match.
    #[error("the snapshot state file {path} does not match its checksum: it is corrupt; take a new snapshot")]
    Checksum {
        /// The file.
        path: String,
    },
    /// The body is not valid state.
    #[error("the snapshot state file {path} is invalid: {detail}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

/// One virtio device as the machine config lists it, to match the devices
/// a restore is given against the snapshot's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SavedDevice {
    /// A disk.
    Block {
        /// Its GET_ID string.
        id: String,
        /// Read-only.
        read_only: bool,
        /// Capacity in sectors.
        capacity: u64,
    },
    /// The vsock device.
    Vsock {
        /// The guest CID.
        cid: u64,
    },
    /// The net device.
    Net {
        /// The guest MAC.
        mac: crate::devices::virtio::net::Mac,
    },
}

/// What the VM was configured as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedConfig {
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// vCPU count.
    pub vcpus: u8,
    /// The virtio devices, in boot-info order.
    pub devices: Vec<SavedDevice>,
}

/// Everything a restore needs besides guest RAM.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotState {
    /// The machine config.
    pub config: SavedConfig,
    /// The memory file's layout and digest.
    pub memory: MemoryLayout,
    /// Each vCPU, by id.
    pub vcpus: Vec<VcpuState>,
    /// irqchip, PIT, clock.
    pub vm: VmState,
    /// The serial port's registers.
    pub serial: SerialDeviceState,
    /// Each virtio device, in boot-info order.
    pub virtio: Vec<VirtioMmioState>,
}

impl SnapshotState {
    /// Checks the limits a corrupt or hostile state could break, before
    /// anything is built from it.
    pub fn validate(&self) -> Result<(), String> {
        let c = &self.config;
        if c.vcpus == 0 || c.vcpus > MAX_VCPUS || self.vcpus.len() != usize::from(c.vcpus) {
            return Err(format!(
                "{} vCPU states for a VM of {} vCPUs",
                self.vcpus.len(),
                c.vcpus
            ));
        }
        if let Some((i, s)) = self
            .vcpus
            .iter()
            .enumerate()
            .find(|(i, s)| usize::from(s.id) != *i)
        {
            return Err(format!("vCPU state {i} is for vCPU {}", s.id));
        }
        if self.virtio.len() > MAX_VIRTIO_DEVICES || self.virtio.len() != c.devices.len() {
            return Err(format!(
                "{} virtio device states for {} devices (at most {MAX_VIRTIO_DEVICES})",
                self.virtio.len(),
                c.devices.len()
            ));
        }
        self.memory.validate()?;
        let expected = crate::arch::arch_memory_regions(
            c.mem_mib
                .checked_mul(crate::vstate::memory::MIB)
                .ok_or("memory size overflows")?,
        );
        let regions: Vec<(u64, u64)> = self
            .memory
            .regions
            .iter()
            .map(|r| (r.guest_addr, r.len))
            .collect();
        let expected: Vec<(u64, u64)> = expected.iter().map(|(a, l)| (a.0, *l)).collect();
        if regions != expected {
            return Err(format!(
                "memory regions {regions:x?} do not match {} MiB of RAM ({expected:x?})",
                c.mem_mib
            ));
        }
        Ok(())
    }
}

/// Writes `state` to a new file at `path`; returns the bytes written.
pub fn write_state(state: &SnapshotState, path: &Path) -> Result<u64, StateFileError> {
    let io = |source| StateFileError::Io {
        what: "write",
        path: path.display().to_string(),
        source,
    };
    let body = serde_json::to_vec(state).map_err(|e| StateFileError::Invalid {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&body));
    out.extend_from_slice(&body);
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io)?;
    file.write_all(&out).map_err(io)?;
    Ok(out.len() as u64)
}

/// Reads and checks the state file at `path` (see the module docs).
pub fn read_state(path: &Path) -> Result<SnapshotState, StateFileError> {
    let p = || path.display().to_string();
    let io = |source| StateFileError::Io {
        what: "read",
        path: p(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > MAX_STATE_BYTES {
        return Err(StateFileError::TooLarge { path: p(), size });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // `take`: the file may grow between the size check and the read.
    file.take(MAX_STATE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    parse_state(&bytes, &p())
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Checks and parses a state file's bytes; `path` is for messages.
pub fn parse_state(bytes: &[u8], path: &str) -> Result<SnapshotState, StateFileError> {
    let path = path.to_owned();
    if bytes.len() < HEADER_LEN {
        if bytes.len() >= 8 && bytes[..8] != MAGIC {
            return Err(StateFileError::Magic { path });
        }
        return Err(StateFileError::Truncated {
            path,
            found: bytes.len() as u64,
            expected: HEADER_LEN as u64,
        });
    }
    if field::<8>(bytes, 0) != MAGIC {
        return Err(StateFileError::Magic { path });
    }
    let version = u32::from_le_bytes(field(bytes, 8));
    if version != SNAPSHOT_VERSION {
        return Err(StateFileError::Version {
            path,
            found: version,
        });
    }
    let body_len = u64::from_le_bytes(field(bytes, 16));
    let found = bytes.len() as u64;
    let expected = (HEADER_LEN as u64).saturating_add(body_len);
    if found != expected {
        return Err(StateFileError::Truncated {
            path,
            found,
            expected,
        });
    }
    let body = &bytes[HEADER_LEN..];
    if Sha256::digest(body).as_slice() != &bytes[24..56] || field::<4>(bytes, 12) != [0; 4] {
        return Err(StateFileError::Checksum { path });
    }
    // serde_json bounds nesting (128 levels) and the body is at most
    // MAX_STATE_BYTES, so parsing is bounded in time and memory.
    let state: SnapshotState =
        serde_json::from_slice(body).map_err(|e| StateFileError::Invalid {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    state
        .validate()
        .map_err(|detail| StateFileError::Invalid { path, detail })?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::memory::{Run, SavedRegion};
    use crate::vstate::vcpu::VCPU_STATE_VERSION;
    use crate::vstate::vm::VM_STATE_VERSION;

    fn vcpu(id: u8) -> VcpuState {
        VcpuState {
            version: VCPU_STATE_VERSION,
            id,
            cpuid: Vec::new(),
            mp_state: Default::default(),
            regs: kvm_bindings::kvm_regs {
                rip: 0x10_0000 + u64::from(id),
                ..Default::default()
            },
            sregs: Default::default(),
            xsave: Default::default(),
            xcrs: Default::default(),
            debug_regs: Default::default(),
            lapic: Default::default(),
            msrs: Vec::new(),
            vcpu_events: Default::default(),
        }
    }

    fn state() -> SnapshotState {
        SnapshotState {
            config: SavedConfig {
                mem_mib: 4,
                vcpus: 2,
                devices: Vec::new(),
            },
            memory: MemoryLayout {
                regions: vec![SavedRegion {
                    guest_addr: 0,
                    len: 4 << 20,
                    file_offset: 0,
                }],
                file_len: 4 << 20,
                runs: vec![Run {
                    offset: 0x10_0000,
                    len: 0x1000,
                }],
                sha256: "ab".repeat(32),
            },
            vcpus: vec![vcpu(0), vcpu(1)],
            vm: VmState {
                version: VM_STATE_VERSION,
                irqchips: Vec::new(),
                pit: Default::default(),
                clock: kvm_bindings::kvm_clock_data {
                    clock: 12345,
                    ..Default::default()
                },
            },
            serial: SerialDeviceState::default(),
            virtio: Vec::new(),
        }
    }

    fn bytes_of(s: &SnapshotState) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "vmm-state-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("dir");
        let path = dir.join("state");
        let n = write_state(s, &path).expect("write");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(n, bytes.len() as u64);
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    }

    #[test]
    fn state_round_trips() {
        let bytes = bytes_of(&state());
        let back = parse_state(&bytes, "s").expect("parse");
        assert_eq!(back.config, state().config);
        assert_eq!(back.memory, state().memory);
        assert_eq!(back.vcpus[1].regs.rip, 0x10_0001);
        assert_eq!(back.vm.clock.clock, 12345);
    }

    #[test]
    fn corrupt_truncated_and_foreign_state_is_refused() {
        let good = bytes_of(&state());
        let mut flipped = good.clone();
        let mid = HEADER_LEN + (good.len() - HEADER_LEN) / 2;
        flipped[mid] ^= 1;
        assert!(matches!(
            parse_state(&flipped, "s"),
            Err(StateFileError::Checksum { .. })
        ));
        for len in [0, 7, 20, HEADER_LEN, good.len() - 1] {
            assert!(
                matches!(
                    parse_state(&good[..len], "s"),
                    Err(StateFileError::Truncated { .. })
                ),
                "length {len}"
            );
        }
        let mut longer = good.clone();
        longer.push(b' ');
        assert!(matches!(
            parse_state(&longer, "s"),
            Err(StateFileError::Truncated { .. })
        ));
        let mut version = good.clone();
        version[8] = 2;
        let err = parse_state(&version, "s").expect_err("version");
        assert!(err.to_string().contains("format version 2"), "{err}");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(matches!(
            parse_state(&magic, "s"),
            Err(StateFileError::Magic { .. })
        ));
        // A huge length in the header is a truncation, not an allocation.
        let mut huge = good;
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            parse_state(&huge, "s"),
            Err(StateFileError::Truncated { .. })
        ));
    }

    #[test]
    fn state_that_breaks_limits_is_refused_after_its_checksum() {
        let mut s = state();
        s.vcpus.pop();
        let err = parse_state(&bytes_of(&s), "s").expect_err("vcpu count");
        assert!(matches!(err, StateFileError::Invalid { .. }), "{err}");
        let mut s = state();
        s.config.mem_mib = 8;
        let err = parse_state(&bytes_of(&s), "s").expect_err("regions");
        assert!(err.to_string().contains("do not match 8 MiB"), "{err}");
        let mut s = state();
        s.memory.runs[0].len = 64 << 20;
        assert!(parse_state(&bytes_of(&s), "s").is_err());
    }

    #[test]
    fn oversized_state_file_is_refused_before_reading() {
        let dir = std::env::temp_dir().join(format!("vmm-state-big-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("dir");
        let path = dir.join("state");
        let f = File::create(&path).expect("create");
        // Sparse: costs no disk.
        f.set_len(MAX_STATE_BYTES + 1).expect("grow");
        assert!(matches!(
            read_state(&path),
            Err(StateFileError::TooLarge { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
