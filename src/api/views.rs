//! The mapping between the API's bodies and the domain: a create body
//! becomes the manager's [`CreateRequest`], a sandbox record becomes the
//! [`Sandbox`] a caller sees. The only place that knows both shapes.

use std::time::{Duration, UNIX_EPOCH};

use super::error::ApiError;
use super::types::{CreateSandbox, Sandbox};
use crate::model::{CreateRequest, RuntimeKind};
use crate::net::policy::{DefaultEgress, EgressPolicy, NetworkPolicy};
use crate::sandbox::SandboxRecord;

impl TryFrom<CreateSandbox> for CreateRequest {
    type Error = ApiError;

    fn try_from(body: CreateSandbox) -> Result<Self, ApiError> {
        let runtime = body
            .runtime
            .as_deref()
            .map(str::parse::<RuntimeKind>)
            .transpose()
            .map_err(|e| ApiError::bad("invalid_runtime", e.to_string()))?;
        Ok(CreateRequest {
            image: body.image,
            runtime,
            cpu: body.cpu,
            memory_mib: body.memory_mib,
            disk_mib: body.disk_mib,
            pids: body.pids,
            ttl_seconds: body.ttl_seconds,
            env: body.env,
            labels: body.labels,
            idempotency_key: body.idempotency_key,
            gpu: body.gpu,
            gpu_count: body.gpu_count,
            network: NetworkPolicy {
                block_network: body.block_network,
                allow_list: body.allow_list,
            },
            from_snapshot: body.from_snapshot,
            secrets: body.secrets,
        })
    }
}

impl From<&SandboxRecord> for Sandbox {
    fn from(record: &SandboxRecord) -> Self {
        Sandbox {
            id: record.id.clone(),
            state: record.state,
            runtime: record.runtime,
            image: record.image.clone(),
            image_digest: record.image_digest.clone(),
            limits: record.limits.clone(),
            ttl_seconds: record.ttl_seconds,
            expires_at: record.expires_at_ms.map(|ms| {
                humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
            }),
            created_at: record.created_at.clone(),
            labels: record.labels.clone(),
            oom_kills: record.oom_kills,
            failure: record.failure.clone(),
            usage: record.usage.clone(),
            gpus: record.gpus.clone(),
            network: EgressPolicy::from_request(&record.network, DefaultEgress::Block)
                .ok()
                .map(|p| p.view()),
            secrets: record.secrets.iter().map(|b| b.name.clone()).collect(),
        }
    }
}
