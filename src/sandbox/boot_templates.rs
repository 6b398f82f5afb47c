//! MicroVM boot templates: a memory snapshot of a guest just booted from
//! one image at one size, with nothing of any caller's in it, from which
//! later creates of that image and size are forked instead of booting a
//! kernel (config `vm_boot_templates`, on by default). The first create of
//! an image and size boots cold and asks for a template; the refill task
//! boots one more VM while no create is in flight, snapshots it and removes
//! it. A fork gets what a cold create would boot with: its own netns, egress
//! policy, environment, secrets, CPU quota and guest pids limit, a fresh RNG
//! seed and wall time (the fork's `Reseed`). Templates are the daemon's
//! own: hidden from the snapshot API, kept at most [`MAX_TEMPLATES`]
//! (the least recently used goes), and dropped when the daemon stops or
//! starts (a new daemon may run another kernel, agent or VMM); a fork keeps
//! its template's data for as long as it lives.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, MutexGuard};

use super::capacity::{capacity, Capacity};
use super::create::ColdCreate;
use super::manager::Manager;
use super::snapshots::index::SnapshotKind;
use super::warm_pool::PoolClaim;
use super::{SandboxError, SandboxRecord};
use crate::model::{Limits, ProcessState, RuntimeKind};
use crate::supervisor::protocol::SpawnSpec;

/// Templates kept at once: each is a memory file about as large as what its
/// guest touched while booting, and a scratch disk clone.
const MAX_TEMPLATES: usize = 8;

/// What a template runs before its snapshot (see
/// [`Manager::warm_interpreters`]), and how long each may take.
const WARM_UPS: &[&[&str]] = &[&["python3", "-c", "pass"], &["node", "-e", "0"]];
const WARM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a template fixes: the image as booted (by digest: a moved tag or a
/// changed recipe is another template) and what a guest boots with and
/// cannot change after (RAM, scratch disk size, vCPUs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct TemplateKey {
    image_digest: String,
    memory_mib: u64,
    disk_mib: u64,
    vcpus: u64,
}

impl TemplateKey {
    fn of(image_digest: &str, limits: &Limits) -> Self {
        Self {
            image_digest: image_digest.to_string(),
            memory_mib: limits.memory_mib,
            disk_mib: limits.disk_mib,
            vcpus: vcpus(limits.cpu),
        }
    }
}

/// The whole vCPUs a CPU limit boots (as `vm_spec` counts them).
fn vcpus(cpu: f64) -> u64 {
    cpu.ceil().clamp(1.0, 254.0) as u64
}

/// Whether the host can hold a template's VM while it is made and still
/// take a caller's create of the same limits: a template never takes the
/// room of real work (a caller's create cannot evict it, as it does a
/// pooled sandbox).
fn leaves_room(now: &Capacity, limits: &Limits) -> bool {
    now.sandboxes.free >= 2.0
        && now.cpu.free + 1e-9 >= 2.0 * limits.cpu
        && now.memory_mib.free >= 2.0 * limits.memory_mib as f64
        && now.disk_mib.free >= 2.0 * limits.disk_mib as f64
}

/// A template to make: its key, the image name to boot and the limits.
pub(super) struct Wanted {
    key: TemplateKey,
    image: String,
    limits: Limits,
}

/// The ready templates (snapshot ids), those wanted in order, the one
/// being made, and the templates creates are forking now.
#[derive(Default)]
pub(super) struct BootTemplates {
    ready: HashMap<TemplateKey, Ready>,
    wanted: VecDeque<Wanted>,
    making: Option<TemplateKey>,
    /// Snapshot ids a create took and has not yet recorded its sandbox
    /// (whose `base_snapshot` then holds it) or given up: kept from
    /// removal, whatever drops them meanwhile.
    pinned: HashMap<String, usize>,
    /// Bumped on every use, for least-recently-used eviction.
    clock: u64,
    /// Bumped when every template is dropped: one made across a drop is
    /// dropped too.
    generation: u64,
}

struct Ready {
    snapshot: String,
    used: u64,
}

impl BootTemplates {
    /// The template of `key`, marked used and pinned (see
    /// [`Manager::unpin_boot_template`]).
    fn take(&mut self, key: &TemplateKey) -> Option<String> {
        self.clock += 1;
        let clock = self.clock;
        let snapshot = self.ready.get_mut(key).map(|r| {
            r.used = clock;
            r.snapshot.clone()
        })?;
        *self.pinned.entry(snapshot.clone()).or_default() += 1;
        Some(snapshot)
    }

    fn unpin(&mut self, snapshot: &str) {
        if let Some(count) = self.pinned.get_mut(snapshot) {
            *count -= 1;
            if *count == 0 {
                self.pinned.remove(snapshot);
            }
        }
    }

    /// Asks for `wanted`'s template once: not while it is ready, wanted or
    /// being made.
    fn want(&mut self, wanted: Wanted) {
        let key = &wanted.key;
        if self.ready.contains_key(key)
            || self.making.as_ref() == Some(key)
            || self.wanted.iter().any(|w| w.key == *key)
        {
            return;
        }
        self.wanted.push_back(wanted);
    }

    /// The next template to make, now being made, with the generation
    /// it is made in.
    fn next(&mut self) -> Option<(Wanted, u64)> {
        let wanted = self.wanted.pop_front()?;
        self.making = Some(wanted.key.clone());
        Some((wanted, self.generation))
    }

    /// Keeps `snapshot` as `key`'s template; returns the snapshots that
    /// are no longer templates (one made meanwhile for the same key, the
    /// least recently used beyond [`MAX_TEMPLATES`]).
    fn insert(&mut self, key: TemplateKey, snapshot: String) -> Vec<String> {
        self.clock += 1;
        let mut dropped: Vec<String> = self
            .ready
            .insert(
                key,
                Ready {
                    snapshot,
                    used: self.clock,
                },
            )
            .map(|old| old.snapshot)
            .into_iter()
            .collect();
        while self.ready.len() > MAX_TEMPLATES {
            let Some(oldest) = self
                .ready
                .iter()
                .min_by_key(|(_, r)| r.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            dropped.extend(self.ready.remove(&oldest).map(|r| r.snapshot));
        }
        dropped
    }

    /// Forgets `snapshot` as a template (its fork failed).
    fn forget(&mut self, snapshot: &str) {
        self.ready.retain(|_, r| r.snapshot != snapshot);
    }

    /// Forgets every template and wish; returns the templates' snapshots.
    fn clear(&mut self) -> Vec<String> {
        self.generation += 1;
        self.wanted.clear();
        self.ready.drain().map(|(_, r)| r.snapshot).collect()
    }
}

/// What a create of a microVM does about templates.
pub(super) enum FromTemplate {
    /// It was forked from its template.
    Forked(Box<SandboxRecord>),
    /// It boots; once it booted, `Some` is the template to want.
    Boot(Option<Wanted>),
    /// Its template could not be restored and was dropped: it boots,
    /// under another id than the failed fork's.
    Failed,
}

impl Manager {
    pub(super) fn boot_templates(&self) -> MutexGuard<'_, BootTemplates> {
        self.boot_templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a template is wanted and not made yet.
    pub(super) fn boot_template_wanted(&self) -> bool {
        !self.boot_templates().wanted.is_empty()
    }

    /// Forks the claim's sandbox from the template of its image and size,
    /// else says to boot it (templates off, a filesystem snapshot as the
    /// image, no template yet: then one is to be wanted once it booted, or
    /// its template could not be restored: then the template is dropped).
    pub(super) async fn create_from_boot_template(
        self: &Arc<Self>,
        id: &str,
        claim: &PoolClaim<'_>,
    ) -> Result<FromTemplate, SandboxError> {
        if !self.config.vm.boot_templates || claim.image.starts_with("snap-") {
            return Ok(FromTemplate::Boot(None));
        }
        let image = self.resolve_image(claim.image).await?;
        let key = TemplateKey::of(&image.digest, claim.limits);
        let Some(snapshot) = self.boot_templates().take(&key) else {
            self.metrics.boot_template_create("miss");
            return Ok(FromTemplate::Boot(Some(Wanted {
                key,
                image: claim.image.to_string(),
                limits: self.boot_template_limits(claim.limits),
            })));
        };
        let req = claim.req;
        let forked = self
            .create_cold(ColdCreate {
                id: id.to_string(),
                image_name: claim.image.to_string(),
                limits: claim.limits.clone(),
                ttl_seconds: claim.ttl_seconds,
                labels: req.labels.clone(),
                env: req.env.clone(),
                pooled: false,
                gpu: None,
                idempotency_key: req.idempotency_key.clone(),
                request_digest: claim.request_digest.map(String::from),
                network: claim.network.clone(),
                from_snapshot: Some(snapshot.clone()),
                runtime: RuntimeKind::Vm,
                secrets: claim.secrets.to_vec(),
                host_rootfs: Vec::new(),
                join_netns: None,
                hostname: None,
                volumes: Vec::new(),
            })
            .await;
        // The record (made, or removed with everything) holds it from here.
        let dropped = {
            let mut templates = self.boot_templates();
            templates.unpin(&snapshot);
            !templates.ready.values().any(|r| r.snapshot == snapshot)
        };
        // Dropped while pinned, and this fork failed: nothing holds it now.
        if dropped && forked.is_err() {
            self.collect_snapshots();
        }
        match forked {
            Ok(record) => {
                self.metrics.boot_template_create("hit");
                Ok(FromTemplate::Forked(Box::new(record)))
            }
            // The template could not be restored (its files gone or
            // corrupt, the VMM refused them): a boot does not need it.
            Err(e @ (SandboxError::Internal(_) | SandboxError::NotFound { .. }))
            | Err(
                e @ SandboxError::Conflict {
                    code: "snapshot_corrupted",
                    ..
                },
            ) => {
                tracing::warn!(%snapshot, "forking a boot template failed ({e}); dropping it and booting");
                self.metrics.boot_template_create("failed");
                let ready = {
                    let mut templates = self.boot_templates();
                    templates.forget(&snapshot);
                    templates.ready.len()
                };
                self.metrics.boot_templates_ready(ready);
                self.drop_boot_template_snapshots(vec![snapshot]);
                Ok(FromTemplate::Failed)
            }
            // What a boot would meet too (capacity, a ready timeout).
            Err(e) => Err(e),
        }
    }

    /// Wants the template of a create that booted, and starts making it.
    pub(super) fn want_boot_template(self: &Arc<Self>, wanted: Wanted) {
        self.boot_templates().want(wanted);
        self.start_refill();
    }

    /// Snapshot ids creates are forking now (kept from removal).
    pub(super) fn pinned_boot_templates(&self) -> Vec<String> {
        self.boot_templates().pinned.keys().cloned().collect()
    }

    /// What a template of a create with `limits` boots with: its size, whole
    /// vCPUs and the default pids limit (a fork's own CPU quota and pids
    /// limit are put in force when it starts).
    fn boot_template_limits(&self, limits: &Limits) -> Limits {
        Limits {
            cpu: vcpus(limits.cpu) as f64,
            memory_mib: limits.memory_mib,
            disk_mib: limits.disk_mib,
            pids: self.config.default_pids,
            // A fork's own groups take its weight when it starts.
            cpu_shares: None,
        }
    }

    /// Makes the next wanted template, if any: boots a VM as a pooled one
    /// (invisible, the default egress, no caller's env or secrets), takes a
    /// memory snapshot of it and removes it. False when none was wanted.
    pub(super) async fn make_next_boot_template(self: &Arc<Self>) -> bool {
        let Some((wanted, generation)) = self.boot_templates().next() else {
            return false;
        };
        let room = {
            let records = self.records();
            let all: Vec<&SandboxRecord> = records.values().collect();
            leaves_room(&capacity(&self.config, &all), &wanted.limits)
        };
        let made = match room {
            true => self.make_boot_template(&wanted).await,
            false => Err(SandboxError::Unavailable {
                resource: "capacity",
                message: "the host has no room for it beside a create of its size".into(),
            }),
        };
        let (dropped, ready) = {
            let mut templates = self.boot_templates();
            templates.making = None;
            let dropped = match made {
                // Every template was dropped while this one was made (an
                // image prune): so is this one.
                Ok(snapshot) if templates.generation != generation => vec![snapshot],
                Ok(snapshot) => {
                    tracing::info!(image = %wanted.image, %snapshot, "boot template made");
                    templates.insert(wanted.key, snapshot)
                }
                // Not asked for again until the next boot of this key.
                Err(e) => {
                    tracing::warn!(image = %wanted.image, "making a boot template: {e}");
                    Vec::new()
                }
            };
            (dropped, templates.ready.len())
        };
        self.drop_boot_template_snapshots(dropped);
        self.metrics.boot_templates_ready(ready);
        true
    }

    async fn make_boot_template(self: &Arc<Self>, wanted: &Wanted) -> Result<String, SandboxError> {
        let booted = self
            .create_cold(ColdCreate {
                limits: wanted.limits.clone(),
                ..self.pooled_create(RuntimeKind::Vm, &wanted.image)
            })
            .await?;
        let taken = self.warm_and_snapshot(&booted).await;
        self.remove_everything(&booted).await;
        let meta = taken?;
        // The image the key was asked for may have moved on since.
        if meta.image_digest != wanted.key.image_digest {
            self.drop_boot_template_snapshots(vec![meta.id]);
            return Err(SandboxError::internal(format!(
                "the image {} changed while its template booted",
                wanted.image
            )));
        }
        Ok(meta.id)
    }

    /// Warms a template's VM and takes its memory snapshot. A stopping
    /// daemon waits for the task that makes templates: it stops here
    /// rather than after the warm-ups and the snapshot.
    async fn warm_and_snapshot(
        self: &Arc<Self>,
        booted: &SandboxRecord,
    ) -> Result<super::snapshots::index::SnapshotMeta, SandboxError> {
        let not_stopping = || match *self.stopping.borrow() {
            true => Err(SandboxError::internal("the daemon is stopping")),
            false => Ok(()),
        };
        not_stopping()?;
        self.warm_interpreters(booted).await?;
        not_stopping()?;
        self.snapshot_of(booted.clone(), SnapshotKind::Memory).await
    }

    /// Runs each of run_code's interpreters the image has once (Python,
    /// its default language, and Node), so that forks find their files in
    /// their guest's page cache instead of reading them through its disk
    /// on their first run. One the image lacks is skipped; one that does
    /// not end fails the template.
    async fn warm_interpreters(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        for argv in WARM_UPS {
            let program = argv[0];
            match self.run_once(record, argv).await {
                // Still running: every fork would run it on, unlisted.
                Ok(process) if process.state != ProcessState::Exited => {
                    return Err(SandboxError::internal(format!(
                        "{program} did not end within {WARM_TIMEOUT:?}"
                    )));
                }
                Ok(process) => {
                    tracing::debug!(sandbox = %record.id, program, exit = ?process.exit_code, "warmed in a boot template")
                }
                Err(e) => {
                    tracing::debug!(sandbox = %record.id, program, "not warmed in a boot template: {e}")
                }
            }
        }
        Ok(())
    }

    /// Runs `argv` in `record` as its processes run, to its end.
    async fn run_once(
        &self,
        record: &SandboxRecord,
        argv: &[&str],
    ) -> Result<crate::model::Process, SandboxError> {
        let (uid, gid) = record.process_user.unwrap_or((0, 0));
        let spec = SpawnSpec {
            groups: Vec::new(),
            confinement: Default::default(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            code: None,
            env: Vec::new(),
            cwd: None,
            uid,
            gid,
            stdin: false,
            pty: None,
            timeout_ms: Some(WARM_TIMEOUT.as_millis() as u64),
            root: None,
        };
        let mut client = self.connect_to(record).await?;
        let process = client.spawn(spec).await?;
        Ok(client.wait(process.id, WARM_TIMEOUT).await?)
    }

    /// Deletes template snapshots; their data goes once no fork holds it.
    fn drop_boot_template_snapshots(&self, snapshots: Vec<String>) {
        if snapshots.is_empty() {
            return;
        }
        for id in snapshots {
            let Some(mut meta) = self.snapshots.get(&id) else {
                continue;
            };
            meta.deleted = true;
            if let Err(e) = self.snapshots.save(&self.disk, &meta) {
                tracing::warn!(snapshot = %id, "dropping a boot template: {e}");
            }
        }
        self.collect_snapshots();
    }

    /// Drops every boot template: at a daemon's start (what an earlier one
    /// left) and clean stop.
    pub(super) fn drop_boot_templates(&self) {
        let mut dropped = self.boot_templates().clear();
        dropped.extend(
            self.snapshots
                .lock()
                .values()
                .filter(|m| m.template && !m.deleted)
                .map(|m| m.id.clone()),
        );
        dropped.sort();
        dropped.dedup();
        self.drop_boot_template_snapshots(dropped);
        self.metrics.boot_templates_ready(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cpu: f64, memory_mib: u64) -> Limits {
        Limits {
            cpu,
            memory_mib,
            disk_mib: 1024,
            pids: 256,
            cpu_shares: None,
        }
    }

    #[test]
    fn a_template_is_made_only_with_room_for_a_create_of_its_size_beside_it() {
        let now = |cpu, memory, sandboxes| Capacity {
            cpu: crate::sandbox::capacity::Amount::new(cpu, 0.0),
            memory_mib: crate::sandbox::capacity::Amount::new(memory, 0.0),
            disk_mib: crate::sandbox::capacity::Amount::new(1e6, 0.0),
            sandboxes: crate::sandbox::capacity::Amount::new(sandboxes, 0.0),
            gpus: Default::default(),
        };
        let wanted = limits(1.0, 256);
        assert!(leaves_room(&now(2.0, 512.0, 2.0), &wanted));
        assert!(!leaves_room(&now(1.5, 512.0, 2.0), &wanted));
        assert!(!leaves_room(&now(2.0, 511.0, 2.0), &wanted));
        assert!(!leaves_room(&now(2.0, 512.0, 1.0), &wanted));
    }

    #[test]
    fn a_key_is_the_digest_and_what_the_guest_boots_with() {
        let a = TemplateKey::of("sha256:a", &limits(0.5, 256));
        assert_eq!(a, TemplateKey::of("sha256:a", &limits(1.0, 256)));
        assert_ne!(a, TemplateKey::of("sha256:a", &limits(1.5, 256)));
        assert_ne!(a, TemplateKey::of("sha256:a", &limits(1.0, 512)));
        assert_ne!(a, TemplateKey::of("sha256:b", &limits(1.0, 256)));
    }

    #[test]
    fn a_template_is_wanted_once_and_the_least_recently_used_goes_first() {
        let mut templates = BootTemplates::default();
        let key = |n: u64| TemplateKey::of("sha256:a", &limits(1.0, n));
        let wish = |n: u64| Wanted {
            key: key(n),
            image: "python".into(),
            limits: limits(1.0, n),
        };
        templates.want(wish(1));
        templates.want(wish(1));
        assert_eq!(templates.wanted.len(), 1);
        // Nor while it is being made.
        let (making, generation) = templates.next().expect("a wish");
        assert_eq!(generation, 0);
        templates.want(wish(1));
        assert!(templates.wanted.is_empty());
        assert_eq!(templates.making, Some(making.key));
        for n in 0..MAX_TEMPLATES as u64 {
            assert!(templates.insert(key(n), format!("snap-{n}")).is_empty());
        }
        // Key 0 is used again: key 1 is now the least recently used. The
        // take pins it until the fork's record holds it.
        assert_eq!(templates.take(&key(0)).as_deref(), Some("snap-0"));
        assert_eq!(templates.pinned.get("snap-0"), Some(&1));
        templates.unpin("snap-0");
        assert!(templates.pinned.is_empty());
        assert_eq!(
            templates.insert(key(100), "snap-100".into()),
            vec!["snap-1".to_string()]
        );
        assert_eq!(templates.take(&key(1)), None);
        // A ready key is not wanted again; a second template for a key
        // replaces the first.
        templates.making = None;
        templates.want(wish(100));
        assert!(templates.wanted.is_empty());
        assert_eq!(
            templates.insert(key(100), "snap-101".into()),
            vec!["snap-100".to_string()]
        );
        templates.forget("snap-101");
        assert_eq!(templates.take(&key(100)), None);
        let mut left = templates.clear();
        left.sort();
        assert_eq!(left.len(), MAX_TEMPLATES - 1);
        assert!(templates.wanted.is_empty());
        // A template made across the drop is made in an older generation.
        assert_eq!(templates.generation, 1);
    }
}
