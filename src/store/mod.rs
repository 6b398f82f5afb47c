//! The daemon's crash-safe state: one redb database under the state dir that
//! records every sandbox the daemon owns, so a restart (even after SIGKILL)
//! finds each one again and nothing is leaked.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");

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

/// Records keyed by sandbox id; values are JSON so a record stays readable by
/// a newer daemon that added fields.
pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| StoreError::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(SANDBOXES).map_err(io)?;
        txn.commit().map_err(io)?;
        Ok(Self { db })
    }

    /// Inserts or replaces one record, durably, before returning.
    pub fn put<T: Serialize>(&self, id: &str, record: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(record).map_err(io)?;
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut table = txn.open_table(SANDBOXES).map_err(io)?;
            table.insert(id, bytes.as_slice()).map_err(io)?;
        }
        txn.commit().map_err(io)
    }

    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut table = txn.open_table(SANDBOXES).map_err(io)?;
            table.remove(id).map_err(io)?;
        }
        txn.commit().map_err(io)
    }

    pub fn all<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read().map_err(io)?;
        let table = txn.open_table(SANDBOXES).map_err(io)?;
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
}
