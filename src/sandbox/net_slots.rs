//! The manager's side of the network slots (`net::slots`): kept at their
//! number by one background task, between callers' creates, and adopted by
//! container launches.

use std::path::Path;
use std::sync::Arc;

use super::manager::Manager;

impl Manager {
    /// The task that makes slots until `net_slots` are ready, one at a
    /// time and only while no caller's create is in flight, then waits for
    /// an adoption to make room.
    pub(super) fn start_slot_maker(self: &Arc<Self>) {
        if !self.net_slots.wanted() {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                while this.net_slots.wanted() {
                    this.creates_settled().await;
                    if *this.stopping.borrow() {
                        return;
                    }
                    let slots = Arc::clone(&this.net_slots);
                    let made = tokio::task::spawn_blocking(move || slots.make_one())
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|made| made.map_err(|e| e.to_string()));
                    if let Err(e) = made {
                        // Creates make their own namespace meanwhile; the
                        // next adoption tries again.
                        tracing::warn!("making a network slot: {e}");
                        break;
                    }
                }
                let mut stopping = this.stopping.subscribe();
                tokio::select! {
                    _ = this.slot_taken.notified() => {}
                    _ = stopping.wait_for(|s| *s) => return,
                }
            }
        });
    }

    /// Gives a container's launch a ready network namespace: a slot moved
    /// to `run_dir`. False when none is ready (the supervisor makes one).
    pub(super) fn adopt_net_slot(&self, run_dir: &Path) -> bool {
        let adopted = self.net_slots.adopt(run_dir);
        self.slot_taken.notify_one();
        adopted
    }

    /// Removes the ready slots (a clean stop).
    pub fn drain_net_slots(&self) {
        self.net_slots.drain();
    }
}
