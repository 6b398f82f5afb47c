//! The ingress: preview URLs for ports a sandbox serves. An HTTP listener
//! (HTTP/1.1 and HTTP/2, cleartext or TLS) routes `<id>-<port>.<domain>` or
//! `/<id>/<port>/` to the port inside the sandbox's network namespace
//! (`proxy.rs`), and raw TCP exposures get host ports of their own
//! (`tcp.rs`). Exposures, tokens and open links are the manager's
//! (`sandbox/ports.rs`, `sandbox/port_links.rs`); this module only serves.

mod auth;
mod body;
mod counted;
mod pages;
mod proxy;
mod route;
mod tcp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::config::IngressSettings;
use crate::sandbox::Manager;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request head may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 pings: a peer that does not answer one in this long is gone.
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// Connections open through all the ingress's listeners at once.
const MAX_CONNECTIONS: usize = 8192;

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
        let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut addresses = Vec::new();
        for listener in self.listeners {
            let address = listener.local_addr().map_err(|source| IngressError::Bind {
                address: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|source| IngressError::Bind { address, source })?;
            tokio::spawn(accept_loop(
                listener,
                Arc::clone(&http),
                acceptor.clone(),
                Arc::clone(&open),
            ));
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
    open: Arc<Semaphore>,
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
        // Past the daemon-wide bound a connection is closed at once, so
        // idle or slow clients cannot take every descriptor.
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!(%peer, "ingress connection refused: {MAX_CONNECTIONS} open already");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let http = Arc::clone(&http);
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            serve_connection(tls, h2, peer, http).await
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "ingress TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "ingress TLS handshake timed out"),
                    }
                }
                None => match h2c_preface(&stream).await {
                    Some(h2) => serve_connection(stream, h2, peer, http).await,
                    None => tracing::debug!(%peer, "ingress connection sent no request in time"),
                },
            }
        });
    }
}

/// Whether a cleartext connection opens with HTTP/2's preface (h2c with
/// prior knowledge) or something else (HTTP/1.1); `None` when its first
/// bytes do not come within the header timeout.
async fn h2c_preface(stream: &tokio::net::TcpStream) -> Option<bool> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let sniff = async {
        let mut seen = [0u8; PREFACE.len()];
        loop {
            let n = stream.peek(&mut seen).await.ok()?;
            if n == 0 {
                return None;
            }
            if seen[..n] != PREFACE[..n] {
                return Some(false);
            }
            if n == PREFACE.len() {
                return Some(true);
            }
            // A preface cut short: wait for the rest (peek does not).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(HEADER_TIMEOUT, sniff)
        .await
        .ok()
        .flatten()
}

/// Serves one connection as HTTP/2 or HTTP/1.1 (with upgrades). Both have
/// deadlines: a request head must come within the header timeout, and an
/// HTTP/2 peer that stops answering pings is dropped.
async fn serve_connection<I>(io: I, h2: bool, peer: SocketAddr, http: Arc<proxy::HttpIngress>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let http = Arc::clone(&http);
        async move { Ok::<_, std::convert::Infallible>(http.handle(req, peer).await) }
    });
    let served = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(KEEP_ALIVE))
            .keep_alive_timeout(KEEP_ALIVE)
            .serve_connection(TokioIo::new(io), service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades()
            .await
    };
    if let Err(e) = served {
        tracing::debug!(%peer, "ingress connection ended: {e}");
    }
}
