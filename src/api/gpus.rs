//! `GET /v1/gpus`: the host's GPUs, discovered afresh, and who holds each.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use super::error::ApiResult;
use super::types::{Gpu, GpuList};
use crate::sandbox::{Manager, SandboxError};

pub async fn list(State(manager): State<Arc<Manager>>) -> ApiResult<Json<GpuList>> {
    let service = manager.gpus();
    // NVML calls block.
    let holdings = tokio::task::spawn_blocking(move || service.list())
        .await
        .map_err(SandboxError::internal)?;
    Ok(Json(GpuList {
        gpus: holdings
            .into_iter()
            .map(|h| Gpu {
                index: h.gpu.index,
                uuid: h.gpu.uuid,
                name: h.gpu.name,
                memory_mib: h.gpu.memory_mib,
                pci_bus_id: h.gpu.pci_bus_id,
                minor_number: h.gpu.minor_number,
                held_by: h.held_by,
            })
            .collect(),
    }))
}
