//! The router and the Unix-socket listener of the API.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::Router;
use tokio::net::UnixListener;

use super::{events, files, gpus, images, ports, processes, roots, sandboxes, secrets, snapshots};
use crate::sandbox::Manager;

/// Declares every route once: the router is built from this list, and
/// [`ROUTES`] (what the OpenAPI document is checked against) is the same
/// list, so a route cannot be served without being checked for a document.
macro_rules! api_routes {
    ($($path:literal => $($method:ident $handler:path),+;)+) => {
        /// Every `(method, path)` the API serves, paths as axum writes them.
        pub const ROUTES: &[(&str, &str)] = &[$($((stringify!($method), $path)),+),+];

        fn routes(router: Router<Arc<Manager>>) -> Router<Arc<Manager>> {
            router$(.route($path, axum::routing::MethodRouter::new()$(.$method($handler))+))+
        }
    };
}

api_routes! {
    "/v1/health" => get sandboxes::health;
    "/v1/openapi.json" => get sandboxes::openapi;
    "/v1/events" => get events::events;
    "/v1/capacity" => get sandboxes::capacity;
    "/v1/gpus" => get gpus::list;
    "/v1/images" => get images::list, post images::pull;
    "/v1/images/prune" => post images::prune;
    "/v1/secrets" => post secrets::create, get secrets::list;
    "/v1/secrets/{name}" => get secrets::get, put secrets::rotate, delete secrets::delete;
    "/v1/sandboxes" => post sandboxes::create, get sandboxes::list;
    "/v1/sandboxes/{id}" => get sandboxes::get, delete sandboxes::delete;
    "/v1/sandboxes/{id}/ttl" => put sandboxes::set_ttl;
    "/v1/sandboxes/{id}/stats" => get sandboxes::stats;
    "/v1/sandboxes/{id}/snapshots" => post snapshots::take;
    "/v1/snapshots" => get snapshots::list;
    "/v1/snapshots/{id}" => get snapshots::get, delete snapshots::delete;
    "/v1/sandboxes/{id}/network" => patch sandboxes::set_network;
    "/v1/sandboxes/{id}/network/log" => get sandboxes::network_log;
    "/v1/sandboxes/{id}/ports" => post ports::expose, get ports::list;
    "/v1/sandboxes/{id}/ports/{port}" => delete ports::unexpose;
    "/v1/sandboxes/{id}/ports/{port}/token" => post ports::rotate_token;
    "/v1/sandboxes/{id}/roots" => post roots::attach;
    "/v1/sandboxes/{id}/roots/{name}" => delete roots::detach;
    "/v1/sandboxes/{id}/roots/{name}/stats" => get roots::stats;
    "/v1/sandboxes/{id}/processes" => post processes::start, get processes::list;
    "/v1/sandboxes/{id}/processes/{proc}" => get processes::get;
    "/v1/sandboxes/{id}/processes/{proc}/output" => get processes::output;
    "/v1/sandboxes/{id}/processes/{proc}/stdin" => post processes::write_stdin, delete processes::close_stdin;
    "/v1/sandboxes/{id}/processes/{proc}/signal" => post processes::signal;
    "/v1/sandboxes/{id}/processes/{proc}/resize" => post processes::resize;
    "/v1/sandboxes/{id}/processes/{proc}/kill" => post processes::kill;
    "/v1/sandboxes/{id}/processes/{proc}/wait" => get processes::wait;
    "/v1/sandboxes/{id}/files" => put files::upload, get files::download, delete files::remove;
    "/v1/sandboxes/{id}/files/list" => get files::list;
    "/v1/sandboxes/{id}/files/stat" => get files::stat;
    "/v1/sandboxes/{id}/files/mkdir" => post files::mkdir;
    "/metrics" => get sandboxes::metrics;
}

pub fn router(manager: Arc<Manager>) -> Router {
    routes(Router::new())
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

/// Who called on the Unix socket (`SO_PEERCRED`): its mode is 0660 and
/// `socket_group` may open it to non-root users, so what only root may
/// ask (`host_rootfs`, which reads any host directory) checks the uid.
#[derive(Clone, Copy, Debug)]
pub struct LocalPeer {
    pub uid: Option<u32>,
}

impl LocalPeer {
    /// Whether the request came from root on the daemon's Unix socket.
    pub fn is_root(extensions: &axum::http::Extensions) -> bool {
        extensions
            .get::<axum::extract::ConnectInfo<LocalPeer>>()
            .is_some_and(|peer| peer.0.uid == Some(0))
    }
}

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, tokio::net::UnixListener>,
    > for LocalPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        LocalPeer {
            uid: stream.io().peer_cred().ok().map(|c| c.uid()),
        }
    }
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
