//! Brokered secrets as the manager applies them: the store's changes fanned
//! out to every sandbox bound to the secret (rotation takes effect on its
//! next request, deletion stops substitution), and a new sandbox's
//! bindings put in force before it is ready: its supervisor gets the values
//! and leaves over its socket, and the sandbox gets the trust bundle.

use std::sync::Arc;

use super::manager::not_running;
use super::warm_pool::SupervisorHolds;
use super::{Manager, SandboxError, SandboxRecord};
use crate::model::{RuntimeKind, SandboxState};
use crate::runtime::beneath::{append_if_length, Dir};
use crate::secrets::{ImageTrustBundle, NewSecret, SecretChange, SecretInfo, TRUST_BUNDLE_PATH};
use crate::supervisor::client::{CallError, SupervisorClient};
use crate::supervisor::protocol::TrustBundleAppend;

impl Manager {
    pub fn create_secret(&self, new: NewSecret) -> Result<SecretInfo, SandboxError> {
        Ok(self.secrets.create(new)?)
    }

    pub fn list_secrets(&self) -> Result<Vec<SecretInfo>, SandboxError> {
        Ok(self.secrets.list()?)
    }

    pub fn get_secret(&self, name: &str) -> Result<SecretInfo, SandboxError> {
        Ok(self.secrets.get(name)?)
    }

    /// Changes a secret's value and/or hosts, then tells every running
    /// sandbox bound to it.
    pub async fn rotate_secret(
        &self,
        name: &str,
        change: SecretChange,
    ) -> Result<SecretInfo, SandboxError> {
        let info = self.secrets.rotate(name, change)?;
        self.refresh_bound(name).await;
        Ok(info)
    }

    /// Deletes a secret and unbinds it from every sandbox: their next
    /// requests carry the placeholder as is.
    pub async fn delete_secret(&self, name: &str) -> Result<(), SandboxError> {
        self.secrets.delete(name)?;
        let unbound: Vec<SandboxRecord> = {
            let mut records = self.records();
            // A create in progress is left alone: its Ready commit would
            // write its own copy over this one. It unbinds what was deleted
            // itself, once ready (`unbind_deleted_secrets`).
            records
                .values_mut()
                .filter(|r| r.state != SandboxState::Creating)
                .filter(|r| r.secrets.iter().any(|b| b.name == name))
                .map(|r| {
                    r.secrets.retain(|b| b.name != name);
                    r.clone()
                })
                .collect()
        };
        for record in &unbound {
            if let Err(e) = self.persist(record) {
                tracing::warn!(sandbox = %record.id, "recording that secret {name} is unbound: {e}");
            }
            self.push_secrets(record).await;
        }
        Ok(())
    }

    /// Unbinds from a just-made (or just-claimed) sandbox the secrets
    /// deleted while it was being made, tells its supervisor, and leaves
    /// `record` as stored. Called after the Ready commit: a delete that ran
    /// before that commit skipped the record, and one after it sees the
    /// sandbox ready and unbinds it itself.
    pub(super) async fn unbind_deleted_secrets(&self, record: &mut SandboxRecord) {
        if record.secrets.is_empty() {
            return;
        }
        // A store that cannot answer keeps the binding: the sandbox keeps
        // what it was made with, as after any unreadable store. Read
        // outside the records lock.
        let gone: Vec<String> = record
            .secrets
            .iter()
            .filter(|b| !self.secrets.exists(&b.name).unwrap_or(true))
            .map(|b| b.name.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        let updated = {
            let mut records = self.records();
            let Some(current) = records.get_mut(&record.id) else {
                return;
            };
            current.secrets.retain(|b| !gone.contains(&b.name));
            current.clone()
        };
        if let Err(e) = self.persist(&updated) {
            tracing::warn!(sandbox = %updated.id, "recording that deleted secrets are unbound: {e}");
        }
        self.push_secrets(&updated).await;
        record.secrets = updated.secrets;
    }

    /// Sends the current secrets to each ready sandbox bound to `name`.
    async fn refresh_bound(&self, name: &str) {
        let bound: Vec<SandboxRecord> = self
            .records()
            .values()
            .filter(|r| r.secrets.iter().any(|b| b.name == name))
            .cloned()
            .collect();
        for record in &bound {
            self.push_secrets(record).await;
        }
    }

    /// Best effort for a running sandbox: one that cannot be told is left
    /// as it was, and says so in the log.
    async fn push_secrets(&self, record: &SandboxRecord) {
        if record.state != SandboxState::Ready {
            return;
        }
        let pushed = match self.secrets.brokered(&record.secrets) {
            Ok(brokered) => self
                .supervisors
                .set_secrets(&record.id, brokered)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = pushed {
            tracing::error!(sandbox = %record.id, "the sandbox's brokered secrets could not be updated: {e}");
        }
    }

    /// [`Self::install_secrets`] for a sandbox whose trust bundle is known
    /// to be its image's, untouched (a pooled one at its claim, or a new
    /// one of an image). The daemon reaches a container's root through
    /// its init: the first such sandbox of an image has the image's
    /// bundle read there
    /// (beneath the root, through no symlink, only a regular file of at
    /// most [`MAX_TRUST_BUNDLE`]) and the bundle it needs made, once per
    /// image, and each has it written straight back. Anything else
    /// there (and a microVM, whose root only its guest reads) goes through
    /// the agent.
    pub(super) async fn install_secrets_fresh(
        &self,
        record: &SandboxRecord,
    ) -> Result<(), SandboxError> {
        if record.runtime != RuntimeKind::Container {
            return self.install_secrets(record).await;
        }
        // The values go to the supervisor while the bundle is written.
        tokio::try_join!(
            self.tell_secrets(record),
            self.install_trust_bundle_fresh(record, RootBundle::InImage)
        )?;
        Ok(())
    }

    /// The trust bundle half of [`Self::install_secrets_fresh`]: nothing
    /// for a sandbox without bindings.
    pub(super) async fn install_trust_bundle_fresh(
        &self,
        record: &SandboxRecord,
        found: RootBundle,
    ) -> Result<(), SandboxError> {
        if record.secrets.is_empty() || matches!(found, RootBundle::AppendedBySupervisor) {
            return Ok(());
        }
        if record.runtime != RuntimeKind::Container {
            return self.install_trust_bundle(record).await;
        }
        let root = self.host_root(record);
        let bundle = match self.secrets.known_image_bundle(&record.image_digest) {
            Some(known) => known,
            None => {
                let root = root.clone();
                let roots = tokio::task::spawn_blocking(move || {
                    root.open()?
                        .read_regular_file(TRUST_BUNDLE_RELATIVE, MAX_TRUST_BUNDLE)
                })
                .await
                .map_err(SandboxError::internal)?;
                let Ok(roots) = roots else {
                    // A symlink on the way, or not a plain file: read
                    // inside, and nothing is kept for the image.
                    return self.install_trust_bundle(record).await;
                };
                self.secrets
                    .image_trust_bundle(&record.image_digest, || roots)?
            }
        };
        let Some(bundle) = bundle else {
            return Ok(());
        };
        // A record of an older build names no init to reach the root
        // through: its agent writes the bundle.
        if root.is_known() && write_in_root(move || root.open(), Arc::clone(&bundle), found).await?
        {
            return Ok(());
        }
        let mut client = SupervisorClient::connect(&self.paths(&record.id).socket())
            .await
            .map_err(|e| not_running(&record.id, e))?;
        // No file there to overwrite: perhaps no directory either.
        write_trust_bundle(&mut client, bundle.bytes.clone(), Parent::Make).await
    }

    /// The CA a claim with `secrets` of pooled container `record` hands
    /// its supervisor to append, where the supervisor holds the copied-up
    /// bundle (`found`) and it still has the image's bundle's length (an
    /// fstat here; the supervisor checks again as it writes), and then
    /// nothing left for the claim to write. Else nothing, and `found` as
    /// it was.
    pub(super) fn trust_bundle_append(
        &self,
        record: &SandboxRecord,
        secrets: &[crate::secrets::SecretBinding],
        found: RootBundle,
    ) -> (Option<TrustBundleAppend>, RootBundle) {
        let RootBundle::CopiedUp(file, SupervisorHolds::Yes) = &found else {
            return (None, found);
        };
        if secrets.is_empty() {
            return (None, found);
        }
        let Some(Some(bundle)) = self.secrets.known_image_bundle(&record.image_digest) else {
            return (None, found);
        };
        let Some((image_length, tail)) = bundle.appended_to_image() else {
            return (None, found);
        };
        if !crate::runtime::beneath::has_length_and_name(file, image_length).unwrap_or(false) {
            return (None, found);
        }
        let append = TrustBundleAppend {
            image_length,
            tail: tail.to_vec(),
        };
        (Some(append), RootBundle::AppendedBySupervisor)
    }

    /// Copies pooled container `id`'s trust bundle up into its writable
    /// layer, contents unchanged, and keeps it open, so that a claim with
    /// secrets appends the CA through it (an fstat and a write) instead of
    /// reaching the root and writing the whole bundle (220 KB here: 0.55
    /// ms to copy up without data and write). Only while the daemon stores
    /// a secret: else it would cost every pooled sandbox 220 KB in its
    /// layer for nothing. `None` where the bundle is not in the root's own
    /// layer now; a failure (logged) only leaves the claim the longer way.
    pub(super) async fn copy_up_trust_bundle(&self, id: &str) -> Option<std::fs::File> {
        if !self.secrets.any_stored() {
            return None;
        }
        let root = self.records().get(id).map(|r| self.host_root(r))?;
        let copied = tokio::task::spawn_blocking(move || {
            root.open()?.copy_up_for_append(TRUST_BUNDLE_RELATIVE)
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|copied| copied);
        copied.unwrap_or_else(|e| {
            tracing::warn!(sandbox = %id, "copying its trust bundle up ahead of a claim: {e}");
            None
        })
    }

    /// Before a sandbox with bindings is ready: its supervisor gets the
    /// values and leaves, and its trust bundle gets the daemon's CA. The
    /// bundle is read through the agent: it may differ from its image's
    /// (a fork).
    pub(super) async fn install_secrets(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        if record.secrets.is_empty() {
            return Ok(());
        }
        self.tell_secrets(record).await?;
        self.install_trust_bundle(record).await
    }

    /// The trust bundle half of [`Self::install_secrets`], read and
    /// written through the agent.
    async fn install_trust_bundle(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        let mut client = SupervisorClient::connect(&self.paths(&record.id).socket())
            .await
            .map_err(|e| not_running(&record.id, e))?;
        let roots = read_file(&mut client, TRUST_BUNDLE_PATH).await;
        if self.secrets.trusts_authority(roots.as_deref())? {
            // A fork, or an image made from a sandbox that had secrets.
            return Ok(());
        }
        let parent = match roots {
            Some(_) => Parent::Exists,
            None => Parent::Make,
        };
        let bundle = self.secrets.trust_bundle(roots)?;
        write_trust_bundle(&mut client, bundle, parent).await
    }

    /// The sandbox's supervisor gets the values and leaves of its bindings.
    pub(super) async fn tell_secrets(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        // A rotation or deletion while this runs pushes only to ready
        // sandboxes: tell this one again until none came in between (a
        // few times at most: a storm of rotations still leaves it with a
        // value from during its create).
        for _ in 0..8 {
            let generation = self.secrets.generation();
            let brokered = self.secrets.brokered(&record.secrets)?;
            match self.supervisors.set_secrets(&record.id, brokered).await {
                Ok(()) => {}
                Err(CallError::Connect(e)) => return Err(not_running(&record.id, e)),
                Err(e) => return Err(SandboxError::internal(e)),
            }
            if self.secrets.generation() == generation {
                break;
            }
        }
        Ok(())
    }
}

/// [`TRUST_BUNDLE_PATH`] beneath a root.
pub(super) const TRUST_BUNDLE_RELATIVE: &str = "etc/ssl/certs/ca-certificates.crt";

/// The largest image trust bundle read on the host (Debian's is 220 KB).
const MAX_TRUST_BUNDLE: u64 = 4 << 20;

/// Where the trust bundle of a container root the sandbox's code has not
/// run in yet is.
#[derive(Debug)]
pub(super) enum RootBundle {
    /// Only in the image's layer (a cold create's root, or a pooled one
    /// the pool did not copy up): appending to it would copy all its data
    /// up first, writing it whole copies up none.
    InImage,
    /// Copied up into the root's own layer ahead, unchanged, and held open
    /// for appending since (a pooled root,
    /// [`Manager::copy_up_trust_bundle`]), by its supervisor too where it
    /// says so.
    CopiedUp(std::fs::File, SupervisorHolds),
    /// Left to the supervisor, which appends the CA as it takes the claim
    /// (`HandOver::trust_bundle_append`).
    AppendedBySupervisor,
}

/// Puts `bundle` in place of the trust bundle of a container root the
/// sandbox's code has not run in yet: where the pool copied it up ahead
/// and holds it open, and it still has the image's length, the CA
/// appended through that descriptor; else the whole bundle written over it
/// straight through the root's overlay (as its init sees it, `HostRoot`;
/// 0.3-0.6 ms, against 3 ms through the supervisor and agent). False
/// where the image's bundle is not a regular file reached through no
/// symlink: the agent then writes it, inside.
pub(super) async fn write_in_root(
    open_root: impl FnOnce() -> std::io::Result<Dir> + Send + 'static,
    bundle: Arc<ImageTrustBundle>,
    found: RootBundle,
) -> Result<bool, SandboxError> {
    let failed = |e: std::io::Error| {
        SandboxError::internal(format!(
            "writing the trust bundle {TRUST_BUNDLE_PATH} into the sandbox's root: {e}"
        ))
    };
    if let (RootBundle::CopiedUp(file, _), Some((image_length, tail))) =
        (&found, bundle.appended_to_image())
    {
        // An fstat and a write of a few KB, which may still wait on a
        // btrfs commit (the file's times): on this thread, its other tasks
        // moved off first, as a blocking thread's wake-up costs more.
        if super::warm_pool::run_blocking_here(|| append_if_length(file, image_length, tail))
            .map_err(failed)?
        {
            return Ok(true);
        }
    }
    tokio::task::spawn_blocking(move || {
        open_root()?.overwrite_regular_file(TRUST_BUNDLE_RELATIVE, &bundle.bytes)
    })
    .await
    .map_err(SandboxError::internal)?
    .map_err(failed)
}

/// Whether a file's directory must be made before the file is written.
enum Parent {
    Exists,
    Make,
}

async fn write_trust_bundle(
    client: &mut SupervisorClient,
    bundle: Vec<u8>,
    parent: Parent,
) -> Result<(), SandboxError> {
    write_file(client, TRUST_BUNDLE_PATH, bundle, parent)
        .await
        .map_err(|e| {
            SandboxError::internal(format!(
                "writing the trust bundle {TRUST_BUNDLE_PATH} into the sandbox: {e}"
            ))
        })
}

/// A file in the sandbox, through its agent; `None` when it cannot be read.
async fn read_file(client: &mut SupervisorClient, path: &str) -> Option<Vec<u8>> {
    let (handle, _) = client.open_read(path.to_string()).await.ok()?;
    let mut out = Vec::new();
    loop {
        match client.read(handle, sandbox_proto::MAX_CHUNK as u32).await {
            Ok(chunk) if chunk.is_empty() => break,
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(_) => {
                let _ = client.close(handle).await;
                return None;
            }
        }
    }
    let _ = client.close(handle).await;
    Some(out)
}

async fn write_file(
    client: &mut SupervisorClient,
    path: &str,
    bytes: Vec<u8>,
    parent: Parent,
) -> Result<(), CallError> {
    let dir = std::path::Path::new(path).parent();
    if let (Parent::Make, Some(dir)) = (parent, dir) {
        client.mkdir(dir.display().to_string(), true, 0o755).await?;
    }
    let handle = client.open_write(path.to_string(), 0o644).await?;
    for chunk in bytes.chunks(sandbox_proto::MAX_CHUNK) {
        client.write(handle, chunk.to_vec()).await?;
    }
    client.close(handle).await
}
