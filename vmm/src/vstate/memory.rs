//! Guest RAM: anonymous, MAP_NORESERVE host mappings laid out by the
//! architecture's memory map. Pages are only backed when the guest touches
//! them, so the size is a ceiling, not an up-front cost.

use vm_memory::mmap::FromRangesError;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::arch;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// Why guest memory could not be created.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The size does not fit this host's address space.
    #[error("guest memory of {mib} MiB does not fit this host's address space")]
    TooLarge {
        /// Requested size.
        mib: u64,
    },
    /// Mapping the memory failed.
    #[error("cannot map {mib} MiB of guest memory: {source}")]
    Mmap {
        /// Requested size.
        mib: u64,
        /// The mapping error.
        #[source]
        source: FromRangesError,
    },
}

/// Maps `mem_mib` MiB of guest RAM. Size limits (zero, host RAM) are the
/// caller's: see `VmConfig::validate`.
pub fn create_guest_memory(mem_mib: u64) -> Result<GuestMemoryMmap, MemoryError> {
    let bytes = mem_mib
        .checked_mul(MIB)
        .ok_or(MemoryError::TooLarge { mib: mem_mib })?;
    let ranges = arch::arch_memory_regions(bytes)
        .into_iter()
        .map(|(start, len)| {
            usize::try_from(len)
                .map(|len| (start, len))
                .map_err(|_| MemoryError::TooLarge { mib: mem_mib })
        })
        .collect::<Result<Vec<(GuestAddress, usize)>, _>>()?;
    GuestMemoryMmap::from_ranges(&ranges).map_err(|source| MemoryError::Mmap {
        mib: mem_mib,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn creates_the_requested_size() {
        let mem = create_guest_memory(4).expect("4 MiB");
        let total: u64 = mem.iter().map(vm_memory::GuestMemoryRegion::len).sum();
        assert_eq!(total, 4 * MIB);
        mem.write_obj(0xabu8, GuestAddress(4 * MIB - 1))
            .expect("last byte is RAM");
        assert!(mem.write_obj(0xabu8, GuestAddress(4 * MIB)).is_err());
    }

    #[test]
    fn overflowing_size_is_refused() {
        assert!(matches!(
            create_guest_memory(u64::MAX),
            Err(MemoryError::TooLarge { .. })
        ));
    }
}
