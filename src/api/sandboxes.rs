//! Sandbox routes: create, get, list, delete, TTL, health.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::error::{parse_json, ApiResult};
use super::types::{CreateSandbox, Health, SandboxList, SetTtl};
use crate::sandbox::Manager;

pub async fn health(State(manager): State<Arc<Manager>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        sandboxes: manager.count(),
        pooled: manager.pooled(),
    })
}

pub async fn openapi() -> impl IntoResponse {
    ([("content-type", "application/json")], super::OPENAPI)
}

pub async fn create(
    State(manager): State<Arc<Manager>>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let request: CreateSandbox = parse_json(&body)?;
    let sandbox = manager.create(request).await?;
    Ok((StatusCode::CREATED, Json(sandbox)))
}

pub async fn list(State(manager): State<Arc<Manager>>) -> Json<SandboxList> {
    Json(SandboxList {
        sandboxes: manager.list(),
    })
}

pub async fn get(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(manager.get(&id).await?))
}

pub async fn delete(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    manager.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn set_ttl(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let request: SetTtl = parse_json(&body)?;
    Ok(Json(manager.set_ttl(&id, request.ttl_seconds)?))
}
