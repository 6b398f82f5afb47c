//! The ingress: preview URLs for ports a sandbox serves. An HTTP listener
//! (HTTP/1.1 and HTTP/2, cleartext or TLS) routes `<id>-<port>.<domain>` or
//! `/<id>/<port>/` to the port inside the sandbox's network namespace
//! (`proxy.rs`), and raw TCP exposures get host ports of their own
//! (`tcp.rs`). Exposures, tokens and open links are the manager's
//! (`sandbox/ports.rs`, `sandbox/port_links.rs`); this module only serves.

mod auth;
mod body;
mod pages;
mod proxy;
mod route;
mod tcp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_rustls::TlsAcceptor;

use crate::config::IngressSettings;
use crate::sandbox::Manager;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request head may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error("ingress_listen {address}: {source}; pick a free address or stop what holds it")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("ingress_tls_cert / ingress_tls_key: {0}")]
    Tls(String),
}

/// The ingress's sockets, bound (and its certificate read) before the
/// daemon opens anything else, so a bad setting refuses the start.
pub struct PreparedIngress {
    listeners: Vec<std::net::TcpListener>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl PreparedIngress {
    /// `None` when `ingress_listen` is empty (the ingress is off).
    pub fn prepare(settings: &IngressSettings) -> Result<Option<Self>, IngressError> {
        if !settings.enabled() {
            return Ok(None);
        }
        let tls = match &settings.tls_files {
            Some((cert, key)) => {
                let identity = crate::api::remote::identity::Identity::load(cert, key)
                    .map_err(|e| IngressError::Tls(e.to_string()))?;
                Some(
                    identity
                        .server_config_offering(&[b"h2", b"http/1.1"])
                        .map_err(|e| IngressError::Tls(e.to_string()))?,
                )
            }
            None => None,
        };
        let mut listeners = Vec::new();
        for address in &settings.listen {
            let bind = |source| IngressError::Bind {
                address: *address,
                source,
            };
            let listener = std::net::TcpListener::bind(address).map_err(bind)?;
            listener.set_nonblocking(true).map_err(bind)?;
            listeners.push(listener);
        }
        Ok(Some(PreparedIngress { listeners, tls }))
    }

    /// Serves every listener and the raw TCP exposures (inside the runtime).
    pub fn serve(self, manager: Arc<Manager>) -> Result<Vec<SocketAddr>, IngressError> {
        let http = proxy::HttpIngress::new(Arc::clone(&manager), self.tls.is_some());
        let acceptor = self.tls.map(TlsAcceptor::from);
        let mut addresses = Vec::new();
        for listener in self.listeners {
            let address = listener.local_addr().map_err(|source| IngressError::Bind {
                address: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|source| IngressError::Bind { address, source })?;
            tokio::spawn(accept_loop(listener, Arc::clone(&http), acceptor.clone()));
            addresses.push(address);
        }
        tokio::spawn(tcp::serve_exposures(manager));
        Ok(addresses)
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    http: Arc<proxy::HttpIngress>,
    tls: Option<TlsAcceptor>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("ingress accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let http = Arc::clone(&http);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => serve_connection(tls, peer, http).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "ingress TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "ingress TLS handshake timed out"),
                    }
                }
                None => serve_connection(stream, peer, http).await,
            }
        });
    }
}

async fn serve_connection<I>(io: I, peer: SocketAddr, http: Arc<proxy::HttpIngress>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let http = Arc::clone(&http);
        async move { Ok::<_, std::convert::Infallible>(http.handle(req, peer).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client that opens a connection and sends no request head does not
    // hold it for ever.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let served = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, "ingress connection ended: {e}");
    }
}
