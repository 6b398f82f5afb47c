//! The router and the Unix-socket listener of the API.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, patch, post, put};
use axum::Router;
use tokio::net::UnixListener;

use super::{events, files, gpus, images, processes, sandboxes, secrets, snapshots};
use crate::sandbox::Manager;

pub fn router(manager: Arc<Manager>) -> Router {
    let v1 = Router::new()
        .route("/health", get(sandboxes::health))
        .route("/openapi.json", get(sandboxes::openapi))
        .route("/events", get(events::events))
        .route("/capacity", get(sandboxes::capacity))
        .route("/gpus", get(gpus::list))
        .route("/images", get(images::list))
        .route("/images/prune", post(images::prune))
        .route("/secrets", post(secrets::create).get(secrets::list))
        .route(
            "/secrets/{name}",
            get(secrets::get)
                .put(secrets::rotate)
                .delete(secrets::delete),
        )
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::delete),
        )
        .route("/sandboxes/{id}/ttl", put(sandboxes::set_ttl))
        .route("/sandboxes/{id}/snapshots", post(snapshots::take))
        .route("/snapshots", get(snapshots::list))
        .route(
            "/snapshots/{id}",
            get(snapshots::get).delete(snapshots::delete),
        )
        .route("/sandboxes/{id}/network", patch(sandboxes::set_network))
        .route("/sandboxes/{id}/network/log", get(sandboxes::network_log))
        .route(
            "/sandboxes/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route("/sandboxes/{id}/processes/{proc}", get(processes::get))
        .route(
            "/sandboxes/{id}/processes/{proc}/output",
            get(processes::output),
        )
        .route(
            "/sandboxes/{id}/processes/{proc}/stdin",
            post(processes::write_stdin).delete(processes::close_stdin),
        )
        .route(
            "/sandboxes/{id}/processes/{proc}/signal",
            post(processes::signal),
        )
        .route(
            "/sandboxes/{id}/processes/{proc}/kill",
            post(processes::kill),
        )
        .route(
            "/sandboxes/{id}/processes/{proc}/wait",
            get(processes::wait),
        )
        .route(
            "/sandboxes/{id}/files",
            put(files::upload)
                .get(files::download)
                .delete(files::remove),
        )
        .route("/sandboxes/{id}/files/list", get(files::list))
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir));
    Router::new()
        .nest("/v1", v1)
        .route("/metrics", get(sandboxes::metrics))
        // JSON bodies are small; uploads stream and enforce their own limit.
        .layer(DefaultBodyLimit::max(4 << 20))
        .with_state(manager)
}

/// The router of the optional TCP metrics listener: `/metrics` only.
pub fn metrics_router(manager: Arc<Manager>) -> Router {
    Router::new()
        .route("/metrics", get(sandboxes::metrics))
        .with_state(manager)
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    #[error("socket group {0:?} does not exist; create it or change `socket_group`")]
    NoGroup(String),
}

/// Binds the API socket with mode 0660 and the configured group. A stale
/// socket file is replaced; the caller holds the state lock, so it is ours.
pub fn listen(path: &Path, group: Option<&str>) -> Result<UnixListener, ListenError> {
    let bind_err = |source| ListenError::Bind {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    if let Some(group) = group {
        let gid = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| ListenError::NoGroup(group.to_string()))?
            .gid;
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| bind_err(e.into()))?;
    }
    Ok(listener)
}
