//! The exit port: a one-byte write to port 0xf4 stops the VM with that byte as
//! the guest's exit code (the port QEMU's isa-debug-exit uses by default, but
//! the value is passed through unchanged). Test guests use it; a Linux guest
//! ends through reset or poweroff instead.

use std::sync::Arc;

use super::bus::BusDevice;
use crate::stop::{StopLatch, StopReason};

/// The port.
pub const EXIT_PORT: u64 = 0xf4;
/// Its width.
pub const EXIT_PORT_LEN: u64 = 1;

/// Stops the VM with the written code.
#[derive(Debug)]
pub struct ExitDevice {
    latch: Arc<StopLatch>,
}

impl ExitDevice {
    /// An exit port that stops through `latch`.
    pub fn new(latch: Arc<StopLatch>) -> Self {
        ExitDevice { latch }
    }
}

impl BusDevice for ExitDevice {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        // The bus only routes accesses that fit the one-byte range.
        if let [code] = data {
            self.latch.stop(StopReason::GuestExit(*code));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_stops_with_the_code() {
        let latch = Arc::new(StopLatch::new());
        let mut dev = ExitDevice::new(latch.clone());
        dev.write(0, &[42]);
        assert!(matches!(
            latch.take_reason(),
            Some(StopReason::GuestExit(42))
        ));
    }
}
