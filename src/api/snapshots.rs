//! Snapshot routes: take one of a sandbox, list, inspect, delete.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;

use super::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{parse_json, ApiResult};
use crate::sandbox::Manager;
use crate::sandbox::{SnapshotKind, SnapshotView};

/// `POST /v1/sandboxes/{id}/snapshots` body; `{}` means a memory snapshot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeSnapshot {
    #[serde(default = "memory")]
    pub kind: SnapshotKind,
}

fn memory() -> SnapshotKind {
    SnapshotKind::Memory
}

#[derive(Debug, Serialize)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
}

pub async fn take(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let request: TakeSnapshot = if body.is_empty() {
        TakeSnapshot { kind: memory() }
    } else {
        parse_json(&body)?
    };
    let view = manager.snapshot(&id, request.kind).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

pub async fn list(State(manager): State<Arc<Manager>>) -> Json<SnapshotList> {
    Json(SnapshotList {
        snapshots: manager.list_snapshots(),
    })
}

pub async fn get(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<Json<SnapshotView>> {
    Ok(Json(manager.get_snapshot(&id)?))
}

pub async fn delete(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    manager.delete_snapshot(&id)?;
    Ok(StatusCode::NO_CONTENT)
}
