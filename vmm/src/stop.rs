//! How a running VM comes to a stop. Whoever first decides the VM is done (a
//! vCPU at the guest's exit port, reset or triple fault, a failing vCPU, the
//! timeout) records why; later reasons are dropped, so the report names the
//! cause and not its aftermath. The thread that runs the VM waits here, then
//! kicks the vCPUs out of KVM_RUN.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::vstate::vcpu::VcpuError;

/// Why the VM stopped.
#[derive(Debug)]
pub enum StopReason {
    /// The guest wrote its exit code to the exit port.
    GuestExit(u8),
    /// The guest asked for a reset (i8042 command 0xfe). A microVM does not
    /// reboot: reset means the guest is done (Linux `reboot` ends up here).
    Reset,
    /// A vCPU shut down (triple fault): the guest crashed in a way the CPU
    /// itself could not report.
    TripleFault {
        /// The vCPU.
        vcpu: u8,
    },
    /// A vCPU halted with no in-kernel LAPIC to wake it.
    Halted {
        /// The vCPU.
        vcpu: u8,
    },
    /// A vCPU hit an error the VMM cannot recover from.
    VcpuFailed {
        /// The vCPU.
        vcpu: u8,
        /// What went wrong.
        error: VcpuError,
    },
    /// A vCPU thread panicked (a VMM bug); recorded so the VM does not wait
    /// for a vCPU that is gone.
    Panicked {
        /// The vCPU.
        vcpu: u8,
    },
    /// The run's time limit passed.
    TimedOut,
    /// Its owner stopped it ([`crate::MachineHandle::stop`]).
    Requested,
    /// The VMM gave up before the guest finished (e.g. a vCPU thread could
    /// not be started); the caller has the error.
    Aborted,
}

/// Records the first [`StopReason`] and wakes whoever waits for it.
#[derive(Debug, Default)]
pub struct StopLatch {
    stopped: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    cond: Condvar,
}

impl StopLatch {
    /// An open latch.
    pub fn new() -> Self {
        Self::default()
    }

    // A panic while holding the lock leaves only an `Option` behind, which
    // is consistent whatever point the panic hit, so poison is ignored.
    fn lock(&self) -> MutexGuard<'_, Option<StopReason>> {
        self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the VM for `reason` unless it already stopped. Returns whether
    /// this call was the one that stopped it.
    pub fn stop(&self, reason: StopReason) -> bool {
        let mut slot = self.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(reason);
        self.stopped.store(true, Ordering::SeqCst);
        self.cond.notify_all();
        true
    }

    /// Whether the VM has stopped. Cheap: vCPU threads check it on every exit.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Waits until the VM stops or `timeout` passes; `None` waits for ever.
    /// Returns whether it stopped.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut slot = self.lock();
        while slot.is_none() {
            match deadline {
                None => slot = self.cond.wait(slot).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    slot = self
                        .cond
                        .wait_timeout(slot, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        true
    }

    /// Takes the recorded reason (once).
    pub fn take_reason(&self) -> Option<StopReason> {
        self.lock().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn first_reason_wins() {
        let latch = StopLatch::new();
        assert!(!latch.is_stopped());
        assert!(latch.stop(StopReason::GuestExit(3)));
        assert!(!latch.stop(StopReason::Reset));
        assert!(latch.is_stopped());
        assert!(matches!(
            latch.take_reason(),
            Some(StopReason::GuestExit(3))
        ));
    }

    #[test]
    fn wait_times_out_then_sees_a_stop_from_another_thread() {
        let latch = Arc::new(StopLatch::new());
        assert!(!latch.wait(Some(Duration::from_millis(10))));
        let other = Arc::clone(&latch);
        let t = std::thread::spawn(move || other.stop(StopReason::Reset));
        assert!(latch.wait(None));
        assert!(t.join().expect("thread"));
    }
}
