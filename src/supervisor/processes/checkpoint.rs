//! Copies of a running sandbox: a memory snapshot (a container's tree
//! through CRIU, a microVM's memory, devices and disk through its VMM) and
//! a microVM's scratch disk cloned while its guest is paused. A snapshot
//! is refused while the sandbox holds what a fork could not have again
//! (pod roots with limits or host volumes of their own, host volumes,
//! copies of them in a microVM), and while requests are in flight.

use std::sync::atomic::Ordering;

use super::{err, Supervisor, AGENT_DEADLINE};
use crate::model::ProcessState;
use crate::supervisor::protocol::{SupervisorError, SupervisorErrorKind};

impl Supervisor {
    /// A crash-consistent copy of a microVM's scratch disk: the guest is
    /// paused while it is cloned (reflink), so no write is half in it.
    pub async fn clone_disk(
        &self,
        to: std::path::PathBuf,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        let paths = self.paths.clone();
        let spec = self.config.spec.clone();
        tokio::task::spawn_blocking(move || crate::runtime::clone_disk(&spec, &paths, &to))
            .await
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
            .map_err(|e| match e {
                crate::runtime::RuntimeError::Unsupported(_) => {
                    err(SupervisorErrorKind::InvalidInput, e.to_string())
                }
                e => err(SupervisorErrorKind::Internal, e.to_string()),
            })?;
        Ok(crate::supervisor::protocol::SupervisorReply::Ok)
    }

    /// Snapshots the sandbox into `target`: a container's tree with CRIU
    /// (the daemon has frozen it; it keeps running afterwards), a
    /// microVM's memory, devices and disk through its VMM.
    pub async fn checkpoint(
        &self,
        target: crate::runtime::CheckpointTarget,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        // A fork just made holds the link's gate until its seed is taken.
        self.await_fresh_seed(AGENT_DEADLINE).await?;
        // No root is attached or detached (and no limited group made) while
        // CRIU dumps.
        let _roots = self.roots.lock().await;
        if let Some(root) = self.limited_roots().iter().next() {
            // CRIU would have to remake those groups and their ceilings in
            // a fork; not built.
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                format!("pod container root {root:?} has limits of its own, which a snapshot cannot keep yet; snapshot a pod whose containers share the sandbox's limits"),
            ));
        }
        if !self.config.spec.volumes.is_empty() {
            // The daemon refuses these first; CRIU could not restore them.
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "the sandbox has host volumes bound into its root, which a snapshot cannot keep",
            ));
        }
        if let Some(root) = self.roots_with_volumes().iter().next() {
            // Host files a fork would have to find again where it runs.
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                format!("pod container root {root:?} has host volumes bound in, which a snapshot cannot keep; detach it first"),
            ));
        }
        if !self.guest_volume_keys().is_empty() {
            // The copies outlive their roots in the guest: a fork would
            // carry the pod's secrets and tokens wherever it runs.
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "the microVM holds copies of its pod containers' host volumes, which its snapshots would hand to every fork; snapshot a pod whose containers took none",
            ));
        }
        let Some(_paused) = self.link.try_pause() else {
            return Err(err(
                SupervisorErrorKind::Conflict,
                "requests to the sandbox are in flight (a file transfer or a process start); snapshot again once they finish",
            ));
        };
        let init_pid = self.init_pid;
        let paths = self.paths.clone();
        let spec = self.config.spec.clone();
        let checkpoint = tokio::task::spawn_blocking(move || {
            crate::runtime::checkpoint(&spec, &paths, init_pid, &target)
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        let processes = self
            .procs()
            .values()
            .filter(|e| e.info.state == ProcessState::Running)
            .map(|e| e.info.clone())
            .collect();
        Ok(crate::supervisor::protocol::SupervisorReply::Checkpointed {
            checkpoint,
            next_proc: self.next_proc.load(Ordering::Relaxed),
            processes,
        })
    }
}
