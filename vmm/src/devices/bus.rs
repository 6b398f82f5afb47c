//! Address-range routing of guest port I/O and MMIO to devices. One `Bus` per
//! address space; vCPU threads share it, each device behind its own lock so
//! two vCPUs only contend when they touch the same device. Accesses no device
//! claims behave like an empty bus on hardware: reads return all ones, writes
//! are dropped; they are counted so a report can show them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A device on a bus. Offsets are relative to the device's base address.
pub trait BusDevice: Send {
    /// Fills `data` with the device's answer to a read at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handles a write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors inserting a device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or wraps around the address space.
    #[error("invalid bus range base={base:#x} len={len:#x}")]
    InvalidRange {
        /// Base address.
        base: u64,
        /// Length.
        len: u64,
    },
    /// The range overlaps a device already on the bus.
    #[error("bus range base={base:#x} len={len:#x} overlaps another device")]
    Overlap {
        /// Base address.
        base: u64,
        /// Length.
        len: u64,
    },
}

struct BusRange {
    base: u64,
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Devices by address range, plus a count of accesses none of them claimed.
#[derive(Default)]
pub struct Bus {
    ranges: Vec<BusRange>,
    unhandled: AtomicU64,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field(
                "ranges",
                &self
                    .ranges
                    .iter()
                    .map(|r| (r.base, r.len))
                    .collect::<Vec<_>>(),
            )
            .field("unhandled", &self.unhandled)
            .finish()
    }
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::InvalidRange { base, len })?;
        if self
            .ranges
            .iter()
            .any(|r| base < r.base + r.len && r.base < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        self.ranges.push(BusRange { base, len, device });
        self.ranges.sort_by_key(|r| r.base);
        Ok(())
    }

    /// The device whose range holds the whole access `[addr, addr + size)`,
    /// and the offset of `addr` in it.
    fn find(&self, addr: u64, size: usize) -> Option<(&BusRange, u64)> {
        let idx = self
            .ranges
            .partition_point(|r| r.base <= addr)
            .checked_sub(1)?;
        let range = &self.ranges[idx];
        let offset = addr - range.base;
        let end = offset.checked_add(size as u64)?;
        (end <= range.len).then_some((range, offset))
    }

    /// Routes a read; returns whether a device handled it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((range, offset)) => {
                // A device that panicked mid-access may be inconsistent, but
                // the vCPU that panicked has already stopped the VM; serving
                // the others' last accesses is harmless.
                let mut device = range.device.lock().unwrap_or_else(PoisonError::into_inner);
                device.read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                self.unhandled.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Routes a write; returns whether a device handled it.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((range, offset)) => {
                let mut device = range.device.lock().unwrap_or_else(PoisonError::into_inner);
                device.write(offset, data);
                true
            }
            None => {
                self.unhandled.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Accesses no device claimed so far.
    pub fn unhandled_accesses(&self) -> u64 {
        self.unhandled.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_range_and_counts_the_rest() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new();
        bus.insert(dev.clone(), 0x3f8, 8).expect("insert");
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fa, &mut data));
        assert_eq!(data, [2]);
        assert!(bus.write(0x3ff, &[7]));
        assert_eq!(dev.lock().expect("lock").last_write, Some((7, vec![7])));
        // Outside, or straddling the end: unhandled.
        assert!(!bus.read(0x400, &mut data));
        assert_eq!(data, [0xff]);
        assert!(!bus.write(0x3ff, &[1, 2]));
        assert!(!bus.write(0x3f7, &[1]));
        assert_eq!(bus.unhandled_accesses(), 3);
    }

    #[test]
    fn refuses_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Recorder::default())), 0x60, 5)
            .expect("insert");
        let other = Arc::new(Mutex::new(Recorder::default()));
        assert_eq!(
            bus.insert(other.clone(), 0x64, 1),
            Err(BusError::Overlap { base: 0x64, len: 1 })
        );
        assert!(matches!(
            bus.insert(other.clone(), 0x70, 0),
            Err(BusError::InvalidRange { .. })
        ));
        assert!(matches!(
            bus.insert(other, u64::MAX, 2),
            Err(BusError::InvalidRange { .. })
        ));
    }
}
