//! The steps that make a recorded sandbox, in order, each timed into
//! `sandboxd_create_phase_seconds`: resolve its root, make its writable
//! layer, grant its devices, launch its supervisor.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::super::events::{EventKind, Note};
use super::super::{Manager, SandboxError, SandboxRecord};
use crate::metrics::Metrics;
use crate::model::{RuntimeKind, SandboxState};

/// Times the steps of one create, of a container or a microVM.
pub(super) struct PhaseClock<'a> {
    metrics: &'a Metrics,
    runtime: RuntimeKind,
    begun: Instant,
    lap: Instant,
}

impl<'a> PhaseClock<'a> {
    fn new(metrics: &'a Metrics, runtime: RuntimeKind) -> Self {
        let now = Instant::now();
        Self {
            metrics,
            runtime,
            begun: now,
            lap: now,
        }
    }

    /// Records the time since the last lap as phase `name`.
    pub(super) fn lap(&mut self, name: &str) {
        self.observe(name, self.lap.elapsed().as_secs_f64());
        self.lap = Instant::now();
    }

    /// Records phase `name` as measured elsewhere (by the supervisor).
    fn observe(&self, name: &str, seconds: f64) {
        self.metrics.observe_phase(name, self.runtime, seconds);
    }

    fn total(&self) {
        self.observe("total", self.begun.elapsed().as_secs_f64());
    }
}

/// The event that announces step `kind` of a create; none for a pooled
/// sandbox, which is announced when it is claimed.
fn announcement(record: &SandboxRecord, kind: EventKind) -> Vec<Note> {
    match record.pooled {
        true => Vec::new(),
        false => vec![Note::of(kind)],
    }
}

/// What a sandbox's processes start with and may open, beyond its root.
pub(super) struct Grant {
    pub(super) env: Vec<(String, String)>,
    pub(super) devices: crate::gpu::DeviceGrant,
}

impl Manager {
    /// Makes the sandbox `record` describes and returns it ready.
    pub(super) async fn start(
        self: &Arc<Self>,
        mut record: SandboxRecord,
        image_name: &str,
    ) -> Result<SandboxRecord, SandboxError> {
        let mut clock = PhaseClock::new(&self.metrics, record.runtime);
        let mut created = announcement(&record, EventKind::Created);
        // Looked up once: the root, the template's pids and the created
        // event read the same one.
        let base = record
            .base_snapshot
            .as_deref()
            .and_then(|b| self.snapshots.held(b));
        // The fork of a boot template that stands for a booted microVM.
        let template_pids = base
            .as_ref()
            .filter(|m| m.template)
            .map(|m| m.memory.as_ref().map(|memory| memory.limits.pids));
        if template_pids.is_some() {
            for note in &mut created {
                note.detail = Some("from a boot template".into());
            }
        }
        // The first commit (an fsync, ~0.65 ms on the dev host) runs beside
        // the making of the sandbox: a crash before it lands leaves only
        // what recovery removes anyway (what no record owns). It lands
        // before any other write of the record: the Ready commit and a
        // failed create's removal come after the wait below, and the one
        // write in between (a filesystem snapshot named as the image, in
        // `resolve_root`) waits for it here instead.
        let created_commit = if image_name.starts_with("snap-") {
            self.persist_announcing(&record, created, || {})?;
            None
        } else {
            let this = Arc::clone(self);
            let first = record.clone();
            Some(tokio::task::spawn_blocking(move || {
                this.persist_announcing(&first, created, || {})
            }))
        };
        let made = async {
            let root = self
                .resolve_root(&mut record, base, image_name, &mut clock)
                .await?;
            record.image_digest = root.image.digest.clone();
            record.process_user = self.image_user(&root.image).await?;
            let vm = match record.runtime {
                RuntimeKind::Vm => Some(self.vm_spec(&record, &root).await?),
                RuntimeKind::Container => None,
            };
            clock.lap("image");
            let layer_dir = self.make_layer(&record).await?;
            clock.lap("disk");
            let grant = self.grant_devices(&record, &root.image.defaults)?;
            let images_own_root = root.is_the_images_own() && record.base_snapshot.is_none();
            let ready = self.launch(&mut record, root, layer_dir, grant, vm).await?;
            Ok::<_, SandboxError>((ready, images_own_root))
        }
        .await;
        if let Some(commit) = created_commit {
            let committed = commit.await.map_err(SandboxError::internal).and_then(|c| c);
            if let Err(e) = committed {
                // The making's own error (a missing image...) is the one the
                // caller can act on.
                if made.is_err() {
                    tracing::warn!(sandbox = %record.id, "writing the created record: {e}");
                } else {
                    return Err(e);
                }
            }
        }
        let (ready, images_own_root) = made?;
        // From the supervisor's ready line to here: the pipe and the wakeup.
        let handoff_ns = crate::supervisor::monotonic_ns().saturating_sub(ready.ready_at_ns);
        clock.lap("supervisor");
        // A template booted with the default pids limit inside its guest.
        if template_pids
            .flatten()
            .is_some_and(|pids| pids != record.limits.pids)
        {
            self.supervisors
                .limit_guest_pids(&record.id, record.limits.pids)
                .await
                .map_err(SandboxError::internal)?;
            clock.lap("pids");
        }
        if !record.secrets.is_empty() {
            if images_own_root {
                self.install_secrets_fresh(&record).await?;
            } else {
                self.install_secrets(&record).await?;
            }
            clock.lap("secrets");
        }
        for (name, us) in &ready.phases_us {
            let name = match name.as_str() {
                "netns" => "namespace",
                "rootfs_and_spec" => "rootfs",
                other => other,
            };
            clock.observe(name, *us as f64 / 1e6);
        }
        if ready.ready_at_ns > 0 {
            clock.observe("handoff", handoff_ns as f64 / 1e9);
        }
        clock.total();
        tracing::debug!(sandbox = %record.id, phases_us = ?ready.phases_us, "sandbox ready");
        record.state = SandboxState::Ready;
        let ready = announcement(&record, EventKind::Ready);
        // Journaled: a crash of the machine before the commit leaves the
        // record `creating`, which recovery tears down with the sandbox.
        self.persist_announcing_journaled(&record, ready, || {
            self.records().insert(record.id.clone(), record.clone());
        })?;
        self.unbind_deleted_secrets(&mut record).await;
        Ok(record)
    }

    /// The sandbox's writable layer: a btrfs subvolume with its disk quota,
    /// owned by the sandbox's root.
    async fn make_layer(&self, record: &SandboxRecord) -> Result<PathBuf, SandboxError> {
        let disk = Arc::clone(&self.disk);
        let layer_id = record.id.clone();
        let base = self.config.id_map_base;
        let limit = record.limits.disk_mib * 1024 * 1024;
        tokio::task::spawn_blocking(move || disk.create_layer(&layer_id, limit, base, base))
            .await
            .map_err(SandboxError::internal)?
            .map_err(SandboxError::internal)
    }

    /// The GPUs the record holds, as device nodes and environment, and the
    /// environment every process starts with ([`super::start_env`]).
    fn grant_devices(
        &self,
        record: &SandboxRecord,
        image: &crate::image::ImageDefaults,
    ) -> Result<Grant, SandboxError> {
        let gpu = self.gpus.grant(&record.gpus)?;
        Ok(Grant {
            env: super::start_env(image, gpu.env, record),
            devices: gpu.devices,
        })
    }
}
