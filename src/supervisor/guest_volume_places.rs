//! Where a microVM's pod container finds each of its host volumes in the
//! guest: a copy it shares with the pod's other containers, a part of one
//! (a kubelet `subPath`), or a copy of its own made now
//! (`volume_copies`), and which of the copies follow the host.

use super::processes::{err, Supervisor};
use super::protocol::{SupervisorError, SupervisorErrorKind};

impl Supervisor {
    /// Where the guest's copy of host `volume` is: its key, and the part of
    /// it bound (`within`, empty for all of it). Written now unless the
    /// guest holds it already: an earlier root of the sandbox had the same
    /// source copied (a pod's emptyDir, which its containers share; what
    /// they wrote there stays), or one it lies inside (a kubelet `subPath`,
    /// see `runtime::subpaths`). A writable `subPath` in the kubelet's
    /// layout has the volume it comes from copied whole first, so the
    /// pod's containers share one copy whichever mounts it first. A
    /// read-only one is never bound out of a copy that follows the host:
    /// Kubernetes updates no `subPath`, and a swap could take its part
    /// away before the bind.
    pub(super) async fn copy_volume_into_guest(
        &self,
        volume: &crate::model::HostVolume,
    ) -> Result<(String, String), SupervisorError> {
        let known = self.guest_volume_keys().contains_key(&volume.source);
        let part = if known {
            None
        } else {
            self.part_of_a_copy(volume).await?
        };
        let (key, within) = match part {
            Some(part) => part,
            None => (self.copy_whole_volume(volume).await?, String::new()),
        };
        if !volume.read_only {
            self.volume_following.stop(&key).await;
        }
        Ok((key, within))
    }

    /// The copy (key) host `volume` is a part of, and where in it: for a
    /// writable kubelet `subPath`, the volume it comes from, copied whole
    /// first; else any copy that does not follow the host.
    async fn part_of_a_copy(
        &self,
        volume: &crate::model::HostVolume,
    ) -> Result<Option<(String, String)>, SupervisorError> {
        let kubelet_volume = if volume.read_only {
            None
        } else {
            crate::runtime::subpaths::kubelet_volume_of(&volume.source)
        };
        if let Some(whole) = kubelet_volume {
            let whole = crate::model::HostVolume {
                source: whole,
                destination: volume.destination.clone(),
                read_only: false,
            };
            let key = self.copy_whole_volume(&whole).await?;
            let part = self
                .find_in_copies(volume, vec![(whole.source, key)])
                .await?;
            if part.is_some() {
                return Ok(part);
            }
        }
        let copies = self.unfollowed_copies();
        self.find_in_copies(volume, copies).await
    }

    /// The key of the guest's copy of all of host `volume`, written now
    /// unless an earlier root had it copied.
    async fn copy_whole_volume(
        &self,
        volume: &crate::model::HostVolume,
    ) -> Result<String, SupervisorError> {
        let next_key = {
            let keys = self.guest_volume_keys();
            if let Some(key) = keys.get(&volume.source) {
                return Ok(key.clone());
            }
            format!("vol-{}", keys.len() + 1)
        };
        self.ensure_live()?;
        let copied = self
            .volume_following
            .copy(&self.link, &next_key, volume)
            .await?;
        self.guest_volume_keys()
            .insert(volume.source.clone(), next_key.clone());
        self.volume_following.start(&self.link, copied);
        Ok(next_key)
    }

    /// The copies the guest holds that do not follow the host (host
    /// source, key), the deepest sources first: a source inside another is
    /// the nearer copy of what lies in both.
    fn unfollowed_copies(&self) -> Vec<(std::path::PathBuf, String)> {
        let mut copies: Vec<(std::path::PathBuf, String)> = self
            .guest_volume_keys()
            .iter()
            .filter(|(_, key)| !self.volume_following.follows(key))
            .map(|(source, key)| (source.clone(), key.clone()))
            .collect();
        copies.sort_by_key(|(source, _)| std::cmp::Reverse(source.components().count()));
        copies
    }

    /// The copy among `copies` (host source, key) that host `volume` lies
    /// inside, and where in it; the directories on the way are made in
    /// the guest's copy where missing.
    async fn find_in_copies(
        &self,
        volume: &crate::model::HostVolume,
        copies: Vec<(std::path::PathBuf, String)>,
    ) -> Result<Option<(String, String)>, SupervisorError> {
        if copies.is_empty() {
            return Ok(None);
        }
        let wanted = volume.source.clone();
        let found = tokio::task::spawn_blocking(move || {
            copies.into_iter().find_map(|(source, key)| {
                match crate::runtime::subpaths::find(&source, &wanted) {
                    Ok(found) => found.map(|found| (key, found)),
                    Err(e) => {
                        tracing::warn!(
                            "looking for {} inside volume {} the guest holds a copy of: {e}; \
                             it gets a copy of its own",
                            wanted.display(),
                            source.display()
                        );
                        None
                    }
                }
            })
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        let Some((key, found)) = found else {
            return Ok(None);
        };
        if !found.dirs.is_empty() {
            self.ensure_live()?;
            self.volume_following
                .add_entries(&self.link, &key, volume, found.dirs)
                .await?;
        }
        Ok(Some((key, found.path)))
    }

    /// Starts following the host for copies made before the supervisor
    /// was (a microVM task's volumes, once bound).
    pub(super) fn follow_volumes(&self, copies: Vec<super::volume_copies::Copied>) {
        for copied in copies {
            self.volume_following.start(&self.link, copied);
        }
    }

    pub(super) fn guest_volume_keys(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::path::PathBuf, String>> {
        self.guest_volume_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
