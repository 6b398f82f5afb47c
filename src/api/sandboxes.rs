//! Sandbox routes: create, get, list, delete, TTL, health.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;

use super::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::error::{parse_json, ApiError, ApiResult};
use super::types::{CreateSandbox, Health, SandboxList, SetTtl};
use super::views::sandbox_view;
use crate::sandbox::Manager;

pub async fn health(State(manager): State<Arc<Manager>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        sandboxes: manager.count(),
        pooled: manager.pooled(),
        virtualization: manager.virtualization,
        ingress: manager.config.ingress.enabled(),
    })
}

pub async fn openapi() -> impl IntoResponse {
    ([("content-type", "application/json")], super::OPENAPI)
}

pub async fn create(
    State(manager): State<Arc<Manager>>,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let body: CreateSandbox = parse_json(&body)?;
    // Host paths name the daemon's own files, idmapped so host root's
    // files are the sandbox root's: only root on the daemon's host may
    // hand them in (the Unix socket may be open to a group; the remote
    // API has no Unix peer at all).
    let local_root = super::server::LocalPeer::is_root(&extensions);
    if !local_root && !body.host_rootfs.is_empty() {
        return Err(ApiError(crate::sandbox::SandboxError::Forbidden {
            code: "host_rootfs_not_allowed",
            message: "host_rootfs names directories on the daemon's host and is accepted only on its Unix socket, from root".into(),
        }));
    }
    if !local_root && !body.volumes.is_empty() {
        return Err(ApiError(crate::sandbox::SandboxError::Forbidden {
            code: "volumes_not_allowed",
            message: "volumes name files on the daemon's host and are accepted only on its Unix socket, from root".into(),
        }));
    }
    if !local_root && body.join_netns.is_some() {
        return Err(ApiError(crate::sandbox::SandboxError::Forbidden {
            code: "join_netns_not_allowed",
            message: "join_netns names a network namespace on the daemon's host and is accepted only on its Unix socket, from root".into(),
        }));
    }
    let (sandbox, grants, answered) = manager.create_exposed(body.try_into()?).await?;
    let view = Json(sandbox_view(&manager.config.ingress, &sandbox, &grants));
    Ok(super::answered_body::holding(
        (StatusCode::CREATED, view),
        answered,
    ))
}

/// `GET /v1/sandboxes?label=key=value&label=...`: every label must match.
pub async fn list(
    State(manager): State<Arc<Manager>>,
    Query(query): Query<Vec<(String, String)>>,
) -> ApiResult<Json<SandboxList>> {
    let mut wanted = Vec::new();
    for (key, value) in query {
        if key != "label" {
            return Err(ApiError::bad(
                "invalid_query",
                format!("unknown query parameter {key:?}; filter with label=key=value"),
            ));
        }
        let (k, v) = value.split_once('=').ok_or_else(|| {
            ApiError::bad(
                "invalid_query",
                format!("label filter {value:?} must be key=value"),
            )
        })?;
        wanted.push((k.to_string(), v.to_string()));
    }
    let sandboxes = manager
        .list()
        .into_iter()
        .filter(|s| wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| sandbox_view(&manager.config.ingress, &s, &[]))
        .collect();
    Ok(Json(SandboxList { sandboxes }))
}

pub async fn metrics(State(manager): State<Arc<Manager>>) -> impl IntoResponse {
    // Egress counters live in the supervisors; read them fresh for a scrape.
    manager.sample_egress().await;
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        manager.render_metrics(),
    )
}

pub async fn capacity(State(manager): State<Arc<Manager>>) -> impl IntoResponse {
    Json(manager.capacity())
}

pub async fn get(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(sandbox_view(
        &manager.config.ingress,
        &manager.get(&id).await?,
        &[],
    )))
}

/// `GET /v1/sandboxes/{id}/stats`: its resource use now.
pub async fn stats(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<Json<crate::model::SandboxStats>> {
    Ok(Json(manager.stats(&id).await?))
}

pub async fn delete(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    manager.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PATCH /v1/sandboxes/{id}/network`: body `{"block_network": true}`,
/// `{"block_network": false}` (open), `{"allow_list": [...]}`, or `{}` (the
/// daemon's default).
/// `GET /v1/sandboxes/{id}/network/log`: recent connections, allowed and
/// refused, oldest first (bounded per sandbox).
pub async fn network_log(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let entries = manager.connect(&id).await?.egress_log().await?;
    Ok(Json(serde_json::json!({ "entries": entries })))
}

pub async fn set_network(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let request: crate::net::policy::NetworkPolicy = parse_json(&body)?;
    Ok(Json(sandbox_view(
        &manager.config.ingress,
        &manager.set_network(&id, &request).await?,
        &[],
    )))
}

pub async fn set_ttl(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let request: SetTtl = parse_json(&body)?;
    Ok(Json(sandbox_view(
        &manager.config.ingress,
        &manager.set_ttl(&id, request.ttl_seconds)?,
        &[],
    )))
}
