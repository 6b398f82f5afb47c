//! When work made ahead of creates (warm pools, network slots, standby
//! supervisors) may run: callers' creates counted in flight, the waits on
//! them, and the one loop that keeps slots and standbys at their number.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::manager::Manager;

/// How long after a caller's create the warm pools wait before a refill, so
/// the caller's next request (most often its first process) does not share
/// this host's CPUs with the making of a whole sandbox: on the 2-core dev
/// host that cost a pooled create's first process about 3 ms. (Network
/// slots and standbys, much cheaper, wait less: [`MADE_AHEAD_QUIET`].)
const AFTER_CREATE_QUIET: Duration = Duration::from_millis(100);

/// How long after a caller's create network slots and standby supervisors
/// wait before one is made again, while more than half of them are left:
/// the caller's first process (most often its next request) then has the
/// host to itself. On the 2-core dev host, making a slot and a standby
/// right after a create cost a cold create's first `print(1)` about 5 ms
/// (a lower CPU priority did not help: they contend in the kernel, not for
/// CPU time). At half or fewer left (a burst), they are made at once, so
/// bursts of creates still find them.
const MADE_AHEAD_QUIET: Duration = Duration::from_millis(30);

/// Counts a caller's create as in flight while it lives.
pub(super) struct CreateInFlight(Arc<Manager>);

impl CreateInFlight {
    pub(super) fn new(manager: &Arc<Manager>) -> Self {
        manager.creates_in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(manager))
    }
}

impl Drop for CreateInFlight {
    fn drop(&mut self) {
        *self
            .0
            .last_create_ended
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if self.0.creates_in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.creates_settled.notify_waiters();
        }
    }
}

impl Manager {
    /// Resolves once no caller's create is in flight.
    pub(super) async fn creates_settled(&self) {
        loop {
            let settled = self.creates_settled.notified();
            if self.creates_in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Resolves once no caller's create is in flight, nor ended within
    /// [`AFTER_CREATE_QUIET`]: when a whole sandbox is to be made.
    pub(super) async fn creates_quiet(&self) {
        self.creates_quiet_for(AFTER_CREATE_QUIET, || false).await
    }

    /// Resolves once no caller's create is in flight, and either none ended
    /// within `quiet` or `urgent` says the work cannot wait.
    async fn creates_quiet_for(&self, quiet: Duration, urgent: impl Fn() -> bool) {
        loop {
            self.creates_settled().await;
            if urgent() {
                return;
            }
            let ended = *self
                .last_create_ended
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match ended.map(|at| at.elapsed()) {
                Some(elapsed) if elapsed < quiet => {
                    tokio::time::sleep(quiet - elapsed).await;
                }
                _ => return,
            }
        }
    }

    /// Starts the task that keeps `what` made ahead: `make` one at a time,
    /// each once no caller's create is in flight (nor ended within
    /// [`MADE_AHEAD_QUIET`] unless `low` says half or fewer are left),
    /// while `wanted` says more are; then it waits for `taken` (a launch
    /// took one) or the stop. A failed `make` waits for the next take
    /// (launches make their own meanwhile).
    pub(super) fn keep_made_ahead<F, Fut>(
        self: &Arc<Self>,
        what: &'static str,
        wanted: fn(&Manager) -> bool,
        low: fn(&Manager) -> bool,
        taken: fn(&Manager) -> &Notify,
        make: F,
    ) where
        F: Fn(Arc<Manager>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), String>> + Send,
    {
        if !wanted(self) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                while wanted(&this) {
                    this.creates_quiet_for(MADE_AHEAD_QUIET, || low(&this))
                        .await;
                    if *this.stopping.borrow() {
                        return;
                    }
                    if let Err(e) = make(Arc::clone(&this)).await {
                        tracing::warn!("making {what}: {e}");
                        break;
                    }
                }
                let mut stopping = this.stopping.subscribe();
                tokio::select! {
                    _ = taken(&this).notified() => {}
                    _ = stopping.wait_for(|s| *s) => return,
                }
            }
        });
    }
}
