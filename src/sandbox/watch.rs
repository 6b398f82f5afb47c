//! Following each supervisor's events (process exits, OOM kills, the
//! sandbox dying) into the daemon's event log, resuming after a restart.
//!
//! A claimed pooled sandbox's watch starts only once the create has been
//! answered ([`Answered`]): its first request makes the supervisor put the
//! claim in force (its limits, the proxy's policy and secrets), work
//! that competed with the answer for the host's cores. No request of the
//! caller's can reach the sandbox before the supervisor has done it. The
//! claim's other background work (the commit of its journaled record,
//! the TTL's wake-up, the pool's refill) waits for the answer too: each
//! wakes another thread.

use super::events::EventKind;
use crate::model::SandboxState;
use crate::supervisor::client::SupervisorClient;
use crate::supervisor::protocol::SupervisorEvent;
use std::sync::Arc;

use super::manager::Manager;

/// Held by whoever answers a create: dropped once the answer is sent (or
/// will not be), it starts what a claim left for after the answer (the
/// watch, the TTL's wake-up, the refill). Dropped inside the daemon's
/// runtime: those are spawned tasks.
#[must_use = "dropping it at once starts the watch before the answer is sent"]
pub struct Answered {
    manager: Arc<Manager>,
    id: String,
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.manager.answered(&self.id);
    }
}

impl Manager {
    /// Follows a sandbox supervisor's events (process exits, OOM kills, the
    /// sandbox dying) into the event log, from where it left off.
    pub(super) fn watch_supervisor(self: &Arc<Self>, id: String) {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.watch(id).await });
    }

    /// What a claim leaves until its create has been answered (each wakes
    /// another thread, so none competes with the answer): sandbox `id`'s
    /// watch, its record's commit, the TTL's look at its deadline and the
    /// pool's refill, all started when [`Self::answered`] is called for
    /// `id`; the watch not, if the sandbox is being removed
    /// ([`Self::unanswered_removed`]).
    pub(super) fn start_once_answered(&self, id: String) {
        self.awaiting_answer().insert(id, true);
    }

    /// The guard that starts what sandbox `id`'s claim left for after its
    /// answer, when dropped.
    pub(super) fn answering(self: &Arc<Self>, id: &str) -> Answered {
        Answered {
            manager: Arc::clone(self),
            id: id.to_string(),
        }
    }

    /// Starts what sandbox `id`'s claim left for after its answer, if it
    /// left anything.
    fn answered(self: &Arc<Self>, id: &str) {
        let Some(watch) = self.awaiting_answer().remove(id) else {
            return;
        };
        self.store.commit_journaled();
        if watch {
            self.watch_supervisor(id.to_string());
        }
        self.ttl_changed.notify_one();
        self.start_refill();
    }

    /// Keeps sandbox `id`'s watch from starting at its answer: the sandbox
    /// is being removed (a create abandoned or failed after its claim), and
    /// a watch started now would make its supervisor put the claim in
    /// force during the teardown. The pool's refill still waits for the
    /// answer.
    pub(super) fn unanswered_removed(&self, id: &str) {
        if let Some(watch) = self.awaiting_answer().get_mut(id) {
            *watch = false;
        }
    }

    /// Sandboxes whose claim waits for its answer, and whether their watch
    /// then starts.
    pub(super) fn awaiting_answer(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, bool>> {
        self.awaiting_answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn watch(self: Arc<Self>, id: String) {
        let after = match self.records().get(&id) {
            Some(r) => r.supervisor_events_seen,
            None => return,
        };
        let Ok(client) = SupervisorClient::connect(&self.paths(&id).socket()).await else {
            return;
        };
        let Ok(mut events) = client.watch(after).await else {
            return;
        };
        while let Ok(Some((seq, event))) = events.next().await {
            self.record_supervisor_event(&id, seq, event);
        }
    }

    pub(super) fn record_supervisor_event(&self, id: &str, seq: u64, event: SupervisorEvent) {
        match event {
            SupervisorEvent::ProcessExited(p) => {
                if p.oom_killed {
                    self.metrics.oom_killed();
                    self.events.emit(EventKind::Oom, id, Some(p.id), None);
                }
                let detail = match (p.exit_code, p.signal) {
                    (Some(code), _) => format!("exit code {code}"),
                    (None, Some(signal)) => format!("signal {signal}"),
                    _ => "ended".to_string(),
                };
                let detail = if p.timed_out {
                    format!("{detail} (timed out)")
                } else {
                    detail
                };
                self.events
                    .emit(EventKind::ProcessExited, id, Some(p.id), Some(detail));
            }
            SupervisorEvent::Failed(reason) => {
                let newly_failed = {
                    let mut records = self.records();
                    match records.get_mut(id) {
                        Some(r) if r.state == SandboxState::Ready => {
                            r.state = SandboxState::Failed;
                            r.failure = Some(reason.clone());
                            true
                        }
                        _ => false,
                    }
                };
                if newly_failed {
                    // Its URLs answer 502 from now; what was open through them ends.
                    self.links.close_sandbox_links(id);
                    self.events.emit(EventKind::Failed, id, None, Some(reason));
                }
            }
        }
        // Persisted under the records lock: a delete removes the map entry
        // first, so a cursor update can never bring a deleted record back.
        let mut records = self.records();
        if let Some(record) = records.get_mut(id) {
            record.supervisor_events_seen = seq;
            if let Err(e) = self.store.put(id, record) {
                tracing::warn!(sandbox = %id, "recording an event cursor: {e}");
            }
        }
    }
}
