//! The daemon's crash-safe state: one redb database under the state dir that
//! records every sandbox the daemon owns, so a restart (even after SIGKILL)
//! finds each one again and nothing is leaked; the event log; and the
//! brokered secrets, whose values come here already sealed.
//!
//! Most writes are durable when they return (a commit and its fsync). The
//! few on a create's critical path ([`Store::put_with_events_journaled`])
//! return once in the write-behind [`journal`], and a committer thread
//! brings them into the database: they survive the daemon, not the
//! machine, as the sandboxes they describe do.

mod journal;

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};
use serde::{de::DeserializeOwned, Serialize};

use journal::{Entry, Journal};

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");
/// The event log, keyed by cursor.
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// Brokered secrets keyed by name (their values sealed by `secrets::seal`).
const SECRETS: TableDefinition<&str, &[u8]> = TableDefinition::new("secrets");
/// The store's own bookkeeping.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The last journal entry the database took in (see [`Entry::seq`]).
const JOURNAL_APPLIED: &str = "journal_applied_seq";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store {path}: {message}; if it is corrupt, move it aside and restart (running sandboxes are then torn down by hand)")]
    Open { path: String, message: String },
    #[error("state store: {0}")]
    Io(String),
    #[error("state store holds a record it cannot read ({id}): {message}")]
    Corrupt { id: String, message: String },
}

fn io<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Io(e.to_string())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long an open waits for a lock a dead process's child still holds.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// How long the committer waits before trying again after a failed commit
/// (a full disk): the journal keeps the writes meanwhile.
const COMMIT_RETRY: Duration = Duration::from_millis(500);

/// Records keyed by sandbox id; values are JSON so a record stays readable by
/// a newer daemon that added fields.
pub struct Store {
    shared: Arc<Shared>,
    committer: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    db: Database,
    /// Held through each commit, so commits take the journal's entries in
    /// the order they were written.
    commits: Mutex<()>,
    queue: Mutex<Queue>,
    /// Wakes the committer: an entry was journaled, or the store closes.
    wake: Condvar,
}

struct Queue {
    journal: Journal,
    next_seq: u64,
    /// Journaled entries the database does not hold yet, oldest first.
    pending: Vec<Entry>,
    closing: bool,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, true)
    }

    fn open_with(path: &Path, start_committer: bool) -> Result<Self, StoreError> {
        let open_error = |message: String| StoreError::Open {
            path: path.display().to_string(),
            message,
        };
        // A daemon killed while it started a process leaves that child,
        // between its fork and its exec, holding the database's lock for a
        // moment: wait that out before calling the store taken.
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        let db = loop {
            match Database::create(path) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                opened => break opened.map_err(|e| open_error(e.to_string()))?,
            }
        };
        // Opened under the database's lock: no other daemon writes it.
        let journal_path = path.with_extension("journal");
        let mut journal = Journal::open(&journal_path)
            .map_err(|e| open_error(format!("{}: {e}", journal_path.display())))?;
        let entries = journal
            .read_all()
            .map_err(|e| open_error(format!("{}: {e}", journal_path.display())))?;
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(SANDBOXES).map_err(io)?;
        txn.open_table(EVENTS).map_err(io)?;
        txn.open_table(SECRETS).map_err(io)?;
        let applied = txn
            .open_table(META)
            .map_err(io)?
            .get(JOURNAL_APPLIED)
            .map_err(io)?
            .map(|v| v.value())
            .unwrap_or(0);
        // What the last daemon journaled and did not live to commit.
        let replay: Vec<Entry> = entries.into_iter().filter(|e| e.seq > applied).collect();
        take_in(&txn, &replay)?;
        txn.commit().map_err(io)?;
        journal.clear().map_err(io)?;
        if !replay.is_empty() {
            tracing::info!(
                "state store: took in {} writes the last daemon journaled",
                replay.len()
            );
        }
        let last = replay.last().map_or(applied, |e| e.seq);
        let shared = Arc::new(Shared {
            db,
            commits: Mutex::new(()),
            queue: Mutex::new(Queue {
                journal,
                next_seq: last + 1,
                pending: Vec::new(),
                closing: false,
            }),
            wake: Condvar::new(),
        });
        let committer = if start_committer {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("store-commit".into())
                .spawn(move || shared.run_committer())
                .map_err(|e| open_error(format!("starting its committer: {e}")))?;
            Some(spawned)
        } else {
            None
        };
        Ok(Self { shared, committer })
    }

    /// Inserts or replaces one record, durably, before returning.
    pub fn put<T: Serialize>(&self, id: &str, record: &T) -> Result<(), StoreError> {
        self.put_in(SANDBOXES, id, record)
    }

    /// Inserts or replaces every `(id, record)` in one commit: one fsync for
    /// the periodic bookkeeping of all sandboxes, however many there are.
    pub fn put_all<'a, T: Serialize + 'a>(
        &self,
        records: impl IntoIterator<Item = (&'a str, &'a T)>,
    ) -> Result<(), StoreError> {
        self.shared
            .commit(|txn| insert_records(txn, SANDBOXES, records))
    }

    /// Inserts or replaces one record and appends `events`, in one durable
    /// commit: a create's state change and the event that announces it cost
    /// one fsync, not two.
    pub fn put_with_events<T: Serialize, E: Serialize>(
        &self,
        id: &str,
        record: &T,
        events: &[(u64, E)],
    ) -> Result<(), StoreError> {
        self.shared.commit(|txn| {
            insert_records(txn, SANDBOXES, [(id, record)])?;
            insert_events(txn, events)
        })
    }

    /// [`Self::put_with_events`] for a sandbox that is running when this
    /// returns: the write is in the journal, which outlives the daemon but
    /// not the machine, and the committer brings it into the database
    /// (within an fsync or so). A crash of the machine before then loses
    /// it, and the sandbox with it: the record keeps its last durable state
    /// (a create's `creating`, which recovery removes; a claimed sandbox
    /// still pooled, which recovery removes too), and the events' cursors
    /// are handed out again after the restart, so a follower that saw
    /// them misses as many later ones. A write made through the store
    /// after this one comes after it; a read sees it unless committing it
    /// fails (a full disk), when the read gets what the database holds.
    pub fn put_with_events_journaled<T: Serialize, E: Serialize>(
        &self,
        id: &str,
        record: &T,
        events: &[(u64, E)],
    ) -> Result<(), StoreError> {
        self.journal(id, record, events, true)
    }

    /// [`Self::put_with_events_journaled`] that leaves the committer asleep
    /// until [`Self::commit_journaled`] (or the next write that wakes it, or
    /// a read): for a claim, whose answer the committer's work would
    /// otherwise compete with for the host's cores. The write is in the
    /// journal as before; only its commit waits.
    pub fn put_with_events_journaled_quietly<T: Serialize, E: Serialize>(
        &self,
        id: &str,
        record: &T,
        events: &[(u64, E)],
    ) -> Result<(), StoreError> {
        self.journal(id, record, events, false)
    }

    /// Wakes the committer for what quiet journaled writes left to it.
    pub fn commit_journaled(&self) {
        self.shared.wake.notify_one();
    }

    fn journal<T: Serialize, E: Serialize>(
        &self,
        id: &str,
        record: &T,
        events: &[(u64, E)],
        wake_committer: bool,
    ) -> Result<(), StoreError> {
        let value = serde_json::to_vec(record).map_err(io)?;
        let events = events
            .iter()
            .map(|(cursor, event)| Ok((*cursor, serde_json::to_vec(event).map_err(io)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let mut queue = lock(&self.shared.queue);
        let entry = Entry {
            seq: queue.next_seq,
            key: id.to_string(),
            value,
            events,
        };
        if let Err(e) = queue.journal.append(&entry) {
            drop(queue);
            tracing::warn!("state store journal: {e}; committing at once");
            // As a durable write: no journal frame holds its seq, which the
            // next entry takes, so the database must not note it as taken.
            return self.shared.commit(|txn| insert_entry(txn, &entry));
        }
        queue.next_seq += 1;
        queue.pending.push(entry);
        drop(queue);
        if wake_committer {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Removes one record and appends `events`, in one durable commit.
    pub fn remove_with_events<E: Serialize>(
        &self,
        id: &str,
        events: &[(u64, E)],
    ) -> Result<(), StoreError> {
        self.shared.commit(|txn| {
            {
                let mut table = txn.open_table(SANDBOXES).map_err(io)?;
                table.remove(id).map_err(io)?;
            }
            insert_events(txn, events)
        })
    }

    fn put_in<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        record: &T,
    ) -> Result<(), StoreError> {
        self.shared
            .commit(|txn| insert_records(txn, table, [(key, record)]))
    }

    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        self.remove_in(SANDBOXES, id)
    }

    fn remove_in(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<(), StoreError> {
        self.shared.commit(|txn| {
            let mut table = txn.open_table(table).map_err(io)?;
            table.remove(key).map_err(io)?;
            Ok(())
        })
    }

    pub fn all<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        // Only records and events are ever journaled: other reads need no
        // commit first.
        self.shared.settle();
        self.all_in(SANDBOXES)
    }

    /// Inserts or replaces a brokered secret, durably.
    pub fn put_secret<T: Serialize>(&self, name: &str, record: &T) -> Result<(), StoreError> {
        self.put_in(SECRETS, name, record)
    }

    pub fn remove_secret(&self, name: &str) -> Result<(), StoreError> {
        self.remove_in(SECRETS, name)
    }

    pub fn all_secrets<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        self.all_in(SECRETS)
    }

    fn all_in<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<T>, StoreError> {
        let txn = self.shared.db.begin_read().map_err(io)?;
        let table = txn.open_table(table).map_err(io)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(io)? {
            let (key, value) = entry.map_err(io)?;
            let record =
                serde_json::from_slice(value.value()).map_err(|e| StoreError::Corrupt {
                    id: key.value().to_string(),
                    message: e.to_string(),
                })?;
            out.push(record);
        }
        Ok(out)
    }
}

impl Store {
    /// Appends events, durably.
    pub fn append_events<T: Serialize>(&self, events: &[(u64, T)]) -> Result<(), StoreError> {
        self.shared.commit(|txn| insert_events(txn, events))
    }

    /// Events with a cursor at or above `from`, in order.
    pub fn events_from<T: DeserializeOwned>(&self, from: u64) -> Result<Vec<T>, StoreError> {
        self.shared.settle();
        let txn = self.shared.db.begin_read().map_err(io)?;
        let table = txn.open_table(EVENTS).map_err(io)?;
        let mut out = Vec::new();
        for entry in table.range(from..).map_err(io)? {
            let (key, value) = entry.map_err(io)?;
            out.push(
                serde_json::from_slice(value.value()).map_err(|e| StoreError::Corrupt {
                    id: format!("event {}", key.value()),
                    message: e.to_string(),
                })?,
            );
        }
        Ok(out)
    }

    /// Drops events below `cursor`.
    pub fn prune_events(&self, below: u64) -> Result<(), StoreError> {
        self.shared.commit(|txn| {
            let mut table = txn.open_table(EVENTS).map_err(io)?;
            table.retain_in(..below, |_, _| false).map_err(io)?;
            Ok(())
        })
    }
}

impl Drop for Store {
    /// Commits what is journaled before the database closes.
    fn drop(&mut self) {
        lock(&self.shared.queue).closing = true;
        self.shared.wake.notify_all();
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
    }
}

impl Shared {
    /// One durable commit of the journaled entries not yet in the database,
    /// then `own`'s writes. On failure the entries stay pending (and in the
    /// journal) for the next commit.
    fn commit(
        &self,
        own: impl FnOnce(&WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.commit_holding(lock(&self.commits), own)
    }

    /// [`Self::commit`] under the commit lock the caller took.
    fn commit_holding(
        &self,
        _in_order: MutexGuard<'_, ()>,
        own: impl FnOnce(&WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let taken = std::mem::take(&mut lock(&self.queue).pending);
        let committed = (|| {
            let txn = self.db.begin_write().map_err(io)?;
            take_in(&txn, &taken)?;
            own(&txn)?;
            txn.commit().map_err(io)
        })();
        let mut queue = lock(&self.queue);
        match &committed {
            // Entries journaled meanwhile keep the journal for their commit.
            Ok(()) if queue.pending.is_empty() => {
                if let Err(e) = queue.journal.clear() {
                    // Harmless: a replay skips what the database holds.
                    tracing::warn!("state store journal: emptying it: {e}");
                }
            }
            // Under load the journal never empties: past a size it is
            // rewritten to what is still pending, so it stays bounded.
            Ok(()) if queue.journal.len() > journal::COMPACT_AT => {
                let Queue {
                    journal, pending, ..
                } = &mut *queue;
                if let Err(e) = journal.compact(pending) {
                    tracing::warn!("state store journal: compacting it: {e}");
                }
            }
            Ok(()) => {}
            Err(_) => {
                let later = std::mem::replace(&mut queue.pending, taken);
                queue.pending.extend(later);
            }
        }
        committed
    }

    /// Commits the journaled entries, if any, so a read sees them: also
    /// those the committer has taken and not yet committed, which the
    /// commit lock waits for. A commit that fails leaves the read to what
    /// the database holds: older, not stalled.
    fn settle(&self) {
        let in_order = lock(&self.commits);
        if lock(&self.queue).pending.is_empty() {
            return;
        }
        if let Err(e) = self.commit_holding(in_order, |_| Ok(())) {
            tracing::warn!("state store: a read misses journaled writes it could not commit: {e}");
        }
    }

    /// Brings journaled entries into the database as they come, many to a
    /// commit when they come faster than an fsync; at close, the rest.
    fn run_committer(&self) {
        loop {
            {
                let mut queue = lock(&self.queue);
                while queue.pending.is_empty() && !queue.closing {
                    queue = self.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
                if queue.pending.is_empty() {
                    return;
                }
            }
            if let Err(e) = self.commit(|_| Ok(())) {
                tracing::warn!("state store: committing journaled writes: {e}; trying again");
                let queue = lock(&self.queue);
                if queue.closing {
                    // The journal keeps them for the next open.
                    return;
                }
                let _ = self.wake.wait_timeout(queue, COMMIT_RETRY);
            }
        }
    }
}

/// Writes journaled `entries` inside `txn`, and notes the last as taken in.
fn take_in(txn: &WriteTransaction, entries: &[Entry]) -> Result<(), StoreError> {
    let Some(last) = entries.last() else {
        return Ok(());
    };
    for entry in entries {
        insert_entry(txn, entry)?;
    }
    let mut meta = txn.open_table(META).map_err(io)?;
    let applied = meta
        .get(JOURNAL_APPLIED)
        .map_err(io)?
        .map_or(0, |v| v.value());
    meta.insert(JOURNAL_APPLIED, applied.max(last.seq))
        .map_err(io)?;
    Ok(())
}

/// Writes one entry's record and events inside `txn`.
fn insert_entry(txn: &WriteTransaction, entry: &Entry) -> Result<(), StoreError> {
    let mut records = txn.open_table(SANDBOXES).map_err(io)?;
    records
        .insert(entry.key.as_str(), entry.value.as_slice())
        .map_err(io)?;
    let mut events = txn.open_table(EVENTS).map_err(io)?;
    for (cursor, event) in &entry.events {
        events.insert(*cursor, event.as_slice()).map_err(io)?;
    }
    Ok(())
}

/// Inserts or replaces each `(key, record)` of `table` inside `txn`.
fn insert_records<'a, T: Serialize + 'a>(
    txn: &WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    records: impl IntoIterator<Item = (&'a str, &'a T)>,
) -> Result<(), StoreError> {
    let mut table = txn.open_table(table).map_err(io)?;
    for (key, record) in records {
        let bytes = serde_json::to_vec(record).map_err(io)?;
        table.insert(key, bytes.as_slice()).map_err(io)?;
    }
    Ok(())
}

/// Appends `events` to the event log inside `txn`.
fn insert_events<T: Serialize>(
    txn: &WriteTransaction,
    events: &[(u64, T)],
) -> Result<(), StoreError> {
    let mut table = txn.open_table(EVENTS).map_err(io)?;
    for (cursor, event) in events {
        let bytes = serde_json::to_vec(event).map_err(io)?;
        table.insert(*cursor, bytes.as_slice()).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        {
            let store = Store::open(&path).expect("open");
            store.put("a", &vec![1, 2]).expect("put a");
            store.put("b", &vec![3]).expect("put b");
            store.remove("a").expect("remove");
        }
        let store = Store::open(&path).expect("reopen");
        let all: Vec<Vec<i32>> = store.all().expect("all");
        assert_eq!(all, vec![vec![3]]);
    }

    #[test]
    fn events_range_and_prune() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.redb")).expect("open");
        store
            .append_events(&[(1, "a"), (2, "b"), (3, "c")])
            .expect("append");
        assert_eq!(
            store.events_from::<String>(2).expect("from"),
            vec!["b", "c"]
        );
        store.prune_events(3).expect("prune");
        assert_eq!(store.events_from::<String>(0).expect("all"), vec!["c"]);
    }

    /// `f`'s store, opened without a committer: what it journals stays in
    /// the journal, as when a daemon dies before its committer runs.
    fn with_stalled_store(path: &Path, f: impl FnOnce(&Store)) {
        let store = Store::open_with(path, false).expect("open");
        f(&store);
    }

    fn journal_len(path: &Path) -> u64 {
        std::fs::metadata(path.with_extension("journal"))
            .expect("journal")
            .len()
    }

    #[test]
    fn a_journaled_write_outlives_a_daemon_that_never_committed_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        with_stalled_store(&path, |store| {
            store.put("a", &"creating").expect("put");
            store
                .put_with_events_journaled("a", &"ready", &[(1, "created"), (2, "ready")])
                .expect("journal");
        });
        assert!(journal_len(&path) > 0, "nothing was journaled");
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.all::<String>().expect("all"), vec!["ready"]);
        assert_eq!(
            store.events_from::<String>(0).expect("events"),
            vec!["created", "ready"]
        );
        assert_eq!(journal_len(&path), 0, "the replayed journal was kept");
    }

    #[test]
    fn a_durable_write_after_a_journaled_one_lands_after_it_even_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        let mut journaled = Vec::new();
        with_stalled_store(&path, |store| {
            store
                .put_with_events_journaled("a", &"claimed", &[(1, "created")])
                .expect("journal");
            journaled = std::fs::read(path.with_extension("journal")).expect("read");
            assert!(!journaled.is_empty(), "nothing was journaled");
            // A delete commits the claim first, then removes it.
            store
                .remove_with_events("a", &[(2, "deleted")])
                .expect("remove");
            assert_eq!(journal_len(&path), 0, "a committed journal was kept");
        });
        // Even a journal that outlived its commit replays nothing twice:
        // the deleted record stays deleted.
        std::fs::write(path.with_extension("journal"), &journaled).expect("restore");
        let store = Store::open(&path).expect("reopen");
        assert!(store.all::<String>().expect("all").is_empty());
        assert_eq!(
            store.events_from::<String>(0).expect("events"),
            vec!["created", "deleted"]
        );
    }

    #[test]
    fn a_journal_cut_short_keeps_its_whole_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        with_stalled_store(&path, |store| {
            store
                .put_with_events_journaled("a", &"ready", &[] as &[(u64, &str)])
                .expect("journal");
            store
                .put_with_events_journaled("b", &"ready", &[] as &[(u64, &str)])
                .expect("journal");
        });
        let journal = path.with_extension("journal");
        let bytes = std::fs::read(&journal).expect("read");
        std::fs::write(&journal, &bytes[..bytes.len() - 3]).expect("cut");
        let store = Store::open_with(&path, false).expect("reopen");
        assert_eq!(store.all::<String>().expect("all"), vec!["ready"]);
        // Journaling goes on after the replay, numbered after it: a second
        // replay takes it in.
        store
            .put_with_events_journaled("c", &"ready", &[] as &[(u64, &str)])
            .expect("journal");
        drop(store);
        assert!(journal_len(&path) > 0, "nothing was journaled");
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.all::<String>().expect("all").len(), 2);
    }

    #[test]
    fn a_write_the_journal_refused_is_committed_and_the_next_one_still_replays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        with_stalled_store(&path, |store| {
            lock(&store.shared.queue).journal.fail_appends = true;
            store
                .put_with_events_journaled("a", &"ready", &[(1, "a")])
                .expect("committed at once");
            assert_eq!(journal_len(&path), 0, "the refused write was journaled");
            lock(&store.shared.queue).journal.fail_appends = false;
            store
                .put_with_events_journaled("b", &"ready", &[(2, "b")])
                .expect("journal");
            assert!(journal_len(&path) > 0, "nothing was journaled");
        });
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.all::<String>().expect("all"), vec!["ready", "ready"]);
        assert_eq!(
            store.events_from::<String>(0).expect("events"),
            vec!["a", "b"]
        );
    }

    #[test]
    fn the_committer_brings_journaled_writes_in_and_empties_the_journal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        let store = Store::open(&path).expect("open");
        for i in 0..50 {
            store
                .put_with_events_journaled(&format!("sb-{i:02}"), &i, &[(i, i)])
                .expect("journal");
        }
        // No read (which would commit itself): only the committer empties
        // the journal, by the close at the latest.
        drop(store);
        assert_eq!(journal_len(&path), 0, "the committer left the journal");
        let store = Store::open_with(&path, false).expect("reopen");
        assert_eq!(
            store.all::<u64>().expect("all"),
            (0..50).collect::<Vec<_>>()
        );
        assert_eq!(store.events_from::<u64>(0).expect("events").len(), 50);
    }

    #[test]
    fn a_quiet_journaled_write_is_committed_once_the_committer_is_woken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        let store = Store::open(&path).expect("open");
        store
            .put_with_events_journaled_quietly("a", &"ready", &[(1, "a")])
            .expect("journal");
        assert!(journal_len(&path) > 0, "nothing was journaled");
        store.commit_journaled();
        // The committer takes the entry off the queue, then commits it
        // under the commit lock; no read may commit it for the test.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !lock(&store.shared.queue).pending.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the committer never took the quiet write"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(lock(&store.shared.commits));
        assert_eq!(journal_len(&path), 0, "the committer left the journal");
        drop(store);
        let store = Store::open_with(&path, false).expect("reopen");
        assert_eq!(store.all::<String>().expect("all"), vec!["ready"]);
        assert_eq!(store.events_from::<String>(0).expect("events"), vec!["a"]);
    }

    #[test]
    fn a_read_sees_the_journaled_writes_made_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.redb")).expect("open");
        for i in 0..20 {
            store
                .put_with_events_journaled(&format!("sb-{i:02}"), &i, &[(i, i)])
                .expect("journal");
            assert_eq!(store.all::<u64>().expect("all").len() as u64, i + 1);
            assert_eq!(
                store.events_from::<u64>(i).expect("events"),
                vec![i],
                "event {i}"
            );
        }
    }
}
