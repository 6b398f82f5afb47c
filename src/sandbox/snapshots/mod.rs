//! Snapshots of sandboxes. This file is the manager's snapshot work: taking
//! a snapshot of a running sandbox, forking one, listing and deleting
//! snapshots, resolving a snapshot used as an image, and removing deleted
//! snapshots once no sandbox or later snapshot stacks on them. What a
//! snapshot is and the index of all of them is [`index`]; the SHA-256 of a
//! memory snapshot's files is [`integrity`]. The bytes live in the disk
//! pool (`disk/snapshot.rs`); the VMM's own snapshot format is `vmm/`.

pub mod index;
pub mod integrity;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::error::SandboxError;
use super::manager::Manager;
use crate::model::{RuntimeKind, SandboxState};
use crate::runtime::cgroups::{Layout, SandboxCgroups};
use crate::runtime::CheckpointTarget;
use crate::supervisor::client::{CallError, Checkpointed};
use crate::supervisor::protocol::SupervisorErrorKind;
use index::{new_id, MemoryImage, SnapshotKind, SnapshotMeta, SnapshotView, META_VERSION};

/// Pool space a filesystem snapshot needs free: it shares the layer's
/// extents, so only btrfs metadata is written.
const FILESYSTEM_SNAPSHOT_RESERVE: u64 = 64 << 20;

/// Where memory snapshots' CRIU images live, under the state directory.
const SNAPSHOT_IMAGES: &str = "snapshot-images";

/// A checkpoint just taken: its images, what restores need, the source's
/// next process id and its running processes.
type Taken = (
    PathBuf,
    crate::runtime::sandbox::Checkpoint,
    u64,
    Vec<crate::model::Process>,
);

/// A snapshot request's failure. The supervisor's refusals: with calls to
/// the agent in flight, a 409 `sandbox_busy` (try again); of a sandbox it
/// cannot snapshot as it is (a pod container root with limits of its own),
/// a 409 `snapshot_unsupported`; any other, an internal error saying `what`
/// failed.
pub(super) fn refused(what: &str, e: CallError) -> SandboxError {
    match e {
        CallError::Refused(e) if e.kind == SupervisorErrorKind::Conflict => {
            SandboxError::Conflict {
                code: "sandbox_busy",
                message: e.message,
            }
        }
        CallError::Refused(e) if e.kind == SupervisorErrorKind::InvalidInput => {
            SandboxError::Conflict {
                code: "snapshot_unsupported",
                message: e.message,
            }
        }
        CallError::Refused(e) => SandboxError::internal(format!("{what}: {}", e.message)),
        other => other.into(),
    }
}

/// What a capture produced, for [`Manager::record_snapshot`].
struct Captured {
    kind: SnapshotKind,
    layers: Vec<PathBuf>,
    size_bytes: u64,
    memory: Option<MemoryImage>,
    vm_scratch: Option<PathBuf>,
}

/// What a new snapshot stacks on.
struct SnapshotBase {
    image: String,
    base_rootfs: std::path::PathBuf,
    layers: Vec<std::path::PathBuf>,
    parents: Vec<String>,
}

impl Manager {
    /// Snapshots sandbox `id`. The sandbox is frozen while its state is
    /// captured and keeps running afterwards.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        kind: SnapshotKind,
    ) -> Result<SnapshotView, SandboxError> {
        let record = self.record(id)?;
        Ok(self.snapshot_of(record, kind).await?.view())
    }

    /// [`Self::snapshot`] of `record`, which may be pooled (a boot
    /// template's).
    pub(super) async fn snapshot_of(
        self: &Arc<Self>,
        record: super::record::SandboxRecord,
        kind: SnapshotKind,
    ) -> Result<SnapshotMeta, SandboxError> {
        let id = record.id.as_str();
        if record.state != SandboxState::Ready {
            return Err(SandboxError::Conflict {
                code: "sandbox_not_running",
                message: format!(
                    "sandbox {id} is {:?}; only a ready sandbox can be snapshotted",
                    record.state
                ),
            });
        }
        if !record.host_rootfs.is_empty() {
            // A snapshot stacks on its image, and host directories are
            // not kept by the daemon: they may be gone when it is used.
            return Err(SandboxError::bad(
                "host_rootfs_snapshot_unsupported",
                format!("sandbox {id} runs on host directories (host_rootfs), which the daemon does not keep; it cannot be snapshotted"),
            ));
        }
        if !record.volumes.is_empty() {
            // Their files are the host's, not the sandbox's layer, and a
            // fork could not be given them back.
            return Err(SandboxError::bad(
                "volumes_snapshot_unsupported",
                format!("sandbox {id} has host volumes bound into its root, which a snapshot cannot keep; it cannot be snapshotted"),
            ));
        }
        if kind == SnapshotKind::Memory && !record.gpus.is_empty() {
            return Err(SandboxError::bad(
                "gpu_snapshot_unsupported",
                "a sandbox with GPUs cannot be memory-snapshotted (GPU state cannot be checkpointed yet); take {\"kind\": \"filesystem\"}",
            ));
        }
        let cgroups = SandboxCgroups::new(Layout::detect(), &record.cgroups_path);
        // Memory images are about as large as the memory in use.
        let needed = FILESYSTEM_SNAPSHOT_RESERVE
            + match kind {
                SnapshotKind::Memory => cgroups.memory_bytes().unwrap_or(0),
                SnapshotKind::Filesystem => 0,
            };
        let free = match kind {
            SnapshotKind::Memory => crate::disk::free_bytes_at(&self.config.state_dir)
                .map_err(SandboxError::internal)?,
            SnapshotKind::Filesystem => self.disk.free_bytes().map_err(SandboxError::internal)?,
        };
        if free < needed {
            return Err(SandboxError::Unavailable {
                resource: "disk",
                message: format!(
                    "{} MiB of disk are free; this snapshot needs {} MiB",
                    free >> 20,
                    needed >> 20
                ),
            });
        }
        let base = self.snapshot_base(&record).await?;
        let snapshot_id = new_id();
        let dir = self
            .disk
            .create_snapshot_dir(&snapshot_id)
            .map_err(SandboxError::internal)?;
        match self
            .capture(&record, &cgroups, kind, &snapshot_id, &dir, base)
            .await
        {
            Ok(meta) => {
                tracing::info!(sandbox = %record.id, snapshot = %snapshot_id, ?kind, size_bytes = meta.size_bytes, "snapshot taken");
                Ok(meta)
            }
            Err(e) => {
                if let Err(undo) = self.remove_snapshot_data(&snapshot_id) {
                    tracing::warn!(snapshot = %snapshot_id, "removing a failed snapshot: {undo}");
                }
                Err(e)
            }
        }
    }

    /// The base image and layers a snapshot of `record` stacks on.
    async fn snapshot_base(
        &self,
        record: &super::record::SandboxRecord,
    ) -> Result<SnapshotBase, SandboxError> {
        if let Some(base) = record.base_snapshot.as_deref() {
            let index = self.snapshots.lock();
            let meta = index.get(base).ok_or_else(|| {
                SandboxError::internal(format!("the sandbox's base snapshot {base} is missing"))
            })?;
            let mut parents = vec![base.to_string()];
            parents.extend(meta.parents.iter().cloned());
            return Ok(SnapshotBase {
                image: meta.image.clone(),
                base_rootfs: meta.base_rootfs.clone(),
                layers: meta.layers.clone(),
                parents,
            });
        }
        // The image as the sandbox was made from it (a tag may have moved,
        // a recipe changed since), else by name.
        let image = match self.image_by_digest(&record.image, &record.image_digest) {
            Some(image) => image,
            None => self.resolve_image(&record.image).await?,
        };
        Ok(SnapshotBase {
            image: record.image.clone(),
            base_rootfs: image.rootfs,
            layers: image.layers,
            parents: Vec::new(),
        })
    }

    /// Freezes the sandbox, checkpoints its processes (memory), snapshots
    /// its layer, thaws it, and records the snapshot.
    async fn capture(
        &self,
        record: &super::record::SandboxRecord,
        cgroups: &SandboxCgroups,
        kind: SnapshotKind,
        snapshot_id: &str,
        dir: &Path,
        base: SnapshotBase,
    ) -> Result<SnapshotMeta, SandboxError> {
        if record.runtime == RuntimeKind::Vm && kind == SnapshotKind::Filesystem {
            return self.capture_vm_disk(record, snapshot_id, dir, base).await;
        }
        if record.runtime == RuntimeKind::Vm {
            return self.capture_vm(record, snapshot_id, dir, base).await;
        }
        let freezing = cgroups.clone();
        tokio::task::spawn_blocking(move || freezing.freeze())
            .await
            .map_err(SandboxError::internal)?
            .map_err(|e| SandboxError::Conflict {
                code: "sandbox_busy",
                message: e.to_string(),
            })?;
        let captured = self
            .capture_frozen(record, cgroups, kind, snapshot_id, dir)
            .await;
        if let Err(e) = cgroups.thaw() {
            tracing::error!(sandbox = %record.id, "thawing after a snapshot: {e}");
        }
        let (layer, checkpointed) = captured?;
        let memory = match checkpointed {
            Some((images_dir, checkpoint, next_proc, processes)) => {
                let hashing = images_dir.clone();
                let sha256 = tokio::task::spawn_blocking(move || integrity::digest_dir(&hashing))
                    .await
                    .map_err(SandboxError::internal)?
                    .map_err(SandboxError::internal)?;
                Some(MemoryImage {
                    images_dir,
                    checkpoint,
                    next_proc,
                    limits: record.limits.clone(),
                    env: record.env.clone(),
                    secrets: record.secrets.clone(),
                    ports: record.ports.clone(),
                    sha256,
                    processes,
                    vm: None,
                })
            }
            None => None,
        };
        let upper = layer.join("upper");
        let mut measured = vec![upper.clone()];
        if let Some(m) = &memory {
            measured.push(m.images_dir.clone());
        }
        let size_bytes = tokio::task::spawn_blocking(move || {
            measured.iter().map(|d| crate::image::tree_bytes(d)).sum()
        })
        .await
        .unwrap_or(0);
        let mut layers = vec![upper];
        layers.extend(base.layers.iter().cloned());
        self.record_snapshot(
            record,
            snapshot_id,
            base,
            Captured {
                kind,
                layers,
                size_bytes,
                memory,
                vm_scratch: None,
            },
        )
    }

    /// Records a captured snapshot: its meta, written atomically.
    fn record_snapshot(
        &self,
        record: &super::record::SandboxRecord,
        snapshot_id: &str,
        base: SnapshotBase,
        captured: Captured,
    ) -> Result<SnapshotMeta, SandboxError> {
        let meta = SnapshotMeta {
            version: META_VERSION,
            id: snapshot_id.to_string(),
            kind: captured.kind,
            sandbox: record.id.clone(),
            image: base.image,
            image_digest: record.image_digest.clone(),
            base_rootfs: base.base_rootfs,
            layers: captured.layers,
            parents: base.parents,
            created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            size_bytes: captured.size_bytes,
            deleted: false,
            memory: captured.memory,
            vm_scratch: captured.vm_scratch,
            // Nobody can snapshot a pooled sandbox through the API: the
            // daemon snapshots one only to make a boot template of it.
            template: record.pooled,
        };
        self.snapshots
            .save(&self.disk, &meta)
            .map_err(SandboxError::internal)?;
        Ok(meta)
    }

    /// A microVM's filesystem snapshot: its scratch disk (the overlay's
    /// upper layer over the image), cloned while the guest is paused. A
    /// sandbox made from it starts with a clone of that disk over the same
    /// image.
    async fn capture_vm_disk(
        &self,
        record: &super::record::SandboxRecord,
        snapshot_id: &str,
        dir: &Path,
        base: SnapshotBase,
    ) -> Result<SnapshotMeta, SandboxError> {
        let scratch = dir.join(crate::runtime::microvm::SNAPSHOT_DISK);
        self.connect_to(record)
            .await?
            .clone_disk(scratch.clone())
            .await
            .map_err(|e| refused("snapshotting the microVM's disk", e))?;
        let size_bytes = std::fs::metadata(&scratch)
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        self.record_snapshot(
            record,
            snapshot_id,
            base,
            Captured {
                kind: SnapshotKind::Filesystem,
                layers: Vec::new(),
                size_bytes,
                memory: None,
                vm_scratch: Some(scratch),
            },
        )
    }

    /// A microVM's memory snapshot: its VMM pauses the guest, writes memory
    /// and device state, and the supervisor clones the scratch disk before
    /// the guest runs on. No cgroup freeze: a frozen VMM could not answer.
    async fn capture_vm(
        &self,
        record: &super::record::SandboxRecord,
        snapshot_id: &str,
        dir: &Path,
        base: SnapshotBase,
    ) -> Result<SnapshotMeta, SandboxError> {
        let (images_dir, checkpointed) = self
            .checkpoint(
                record,
                snapshot_id,
                dir,
                PathBuf::new(),
                "snapshotting the microVM",
            )
            .await?;
        let Checkpointed {
            next_proc,
            mut processes,
            ..
        } = checkpointed;
        // A boot template's forks list none of the daemon's own warm-up.
        if record.pooled {
            processes.clear();
        }
        let scratch = dir.join(crate::runtime::microvm::SNAPSHOT_DISK);
        let measured = images_dir.clone();
        let size_bytes = tokio::task::spawn_blocking(move || crate::image::tree_bytes(&measured))
            .await
            .unwrap_or(0);
        self.record_snapshot(
            record,
            snapshot_id,
            base,
            Captured {
                kind: SnapshotKind::Memory,
                layers: Vec::new(),
                size_bytes,
                memory: Some(MemoryImage {
                    images_dir,
                    checkpoint: Default::default(),
                    next_proc,
                    limits: record.limits.clone(),
                    env: record.env.clone(),
                    secrets: record.secrets.clone(),
                    ports: record.ports.clone(),
                    sha256: Default::default(),
                    processes,
                    vm: Some(index::VmImage { scratch }),
                }),
                vm_scratch: None,
            },
        )
    }

    /// The part of [`Self::capture`] done while the sandbox is frozen: the
    /// layer snapshot first (its sync then has only the layer to write),
    /// then the checkpoint, whose images stay outside the btrfs pool so that
    /// the pool's transaction commits (every layer create) never wait on
    /// writing them back.
    async fn capture_frozen(
        &self,
        record: &super::record::SandboxRecord,
        cgroups: &SandboxCgroups,
        kind: SnapshotKind,
        snapshot_id: &str,
        dir: &Path,
    ) -> Result<(PathBuf, Option<Taken>), SandboxError> {
        let disk = Arc::clone(&self.disk);
        let (layer_id, sid) = (record.id.clone(), snapshot_id.to_string());
        let layer = tokio::task::spawn_blocking(move || disk.snapshot_layer(&layer_id, &sid))
            .await
            .map_err(SandboxError::internal)?
            .map_err(SandboxError::internal)?;
        if kind == SnapshotKind::Filesystem {
            return Ok((layer, None));
        }
        let (images_dir, checkpointed) = self
            .checkpoint(
                record,
                snapshot_id,
                dir,
                cgroups.freezer_dir(),
                "checkpointing the sandbox",
            )
            .await?;
        let Checkpointed {
            checkpoint,
            next_proc,
            processes,
        } = checkpointed;
        Ok((layer, Some((images_dir, checkpoint, next_proc, processes))))
    }

    /// Asks the sandbox's supervisor to checkpoint it (CRIU for a container,
    /// the VMM for a microVM) into snapshot `snapshot_id`'s images
    /// directory, which it returns with what the supervisor took.
    async fn checkpoint(
        &self,
        record: &super::record::SandboxRecord,
        snapshot_id: &str,
        dir: &Path,
        freezer: PathBuf,
        what: &str,
    ) -> Result<(PathBuf, Checkpointed), SandboxError> {
        let images_dir = self.images_dir(snapshot_id)?;
        let target = CheckpointTarget {
            criu: self.config.criu_path.clone(),
            freezer,
            images_dir: images_dir.clone(),
            work_dir: dir.to_path_buf(),
        };
        let checkpointed = self
            .connect_to(record)
            .await?
            .checkpoint(target)
            .await
            .map_err(|e| refused(what, e))?;
        Ok((images_dir, checkpointed))
    }

    /// Makes the directory of snapshot `id`'s CRIU images, under a 0700
    /// parent in the state directory.
    fn images_dir(&self, id: &str) -> Result<PathBuf, SandboxError> {
        let parent = self.config.state_dir.join(SNAPSHOT_IMAGES);
        let mut builder = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        if let Err(e) = builder.create(&parent) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(SandboxError::internal(format!(
                    "creating {}: {e}",
                    parent.display()
                )));
            }
        }
        // Searchable itself: CRIU opens images from inside the restored
        // tree's user namespace. The 0700 parent keeps everyone else out.
        let dir = parent.join(id);
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o755);
        builder
            .create(&dir)
            .map_err(|e| SandboxError::internal(format!("creating {}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Removes snapshot `id`'s layer, meta and images.
    fn remove_snapshot_data(&self, id: &str) -> Result<(), String> {
        self.disk.remove_snapshot(id).map_err(|e| e.to_string())?;
        let images = self.config.state_dir.join(SNAPSHOT_IMAGES).join(id);
        match std::fs::remove_dir_all(&images) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", images.display())),
        }
    }

    /// Creates a fork of memory snapshot `snapshot`: a new sandbox whose
    /// processes continue from where the snapshot's stood. A fork keeps the
    /// snapshot's image, limits and environment (extra `env` is added);
    /// asking for others is a 400.
    pub(super) async fn create_fork(
        self: &Arc<Self>,
        snapshot: &str,
        req: crate::model::CreateRequest,
        admitted: super::create::Admitted,
    ) -> Result<crate::sandbox::SandboxRecord, SandboxError> {
        let super::create::Admitted {
            request_digest,
            gpu,
            ttl_seconds,
            network,
            secrets: asked_secrets,
        } = admitted;
        let meta = self
            .snapshots
            .visible(snapshot)
            .ok_or_else(|| snapshot_not_found(snapshot))?;
        let Some(memory) = meta.memory.clone() else {
            return Err(SandboxError::bad(
                "invalid_snapshot",
                format!("{snapshot} is a filesystem snapshot: create from it with \"image\": \"{snapshot}\""),
            ));
        };
        let conflict = |what: &str| {
            SandboxError::bad(
                "snapshot_conflict",
                format!(
                    "a fork of {snapshot} keeps the snapshot's {what}; leave it out of the request"
                ),
            )
        };
        if req
            .image
            .as_deref()
            .is_some_and(|i| i != meta.image && i != snapshot)
        {
            return Err(conflict("image"));
        }
        if gpu.is_some() {
            return Err(conflict("devices (no GPUs)"));
        }
        let limits = &memory.limits;
        let differs = req.cpu.is_some_and(|v| v != limits.cpu)
            || req.memory_mib.is_some_and(|v| v != limits.memory_mib)
            || req.disk_mib.is_some_and(|v| v != limits.disk_mib)
            || req.pids.is_some_and(|v| v != limits.pids)
            || req.cpu_shares.is_some_and(|v| {
                v != limits
                    .cpu_shares
                    .unwrap_or(sandbox_proto::limits::DEFAULT_CPU_SHARES)
            });
        if differs {
            return Err(conflict("limits"));
        }
        let runtime = if memory.vm.is_some() {
            RuntimeKind::Vm
        } else {
            RuntimeKind::Container
        };
        if req.runtime.is_some_and(|r| r != runtime) {
            return Err(conflict("runtime"));
        }
        let mut env = memory.env.clone();
        env.extend(req.env);
        // The source's placeholders are in the restored processes' memory:
        // the fork keeps them and their bindings; secrets it asks for
        // besides get placeholders of their own.
        // Bindings of secrets deleted since are dropped.
        let mut secrets = Vec::new();
        for binding in &memory.secrets {
            if self.secrets.exists(&binding.name)? {
                secrets.push(binding.clone());
            }
        }
        for binding in asked_secrets {
            if !secrets.iter().any(|b| b.name == binding.name) {
                secrets.push(binding);
            }
        }
        self.create_cold(super::create::ColdCreate {
            id: super::create::new_id(),
            image_name: meta.image.clone(),
            limits: memory.limits,
            ttl_seconds,
            labels: req.labels,
            env,
            pooled: false,
            gpu: None,
            idempotency_key: req.idempotency_key,
            request_digest,
            network,
            from_snapshot: Some(snapshot.to_string()),
            runtime,
            secrets,
            host_rootfs: Vec::new(),
            join_netns: None,
            hostname: None,
            volumes: Vec::new(),
        })
        .await
    }

    /// Every snapshot not deleted, oldest first.
    pub fn list_snapshots(&self) -> Vec<SnapshotView> {
        let mut views: Vec<SnapshotView> = self
            .snapshots
            .lock()
            .values()
            .filter(|m| !m.deleted && !m.template)
            .map(SnapshotMeta::view)
            .collect();
        views.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        views
    }

    pub fn get_snapshot(&self, id: &str) -> Result<SnapshotView, SandboxError> {
        self.snapshots
            .visible(id)
            .map(|m| m.view())
            .ok_or_else(|| snapshot_not_found(id))
    }

    /// Deletes snapshot `id` for the API at once; its data goes when no
    /// sandbox or later snapshot stacks on it any more.
    pub fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        let mut meta = self
            .snapshots
            .visible(id)
            .ok_or_else(|| snapshot_not_found(id))?;
        meta.deleted = true;
        self.snapshots
            .save(&self.disk, &meta)
            .map_err(SandboxError::internal)?;
        self.collect_snapshots();
        Ok(())
    }

    /// The filesystem snapshot named by an image name, if it is one.
    pub(super) fn snapshot_image(&self, name: &str) -> Result<Option<SnapshotMeta>, SandboxError> {
        if !name.starts_with("snap-") {
            return Ok(None);
        }
        match self.snapshots.visible(name) {
            Some(meta) if meta.kind == SnapshotKind::Filesystem => Ok(Some(meta)),
            Some(_) => Err(SandboxError::bad(
                "invalid_image",
                format!("{name} is a memory snapshot; create from it with \"from_snapshot\""),
            )),
            None => Err(snapshot_not_found(name)),
        }
    }

    /// Snapshots a sandbox or a kept snapshot stacks on.
    fn snapshots_in_use(&self) -> BTreeSet<String> {
        let mut in_use: BTreeSet<String> = self
            .records()
            .values()
            .filter_map(|r| r.base_snapshot.clone())
            .collect();
        // Boot templates a create is forking before its record holds them.
        in_use.extend(self.pinned_boot_templates());
        // A base's own parents are listed in its meta, which stays while
        // the base is used.
        for meta in self.snapshots.lock().values() {
            in_use.extend(meta.parents.iter().cloned());
        }
        in_use
    }

    /// Removes deleted snapshots that nothing stacks on any more.
    pub(super) fn collect_snapshots(&self) {
        // A removed snapshot may have been the last user of its parents:
        // repeat until nothing more goes.
        loop {
            let in_use = self.snapshots_in_use();
            let removable: Vec<String> = self
                .snapshots
                .lock()
                .values()
                .filter(|m| m.deleted && !in_use.contains(&m.id))
                .map(|m| m.id.clone())
                .collect();
            if removable.is_empty() {
                return;
            }
            for id in removable {
                if let Err(e) = self.remove_snapshot_data(&id) {
                    tracing::warn!(snapshot = %id, "removing a deleted snapshot: {e}");
                    return;
                }
                tracing::info!(snapshot = %id, "snapshot removed");
                self.snapshots.lock().remove(&id);
            }
        }
    }
}

/// Removes CRIU image directories no snapshot owns (a crash between the
/// dump and the snapshot's meta being written).
pub(super) fn sweep_orphan_images(state_dir: &Path, index: &index::SnapshotIndex) {
    let Ok(entries) = std::fs::read_dir(state_dir.join(SNAPSHOT_IMAGES)) else {
        return;
    };
    let known = index.lock();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !known.contains_key(&name) {
            tracing::warn!(snapshot = %name, "removing checkpoint images no snapshot owns");
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(snapshot = %name, "{e}");
            }
        }
    }
}

fn snapshot_not_found(id: &str) -> SandboxError {
    SandboxError::NotFound {
        code: "snapshot_not_found",
        message: format!("no snapshot with id {id:?}"),
    }
}
