//! Changing a running sandbox's egress policy (`PATCH
//! /v1/sandboxes/{id}/network`): validated here, put in force by the
//! sandbox's supervisor, then persisted in its record.

use super::manager::not_running;
use super::SandboxRecord;
use super::{Manager, SandboxError};
use crate::net::policy::NetworkPolicy;
use crate::supervisor::client::CallError;

impl Manager {
    /// Puts `request` in force on sandbox `id` (the daemon's default when it
    /// names no policy); open connections it forbids are closed.
    pub async fn set_network(
        &self,
        id: &str,
        request: &NetworkPolicy,
    ) -> Result<SandboxRecord, SandboxError> {
        let network = self.resolved_network(request)?;
        self.ready(id)?;
        // Persisted only once the supervisor has it in force: a record that
        // names a policy the sandbox does not enforce would lie.
        match self.supervisors.set_policy(id, &network).await {
            Ok(()) => {}
            Err(CallError::Connect(e)) => return Err(not_running(id, e)),
            Err(e) => return Err(SandboxError::internal(e)),
        }
        let record = {
            let mut records = self.records();
            let record = records
                .get_mut(id)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            record.network = network;
            record.clone()
        };
        self.persist(&record)?;
        Ok(record)
    }
}
