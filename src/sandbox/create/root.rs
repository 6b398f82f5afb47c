//! Step one of a create: the root a sandbox starts from. An image from the
//! cache; a filesystem snapshot (the image it was taken over, plus its
//! layers, or a microVM's disk); or a memory snapshot to fork (its image,
//! layers and checkpoint, verified before use). For a microVM, the VM to
//! boot from that root.

use std::path::PathBuf;
use std::sync::Arc;

use super::super::{Manager, SandboxError, SandboxRecord};
use super::pipeline::PhaseClock;
use crate::sandbox::snapshots::index::SnapshotMeta;

/// What the sandbox's root is made of.
pub(super) struct Root {
    pub(super) image: crate::image::Image,
    /// Read-only layers above the image (a snapshot's writes), top first.
    pub(super) layers: Vec<PathBuf>,
    /// A container fork: the CRIU checkpoint to restore.
    pub(super) restore: Option<crate::runtime::sandbox::RestoreSpec>,
    /// A microVM fork: the VMM snapshot to restore.
    pub(super) vm_restore: Option<crate::runtime::sandbox::VmRestore>,
    /// A microVM's filesystem snapshot used as its image: its disk.
    pub(super) vm_scratch: Option<PathBuf>,
    /// The image is host directories owned by host ids (`host_rootfs`).
    pub(super) host_owned: bool,
}

impl Root {
    /// Whether the root is its image as cached, nothing above it but the
    /// image's own layers: not a fork's or a host directory. A filesystem
    /// snapshot used as the image passes; the record's `base_snapshot`
    /// tells it apart.
    pub(super) fn is_the_images_own(&self) -> bool {
        self.layers == self.image.layers
            && self.restore.is_none()
            && self.vm_restore.is_none()
            && self.vm_scratch.is_none()
            && !self.host_owned
    }
}

impl Manager {
    /// The image `name` names: a registry reference (pulled on first use),
    /// a declarative image built before (`built-<hex>`), or a built-in or
    /// recipe image (built on first use).
    pub(in crate::sandbox) async fn resolve_image(
        &self,
        name: &str,
    ) -> Result<crate::image::Image, SandboxError> {
        if let Some(hex) = crate::image::built::store::hex_of_name(name) {
            return self.built_image(hex);
        }
        if crate::image::oci::is_reference(name) {
            return self
                .registry
                .resolve(name)
                .await
                .map_err(SandboxError::from);
        }
        let images = Arc::clone(&self.images);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || images.resolve(&name))
            .await
            .map_err(SandboxError::internal)?
            .map_err(|e| {
                if e.is_client_error() {
                    SandboxError::NotFound {
                        code: "image_not_found",
                        message: e.to_string(),
                    }
                } else {
                    SandboxError::internal(e)
                }
            })
    }

    /// The image named `name` as it was at `digest`: a pulled image by
    /// manifest digest (its tag may have moved), a declarative image by
    /// build address, a recipe image by recipe digest (its recipe may have
    /// changed since).
    pub(in crate::sandbox) fn image_by_digest(
        &self,
        name: &str,
        digest: &str,
    ) -> Option<crate::image::Image> {
        if let Some(image) = self.registry.by_digest(digest) {
            return Some(image);
        }
        if let Some(hex) = crate::image::built::store::hex_of_name(name) {
            return self.built_image(hex).ok();
        }
        self.images.by_digest(name, digest)
    }

    /// The uid and gid of `image`'s config `User` (a 400 when the image
    /// does not know it, or it is outside the sandbox's ids).
    pub(super) async fn image_user(
        &self,
        image: &crate::image::Image,
    ) -> Result<Option<(u32, u32)>, SandboxError> {
        let Some(user) = image.defaults.user.clone() else {
            return Ok(None);
        };
        let layered = crate::image::Layered::of(image);
        let looked_up = tokio::task::spawn_blocking(move || layered.user(&user))
            .await
            .map_err(SandboxError::internal)?;
        let name = &image.name;
        let (uid, gid) = looked_up.map_err(|e| {
            SandboxError::bad("invalid_image", format!("{name}: its config's User: {e}"))
        })?;
        let range = crate::model::ID_MAP_SIZE;
        if uid >= range || gid >= range {
            return Err(SandboxError::bad(
                "invalid_image",
                format!(
                    "{name}: its config's User is {uid}:{gid}, outside the sandbox's ids (0 to {})",
                    range - 1
                ),
            ));
        }
        Ok(Some((uid, gid)))
    }

    /// The process defaults of image `name` at `digest` (none for a
    /// recipe image).
    pub(in crate::sandbox) fn image_defaults(
        &self,
        name: &str,
        digest: &str,
    ) -> crate::image::ImageDefaults {
        self.image_by_digest(name, digest)
            .map(|i| i.defaults)
            .unwrap_or_default()
    }

    /// Resolves the root of `record`: its fork snapshot (`base`, as the
    /// index held it when the create began), else the image `image_name` (a
    /// filesystem snapshot, which the record then holds, or a cached image).
    pub(super) async fn resolve_root(
        &self,
        record: &mut SandboxRecord,
        base: Option<SnapshotMeta>,
        image_name: &str,
        clock: &mut PhaseClock<'_>,
    ) -> Result<Root, SandboxError> {
        // Held even if deleted since the create began: the record keeps its
        // data (a boot template dropped meanwhile, a snapshot deleted).
        let fork = match (record.base_snapshot.as_deref(), base) {
            (Some(_), Some(meta)) => Some(meta),
            (Some(id), None) => {
                return Err(SandboxError::NotFound {
                    code: "snapshot_not_found",
                    message: format!("the snapshot {id} this sandbox forks is gone"),
                })
            }
            (None, _) => None,
        }
        .filter(|m| m.memory.is_some());
        let mut restore = None;
        let mut vm_restore = None;
        let mut vm_scratch = None;
        if !record.host_rootfs.is_empty() {
            let image = host_rootfs_image(&record.host_rootfs);
            let layers = image.layers.clone();
            return Ok(Root {
                image,
                layers,
                restore,
                vm_restore,
                vm_scratch,
                host_owned: true,
            });
        }
        let (image, layers) = match fork {
            Some(snapshot) if snapshot.memory.as_ref().is_some_and(|m| m.vm.is_some()) => {
                // The VMM checks its own snapshot files before it maps them.
                if let Some(memory) = &snapshot.memory {
                    vm_restore = memory
                        .vm
                        .as_ref()
                        .map(|vm| crate::runtime::sandbox::VmRestore {
                            dir: memory.images_dir.clone(),
                            scratch: vm.scratch.clone(),
                            next_proc: memory.next_proc,
                        });
                }
                let image = crate::image::Image {
                    name: snapshot.image.clone(),
                    digest: snapshot.image_digest.clone(),
                    rootfs: snapshot.base_rootfs.clone(),
                    layers: Vec::new(),
                    defaults: self.image_defaults(&snapshot.image, &snapshot.image_digest),
                };
                (image, Vec::new())
            }
            Some(snapshot) => {
                let memory = snapshot.memory.clone().ok_or_else(|| {
                    SandboxError::internal("a memory snapshot without its checkpoint")
                })?;
                let (dir, sums) = (memory.images_dir.clone(), memory.sha256.clone());
                tokio::task::spawn_blocking(move || {
                    super::super::snapshots::integrity::verify(&dir, &sums)
                })
                .await
                .map_err(SandboxError::internal)?
                .map_err(|e| SandboxError::Conflict {
                    code: "snapshot_corrupted",
                    message: e.to_string(),
                })?;
                clock.lap("verify");
                restore = Some(crate::runtime::sandbox::RestoreSpec {
                    criu: self.config.criu_path.clone(),
                    images_dir: memory.images_dir,
                    checkpoint: memory.checkpoint,
                    next_proc: memory.next_proc,
                    processes: memory.processes,
                });
                let image = crate::image::Image {
                    name: snapshot.image.clone(),
                    digest: snapshot.image_digest.clone(),
                    rootfs: snapshot.base_rootfs.clone(),
                    layers: Vec::new(),
                    defaults: self.image_defaults(&snapshot.image, &snapshot.image_digest),
                };
                (image, snapshot.layers.clone())
            }
            None => match self.snapshot_image(image_name)? {
                Some(snapshot) => {
                    record.base_snapshot = Some(snapshot.id.clone());
                    self.persist(record)?;
                    vm_scratch = snapshot.vm_scratch.clone();
                    let image = crate::image::Image {
                        name: snapshot.id.clone(),
                        digest: snapshot.image_digest.clone(),
                        rootfs: snapshot.base_rootfs.clone(),
                        layers: Vec::new(),
                        defaults: self.image_defaults(&snapshot.image, &snapshot.image_digest),
                    };
                    (image, snapshot.layers.clone())
                }
                None => {
                    let image = self.resolve_image(image_name).await?;
                    // A pulled image's upper layers stack like a snapshot's.
                    let layers = image.layers.clone();
                    (image, layers)
                }
            },
        };
        Ok(Root {
            image,
            layers,
            restore,
            vm_restore,
            vm_scratch,
            host_owned: false,
        })
    }

    /// Where the agent disks of microVMs are kept, under the image cache.
    const VM_AGENT_DISKS: &str = "vm-agent";

    /// The VM a microVM sandbox boots: its image as an ext4 file (made on
    /// first use), its size from the sandbox's limits, and for a fork or a
    /// filesystem snapshot the VMM snapshot or disk it starts from.
    pub(super) async fn vm_spec(
        &self,
        record: &SandboxRecord,
        root: &Root,
    ) -> Result<crate::runtime::sandbox::VmSpec, SandboxError> {
        let image = root.image.clone();
        let vm = &self.config.vm;
        let kernel = vm.kernel.clone().ok_or_else(|| {
            SandboxError::bad(
                "runtime_unavailable",
                "no guest kernel is configured (vm_kernel)",
            )
        })?;
        let shift = self.config.id_map_base;
        let agent = self.config.agent_path.clone();
        let agent_dir = self.config.images_dir.join(Self::VM_AGENT_DISKS);
        let layered_dir = self
            .config
            .images_dir
            .join(crate::image::flatten::LAYERED_DISKS);
        let host_owned = root.host_owned;
        let (base_disk, agent_disk) = tokio::task::spawn_blocking(move || {
            // A layered image (pulled, or built from a spec) is merged into
            // one disk; a single tree is exported as it is; host directories
            // (a containerd task's root) keep their ids.
            let base = if host_owned {
                let mut dirs = image.layers.clone();
                dirs.push(image.rootfs.clone());
                crate::image::host_ext4::ensure_host_ext4(&dirs, &layered_dir)?
            } else if image.layers.is_empty() {
                crate::image::ext4::ensure_ext4(&image.rootfs, shift)?
            } else {
                crate::image::flatten::ensure_layered_ext4(&image, &layered_dir, shift)?
            };
            Ok::<_, crate::image::ext4::Ext4Error>((
                base,
                crate::image::ext4::ensure_agent_disk(&agent, &agent_dir)?,
            ))
        })
        .await
        .map_err(SandboxError::internal)?
        .map_err(SandboxError::internal)?;
        // The agent runs as the guest's init; the seed is mixed into the
        // guest kernel's RNG before anything else runs, and the pids limit
        // put on the group of everything it starts.
        let seed: [u8; 32] = rand::random();
        let cmdline = crate::runtime::microvm::guest_cmdline(
            Some(&hex::encode(seed)),
            Some(record.limits.pids),
            record.hostname.as_deref(),
            &vm.cmdline,
        );
        Ok(crate::runtime::sandbox::VmSpec {
            vmm_path: vm.vmm_path.clone(),
            kernel,
            cmdline,
            // Whole vCPUs; the cgroup's CPU quota holds a fractional limit.
            vcpus: record.limits.cpu.ceil().clamp(1.0, 254.0) as u8,
            mem_mib: record.limits.memory_mib,
            overhead_bytes: vm.memory_overhead_mib << 20,
            base_disk,
            agent_disk,
            scratch_bytes: record.limits.disk_mib << 20,
            restore: root.vm_restore.clone(),
            scratch_from: root.vm_scratch.clone(),
            uid: record
                .vm_uid
                .ok_or_else(|| SandboxError::internal("a microVM record without its uid"))?,
            // A CRI pod's containers bring their roots after boot.
            root_slots: if record.join_netns.is_some() {
                crate::runtime::microvm::POD_ROOT_SLOTS
            } else {
                0
            },
        })
    }
}

/// `dirs` (top first) as an image: the bottom one its root, the others its
/// layers; its digest names the directories, which is all that is known of
/// them.
fn host_rootfs_image(dirs: &[PathBuf]) -> crate::image::Image {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for dir in dirs {
        hash.update(dir.as_os_str().as_encoded_bytes());
        hash.update([0]);
    }
    let (rootfs, layers) = match dirs.split_last() {
        Some((bottom, above)) => (bottom.clone(), above.to_vec()),
        None => (PathBuf::new(), Vec::new()),
    };
    crate::image::Image {
        name: crate::model::HOST_ROOTFS_IMAGE.to_string(),
        digest: format!("sha256:{}", hex::encode(hash.finalize())),
        rootfs,
        layers,
        defaults: Default::default(),
    }
}
