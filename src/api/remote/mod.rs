//! The API over TCP + TLS for clients on other machines (`api_listen`, off
//! by default): the same routes as the Unix socket, behind named bearer
//! tokens. The Unix socket stays the default and keeps its file-mode
//! access control.

mod auth;
pub mod identity;
mod listener;
pub mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;

use crate::config::RemoteApiSettings;
pub use auth::TokenStore;
pub use identity::{Identity, IdentityError};

#[derive(Debug, thiserror::Error)]
pub enum RemoteApiError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Tokens(#[from] tokens::TokenError),
    #[error(
        "api_listen is set but {0} holds no token, so every request would be refused; make one with `sandboxd token create NAME`"
    )]
    NoTokens(String),
    #[error("cannot listen on api_listen {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// The remote API with everything that can fail at start checked (its
/// identity, its tokens, its address), before the daemon opens anything
/// else; [`serve`](Self::serve) starts it.
pub struct PreparedRemoteApi {
    tcp: std::net::TcpListener,
    address: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    fingerprint: String,
    tokens: Arc<TokenStore>,
}

/// A serving remote API.
pub struct RemoteApi {
    pub address: SocketAddr,
    pub fingerprint: String,
    pub tokens: Arc<TokenStore>,
}

impl PreparedRemoteApi {
    pub fn prepare(
        settings: &RemoteApiSettings,
        listen: SocketAddr,
        state_dir: &std::path::Path,
    ) -> Result<PreparedRemoteApi, RemoteApiError> {
        let identity = Identity::load_or_make(settings, state_dir)?;
        let tokens = Arc::new(TokenStore::load(settings.tokens_file.clone())?);
        if tokens.current().is_empty() {
            return Err(RemoteApiError::NoTokens(
                settings.tokens_file.display().to_string(),
            ));
        }
        let bind_err = |source| RemoteApiError::Bind {
            address: listen,
            source,
        };
        // A certificate that does not match its key fails here, not
        // after the store is open.
        let tls = identity.server_config()?;
        let tcp = std::net::TcpListener::bind(listen).map_err(bind_err)?;
        tcp.set_nonblocking(true).map_err(bind_err)?;
        let address = tcp.local_addr().map_err(bind_err)?;
        Ok(PreparedRemoteApi {
            tcp,
            address,
            tls,
            fingerprint: identity.fingerprint(),
            tokens,
        })
    }

    /// Serves `router` until `shutdown` resolves; within a Tokio runtime.
    pub fn serve(
        self,
        router: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<RemoteApi, RemoteApiError> {
        let bind_err = |source| RemoteApiError::Bind {
            address: self.address,
            source,
        };
        let tcp = tokio::net::TcpListener::from_std(self.tcp).map_err(bind_err)?;
        let listener = listener::TlsListener::spawn(tcp, self.tls).map_err(bind_err)?;
        let app = router.layer(axum::middleware::from_fn_with_state(
            Arc::clone(&self.tokens),
            auth::require_token,
        ));
        tokio::spawn(async move {
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<listener::Peer>(),
            )
            .with_graceful_shutdown(shutdown)
            .await;
            if let Err(e) = served {
                tracing::error!("the remote API stopped: {e}");
            }
        });
        spawn_reload_on_hangup(Arc::clone(&self.tokens));
        Ok(RemoteApi {
            address: self.address,
            fingerprint: self.fingerprint,
            tokens: self.tokens,
        })
    }
}

/// SIGHUP re-reads the tokens file: revoked tokens stop working at once,
/// new ones start. A file that does not load leaves the tokens in force.
fn spawn_reload_on_hangup(tokens: Arc<TokenStore>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot watch SIGHUP: the tokens file is read at start only");
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match tokens.reload() {
                Ok(count) => tracing::info!(
                    tokens = count,
                    file = %tokens.path().display(),
                    "SIGHUP: remote API tokens reloaded"
                ),
                Err(e) => tracing::error!("SIGHUP: {e}; the tokens loaded before stay in force"),
            }
        }
    });
}
