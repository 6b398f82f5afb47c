//! Network slots: sandbox run directories made ahead of demand, each with
//! its network namespace already plumbed and its rules loaded (the same in
//! every sandbox, see [`super::plumbing`] and [`super::rules`]). A create
//! renames a slot to its own run directory (one `rename(2)`, the namespace's
//! bind mount moves with it) instead of making the namespace, the veth pair
//! and the ruleset on its critical path. A slot is used once: the sandbox's
//! teardown removes its namespace as it would one made in place, so no
//! tenant's conntrack entries, sockets or neighbours reach the next.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::netns::{self, NetnsError};
use super::proxy::{self, EgressError};

/// Slot directories start with this, which no sandbox id can (ids never
/// start with a dot), beside the sandboxes' run directories.
const SLOT_PREFIX: &str = ".slot-";
/// Ends the name of a slot being made, dropped once it is complete.
const MAKING_SUFFIX: &str = ".making";

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("making network slot directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Egress(#[from] EgressError),
}

/// The ready slots under one run directory.
#[derive(Debug)]
pub struct NetSlots {
    dir: PathBuf,
    size: usize,
    ready: Mutex<VecDeque<PathBuf>>,
    next: AtomicU64,
    /// Set by [`Self::drain`]: a slot made after it is removed at once.
    closed: AtomicBool,
}

impl NetSlots {
    /// Slots in `sandboxes_run_dir`, kept at `size` (0: none are made).
    /// Slots an earlier daemon left are removed first.
    pub fn new(sandboxes_run_dir: &Path, size: usize) -> Self {
        let slots = Self {
            dir: sandboxes_run_dir.to_path_buf(),
            size,
            ready: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        };
        let left: Vec<PathBuf> = std::fs::read_dir(&slots.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(SLOT_PREFIX))
            .map(|e| e.path())
            .collect();
        for slot in left {
            discard(&slot);
        }
        slots
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<PathBuf>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether fewer than `size` slots are ready.
    pub fn wanted(&self) -> bool {
        self.ready().len() < self.size
    }

    /// Half or fewer of the slots are ready.
    pub fn low(&self) -> bool {
        self.ready().len() * 2 <= self.size
    }

    /// Makes one slot and adds it to the ready ones. Blocking (a few ms:
    /// a namespace, a veth pair, addresses, routes, its rules), at a
    /// lower CPU priority than creates (`background_priority`; the thread
    /// or `nft` process it starts for the rules inherits it).
    pub fn make_one(&self) -> Result<(), SlotError> {
        let _lowered = crate::background_priority::BackgroundThread::enter();
        self.make_one_now()
    }

    fn make_one_now(&self) -> Result<(), SlotError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let making = self.dir.join(format!("{SLOT_PREFIX}{n}{MAKING_SUFFIX}"));
        let slot = self.dir.join(format!("{SLOT_PREFIX}{n}"));
        let dir_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SlotError::Dir { path, source }
        };
        std::fs::create_dir_all(&making).map_err(dir_err(&making))?;
        let made = netns::create(&making.join("netns"))
            .map_err(SlotError::from)
            .and_then(|()| {
                Ok(proxy::prepare_network(
                    &making.join("netns"),
                    crate::net::rules::Loader::preferred(),
                )?)
            })
            .and_then(|()| std::fs::rename(&making, &slot).map_err(dir_err(&slot)));
        if let Err(e) = made {
            discard(&making);
            return Err(e);
        }
        let mut ready = self.ready();
        if self.closed.load(Ordering::Acquire) {
            drop(ready);
            discard(&slot);
        } else {
            ready.push_back(slot);
        }
        Ok(())
    }

    /// Moves a ready slot to `run_dir` (which must not exist, or be an
    /// empty directory); false when none is ready or the move failed (the
    /// slot is then removed).
    pub fn adopt(&self, run_dir: &Path) -> bool {
        let Some(slot) = self.ready().pop_front() else {
            return false;
        };
        match std::fs::rename(&slot, run_dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(slot = %slot.display(), "moving a network slot to {}: {e}", run_dir.display());
                discard(&slot);
                false
            }
        }
    }

    /// Removes every ready slot (a clean stop).
    pub fn drain(&self) {
        let slots: Vec<PathBuf> = {
            let mut ready = self.ready();
            self.closed.store(true, Ordering::Release);
            ready.drain(..).collect()
        };
        for slot in slots {
            discard(&slot);
        }
    }
}

/// Removes a slot's namespace and directory.
fn discard(slot: &Path) {
    if let Err(e) = netns::remove(&slot.join("netns")) {
        tracing::warn!(slot = %slot.display(), "removing a network slot: {e}");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(slot) {
        tracing::warn!(slot = %slot.display(), "removing a network slot: {e}");
    }
}
