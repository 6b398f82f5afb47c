//! Idempotency keys of creates: which keys have a create running now, and
//! the errors of keyed creates that failed. A sandbox made with a key
//! carries the key and its request's digest in its record (so that survives
//! a restart, and deleting the sandbox frees the key). A failed create
//! leaves no record, so its error is kept here instead, in memory only:
//! the newest [`MAX_FAILED`], each for [`FAILED_FOR`], and none survive a
//! daemon restart (a retry after one creates again).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::model::SandboxState;
use crate::sandbox::{SandboxError, SandboxRecord};

/// How many failed keyed creates are remembered; the oldest go first.
pub(in crate::sandbox) const MAX_FAILED: usize = 1024;
/// How long a failed keyed create is remembered: a client's retries of one
/// request come well within it.
pub(in crate::sandbox) const FAILED_FOR: Duration = Duration::from_secs(3600);

struct Failed {
    key: String,
    digest: String,
    error: SandboxError,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    /// Key -> digest of the request whose create is running with it.
    running: HashMap<String, String>,
    /// Oldest first.
    failed: VecDeque<Failed>,
}

impl Inner {
    fn expire(&mut self, now: Instant) {
        while self
            .failed
            .front()
            .is_some_and(|f| now.saturating_duration_since(f.at) >= FAILED_FOR)
        {
            self.failed.pop_front();
        }
    }
}

/// The manager's table of keys in use by creates not (or no longer)
/// visible as records.
#[derive(Default)]
pub(in crate::sandbox) struct Idempotency {
    inner: Mutex<Inner>,
}

/// What a keyed create does.
pub(super) enum Admission<'a> {
    /// Nothing holds the key: create, holding the claim until done.
    Create(Claim<'a>),
    /// The answer for this key, without creating anything (boxed: a record
    /// is large beside a claim).
    Answer(Box<Result<SandboxRecord, SandboxError>>),
}

/// A key held by the create running with it; [`Claim::finish`] releases
/// it (remembering a failure), and so does dropping it (a panicked create
/// leaves the key free rather than stuck "in progress").
pub(super) struct Claim<'a> {
    table: &'a Idempotency,
    key: String,
    digest: String,
    /// Set by `finish`, which released the key already.
    finished: bool,
}

fn in_progress(key: &str, sandbox: Option<&str>) -> SandboxError {
    let which = sandbox
        .map(|id| format!(" (sandbox {id})"))
        .unwrap_or_default();
    SandboxError::Conflict {
        code: "create_in_progress",
        message: format!(
            "a create with idempotency key {key:?} is still running{which}; retry shortly"
        ),
    }
}

fn reused(key: &str, whose: &str) -> SandboxError {
    SandboxError::Conflict {
        code: "idempotency_key_reused",
        message: format!(
            "idempotency key {key:?} was already used with another request body ({whose}); \
             a different request needs a new key"
        ),
    }
}

impl Idempotency {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides a create with `key` whose request has `digest`. `earlier`
    /// finds the live sandbox holding the key, if any; it is called under
    /// this table's lock (so a second create with the key cannot slip in
    /// between the look and the claim), and must not take this table.
    pub(super) fn admit(
        &self,
        key: &str,
        digest: &str,
        earlier: impl FnOnce() -> Option<SandboxRecord>,
        now: Instant,
    ) -> Admission<'_> {
        let mut inner = self.lock();
        inner.expire(now);
        let earlier = earlier();
        let earlier_id = earlier.as_ref().map(|r| r.id.as_str());
        if let Some(running) = inner.running.get(key) {
            return Admission::Answer(Box::new(Err(if running == digest {
                in_progress(key, earlier_id)
            } else {
                let whose = match earlier_id {
                    Some(id) => format!("sandbox {id}, still being created"),
                    None => "its create is still running".to_string(),
                };
                reused(key, &whose)
            })));
        }
        // Before the records: a create that failed may have left a record
        // behind (a teardown that did not finish), and it is still a failure.
        if let Some(failed) = inner.failed.iter().find(|f| f.key == key) {
            return Admission::Answer(Box::new(Err(if failed.digest == digest {
                failed.error.clone()
            } else {
                reused(key, &format!("its create failed: {}", failed.error))
            })));
        }
        if let Some(earlier) = earlier {
            // A record from before digests were kept has none: a retry.
            let other_body = earlier
                .request_digest
                .as_deref()
                .is_some_and(|d| d != digest);
            return Admission::Answer(Box::new(if other_body {
                Err(reused(key, &format!("sandbox {}", earlier.id)))
            } else if earlier.state == SandboxState::Creating {
                Err(in_progress(key, Some(&earlier.id)))
            } else {
                Ok(earlier)
            }));
        }
        inner.running.insert(key.to_string(), digest.to_string());
        Admission::Create(Claim {
            table: self,
            key: key.to_string(),
            digest: digest.to_string(),
            finished: false,
        })
    }

    fn remember_failed(&self, inner: &mut Inner, failed: Failed) {
        inner.failed.retain(|f| f.key != failed.key);
        inner.failed.push_back(failed);
        while inner.failed.len() > MAX_FAILED {
            inner.failed.pop_front();
        }
    }
}

impl Claim<'_> {
    /// Releases the key once the create is done. A success is the record's
    /// from now on (it carries the key); a failure other than a 503 is
    /// remembered so that retries get the same error. One lock for both, so a retry sees the
    /// key running or failed, never neither.
    pub(super) fn finish(mut self, result: &Result<SandboxRecord, SandboxError>, now: Instant) {
        let mut inner = self.table.lock();
        inner.running.remove(&self.key);
        match result {
            // A 503 made nothing and says "not now": the caller's retry with
            // the same key is a new attempt, not a replay of the refusal.
            Ok(_) | Err(SandboxError::Unavailable { .. }) => {}
            Err(error) => {
                let failed = Failed {
                    key: self.key.clone(),
                    digest: self.digest.clone(),
                    error: error.clone(),
                    at: now,
                };
                self.table.remember_failed(&mut inner, failed);
            }
        }
        self.finished = true;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.table.lock().running.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found() -> SandboxError {
        SandboxError::NotFound {
            code: "image_not_found",
            message: "no image \"nope\"".into(),
        }
    }

    fn create<'a>(
        table: &'a Idempotency,
        key: &str,
        digest: &str,
        now: Instant,
    ) -> Option<Claim<'a>> {
        match table.admit(key, digest, || None, now) {
            Admission::Create(claim) => Some(claim),
            Admission::Answer(_) => None,
        }
    }

    fn answer(table: &Idempotency, key: &str, digest: &str, now: Instant) -> SandboxError {
        match table.admit(key, digest, || None, now) {
            Admission::Answer(answer) => match *answer {
                Err(e) => e,
                Ok(r) => panic!("a sandbox for {key}: {}", r.id),
            },
            Admission::Create(_) => panic!("{key} was free"),
        }
    }

    fn fail(table: &Idempotency, key: &str, digest: &str, now: Instant) {
        let claim = create(table, key, digest, now).expect("the key is free");
        claim.finish(&Err(not_found()), now);
    }

    #[test]
    fn a_failed_create_answers_its_retries_with_its_error() {
        let table = Idempotency::default();
        let now = Instant::now();
        fail(&table, "k", "d1", now);
        let again = answer(&table, "k", "d1", now);
        assert_eq!(again.code(), "image_not_found");
        assert_eq!(again.to_string(), not_found().to_string());
        let other = answer(&table, "k", "d2", now);
        assert_eq!(other.code(), "idempotency_key_reused");
        assert!(other.to_string().contains("\"k\""), "{other}");
    }

    #[test]
    fn a_running_create_holds_its_key_until_it_finishes() {
        let table = Idempotency::default();
        let now = Instant::now();
        let claim = create(&table, "k", "d1", now).expect("the key is free");
        assert_eq!(answer(&table, "k", "d1", now).code(), "create_in_progress");
        assert_eq!(
            answer(&table, "k", "d2", now).code(),
            "idempotency_key_reused"
        );
        drop(claim);
        assert!(
            create(&table, "k", "d1", now).is_some(),
            "a dropped claim frees its key"
        );
    }

    #[test]
    fn failures_are_kept_for_an_hour() {
        let table = Idempotency::default();
        let then = Instant::now();
        fail(&table, "k", "d", then);
        let almost = then + FAILED_FOR - Duration::from_secs(1);
        assert_eq!(answer(&table, "k", "d", almost).code(), "image_not_found");
        assert!(create(&table, "k", "d", then + FAILED_FOR).is_some());
    }

    #[test]
    fn only_the_newest_failures_are_kept() {
        let table = Idempotency::default();
        let now = Instant::now();
        for i in 0..=MAX_FAILED {
            fail(&table, &format!("k{i}"), "d", now);
        }
        assert_eq!(table.lock().failed.len(), MAX_FAILED);
        assert!(
            create(&table, "k0", "d", now).is_some(),
            "the oldest is gone"
        );
        let newest = format!("k{MAX_FAILED}");
        assert_eq!(answer(&table, &newest, "d", now).code(), "image_not_found");
        assert_eq!(answer(&table, "k1", "d", now).code(), "image_not_found");
    }
}
