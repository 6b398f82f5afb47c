//! Pod container roots: `POST /v1/sandboxes/{id}/roots` makes a separate
//! root from host directories, with host volumes bound in, `DELETE /v1/sandboxes/{id}/roots/{name}`
//! removes it, `GET .../roots/{name}/stats` reads a limited one's use;
//! processes name it in `root`. Only root on the Unix socket
//! may name host directories, as for `host_rootfs` at create.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::error::{parse_json, ApiError, ApiResult};
use super::extract::Path;
use super::server::LocalPeer;
use super::types::AttachRoot;
use crate::sandbox::{Manager, SandboxError};

pub async fn attach(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    if !LocalPeer::is_root(&extensions) {
        return Err(ApiError(SandboxError::Forbidden {
            code: "host_rootfs_not_allowed",
            message: "a root's host_rootfs names directories on the daemon's host and is accepted only on its Unix socket, from root".into(),
        }));
    }
    let body: AttachRoot = parse_json(&body)?;
    manager
        .attach_root(
            &id,
            &body.name,
            body.host_rootfs.clone(),
            body.limits.as_ref(),
            body.volumes.clone(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(body)))
}

/// `GET /v1/sandboxes/{id}/roots/{name}/stats`: a limited root's own use.
pub async fn stats(
    State(manager): State<Arc<Manager>>,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<Json<crate::model::SandboxStats>> {
    Ok(Json(manager.root_stats(&id, &name).await?))
}

pub async fn detach(
    State(manager): State<Arc<Manager>>,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    manager.detach_root(&id, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
