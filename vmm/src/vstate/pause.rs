//! Pausing a running VM's vCPUs: a pause request kicks every vCPU thread out
//! of KVM_RUN (the same signal and `immediate_exit` as a stop) and each one
//! parks here until resumed or stopped. A parked vCPU also saves its own
//! state on request, because KVM vCPU ioctls belong on the vCPU's thread.
//!
//! vCPU threads register themselves (not their spawner): a thread checks the
//! pause flag on every loop turn after it registered, and a pause request
//! kicks every registered thread, so no vCPU can slip into KVM_RUN unseen.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::vcpu::{kick_signal, Vcpu, VcpuError, VcpuState};

/// How long a pause waits for every vCPU to park: a vCPU returns from
/// KVM_RUN within microseconds of the kick, so this is only hit when the VMM
/// is wedged.
pub const PARK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why vCPUs could not be paused or their state saved.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// The VM stopped (guest exit, timeout, failure) or never ran.
    #[error("the VM is not running (it has stopped or not started yet)")]
    NotRunning,
    /// Not every vCPU parked in time.
    #[error(
        "only {parked} of {vcpus} vCPUs paused within {PARK_TIMEOUT:?}; the vmm is stuck, stop it"
    )]
    Timeout {
        /// vCPUs parked.
        parked: usize,
        /// vCPUs in the VM.
        vcpus: usize,
    },
    /// The VM is not paused (state can only be saved while it is).
    #[error("the VM is not paused; pause it first")]
    NotPaused,
    /// A vCPU could not read its state.
    #[error("vCPU {vcpu}: {source}")]
    Save {
        /// The vCPU.
        vcpu: usize,
        /// What failed.
        #[source]
        source: VcpuError,
    },
}

#[derive(Debug, Default)]
struct Inner {
    /// Live vCPU threads (id, pthread), for kicks; a thread removes itself
    /// before it ends, so no signal goes to a finished thread.
    threads: Vec<(u8, libc::pthread_t)>,
    paused: bool,
    parked: usize,
    /// The VM is stopping: parked vCPUs leave, pauses fail.
    finished: bool,
    /// Bumped for each save request; a parked vCPU answers each once.
    save_generation: u64,
    saved: Vec<Option<Result<VcpuState, VcpuError>>>,
}

/// Pause/resume/save coordination between a VM's vCPU threads and whoever
/// controls the VM (the control socket, tests).
#[derive(Debug)]
pub struct RunControl {
    vcpus: usize,
    pause_requested: AtomicBool,
    inner: Mutex<Inner>,
    cond: Condvar,
}

impl RunControl {
    /// Control for a VM of `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        RunControl {
            vcpus,
            pause_requested: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                saved: (0..vcpus).map(|_| None).collect(),
                ..Inner::default()
            }),
            cond: Condvar::new(),
        }
    }

    // The state is plain data consistent at every unlock, so poison (a
    // panicking vCPU thread, reported by the run) is ignored.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(
        &self,
        g: MutexGuard<'a, Inner>,
        deadline: Instant,
    ) -> (MutexGuard<'a, Inner>, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (g, false);
        }
        let (g, _) = self
            .cond
            .wait_timeout(g, left)
            .unwrap_or_else(PoisonError::into_inner);
        (g, true)
    }

    /// Whether vCPUs should park (checked by each vCPU on every loop turn).
    pub fn pause_requested(&self) -> bool {
        self.pause_requested.load(Ordering::SeqCst)
    }

    /// Whether the VM is paused (every vCPU parked).
    pub fn is_paused(&self) -> bool {
        let g = self.lock();
        g.paused && g.parked == self.vcpus
    }

    /// Called by a vCPU thread before its run loop.
    pub(crate) fn register_current(&self, id: u8) {
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        self.lock().threads.push((id, me));
    }

    /// Called by a vCPU thread when its run loop ends.
    pub(crate) fn unregister(&self, id: u8) {
        self.lock().threads.retain(|&(t, _)| t != id);
    }

    /// The VM stopped: wakes parked vCPUs so they can end, and fails pauses.
    pub fn finish(&self) {
        let mut g = self.lock();
        g.finished = true;
        self.pause_requested.store(false, Ordering::SeqCst);
        self.cond.notify_all();
    }

    /// Kicks every vCPU out of KVM_RUN and waits until all are parked.
    /// Pausing a paused VM is a no-op.
    pub fn pause(&self) -> Result<(), PauseError> {
        let deadline = Instant::now() + PARK_TIMEOUT;
        let mut g = self.lock();
        if g.finished {
            return Err(PauseError::NotRunning);
        }
        g.paused = true;
        self.pause_requested.store(true, Ordering::SeqCst);
        for &(_, thread) in &g.threads {
            // SAFETY: the thread is registered, so it has not returned from
            // its run loop (it unregisters under this lock first); the kick
            // handler is installed before any vCPU thread starts.
            unsafe { libc::pthread_kill(thread, kick_signal()) };
        }
        while g.parked < self.vcpus && !g.finished {
            let (next, in_time) = self.wait(g, deadline);
            g = next;
            if !in_time {
                let parked = g.parked;
                drop(g);
                self.resume();
                return Err(PauseError::Timeout {
                    parked,
                    vcpus: self.vcpus,
                });
            }
        }
        if g.finished {
            return Err(PauseError::NotRunning);
        }
        Ok(())
    }

    /// Lets parked vCPUs run again.
    pub fn resume(&self) {
        let mut g = self.lock();
        g.paused = false;
        self.pause_requested.store(false, Ordering::SeqCst);
        self.cond.notify_all();
    }

    /// Has every parked vCPU save its state; returns them by vCPU id.
    pub fn save_vcpus(&self) -> Result<Vec<VcpuState>, PauseError> {
        let deadline = Instant::now() + PARK_TIMEOUT;
        let mut g = self.lock();
        if g.finished {
            return Err(PauseError::NotRunning);
        }
        if !(g.paused && g.parked == self.vcpus) {
            return Err(PauseError::NotPaused);
        }
        g.saved.iter_mut().for_each(|s| *s = None);
        g.save_generation += 1;
        self.cond.notify_all();
        while g.saved.iter().any(Option::is_none) && !g.finished {
            let (next, in_time) = self.wait(g, deadline);
            g = next;
            if !in_time {
                return Err(PauseError::Timeout {
                    parked: g.saved.iter().filter(|s| s.is_some()).count(),
                    vcpus: self.vcpus,
                });
            }
        }
        if g.finished {
            return Err(PauseError::NotRunning);
        }
        g.saved
            .iter_mut()
            .enumerate()
            .map(|(vcpu, s)| match s.take() {
                Some(Ok(state)) => Ok(state),
                Some(Err(source)) => Err(PauseError::Save { vcpu, source }),
                None => Err(PauseError::NotRunning),
            })
            .collect()
    }

    /// Parks the calling vCPU thread until resume or stop, answering save
    /// requests meanwhile.
    pub(crate) fn park(&self, vcpu: &Vcpu) {
        let mut g = self.lock();
        g.parked += 1;
        let mut answered = g.save_generation;
        self.cond.notify_all();
        while g.paused && !g.finished {
            if g.save_generation != answered {
                answered = g.save_generation;
                drop(g);
                let state = vcpu.save_state();
                g = self.lock();
                if let Some(slot) = g.saved.get_mut(usize::from(vcpu.id())) {
                    *slot = Some(state);
                }
                self.cond.notify_all();
                continue;
            }
            g = self.cond.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.parked -= 1;
        self.cond.notify_all();
    }
}
