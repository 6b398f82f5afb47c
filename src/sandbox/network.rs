//! Changing a running sandbox's egress policy (`PATCH
//! /v1/sandboxes/{id}/network`): validated here, put in force by the
//! sandbox's supervisor, then persisted in its record.

use super::manager::HEALTH_DEADLINE;
use super::SandboxRecord;
use super::{Manager, SandboxError};
use crate::net::policy::NetworkPolicy;
use crate::supervisor::protocol::{SupervisorReply, SupervisorRequest};

impl Manager {
    /// Puts `request` in force on sandbox `id` (the daemon's default when it
    /// names no policy); open connections it forbids are closed.
    pub async fn set_network(
        &self,
        id: &str,
        request: &NetworkPolicy,
    ) -> Result<SandboxRecord, SandboxError> {
        let network = self.resolved_network(request)?;
        let mut conn = self.connect(id).await?;
        match conn
            .call(
                &SupervisorRequest::SetPolicy {
                    block_network: network.block_network,
                    allow_list: network.allow_list.clone(),
                },
                HEALTH_DEADLINE,
            )
            .await
        {
            Ok(SupervisorReply::Ok) => {}
            Ok(SupervisorReply::Error(e)) => return Err(SandboxError::internal(e)),
            Ok(other) => {
                return Err(SandboxError::internal(format!(
                    "unexpected supervisor reply {other:?}"
                )))
            }
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
