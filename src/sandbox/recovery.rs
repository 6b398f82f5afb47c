//! Start-up: adopting the sandboxes in the store, finishing what a crash
//! cut off, and removing what no record owns.

use super::record::SandboxRecord;
use super::teardown::teardown;
use super::SandboxError;
use crate::model::SandboxState;
use crate::supervisor::client::CallError;
use crate::supervisor::protocol::{ClientError, VersionMismatch};
use futures::StreamExt;
use std::sync::Arc;

use super::manager::Manager;

/// Supervisors asked for their health at once at a start: each call holds
/// a connection (a descriptor) until it answers.
const HEALTH_CHECKS_AT_ONCE: usize = 32;

/// Sandboxes torn down at once at a start: a supervisor that no longer
/// answers costs its teardown a health check's deadline, which run side
/// by side rather than one after another.
const TEARDOWNS_AT_ONCE: usize = 16;

/// What a start does to a sandbox it does not adopt.
enum Removal {
    /// Removed with everything it held (a half-made, half-deleted or
    /// pooled one).
    Everything(SandboxRecord),
    /// Torn down and kept as failed, for its owner to see and delete.
    KeptFailed(SandboxRecord),
}

/// How long a start waits for a supervisor it SIGKILLed to exit.
const KILLED_SUPERVISOR_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Manager {
    /// Loads the store after a (re)start: sandboxes whose supervisor answers
    /// are kept as they are; half-made or half-deleted ones are finished off,
    /// and so are pooled ones a claim began to change and pooled ones whose
    /// supervisor is gone; others whose supervisor is gone are torn down
    /// and kept as failed; ones
    /// whose supervisor speaks another protocol version (an earlier build's,
    /// after an upgrade) are left running and shown as failed, see
    /// [`Self::keep_foreign`].
    pub async fn recover(self: &Arc<Self>) -> Result<(), SandboxError> {
        let stored: Vec<SandboxRecord> = self.store.all().map_err(SandboxError::internal)?;
        // A supervisor the old daemon started but never saw ready would go
        // on making its sandbox while it is torn down below: stop it first.
        let finished: std::collections::HashMap<&str, i32> = stored
            .iter()
            .filter(|r| !matches!(r.state, SandboxState::Creating | SandboxState::Deleting))
            .map(|r| (r.id.as_str(), r.supervisor_pid))
            .collect();
        self.kill_supervisors_except(&finished).await;
        // The supervisors are asked together (at most HEALTH_CHECKS_AT_ONCE
        // in flight, in whatever order they answer; a slow one holds its
        // own slot only), so their deadlines run side by side rather than
        // one after another. The version is checked before anything else
        // is said to a supervisor.
        let mut answered: Vec<(usize, _)> =
            futures::stream::iter(stored.iter().enumerate().map(|(index, record)| async move {
                (index, self.supervisors.health(&record.id).await)
            }))
            .buffer_unordered(HEALTH_CHECKS_AT_ONCE)
            .collect()
            .await;
        answered.sort_by_key(|(index, _)| *index);
        let healths = answered.into_iter().map(|(_, health)| health);
        let mut removals = Vec::new();
        for (record, health) in stored.into_iter().zip(healths) {
            let alive = health.is_ok();
            match (record.state, health) {
                (SandboxState::Ready, Err(CallError::Client(ClientError::Version(mismatch)))) => {
                    if record.pooled {
                        tracing::info!(sandbox = %record.id, "removing a pooled sandbox not adopted: {mismatch}");
                        removals.push(Removal::Everything(record));
                    } else {
                        self.keep_foreign(record, mismatch);
                    }
                }
                // `claiming`: journaled by daemons before protocol 18, whose
                // pooled sandboxes the version check above removes already;
                // kept for a store that outlived its supervisors' protocol.
                (SandboxState::Ready, ref health)
                    if record.pooled
                        && (record.claiming || health.as_ref().is_ok_and(|h| h.claimed)) =>
                {
                    tracing::info!(sandbox = %record.id, "removing a pooled sandbox the last daemon died claiming");
                    removals.push(Removal::Everything(record));
                }
                (SandboxState::Ready, _)
                    if alive && record.pooled && !self.still_pooled(&record) =>
                {
                    tracing::info!(sandbox = %record.id, "removing a pooled sandbox no pool of this daemon holds (its pools changed, or it was a boot template's)");
                    removals.push(Removal::Everything(record));
                }
                (SandboxState::Ready, _) if alive => {
                    tracing::info!(sandbox = %record.id, "recovered");
                    let (id, pooled, runtime, image) = (
                        record.id.clone(),
                        record.pooled,
                        record.runtime,
                        record.image.clone(),
                    );
                    self.links.seed_bytes(&id, record.usage.ingress_bytes);
                    // Raw TCP exposures listen again on their host ports.
                    for exposed in &record.ports {
                        if let Some(host_port) = exposed.host_port {
                            self.rebind_tcp(&id, exposed.port, host_port);
                        }
                    }
                    self.records().insert(id.clone(), record);
                    if pooled {
                        self.pool_ready(runtime, &image, id).await;
                    } else {
                        self.watch_supervisor(id);
                    }
                }
                (SandboxState::Creating | SandboxState::Deleting, _) => {
                    tracing::info!(sandbox = %record.id, "finishing an interrupted create/delete");
                    removals.push(Removal::Everything(record));
                }
                // Nobody's sandbox (a reboot, or a claim the machine lost
                // before its commit): nothing to show as failed.
                _ if record.pooled => {
                    tracing::info!(sandbox = %record.id, "removing a pooled sandbox whose supervisor is gone");
                    removals.push(Removal::Everything(record));
                }
                _ => removals.push(Removal::KeptFailed(record)),
            }
        }
        let removed: Vec<Result<(), SandboxError>> = futures::stream::iter(removals)
            .map(|removal| async move {
                match removal {
                    Removal::Everything(record) => {
                        self.remove_everything(&record).await;
                        Ok(())
                    }
                    Removal::KeptFailed(record) => self.keep_failed(record).await,
                }
            })
            .buffer_unordered(TEARDOWNS_AT_ONCE)
            .collect()
            .await;
        removed.into_iter().collect::<Result<(), _>>()?;
        self.sweep_unowned().await;
        // A new daemon may boot another kernel, agent or VMM.
        self.drop_boot_templates();
        // A sandbox holds its GPUs until it is removed, whatever its state.
        let holders: Vec<(String, Vec<String>)> = self
            .records()
            .values()
            .map(|r| (r.id.clone(), r.gpus.clone()))
            .collect();
        self.gpus.rebuild(holders);
        Ok(())
    }

    /// Tears down a sandbox whose supervisor is gone and keeps it as
    /// failed.
    async fn keep_failed(&self, mut record: SandboxRecord) -> Result<(), SandboxError> {
        let problems = teardown(
            &record.id,
            &record.cgroups_path,
            &self.paths(&record.id),
            &self.disk,
        )
        .await;
        record.state = SandboxState::Failed;
        if record.failure.is_none() {
            record.failure =
                Some("the sandbox's supervisor was gone after a daemon restart".into());
        }
        if !problems.is_empty() {
            tracing::warn!(sandbox = %record.id, "recovery teardown: {}", problems.join("; "));
        }
        self.persist(&record)?;
        self.records().insert(record.id.clone(), record);
        Ok(())
    }

    /// Keeps a sandbox whose supervisor speaks another protocol version:
    /// failed to this daemon (the API answers 409 with the reason and
    /// sends it nothing), but left running and still counted as holding its
    /// resources, so that the build that matches can still adopt it. For
    /// that the store keeps its record as that build wrote it; the failure
    /// lives in memory and each start checks again. Deleting it kills the
    /// supervisor instead of asking it to shut down (see `teardown`). A
    /// pooled one has nothing to drain and is removed instead.
    fn keep_foreign(&self, mut record: super::record::SandboxRecord, mismatch: VersionMismatch) {
        tracing::error!(sandbox = %record.id, "not adopted after a daemon restart: {mismatch}");
        record.state = SandboxState::Failed;
        record.failure = Some(format!("not adopted after a daemon restart: {mismatch}"));
        record.foreign_supervisor = true;
        self.records().insert(record.id.clone(), record);
    }

    /// SIGKILLs this daemon's supervisors whose sandbox is not in `keep`
    /// (sandbox id -> its record's supervisor pid). A supervisor is
    /// `sandboxd supervise <run dir>/<id>` (`shim` before the subcommand
    /// was renamed, for supervisors of earlier builds); its sandbox's
    /// processes live in the sandbox's cgroup and go with its teardown.
    /// Returns once they have exited: one killed in the middle of a mount
    /// finishes that mount first, and a teardown that ran before it ended
    /// would leave the mount behind.
    async fn kill_supervisors_except(&self, keep: &std::collections::HashMap<&str, i32>) {
        let run_dir = self.config.sandboxes_run_dir();
        let mut killed = Vec::new();
        for pid in crate::runtime::cgroups::supervisor_pids(&self.config.cgroup_parent) {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            // A supervisor that began as a standby names no sandbox: it is
            // a record's by its pid, or an earlier daemon's idle standby.
            if args.contains(&crate::supervisor::standby::STANDBY_FLAG.as_bytes()) {
                let owned = keep.values().any(|kept| *kept == pid);
                if !owned {
                    tracing::info!(pid, "stopping a standby supervisor no record owns");
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    killed.push(pid);
                }
                continue;
            }
            let Some(dir) = args
                .windows(2)
                .find(|w| w[0] == b"supervise" || w[0] == b"shim")
                .map(|w| std::path::PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()))
            else {
                continue;
            };
            if dir.parent() != Some(run_dir.as_path()) {
                continue;
            }
            let id = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if keep.contains_key(id.as_str()) {
                continue;
            }
            tracing::info!(sandbox = %id, pid, "stopping a supervisor no finished record owns");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed.push(pid);
        }
        let exits = killed
            .iter()
            .map(|pid| super::teardown::exited(*pid, KILLED_SUPERVISOR_EXIT));
        for (pid, gone) in killed.iter().zip(futures::future::join_all(exits).await) {
            if !gone {
                tracing::warn!(pid, "a killed supervisor has not exited after {KILLED_SUPERVISOR_EXIT:?}; tearing its sandbox down anyway");
            }
        }
    }

    /// Removes what no record owns: run dirs, writable layers and cgroups of
    /// sandboxes whose creation was cut off before their record was written
    /// (or whose record was lost).
    pub(super) async fn sweep_unowned(&self) {
        let known: std::collections::HashMap<String, i32> = self
            .records()
            .values()
            .map(|r| (r.id.clone(), r.supervisor_pid))
            .collect();
        self.kill_supervisors_except(&known.iter().map(|(id, pid)| (id.as_str(), *pid)).collect())
            .await;
        let mut unowned: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(self.config.sandboxes_run_dir()) {
            unowned.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
        if let Ok(layers) = self.disk.list_layers() {
            unowned.extend(layers);
        }
        unowned.extend(crate::runtime::cgroups::sandbox_group_ids(
            &self.config.cgroup_parent,
        ));
        for id in unowned.into_iter().filter(|id| !known.contains_key(id)) {
            if crate::disk::validate_id(&id).is_err() {
                continue;
            }
            tracing::info!(sandbox = %id, "removing leftovers no record owns");
            let cgroups_path = format!("{}/{id}", self.config.cgroup_parent.trim_end_matches('/'));
            let problems = teardown(&id, &cgroups_path, &self.paths(&id), &self.disk).await;
            for p in problems {
                tracing::warn!(sandbox = %id, "removing leftovers: {p}");
            }
        }
    }
}
