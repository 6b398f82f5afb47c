//! The i8042 keyboard controller, reduced to the one thing a microVM guest
//! uses it for: command 0xfe on port 0x64 resets the CPU, which here stops the
//! VM (Linux's `reboot=k`, the default on x86, ends this way).

use std::sync::Arc;

use vm_superio::{I8042Device, Trigger};

use super::bus::BusDevice;
use crate::stop::{StopLatch, StopReason};

/// First port of the controller (data port 0x60; command/status is 0x64).
pub const I8042_BASE: u64 = 0x60;
/// Ports 0x60-0x64.
pub const I8042_LEN: u64 = 5;

/// Fires a reset stop.
#[derive(Debug)]
pub struct ResetTrigger(Arc<StopLatch>);

impl Trigger for ResetTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.stop(StopReason::Reset);
        Ok(())
    }
}

/// The i8042 on the port bus.
#[derive(Debug)]
pub struct I8042 {
    inner: I8042Device<ResetTrigger>,
}

impl I8042 {
    /// An i8042 whose reset stops through `latch`.
    pub fn new(latch: Arc<StopLatch>) -> Self {
        I8042 {
            inner: I8042Device::new(ResetTrigger(latch)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match (u8::try_from(offset), data) {
            (Ok(offset), [byte]) => *byte = self.inner.read(offset),
            (_, data) => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(offset), [value]) = (u8::try_from(offset), data) {
            // The trigger cannot fail (its error type is uninhabited).
            let Ok(()) = self.inner.write(offset, *value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_stops_the_vm() {
        let latch = Arc::new(StopLatch::new());
        let mut dev = I8042::new(latch.clone());
        dev.write(0, &[0xfe]);
        assert!(!latch.is_stopped(), "0xfe on the data port is not a reset");
        dev.write(4, &[0xfe]);
        assert!(matches!(latch.take_reason(), Some(StopReason::Reset)));
    }
}
