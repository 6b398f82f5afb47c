//! The event log a scheduler follows: what happened to each sandbox, in
//! order, each with a cursor. Kept in the store (so a reconnecting scheduler
//! misses nothing across daemon restarts) for `event_retention_seconds`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::record::now_ms;
use crate::store::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A create was admitted; the sandbox is being made.
    Created,
    /// The create waits for its declarative image to be built; the
    /// detail names the image's digest.
    ImageBuilding,
    /// That image is ready (built, or found built by another create).
    ImageBuilt,
    Ready,
    /// A create failed or a ready sandbox died on its own.
    Failed,
    /// The kernel's OOM killer killed a process in the sandbox.
    Oom,
    ProcessExited,
    /// The TTL ended; `deleted` follows.
    Expired,
    Deleted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub cursor: u64,
    pub time: String,
    /// Milliseconds since the epoch (for retention).
    pub time_ms: u64,
    pub kind: EventKind,
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

pub struct EventLog {
    store: Arc<Store>,
    /// Recent events, for followers that are nearly caught up.
    recent: Mutex<VecDeque<Event>>,
    latest: watch::Sender<u64>,
    retention_ms: u64,
}

const RECENT: usize = 4096;

impl EventLog {
    /// Opens the log, continuing after the last stored cursor.
    pub fn open(store: Arc<Store>, retention_seconds: u64) -> Self {
        let stored: Vec<Event> = store.events_from(0).unwrap_or_default();
        let last = stored.last().map(|e| e.cursor).unwrap_or(0);
        let recent: VecDeque<Event> = stored.into_iter().rev().take(RECENT).rev().collect();
        let (latest, _) = watch::channel(last);
        Self {
            store,
            recent: Mutex::new(recent),
            latest,
            retention_ms: retention_seconds.saturating_mul(1000),
        }
    }

    fn recent(&self) -> MutexGuard<'_, VecDeque<Event>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn emit(
        &self,
        kind: EventKind,
        sandbox_id: &str,
        process_id: Option<u64>,
        detail: Option<String>,
    ) {
        let event = {
            let mut recent = self.recent();
            let cursor = recent
                .back()
                .map(|e| e.cursor)
                .unwrap_or(*self.latest.borrow())
                + 1;
            let event = Event {
                cursor,
                time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                time_ms: now_ms(),
                kind,
                sandbox_id: sandbox_id.to_string(),
                process_id,
                detail,
            };
            if let Err(e) = self.store.append_events(&[(cursor, &event)]) {
                tracing::warn!("event log: {e}");
            }
            recent.push_back(event.clone());
            while recent.len() > RECENT {
                recent.pop_front();
            }
            event
        };
        tracing::debug!(sandbox = %event.sandbox_id, kind = ?event.kind, cursor = event.cursor, "event");
        self.latest.send_replace(event.cursor);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// Events after `cursor`, oldest first, and whether older events the
    /// caller had not seen were already dropped by retention.
    pub fn after(&self, cursor: u64) -> (Vec<Event>, bool) {
        {
            let recent = self.recent();
            if let Some(first) = recent.front() {
                if first.cursor <= cursor + 1 {
                    let events = recent
                        .iter()
                        .filter(|e| e.cursor > cursor)
                        .cloned()
                        .collect();
                    return (events, false);
                }
            }
        }
        let events: Vec<Event> = self.store.events_from(cursor + 1).unwrap_or_default();
        let lost = events.first().is_some_and(|e| e.cursor > cursor + 1);
        (events, lost)
    }

    /// Drops events older than the retention period.
    pub fn prune(&self) {
        let horizon = now_ms().saturating_sub(self.retention_ms);
        let below = self
            .store
            .events_from::<Event>(0)
            .unwrap_or_default()
            .iter()
            .find(|e| e.time_ms >= horizon)
            .map(|e| e.cursor);
        if let Some(below) = below {
            let _ = self.store.prune_events(below);
        }
        self.recent().retain(|e| e.time_ms >= horizon);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_continue_across_reopen_and_resume_without_loss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(&dir.path().join("s.redb")).expect("store"));
        let log = EventLog::open(Arc::clone(&store), 3600);
        log.emit(EventKind::Created, "sb-1", None, None);
        log.emit(EventKind::Ready, "sb-1", None, None);
        drop(log);
        let log = EventLog::open(store, 3600);
        log.emit(EventKind::Deleted, "sb-1", None, None);
        let (events, lost) = log.after(1);
        assert!(!lost);
        let kinds: Vec<(u64, EventKind)> = events.iter().map(|e| (e.cursor, e.kind)).collect();
        assert_eq!(kinds, vec![(2, EventKind::Ready), (3, EventKind::Deleted)]);
    }
}
