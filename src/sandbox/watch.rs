//! Following each supervisor's events (process exits, OOM kills, the
//! sandbox dying) into the daemon's event log, resuming after a restart.

use super::events::EventKind;
use crate::model::SandboxState;
use crate::supervisor::client::SupervisorClient;
use crate::supervisor::protocol::SupervisorEvent;
use std::sync::Arc;

use super::manager::Manager;

impl Manager {
    /// Follows a sandbox supervisor's events (process exits, OOM kills, the
    /// sandbox dying) into the event log, from where it left off.
    pub(super) fn watch_supervisor(self: &Arc<Self>, id: String) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let after = match this.records().get(&id) {
                Some(r) => r.supervisor_events_seen,
                None => return,
            };
            let Ok(client) = SupervisorClient::connect(&this.paths(&id).socket()).await else {
                return;
            };
            let Ok(mut events) = client.watch(after).await else {
                return;
            };
            while let Ok(Some((seq, event))) = events.next().await {
                this.record_supervisor_event(&id, seq, event);
            }
        });
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
