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

/// What an event says, before the log gives it a cursor and a time.
#[derive(Debug, Clone)]
pub struct Note {
    pub kind: EventKind,
    pub process_id: Option<u64>,
    pub detail: Option<String>,
}

impl Note {
    /// An event of `kind` with no process and no detail.
    pub fn of(kind: EventKind) -> Self {
        Self {
            kind,
            process_id: None,
            detail: None,
        }
    }
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
        let note = Note {
            kind,
            process_id,
            detail,
        };
        // The event is kept and followed even when the store refuses it: a
        // follower hears of it now, only a restart's replay misses it.
        let _ = self.emit_with(sandbox_id, vec![note], |events| {
            if let Err(e) = self.store.append_events(events) {
                tracing::warn!("event log: {e}");
            }
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Emits `notes` about `sandbox_id` once `write` has stored them: it
    /// gets the events to write in its own commit, beside the record whose
    /// change they announce (one fsync for both). Followers hear of them
    /// after `write` returns (so what it also does, such as putting the
    /// record in the manager's map, is done by then); if it fails, nothing
    /// is emitted and its error is returned. `write` runs while the log's
    /// lock is held, which keeps cursors in the store's order.
    pub fn emit_with<E>(
        &self,
        sandbox_id: &str,
        notes: Vec<Note>,
        write: impl FnOnce(&[(u64, &Event)]) -> Result<(), E>,
    ) -> Result<(), E> {
        if notes.is_empty() {
            return write(&[]);
        }
        let last = {
            let mut recent = self.recent();
            let first = recent
                .back()
                .map(|e| e.cursor)
                .unwrap_or(*self.latest.borrow())
                + 1;
            // One moment for the whole batch, written once.
            let time = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
            let time_ms = now_ms();
            let events: Vec<Event> = notes
                .into_iter()
                .zip(first..)
                .map(|(note, cursor)| Event {
                    cursor,
                    time: time.clone(),
                    time_ms,
                    kind: note.kind,
                    sandbox_id: sandbox_id.to_string(),
                    process_id: note.process_id,
                    detail: note.detail,
                })
                .collect();
            let keyed: Vec<(u64, &Event)> = events.iter().map(|e| (e.cursor, e)).collect();
            write(&keyed)?;
            for event in events {
                tracing::debug!(sandbox = %event.sandbox_id, kind = ?event.kind, cursor = event.cursor, "event");
                recent.push_back(event);
            }
            while recent.len() > RECENT {
                recent.pop_front();
            }
            recent.back().map(|e| e.cursor).unwrap_or(first)
        };
        self.latest.send_replace(last);
        Ok(())
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

    #[test]
    fn events_written_with_a_record_go_out_only_once_the_commit_holds_both() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(&dir.path().join("s.redb")).expect("store"));
        let log = EventLog::open(Arc::clone(&store), 3600);
        let refused: Result<(), &str> =
            log.emit_with("sb-1", vec![Note::of(EventKind::Created)], |_| {
                Err("refused")
            });
        assert_eq!(refused, Err("refused"));
        assert!(log.after(0).0.is_empty(), "a refused write emits nothing");
        let notes = vec![Note::of(EventKind::Created), Note::of(EventKind::Ready)];
        log.emit_with("sb-1", notes, |events| {
            store.put_with_events("sb-1", &"the record", events)
        })
        .expect("written");
        let kinds = |log: &EventLog, after| -> Vec<(u64, EventKind)> {
            log.after(after)
                .0
                .iter()
                .map(|e| (e.cursor, e.kind))
                .collect()
        };
        let expected = vec![(1, EventKind::Created), (2, EventKind::Ready)];
        assert_eq!(kinds(&log, 0), expected, "the refused write used no cursor");
        drop(log);
        let log = EventLog::open(Arc::clone(&store), 3600);
        assert_eq!(kinds(&log, 0), expected);
        assert_eq!(store.all::<String>().expect("records"), vec!["the record"]);
        log.emit_with("sb-1", vec![Note::of(EventKind::Deleted)], |events| {
            store.remove_with_events("sb-1", events)
        })
        .expect("removed");
        assert!(store.all::<String>().expect("records").is_empty());
        assert_eq!(kinds(&log, 2), vec![(3, EventKind::Deleted)]);
    }
}
