//! The manager's side of the network slots (`net::slots`): kept at their
//! number by one background task, between callers' creates, and adopted by
//! launches.

use std::path::Path;
use std::sync::Arc;

use super::manager::Manager;

impl Manager {
    /// The task that keeps `net_slots` made ([`Manager::keep_made_ahead`]).
    pub(super) fn start_slot_maker(self: &Arc<Self>) {
        self.keep_made_ahead(
            "a network slot",
            |m| m.net_slots.wanted(),
            |m| m.net_slots.low(),
            |m| &m.slot_taken,
            |m| async move {
                let slots = Arc::clone(&m.net_slots);
                tokio::task::spawn_blocking(move || slots.make_one())
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())
            },
        );
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
