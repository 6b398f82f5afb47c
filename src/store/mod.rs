//! The daemon's crash-safe state: one redb database under the state dir that
//! records every sandbox the daemon owns, so a restart (even after SIGKILL)
//! finds each one again and nothing is leaked; the event log; and the
//! brokered secrets, whose values come here already sealed.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");
/// The event log, keyed by cursor.
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// Brokered secrets keyed by name (their values sealed by `secrets::seal`).
const SECRETS: TableDefinition<&str, &[u8]> = TableDefinition::new("secrets");

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

/// How long an open waits for a lock a dead process's child still holds.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Records keyed by sandbox id; values are JSON so a record stays readable by
/// a newer daemon that added fields.
pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // A daemon killed while it started a process leaves that child,
        // between its fork and its exec, holding the database's lock for a
        // moment: wait that out before calling the store taken.
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        let db = loop {
            match Database::create(path) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                opened => {
                    break opened.map_err(|e| StoreError::Open {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?
                }
            }
        };
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(SANDBOXES).map_err(io)?;
        txn.open_table(EVENTS).map_err(io)?;
        txn.open_table(SECRETS).map_err(io)?;
        txn.commit().map_err(io)?;
        Ok(Self { db })
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
        let txn = self.db.begin_write().map_err(io)?;
        insert_records(&txn, SANDBOXES, records)?;
        txn.commit().map_err(io)
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
        let txn = self.db.begin_write().map_err(io)?;
        insert_records(&txn, SANDBOXES, [(id, record)])?;
        insert_events(&txn, events)?;
        txn.commit().map_err(io)
    }

    /// Removes one record and appends `events`, in one durable commit.
    pub fn remove_with_events<E: Serialize>(
        &self,
        id: &str,
        events: &[(u64, E)],
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut table = txn.open_table(SANDBOXES).map_err(io)?;
            table.remove(id).map_err(io)?;
        }
        insert_events(&txn, events)?;
        txn.commit().map_err(io)
    }

    fn put_in<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        record: &T,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(io)?;
        insert_records(&txn, table, [(key, record)])?;
        txn.commit().map_err(io)
    }

    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        self.remove_in(SANDBOXES, id)
    }

    fn remove_in(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut table = txn.open_table(table).map_err(io)?;
            table.remove(key).map_err(io)?;
        }
        txn.commit().map_err(io)
    }

    pub fn all<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
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
        let txn = self.db.begin_read().map_err(io)?;
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
    /// Appends events, durably. (redb's `Eventual` durability would not
    /// spare the fsync: on Linux it syncs as `Immediate` does. Paths that
    /// write a record with their events use [`Self::put_with_events`].)
    pub fn append_events<T: Serialize>(&self, events: &[(u64, T)]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(io)?;
        insert_events(&txn, events)?;
        txn.commit().map_err(io)
    }

    /// Events with a cursor at or above `from`, in order.
    pub fn events_from<T: DeserializeOwned>(&self, from: u64) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read().map_err(io)?;
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
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut table = txn.open_table(EVENTS).map_err(io)?;
            table.retain_in(..below, |_, _| false).map_err(io)?;
        }
        txn.commit().map_err(io)
    }
}

/// Inserts or replaces each `(key, record)` of `table` inside `txn`.
fn insert_records<'a, T: Serialize + 'a>(
    txn: &redb::WriteTransaction,
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
    txn: &redb::WriteTransaction,
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
}
