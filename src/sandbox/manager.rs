//! The sandbox manager: the registry of sandbox records, lookup, TTL and
//! delete. Creating one is `create/`, recovery after a restart
//! `recovery.rs`. Records live in the store; processes, output and files
//! live behind each sandbox's supervisor.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::events::{EventKind, EventLog, Note};
use super::record::{expiry, SandboxRecord};
use super::teardown::teardown;
use super::validate::validated_ttl;
use super::SandboxError;
use crate::config::Config;
use crate::disk::DiskPool;
use crate::gpu::GpuService;
use crate::image::ImageCache;
use crate::model::{RuntimeKind, SandboxState};
use crate::net::policy::{DefaultEgress, EgressPolicy, NetworkPolicy};
use crate::runtime::mount_ns::HostRoot;
use crate::runtime::paths::SandboxPaths;
use crate::store::{Store, StoreError};
use crate::supervisor::client::{SocketSupervisors, SupervisorClient, Supervisors};

pub struct Manager {
    pub config: Config,
    pub(super) store: Arc<Store>,
    /// The sandboxes' supervisors, as the orchestration speaks to them.
    pub(super) supervisors: Arc<dyn Supervisors>,
    pub events: EventLog,
    pub metrics: crate::metrics::Metrics,
    pub(super) images: Arc<ImageCache>,
    /// Images pulled from OCI registries.
    pub(super) registry: Arc<crate::image::oci::Registry>,
    /// Images built from declarative specs.
    pub(super) builds: super::builds::Builds,
    pub(super) disk: Arc<DiskPool>,
    /// The host's GPUs and who holds them.
    pub(super) gpus: Arc<GpuService>,
    pub(super) records: Mutex<HashMap<String, SandboxRecord>>,
    pub(super) ttl_changed: Notify,
    /// Claimed sandboxes whose create's answer their watch, the TTL's
    /// wake-up and the pool's refill wait for, by id; whether the watch
    /// then starts (see [`super::watch::Answered`]).
    pub(super) awaiting_answer: Mutex<HashMap<String, bool>>,
    /// Ids of ready sandboxes of the pooled images, not yet handed out.
    pub(super) pool: Mutex<super::warm_pool::WarmPools>,
    /// MicroVM boot templates, ready and wanted.
    pub(super) boot_templates: Mutex<super::boot_templates::BootTemplates>,
    /// Network namespaces made ahead of creates.
    pub(super) net_slots: Arc<crate::net::slots::NetSlots>,
    /// Supervisors started ahead of launches.
    pub(super) standbys: Mutex<super::standby::Standbys>,
    /// Notified when a launch takes a standby (or finds none).
    pub(super) standby_taken: Notify,
    /// Notified when a launch takes a slot (or finds none).
    pub(super) slot_taken: Notify,
    /// Callers' creates running now; refills wait for none.
    pub(super) creates_in_flight: std::sync::atomic::AtomicUsize,
    /// Notified when the last create in flight ends.
    pub(super) creates_settled: Notify,
    /// When the last caller's create ended.
    pub(super) last_create_ended: Mutex<Option<std::time::Instant>>,
    pub(super) refilling: AtomicBool,
    /// Notified when a refill task ends.
    pub(super) refill_done: Notify,
    /// Set once the daemon stops: long-lived streams end so that in-flight
    /// requests can finish and the daemon can exit.
    pub(super) stopping: tokio::sync::watch::Sender<bool>,
    /// Each supervisor's egress counters as last read, for metric deltas.
    pub(super) egress_seen: Mutex<HashMap<String, crate::net::proxy::EgressCounters>>,
    /// Each supervisor's per-secret substitution counts as last read.
    pub(super) substitutions_seen: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// Every snapshot, with its meta.
    pub(super) snapshots: super::snapshots::index::SnapshotIndex,
    /// Idempotency keys held by running creates, and failed keyed creates'
    /// errors (in memory only: a restart forgets them).
    pub(super) idempotency: super::create::idempotency::Idempotency,
    /// What the host offers microVMs, found at start.
    pub virtualization: crate::runtime::virt::Virtualization,
    /// The brokered secrets and the CA of their intercepted hosts.
    pub(super) secrets: Arc<crate::secrets::SecretBroker>,
    /// What is open through the ingress, per sandbox and exposed port.
    pub links: Arc<super::port_links::PortLinks>,
}

/// How far a record's write has gone when [`Manager::announce_stored`]
/// returns.
#[derive(Clone, Copy)]
enum Durability {
    /// Committed to the database (an fsync).
    Committed,
    /// In the store's journal; the committer is woken to commit it.
    Journaled,
    /// In the store's journal; the committer is woken once the claim it
    /// records has been answered.
    JournaledCommitAfterAnswer,
}

/// What the store keeps of `record`. A sandbox left running under a
/// supervisor of another protocol version is failed to this daemon only:
/// it is stored as ready (as its own build wrote it, with what its owner
/// changed since, a TTL or a port), so that the build that matches can
/// still adopt it; its failure lives in memory (see `recovery`).
fn stored_form(record: &SandboxRecord) -> std::borrow::Cow<'_, SandboxRecord> {
    if !record.foreign_supervisor {
        return std::borrow::Cow::Borrowed(record);
    }
    let mut stored = record.clone();
    stored.state = crate::model::SandboxState::Ready;
    stored.failure = None;
    std::borrow::Cow::Owned(stored)
}

impl Manager {
    /// Validates a policy request (400 naming the bad entry) and returns it
    /// with the daemon's `default_egress` applied when it names none.
    pub(super) fn resolved_network(
        &self,
        req: &NetworkPolicy,
    ) -> Result<NetworkPolicy, SandboxError> {
        EgressPolicy::from_request(req, self.config.default_egress)
            .map_err(|e| SandboxError::bad("invalid_network_policy", e.to_string()))?;
        if req.block_network.is_none() && req.allow_list.is_none() {
            return Ok(NetworkPolicy {
                block_network: Some(self.config.default_egress == DefaultEgress::Block),
                allow_list: None,
            });
        }
        Ok(req.clone())
    }
}

/// A ready sandbox whose supervisor cannot be reached: 409.
pub(super) fn not_running(id: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Conflict {
        code: "sandbox_not_running",
        message: format!("sandbox {id} is not running: {e}"),
    }
}

impl Manager {
    pub fn new(config: Config, store: Store, images: ImageCache, disk: DiskPool) -> Arc<Self> {
        let store = Arc::new(store);
        let snapshots = super::snapshots::index::SnapshotIndex::load(&disk);
        super::snapshots::sweep_orphan_images(&config.state_dir, &snapshots);
        let registry = Arc::new(crate::image::oci::Registry::new(
            config.images_dir.join("oci"),
            config.registry.clone(),
            config.upstream.clone(),
        ));
        let builds = super::builds::Builds::open(&disk, config.package_sources.clone());
        let net_slots = Arc::new(crate::net::slots::NetSlots::new(
            &config.sandboxes_run_dir(),
            config.net_slots,
        ));
        Arc::new(Self {
            builds,
            secrets: Arc::new(crate::secrets::SecretBroker::new(
                Arc::clone(&store),
                config.state_dir.clone(),
            )),
            events: EventLog::open(Arc::clone(&store), config.event_retention_seconds),
            metrics: crate::metrics::Metrics::new(),
            gpus: GpuService::new(config.gpu.clone()),
            supervisors: Arc::new(SocketSupervisors::new(config.sandboxes_run_dir())),
            config,
            store,
            images: Arc::new(images),
            registry,
            disk: Arc::new(disk),
            records: Mutex::new(HashMap::new()),
            ttl_changed: Notify::new(),
            awaiting_answer: Mutex::new(HashMap::new()),
            pool: Mutex::new(Default::default()),
            boot_templates: Mutex::new(Default::default()),
            creates_in_flight: Default::default(),
            net_slots,
            slot_taken: Notify::new(),
            standbys: Mutex::new(Default::default()),
            standby_taken: Notify::new(),
            creates_settled: Notify::new(),
            last_create_ended: Mutex::new(None),
            refilling: AtomicBool::new(false),
            refill_done: Notify::new(),
            stopping: tokio::sync::watch::channel(false).0,
            egress_seen: Mutex::new(HashMap::new()),
            substitutions_seen: Mutex::new(HashMap::new()),
            snapshots,
            idempotency: Default::default(),
            links: Default::default(),
            virtualization: crate::runtime::virt::Virtualization::detect(),
        })
    }

    /// Ends the event and output streams; creates in flight finish.
    pub fn begin_stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once the daemon is stopping.
    pub async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|stopping| *stopping).await;
    }

    /// Tears down every sandbox, the warm pool's too, through the normal
    /// teardown (a clean stop with `stop_sandboxes_on_exit`, once no request
    /// is in flight). Returns the ids still there: those whose teardown was
    /// incomplete (kept as failed, as a DELETE keeps them), and creates
    /// still running, which are not torn down under their own feet (the
    /// next daemon's recovery finishes them).
    pub async fn delete_all(&self) -> Vec<String> {
        let records: Vec<SandboxRecord> = self
            .records()
            .values()
            .filter(|r| r.state != SandboxState::Creating)
            .cloned()
            .collect();
        // All at once, as concurrent DELETEs would: one by one, a full host
        // would outlast the service manager's stop timeout.
        futures::future::join_all(records.into_iter().map(|mut record| async move {
            self.pool().forget(&record.id);
            // Persisted first, as DELETE does: a daemon killed halfway
            // finishes the teardown at its next start instead of adopting.
            record.state = SandboxState::Deleting;
            if let Err(e) = self.persist(&record) {
                tracing::warn!(sandbox = %record.id, "deleting on exit: {e}");
            }
            self.records().insert(record.id.clone(), record.clone());
            self.remove_everything(&record).await;
        }))
        .await;
        self.records().keys().cloned().collect()
    }

    pub(super) fn records(&self) -> MutexGuard<'_, HashMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn paths(&self, id: &str) -> SandboxPaths {
        SandboxPaths::new(&self.config.sandboxes_run_dir(), id)
    }

    /// Container `record`'s root as this daemon reaches it (through its
    /// init: no mount namespace of the host's holds it).
    pub(super) fn host_root(&self, record: &SandboxRecord) -> HostRoot {
        self.supervisors.root(
            &self.paths(&record.id),
            record.init_pid,
            &record.cgroups_path,
        )
    }

    pub(super) fn persist(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        self.store
            .put(&record.id, &stored_form(record))
            .map_err(SandboxError::internal)
    }

    /// Persists `record` with the events `notes` announce in one commit (one
    /// fsync), runs `then`, and only then lets followers hear of them.
    pub(super) fn persist_announcing(
        &self,
        record: &SandboxRecord,
        notes: Vec<Note>,
        then: impl FnOnce(),
    ) -> Result<(), SandboxError> {
        self.announce_stored(record, notes, then, Durability::Committed)
    }

    /// [`Self::persist_announcing`] through the store's journal: for the
    /// last write of a create or a claim, whose sandbox runs by then, so a
    /// crash of the machine before the commit loses nothing it would not
    /// lose anyway ([`Store::put_with_events_journaled`]).
    pub(super) fn persist_announcing_journaled(
        &self,
        record: &SandboxRecord,
        notes: Vec<Note>,
        then: impl FnOnce(),
    ) -> Result<(), SandboxError> {
        self.announce_stored(record, notes, then, Durability::Journaled)
    }

    /// [`Self::persist_announcing_journaled`] for a claim: the store's
    /// committer is woken only once the claim has been answered
    /// ([`super::Answered`]), so its commit does not compete with the
    /// answer for the host's cores.
    pub(super) fn persist_announcing_claimed(
        &self,
        record: &SandboxRecord,
        notes: Vec<Note>,
        then: impl FnOnce(),
    ) -> Result<(), SandboxError> {
        self.announce_stored(record, notes, then, Durability::JournaledCommitAfterAnswer)
    }

    fn announce_stored(
        &self,
        record: &SandboxRecord,
        notes: Vec<Note>,
        then: impl FnOnce(),
        durability: Durability,
    ) -> Result<(), SandboxError> {
        self.events
            .emit_with(&record.id, notes, |events| {
                let record = stored_form(record);
                let (id, record) = (&record.id, &*record);
                match durability {
                    Durability::Committed => self.store.put_with_events(id, record, events)?,
                    Durability::Journaled => {
                        self.store.put_with_events_journaled(id, record, events)?
                    }
                    Durability::JournaledCommitAfterAnswer => self
                        .store
                        .put_with_events_journaled_quietly(id, record, events)?,
                }
                then();
                Ok::<(), StoreError>(())
            })
            .map_err(SandboxError::internal)
    }

    pub fn capacity(&self) -> super::capacity::Capacity {
        let mut capacity = {
            let records = self.records();
            let all: Vec<&SandboxRecord> = records.values().collect();
            super::capacity::capacity(&self.config, &all)
        };
        let gpus = self.gpus.list();
        let held = gpus.iter().filter(|g| g.held_by.is_some()).count();
        capacity.gpus = super::capacity::Amount::new(gpus.len() as f64, held as f64);
        capacity
    }

    /// Sandboxes handed to callers (the warm pool is not counted).
    pub fn count(&self) -> usize {
        self.records().values().filter(|r| !r.pooled).count()
    }

    pub(super) async fn remove_everything(&self, record: &SandboxRecord) {
        // Whatever the pool holds of it goes first: a trust bundle held
        // open would keep its root's overlay alive past the teardown.
        self.pool().forget(&record.id);
        self.unanswered_removed(&record.id);
        let paths = self.paths(&record.id);
        // Its URLs stop answering before anything of it goes.
        let ingress_bytes = self.links.close_sandbox(&record.id);
        let problems = teardown(&record.id, &record.cgroups_path, &paths, &self.disk).await;
        if problems.is_empty() {
            self.records().remove(&record.id);
            let mut notes = Vec::new();
            if !record.pooled && record.state != SandboxState::Creating {
                let mut usage = record.usage.clone();
                usage.ingress_bytes = usage.ingress_bytes.max(ingress_bytes);
                notes.push(Note {
                    kind: EventKind::Deleted,
                    process_id: None,
                    detail: serde_json::to_string(&usage).ok(),
                });
            }
            // The record goes with its `deleted` event in one commit. A
            // store that refuses leaves a record whose sandbox is gone,
            // which the next start's recovery removes; the event still goes out.
            let _ = self.events.emit_with(&record.id, notes, |events| {
                if let Err(e) = self.store.remove_with_events(&record.id, events) {
                    tracing::warn!(sandbox = %record.id, "removing its record: {e}");
                }
                Ok::<(), std::convert::Infallible>(())
            });
            self.gpus.release(&record.id);
            self.metrics.sandbox_gone(&record.id);
            if record.base_snapshot.is_some() {
                self.collect_snapshots();
            }
        } else {
            for p in &problems {
                tracing::warn!(sandbox = %record.id, "teardown: {p}");
            }
            // Kept as failed so the operator sees it and a later delete retries.
            let mut failed = record.clone();
            failed.state = SandboxState::Failed;
            // Its supervisor, of whichever build, was stopped by the teardown.
            failed.foreign_supervisor = false;
            failed.failure = Some(format!("teardown incomplete: {}", problems.join("; ")));
            let _ = self.persist(&failed);
            self.records().insert(failed.id.clone(), failed);
        }
        // Again, now that the record is gone or failed: a refill that
        // checked it before the first forget may have pooled the sandbox
        // meanwhile (`pool_ready`).
        self.pool().forget(&record.id);
    }

    /// A caller's sandbox; pooled ones are not visible until handed out.
    pub(super) fn record(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        self.records()
            .get(id)
            .filter(|r| !r.pooled)
            .cloned()
            .ok_or_else(|| SandboxError::sandbox_not_found(id))
    }

    /// The uid and gid a process in sandbox `id` runs as when its start
    /// names none.
    pub fn process_user(&self, id: &str) -> Result<(u32, u32), SandboxError> {
        Ok(self.record(id)?.process_user.unwrap_or((0, 0)))
    }

    /// Sandbox `id`'s resource use now, from its cgroups (409 when it is
    /// not ready). A microVM's tasks are its guest's, counted by its agent:
    /// its host group holds only the VMM's threads. Like every other figure
    /// here, a count that cannot be had at once is 0, not an error: a busy
    /// or stalled guest (a fork bomb) is when metrics are wanted most.
    pub async fn stats(&self, id: &str) -> Result<crate::model::SandboxStats, SandboxError> {
        /// How long the agent may take to count its guest's tasks (the
        /// supervisor's own bound, and a little for the round trip).
        const GUEST_COUNT_WAIT: std::time::Duration =
            crate::supervisor::processes::GUEST_COUNT_DEADLINE
                .saturating_add(std::time::Duration::from_millis(500));
        let record = self.ready(id)?;
        let cgroups = crate::runtime::cgroups::SandboxCgroups::new(
            crate::runtime::cgroups::Layout::detect(),
            &record.cgroups_path,
        );
        let pids = match record.runtime {
            RuntimeKind::Container => cgroups.pids_current().unwrap_or(0),
            RuntimeKind::Vm => {
                match tokio::time::timeout(GUEST_COUNT_WAIT, self.supervisors.guest_pids(id)).await
                {
                    Ok(Ok(count)) => count,
                    Ok(Err(e)) => {
                        tracing::warn!(sandbox = %id, "counting the guest's tasks: {e}");
                        0
                    }
                    Err(_) => {
                        tracing::warn!(sandbox = %id, "the guest's agent did not count its tasks within {GUEST_COUNT_WAIT:?}");
                        0
                    }
                }
            }
        };
        Ok(crate::model::SandboxStats {
            cpu_seconds: cgroups.cpu_seconds().unwrap_or(0.0),
            memory_bytes: cgroups.memory_bytes().unwrap_or(0),
            memory_limit_bytes: record.limits.memory_mib * 1024 * 1024,
            pids,
            pids_limit: record.limits.pids,
            oom_kills: cgroups.oom_kills(),
        })
    }

    /// The sandbox as it is now, with fresh OOM and failure facts from its supervisor.
    pub async fn get(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Ok(record);
        }
        let health = self.supervisors.health(id).await.ok();
        let mut records = self.records();
        let Some(current) = records.get_mut(id) else {
            return Err(SandboxError::sandbox_not_found(id));
        };
        match health {
            Some(h) => {
                current.oom_kills = h.oom_kills;
                current.usage.egress_bytes = h.egress.bytes;
                current.usage.ingress_bytes = current.usage.ingress_bytes.max(self.links.bytes(id));
                if let Some(reason) = h.failure {
                    current.state = SandboxState::Failed;
                    current.failure = Some(reason);
                }
            }
            None => {
                current.state = SandboxState::Failed;
                current.failure = Some("the sandbox's supervisor is gone".into());
            }
        }
        let view = current.clone();
        let snapshot = current.clone();
        drop(records);
        if snapshot.state == SandboxState::Failed {
            let _ = self.persist(&snapshot);
            self.events
                .emit(EventKind::Failed, id, None, snapshot.failure.clone());
        }
        Ok(view)
    }

    pub fn list(&self) -> Vec<SandboxRecord> {
        let mut all: Vec<SandboxRecord> = self
            .records()
            .values()
            .filter(|r| !r.pooled)
            .cloned()
            .collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        all
    }

    /// A connection to a ready sandbox's supervisor (409 when it is not ready).
    pub async fn connect(&self, id: &str) -> Result<SupervisorClient, SandboxError> {
        self.ready(id)?;
        SupervisorClient::connect(&self.paths(id).socket())
            .await
            .map_err(|e| not_running(id, e))
    }

    /// The supervisor of `record`, which the caller found ready (a pooled
    /// one too: the daemon's own work on it).
    pub(super) async fn connect_to(
        &self,
        record: &SandboxRecord,
    ) -> Result<SupervisorClient, SandboxError> {
        SupervisorClient::connect(&self.paths(&record.id).socket())
            .await
            .map_err(|e| not_running(&record.id, e))
    }

    /// A caller's sandbox that is ready (409 when it is not).
    pub(super) fn ready(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Err(SandboxError::Conflict {
                code: "sandbox_not_ready",
                message: format!(
                    "sandbox {id} is {:?}, not ready{}",
                    record.state,
                    record
                        .failure
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                ),
            });
        }
        Ok(record)
    }

    pub async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        let record = {
            let mut records = self.records();
            let record = records
                .get_mut(id)
                .filter(|r| !r.pooled)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            if record.state == SandboxState::Creating {
                return Err(still_creating(id, "delete it"));
            }
            record.state = SandboxState::Deleting;
            record.clone()
        };
        self.persist(&record)?;
        self.remove_everything(&record).await;
        match self.records().get(id) {
            Some(left) => Err(SandboxError::internal(
                left.failure.clone().unwrap_or_default(),
            )),
            None => Ok(()),
        }
    }

    pub fn set_ttl(&self, id: &str, ttl_seconds: i64) -> Result<SandboxRecord, SandboxError> {
        let ttl_seconds = validated_ttl(ttl_seconds)?;
        let record = {
            let mut records = self.records();
            let record = records
                .get_mut(id)
                .filter(|r| !r.pooled)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            // The create's Ready commit writes its own copy of the record:
            // a TTL set now would be lost.
            if record.state == SandboxState::Creating {
                return Err(still_creating(id, "set its TTL"));
            }
            record.ttl_seconds = ttl_seconds;
            record.expires_at_ms = expiry(ttl_seconds);
            record.clone()
        };
        self.persist(&record)?;
        self.ttl_changed.notify_one();
        Ok(record)
    }

    /// The host's GPUs and who holds them.
    pub fn gpus(&self) -> Arc<GpuService> {
        Arc::clone(&self.gpus)
    }
}

/// The answer to a change of a sandbox whose create has not returned yet.
fn still_creating(id: &str, what: &str) -> SandboxError {
    SandboxError::Conflict {
        code: "sandbox_creating",
        message: format!("sandbox {id} is still being created; {what} once create returns"),
    }
}
