//! The warm pools: ready sandboxes of the pooled images, containers
//! (config `pool_size` for the default image, `pools` for others) and
//! microVMs (`vm_pool_size`, `vm_pools`), made ahead of demand at the
//! default limits, and handed to any create of that runtime and image
//! whose limits fit: its egress policy, secrets, env, TTL and labels are
//! put in force at the claim, and lower limits through its cgroups and
//! disk quota. (The disk pool, `disk/pool.rs`, is the btrfs filesystem
//! layers live on.)

use super::events::{EventKind, Note};
use super::record::expiry;
use super::secrets::RootBundle;
use super::SandboxError;
use super::SandboxRecord;
use crate::model::{CreateRequest, Limits, RuntimeKind, SandboxState};
use crate::net::policy::{DefaultEgress, NetworkPolicy};
use crate::runtime::cgroups::{CgroupLimits, Layout, SandboxCgroups};
use crate::secrets::SecretBinding;
use crate::supervisor::mailbox::Postbox;
use crate::supervisor::protocol::{Ceilings, HandOver};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::SystemTime;

use super::create::{new_id, start_env, ColdCreate};
use super::manager::Manager;

/// Which pool a sandbox belongs to: its runtime and its image, as
/// creates spell it.
pub(super) type PoolKey = (RuntimeKind, String);

/// Ids of ready, unclaimed sandboxes, per pool, oldest first. Keyed by
/// runtime, then image, so a claim looks its image up by `&str` without
/// allocating a key.
#[derive(Debug, Default)]
pub(super) struct WarmPools {
    by_pool: HashMap<RuntimeKind, HashMap<String, VecDeque<String>>>,
    /// What was made for each pooled sandbox's claim as it joined the
    /// pool, by id; it leaves with the sandbox, however it leaves.
    pub(super) made: HashMap<String, MadeForClaim>,
}

/// What a claim of one pooled sandbox uses that was made as it joined the
/// pool. What could not be made (logged) is missing, and the claim does
/// without: it reads or sends it another way.
#[derive(Debug, Default)]
pub(super) struct MadeForClaim {
    /// The daemon's end of its claim mailbox (without: its claim is a
    /// request).
    postbox: Option<Postbox>,
    /// A container's trust bundle, copied up into its own layer and held
    /// open (by its supervisor too, where it said so) for a claim's append.
    bundle_copied_up: Option<(std::fs::File, SupervisorHolds)>,
    /// A container's memory usage file, held open for the memory check of
    /// a claim that lowers the limit (without: read by path).
    memory_usage: Option<Arc<std::fs::File>>,
    /// Its image's defaults, for a claim's environment (without: looked
    /// up again).
    image_defaults: Option<crate::image::ImageDefaults>,
}

/// Whether a pooled container's supervisor holds its copied-up trust bundle
/// too, and so appends a claim's CA itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SupervisorHolds {
    Yes,
    No,
}

impl WarmPools {
    /// The queue of a pool, made if need be (a refill's put or a put back
    /// may allocate; a claim's lookups do not).
    fn queue(&mut self, runtime: RuntimeKind, image: &str) -> &mut VecDeque<String> {
        self.by_pool
            .entry(runtime)
            .or_default()
            .entry(image.to_string())
            .or_default()
    }

    pub(super) fn put(&mut self, runtime: RuntimeKind, image: &str, id: String) {
        self.queue(runtime, image).push_back(id);
    }

    fn take(&mut self, runtime: RuntimeKind, image: &str) -> Option<String> {
        self.by_pool.get_mut(&runtime)?.get_mut(image)?.pop_front()
    }

    /// Returns a sandbox [`Self::take`] gave out, first in line again.
    fn put_back(&mut self, runtime: RuntimeKind, image: &str, id: String) {
        self.queue(runtime, image).push_front(id);
    }

    /// Forgets `id` wherever it is (a pooled sandbox being deleted).
    pub(super) fn forget(&mut self, id: &str) {
        for ids in self.queues_mut() {
            ids.retain(|i| i != id);
        }
        self.made.remove(id);
    }

    /// What was made for pooled sandbox `id`'s claim, to add to: tests
    /// put there what [`Manager::pool_ready`] makes.
    #[cfg(test)]
    fn made_for(&mut self, id: String) -> &mut MadeForClaim {
        self.made.entry(id).or_default()
    }

    #[cfg(test)]
    pub(super) fn keep_postbox(&mut self, id: String, postbox: Postbox) {
        self.made_for(id).postbox = Some(postbox);
    }

    #[cfg(test)]
    pub(super) fn keep_copied_up_bundle(
        &mut self,
        id: String,
        bundle: std::fs::File,
        held: SupervisorHolds,
    ) {
        self.made_for(id).bundle_copied_up = Some((bundle, held));
    }

    #[cfg(test)]
    pub(super) fn keep_memory_usage(&mut self, id: String, usage: std::fs::File) {
        self.made_for(id).memory_usage = Some(Arc::new(usage));
    }

    #[cfg(test)]
    pub(super) fn keep_image_defaults(
        &mut self,
        id: String,
        defaults: crate::image::ImageDefaults,
    ) {
        self.made_for(id).image_defaults = Some(defaults);
    }

    /// Pooled sandbox `id`'s held memory usage file, if it has one.
    pub(super) fn memory_usage(&self, id: &str) -> Option<Arc<std::fs::File>> {
        self.made.get(id)?.memory_usage.clone()
    }

    /// What was made for pooled sandbox `id`'s claim, as it leaves the
    /// pool for it.
    fn take_made(&mut self, id: &str) -> MadeForClaim {
        self.made.remove(id).unwrap_or_default()
    }

    fn queues_mut(&mut self) -> impl Iterator<Item = &mut VecDeque<String>> {
        self.by_pool.values_mut().flat_map(HashMap::values_mut)
    }

    pub(super) fn len(&self) -> usize {
        self.by_pool
            .values()
            .flat_map(HashMap::values)
            .map(VecDeque::len)
            .sum()
    }

    fn len_of(&self, runtime: RuntimeKind, image: &str) -> usize {
        self.by_pool
            .get(&runtime)
            .and_then(|images| images.get(image))
            .map_or(0, VecDeque::len)
    }

    fn drain(&mut self) -> Vec<String> {
        self.made.clear();
        self.queues_mut().flat_map(|ids| ids.drain(..)).collect()
    }

    /// The newest sandbox of the fullest pool: what a caller's create that
    /// does not fit the host takes the room of.
    fn evict(&mut self) -> Option<String> {
        let id = self.queues_mut().max_by_key(|ids| ids.len())?.pop_back()?;
        self.made.remove(&id);
        Some(id)
    }
}

/// A create the pools (or a microVM's boot template) may serve, validated
/// and with the daemon's defaults applied.
pub(super) struct PoolClaim<'a> {
    pub(super) runtime: RuntimeKind,
    pub(super) image: &'a str,
    pub(super) limits: &'a Limits,
    pub(super) ttl_seconds: i64,
    pub(super) req: &'a CreateRequest,
    pub(super) request_digest: Option<&'a str>,
    pub(super) network: &'a NetworkPolicy,
    pub(super) secrets: &'a [SecretBinding],
    pub(super) gpu: bool,
}

/// Whether a sandbox made with `pooled` limits can be lowered to `wanted`.
/// A microVM's memory is its guest's RAM, its disk a device of a fixed
/// size and its vCPUs whole CPUs, all set at boot: those must be what a
/// cold create would boot (only the CPU quota around the vCPUs can be
/// lowered).
fn fits(runtime: RuntimeKind, wanted: &Limits, pooled: &Limits) -> bool {
    let lower = wanted.cpu <= pooled.cpu
        && wanted.memory_mib <= pooled.memory_mib
        && wanted.disk_mib <= pooled.disk_mib
        && wanted.pids <= pooled.pids
        // A claim does not reweigh a sandbox: it keeps the pooled one's.
        && wanted.cpu_shares == pooled.cpu_shares;
    match runtime {
        RuntimeKind::Container => lower,
        RuntimeKind::Vm => {
            lower
                && wanted.memory_mib == pooled.memory_mib
                && wanted.disk_mib == pooled.disk_mib
                && wanted.cpu.ceil() == pooled.cpu.ceil()
        }
    }
}

impl Manager {
    pub(super) fn pool(&self) -> MutexGuard<'_, WarmPools> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn pooled(&self) -> usize {
        self.pool().len()
    }

    pub(super) fn pooled_limits(&self) -> Limits {
        Limits {
            cpu: self.config.default_cpu,
            memory_mib: self.config.default_memory_mib,
            disk_mib: self.config.default_disk_mib,
            pids: self.config.default_pids,
            cpu_shares: None,
        }
    }

    /// The pool that is furthest below its size, if any is. MicroVM pools
    /// wait while microVMs cannot run here (their refills would fail and
    /// hold up the others).
    fn next_to_refill(&self) -> Option<PoolKey> {
        let vms_run = self.vm_unavailable().is_none();
        let pools = self.pool();
        self.config
            .warm_pools
            .iter()
            .filter(|p| p.runtime == RuntimeKind::Container || vms_run)
            .filter(|p| pools.len_of(p.runtime, &p.image) < p.size)
            .max_by_key(|p| p.size - pools.len_of(p.runtime, &p.image))
            .map(|p| (p.runtime, p.image.clone()))
    }

    /// Keeps every warm pool at its size, then makes the boot templates
    /// wanted, one sandbox at a time, and only while no caller's create is
    /// in flight: a refill never competes with real work for the host's
    /// CPUs.
    pub(super) fn start_refill(self: &Arc<Self>) {
        if (self.config.warm_pools.is_empty() && !self.boot_template_wanted())
            || self.refilling.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // A pool whose refill failed is not retried by this task (the
            // next claim or restart tries again); templates still are made.
            let mut pools_failed = false;
            loop {
                this.creates_quiet().await;
                if *this.stopping.borrow() {
                    break;
                }
                let refill = match pools_failed {
                    true => None,
                    false => this.next_to_refill(),
                };
                let Some((runtime, image)) = refill else {
                    // The pools are full: then boot templates.
                    if this.make_next_boot_template().await {
                        continue;
                    }
                    break;
                };
                match this.create_cold(this.pooled_create(runtime, &image)).await {
                    Ok(view) => this.pool_ready(runtime, &image, view.id).await,
                    Err(e) => {
                        let runtime = runtime.as_str();
                        tracing::warn!(image, runtime, "refilling the warm pool: {e}");
                        pools_failed = true;
                    }
                }
            }
            this.refilling.store(false, Ordering::Release);
            this.refill_done.notify_waiters();
            // A template wanted after this task last looked.
            if !*this.stopping.borrow() && this.boot_template_wanted() {
                this.start_refill();
            }
        });
    }

    /// Puts ready sandbox `id` in its pool, with what its claim uses made
    /// first ([`MadeForClaim`]): its claim mailbox, so a claim need not
    /// wait on its supervisor (without one, an error logged, its claim is
    /// a `HandOver` request); a container's trust bundle copied up for a
    /// claim with secrets, and held by its supervisor too (which then
    /// appends the claim's CA as it takes the claim; without, an error
    /// logged, the claim appends it); a container's memory usage file; its
    /// image's defaults.
    pub(super) async fn pool_ready(&self, runtime: RuntimeKind, image: &str, id: String) {
        let copied_up = match runtime {
            RuntimeKind::Container => self.copy_up_trust_bundle(&id).await,
            RuntimeKind::Vm => None,
        };
        let copied_up = match copied_up {
            Some(file) => {
                let held = match self
                    .supervisors
                    .hold_trust_bundle(&id, super::secrets::TRUST_BUNDLE_RELATIVE)
                    .await
                {
                    Ok(()) => SupervisorHolds::Yes,
                    Err(e) => {
                        tracing::warn!(sandbox = %id, "its supervisor holding its trust bundle: {e}; a claim appends the CA");
                        SupervisorHolds::No
                    }
                };
                Some((file, held))
            }
            None => None,
        };
        let memory_usage = match runtime {
            RuntimeKind::Container => self.open_memory_usage(&id),
            RuntimeKind::Vm => None,
        };
        let postbox = match self.supervisors.open_mailbox(&id).await {
            Ok(postbox) => Some(postbox),
            Err(e) => {
                tracing::warn!(sandbox = %id, "opening its claim mailbox: {e}; its claim will be a request");
                None
            }
        };
        // Its own statement: the records' lock is not held over the lookup.
        let named = self
            .records()
            .get(&id)
            .map(|r| (r.image.clone(), r.image_digest.clone()));
        let image_defaults = named
            .and_then(|(name, digest)| self.image_by_digest(&name, &digest))
            .map(|image| image.defaults);
        let made = MadeForClaim {
            postbox,
            bundle_copied_up: copied_up,
            memory_usage: memory_usage.map(Arc::new),
            image_defaults,
        };
        // Checked under the pool's lock: a removal forgets the sandbox in
        // the pool again after its teardown (`remove_everything`), so either
        // that second forget finds it here, or this finds it removed or
        // being removed.
        let mut pools = self.pool();
        let still_pooled = self
            .records()
            .get(&id)
            .is_some_and(|r| r.pooled && r.state == SandboxState::Ready);
        if !still_pooled {
            return;
        }
        pools.made.insert(id.clone(), made);
        pools.put(runtime, image, id);
    }

    /// Pooled container `id`'s memory usage file, opened for its claim's
    /// memory check; `None` (logged) where it cannot be opened.
    fn open_memory_usage(&self, id: &str) -> Option<std::fs::File> {
        let path = self.records().get(id)?.cgroups_path.clone();
        match SandboxCgroups::new(Layout::detect(), &path).open_memory_usage() {
            Ok(usage) => Some(usage),
            Err(e) => {
                tracing::warn!(sandbox = %id, "opening its memory usage file: {e}; a claim reads it by name");
                None
            }
        }
    }

    pub(super) fn pooled_create(&self, runtime: RuntimeKind, image: &str) -> ColdCreate {
        ColdCreate {
            id: new_id(),
            secrets: Vec::new(),
            from_snapshot: None,
            runtime,
            image_name: image.to_string(),
            limits: self.pooled_limits(),
            ttl_seconds: -1,
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            pooled: true,
            gpu: None,
            idempotency_key: None,
            request_digest: None,
            network: self.pooled_network(),
            host_rootfs: Vec::new(),
            join_netns: None,
            hostname: None,
            volumes: Vec::new(),
        }
    }

    /// The egress policy pooled sandboxes are made with: the default.
    pub(super) fn pooled_network(&self) -> NetworkPolicy {
        NetworkPolicy {
            block_network: Some(self.config.default_egress == DefaultEgress::Block),
            allow_list: None,
        }
    }

    /// Whether a pooled sandbox an earlier daemon made belongs in one of
    /// this daemon's pools: its runtime and image are pooled, at the
    /// limits this daemon pools them with.
    pub(super) fn still_pooled(&self, record: &SandboxRecord) -> bool {
        record.limits == self.pooled_limits()
            && self
                .config
                .warm_pools
                .iter()
                .any(|p| p.runtime == record.runtime && p.image == record.image)
    }

    /// Tears down the warm pools (on a clean stop: nobody can see or use
    /// those sandboxes, and a restart refills them in the background).
    pub async fn drain_pool(&self) {
        // A refill still making a sandbox would add it after the drain and
        // leave it running with nobody to adopt it; it stops once the daemon
        // is stopping, so wait for it first.
        loop {
            let done = self.refill_done.notified();
            if !self.refilling.load(Ordering::Acquire) {
                break;
            }
            done.await;
        }
        let ids = self.pool().drain();
        for id in ids {
            self.remove_pooled(&id).await;
        }
        self.drop_boot_templates();
    }

    /// Removes one pooled sandbox to make room for a caller's create that
    /// the host cannot otherwise take; false when the pools are empty.
    pub(super) async fn evict_pooled(&self) -> bool {
        let Some(id) = self.pool().evict() else {
            return false;
        };
        tracing::info!(sandbox = %id, "giving up a pooled sandbox to make room for a create");
        self.remove_pooled(&id).await;
        true
    }

    pub(super) async fn remove_pooled(&self, id: &str) {
        let record = self.records().get(id).cloned();
        if let Some(record) = record {
            self.remove_everything(&record).await;
        }
    }

    /// Hands out a pooled sandbox of the claim's runtime and image, made
    /// the claim's own; `None` means start one cold (no such pool, limits
    /// the pooled ones cannot become, GPUs, or none ready).
    pub(super) async fn claim_pooled(
        self: &Arc<Self>,
        claim: &PoolClaim<'_>,
    ) -> Result<Option<SandboxRecord>, SandboxError> {
        let (runtime, image) = (claim.runtime, claim.image);
        if !self
            .config
            .warm_pools
            .iter()
            .any(|p| p.runtime == runtime && p.image == image)
        {
            return Ok(None);
        }
        if claim.gpu || !fits(runtime, claim.limits, &self.pooled_limits()) {
            self.metrics.pool_claim(runtime, image, "unfit");
            return Ok(None);
        }
        loop {
            let Some(id) = self.pool().take(runtime, image) else {
                self.metrics.pool_claim(runtime, image, "empty");
                self.start_refill();
                return Ok(None);
            };
            // A microVM's memory limit is its guest's RAM, which the claim
            // does not change.
            if runtime == RuntimeKind::Container && !self.memory_fits(&id, claim.limits) {
                // Its agent alone uses more than the request allows: keep
                // it for another claim; this one starts cold.
                self.pool().put_back(runtime, image, id);
                self.metrics.pool_claim(runtime, image, "unfit");
                return Ok(None);
            }
            let record = match self.hand_over(&id, claim).await {
                Ok(record) => record,
                Err(e) => {
                    tracing::warn!(sandbox = %id, "pooled sandbox could not be handed out ({e}); removing it");
                    self.remove_pooled(&id).await;
                    continue;
                }
            };
            self.metrics.pool_claim(runtime, image, "hit");
            self.start_once_answered(id.clone());
            return Ok(Some(record));
        }
    }

    /// Puts the claim in force in pooled sandbox `id` (each step only where
    /// it differs from what the pool made) and records it as the caller's.
    async fn hand_over(
        &self,
        id: &str,
        claim: &PoolClaim<'_>,
    ) -> Result<SandboxRecord, SandboxError> {
        // Taken whether or not they are used: the sandbox leaves the pool.
        let made = self.pool().take_made(id);
        let (postbox, image_defaults) = (made.postbox, made.image_defaults);
        let bundle_place = match made.bundle_copied_up {
            Some((file, held)) => RootBundle::CopiedUp(file, held),
            None => RootBundle::InImage,
        };
        let mut record = self
            .records()
            .get(id)
            .cloned()
            .ok_or_else(|| SandboxError::internal("a pooled sandbox without its record"))?;
        // A microVM's pids limit is kept inside its guest, by its agent.
        let guest_pids = (record.runtime == RuntimeKind::Vm
            && claim.limits.pids != record.limits.pids)
            .then_some(claim.limits.pids);
        let ceilings = ceilings_to_lower(&record, claim.limits)?;
        // Where the supervisor holds the copied-up bundle, the CA goes
        // with the hand-over.
        let (trust_bundle_append, bundle_place) =
            self.trust_bundle_append(&record, claim.secrets, bundle_place);
        // A microVM's disk is its scratch image, whose size `fits` keeps.
        let disk_quota_bytes = (record.runtime == RuntimeKind::Container
            && claim.limits.disk_mib != record.limits.disk_mib)
            .then(|| claim.limits.disk_mib * 1024 * 1024);
        record.limits = claim.limits.clone();
        let policy_differs = *claim.network != record.network;
        record.network = claim.network.clone();
        record.secrets = claim.secrets.to_vec();
        record.env = claim.req.env.clone();
        // What the supervisor holds, the lower limits included, goes in
        // one hand-over (posted to its mailbox, or one request); the trust
        // bundle beside it.
        let secrets_generation = self.secrets.generation();
        let change = HandOver {
            policy: policy_differs.then(|| claim.network.into()),
            secrets: if record.secrets.is_empty() {
                None
            } else {
                Some(self.secrets.brokered(&record.secrets)?)
            },
            env: (!record.env.is_empty() || !record.secrets.is_empty()).then(|| {
                let image = image_defaults
                    .unwrap_or_else(|| self.image_defaults(&record.image, &record.image_digest));
                start_env(&image, Vec::new(), &record)
            }),
            guest_pids,
            ceilings,
            disk_quota_bytes,
            trust_bundle_append,
        };
        // Nothing is journaled before the change: a daemon killed before
        // the claim's record hears from the supervisor that a claim
        // reached it (`SupervisorHealth::claimed`), and removes the
        // sandbox instead of pooling it again.
        let told = async {
            if change.is_empty() {
                return Ok::<(), SandboxError>(());
            }
            let secrets = change.secrets.is_some();
            self.deliver_hand_over(id, change, postbox).await?;
            if secrets && self.secrets.generation() != secrets_generation {
                // A secret rotated or deleted meanwhile: pushes reach only
                // ready sandboxes, so tell this one what holds now.
                self.tell_secrets(&record).await?;
            }
            Ok(())
        };
        // The hand-over first, then the bundle where the daemon writes it
        // itself: a daemon killed after that write hears from the
        // supervisor that a claim reached it (health's `claimed`), so a
        // changed bundle is never pooled again. A failed hand-over writes
        // nothing.
        told.await?;
        self.install_trust_bundle_fresh(&record, bundle_place)
            .await?;
        record.pooled = false;
        record.idempotency_key = claim.req.idempotency_key.clone();
        record.request_digest = claim.request_digest.map(String::from);
        record.ttl_seconds = claim.ttl_seconds;
        record.expires_at_ms = expiry(claim.ttl_seconds);
        record.labels = claim.req.labels.clone();
        record.created_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        // Announced now, with the record that makes it the caller's.
        let notes = vec![
            Note {
                kind: EventKind::Created,
                process_id: None,
                detail: Some("from the warm pool".into()),
            },
            Note::of(EventKind::Ready),
        ];
        // Journaled: the sandbox is the caller's from here, and a daemon
        // killed before the commit finds it so in the journal. Committed
        // after the answer.
        self.persist_announcing_claimed(&record, notes, || {
            self.records().insert(id.to_string(), record.clone());
        })?;
        // A secret deleted during the claim skipped the record, still pooled
        // and bound to nothing then.
        self.unbind_deleted_secrets(&mut record).await;
        Ok(record)
    }

    /// Puts `change` in force in pooled sandbox `id`'s supervisor: posted
    /// to its mailbox where it has one (the supervisor takes it before it
    /// answers its next request, and only a request starts the caller's
    /// code), else as a `HandOver` request. A microVM's pids limit needs
    /// its agent, so a claim that lowers it is always a request.
    async fn deliver_hand_over(
        &self,
        id: &str,
        change: HandOver,
        postbox: Option<Postbox>,
    ) -> Result<(), SandboxError> {
        if let (Some(postbox), None) = (postbox, change.guest_pids) {
            // A failed post leaves no mark, so the supervisor takes nothing.
            match postbox.post(&change) {
                Ok(()) => {
                    self.metrics.pool_hand_over("mailbox");
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, "posting its claim: {e}; sending it as a request")
                }
            }
        }
        self.supervisors
            .hand_over(id, change)
            .await
            .map_err(SandboxError::internal)?;
        self.metrics.pool_hand_over("request");
        Ok(())
    }

    /// Whether pooled sandbox `id` uses less memory now than `limits`
    /// allow (else lowering its limit would fail, or on cgroup v2 kill).
    /// A claim that keeps its memory limit lowers nothing: its usage is
    /// not read.
    fn memory_fits(&self, id: &str, limits: &Limits) -> bool {
        let path = match self.records().get(id) {
            Some(r) if limits.memory_mib < r.limits.memory_mib => r.cgroups_path.clone(),
            _ => return true,
        };
        // Read outside the pool's lock; by path where the held file has
        // no figure to give.
        let held = self.pool().memory_usage(id);
        let in_use = held
            .and_then(|usage| SandboxCgroups::memory_bytes_in(&usage))
            .or_else(|| SandboxCgroups::new(Layout::detect(), &path).memory_bytes());
        in_use.is_none_or(|bytes| bytes < limits.memory_mib * 1024 * 1024)
    }
}

/// Runs `f`, which may block, on this thread: in the daemon's
/// multi-threaded runtime the worker's other tasks move to another first
/// (`block_in_place`), so nothing waits behind it, and its caller pays no
/// blocking thread's wake-up (0.1-0.2 ms on an idle host). Elsewhere (unit
/// tests) it just runs.
pub(super) fn run_blocking_here<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The cgroup ceilings pooled sandbox `pooled` must lower to take
/// `limits`, which its supervisor writes as it takes the hand-over; `None`
/// where its cgroups stay as they are. A microVM's CPU quota alone: what
/// else a claim may differ in, [`fits`] allows only where nothing outside
/// the guest holds it (the pids limit, which its agent lowers at the
/// claim).
fn ceilings_to_lower(
    pooled: &SandboxRecord,
    limits: &Limits,
) -> Result<Option<Ceilings>, SandboxError> {
    let cpu_quota_us =
        crate::runtime::spec::cpu_quota_us(limits.cpu).map_err(SandboxError::internal)?;
    let was = &pooled.limits;
    Ok(match pooled.runtime {
        RuntimeKind::Vm => (limits.cpu != was.cpu).then_some(Ceilings::VmCpuQuota {
            quota_us: cpu_quota_us,
        }),
        RuntimeKind::Container => (limits.cpu != was.cpu
            || limits.memory_mib != was.memory_mib
            || limits.pids != was.pids)
            .then_some(Ceilings::Container(CgroupLimits {
                cpu_quota_us,
                memory_bytes: limits.memory_mib * 1024 * 1024,
                pids_max: i64::try_from(limits.pids).unwrap_or(i64::MAX),
            })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_microvm_fits_only_the_size_it_booted_with() {
        let pooled = Limits {
            cpu: 2.0,
            memory_mib: 512,
            disk_mib: 1024,
            pids: 512,
            cpu_shares: None,
        };
        let lower_cpu = Limits {
            cpu: 1.5,
            ..pooled.clone()
        };
        let fewer_vcpus = Limits {
            cpu: 1.0,
            ..pooled.clone()
        };
        let less_memory = Limits {
            memory_mib: 256,
            ..pooled.clone()
        };
        let smaller_disk = Limits {
            disk_mib: 512,
            ..pooled.clone()
        };
        let fewer_pids = Limits {
            pids: 64,
            ..pooled.clone()
        };
        let weighed = Limits {
            cpu_shares: Some(512),
            ..pooled.clone()
        };
        for (wanted, container, vm) in [
            (&pooled, true, true),
            (&lower_cpu, true, true),
            (&fewer_pids, true, true),
            (&fewer_vcpus, true, false),
            (&less_memory, true, false),
            (&smaller_disk, true, false),
            (&weighed, false, false),
        ] {
            assert_eq!(
                fits(RuntimeKind::Container, wanted, &pooled),
                container,
                "{wanted:?}"
            );
            assert_eq!(fits(RuntimeKind::Vm, wanted, &pooled), vm, "{wanted:?}");
        }
        let more = Limits {
            cpu: 3.0,
            ..pooled.clone()
        };
        assert!(!fits(RuntimeKind::Container, &more, &pooled));
        assert!(!fits(RuntimeKind::Vm, &more, &pooled));
    }

    /// A claim finds what the pool made for it (here a copied-up bundle)
    /// only where the pool kept it, once; a sandbox leaving the pool any
    /// other way takes it along.
    #[test]
    fn a_claim_finds_what_was_made_for_it_only_where_the_pool_kept_it() {
        let file = || tempfile::tempfile().expect("a file");
        let copied_up = |made: MadeForClaim| made.bundle_copied_up.is_some();
        let mut pools = WarmPools::default();
        for id in ["sb-a", "sb-b", "sb-c"] {
            pools.put(RuntimeKind::Container, "python", id.into());
        }
        pools.keep_copied_up_bundle("sb-a".into(), file(), SupervisorHolds::Yes);
        pools.keep_copied_up_bundle("sb-b".into(), file(), SupervisorHolds::No);
        assert!(copied_up(pools.take_made("sb-a")));
        assert!(!copied_up(pools.take_made("sb-a")));
        assert!(!copied_up(pools.take_made("sb-c")));
        pools.forget("sb-b");
        assert!(!copied_up(pools.take_made("sb-b")));
        pools.keep_copied_up_bundle("sb-c".into(), file(), SupervisorHolds::Yes);
        pools.keep_memory_usage("sb-c".into(), file());
        assert_eq!(pools.evict().as_deref(), Some("sb-c"));
        assert!(!copied_up(pools.take_made("sb-c")));
        assert!(pools.made.is_empty());
    }
}
