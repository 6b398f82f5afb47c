//! One intercepted connection, through hyper on both sides: TLS with the
//! sandbox is accepted with the host's leaf once the upstream's own TLS
//! (verified) has chosen the protocol, so both sides speak the same one:
//! HTTP/2 to HTTP/2 (HPACK is the library's), HTTP/1.1 to HTTP/1.1 with
//! keep-alive and `Upgrade` (websockets) passed through after the
//! handshake's headers are rewritten. Bodies stream both ways untouched;
//! each request must name the connection's host.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::tls::{self, Rewound, ALPN_H2};
use super::Interceptor;
use crate::net::host::{parse_host, HostPort, HostSpec};

type Body = BoxBody<Bytes, hyper::Error>;

/// One request as the egress log keeps it (never a header value).
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub method: String,
    /// The path without its query.
    pub path: String,
    pub status: u16,
    /// The secrets put into its headers.
    pub secrets: Vec<String>,
    /// Why it was refused, when it was.
    pub refused: Option<String>,
}

/// Where each request's record goes.
pub type RequestLog = Arc<dyn Fn(RequestRecord) + Send + Sync>;

enum Upstream {
    Http1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>),
    Http2(hyper::client::conn::http2::SendRequest<Incoming>),
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("sandboxd egress: {message}\n")))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// Serves the sandbox's connection `client` (whose first bytes, the
/// ClientHello, are `hello`) to host `name` over `upstream` (dialled,
/// not yet TLS). Returns the bytes carried on the sandbox's side.
pub async fn serve(
    interceptor: Arc<Interceptor>,
    name: String,
    client: TcpStream,
    hello: Vec<u8>,
    upstream: TcpStream,
    log: RequestLog,
) -> Result<u64, String> {
    let upstream_tls = interceptor.upstream_tls()?;
    let io = Rewound::new(hello, client);
    let counted = Arc::clone(&io.counted);
    let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .map_err(|e| format!("reading the ClientHello: {e}"))?;
    let offered: Vec<Vec<u8>> = start
        .client_hello()
        .alpn()
        .map(|protocols| protocols.map(<[u8]>::to_vec).collect())
        .unwrap_or_default();
    let server_name =
        ServerName::try_from(name.clone()).map_err(|e| format!("{name} as a TLS name: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(upstream_tls.for_client_offer(&offered));
    let upstream = connector
        .connect(server_name, upstream)
        .await
        .map_err(|e| format!("TLS to the upstream {name} did not verify: {e}"))?;
    let chosen = upstream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let leaf = interceptor
        .leaf_for(&name)
        .ok_or_else(|| format!("no leaf covers {name} any more"))?;
    let config = tls::server_config(leaf, chosen.as_deref()).map_err(|e| e.to_string())?;
    let sandbox_side = start
        .into_stream(config)
        .await
        .map_err(|e| format!("TLS with the sandbox: {e}"))?;
    let h2 = chosen.as_deref() == Some(ALPN_H2);
    let sender = if h2 {
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(upstream))
                .await
                .map_err(|e| format!("HTTP/2 with {name}: {e}"))?;
        tokio::spawn(conn);
        Upstream::Http2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
            .await
            .map_err(|e| format!("HTTP/1.1 with {name}: {e}"))?;
        tokio::spawn(conn.with_upgrades());
        Upstream::Http1(tokio::sync::Mutex::new(sender))
    };
    let forwarder = Arc::new(Forwarder {
        interceptor,
        name,
        upstream: sender,
        log,
    });
    let service = hyper::service::service_fn(move |req| {
        let forwarder = Arc::clone(&forwarder);
        async move { Ok::<_, Infallible>(forwarder.forward(req).await) }
    });
    let io = TokioIo::new(sandbox_side);
    let served = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .with_upgrades()
            .await
    };
    // A client that hangs up mid-response is its business, not a refusal.
    if let Err(e) = served {
        tracing::debug!("intercepted connection ended: {e}");
    }
    Ok(counted.load(Ordering::Relaxed))
}

struct Forwarder {
    interceptor: Arc<Interceptor>,
    name: String,
    upstream: Upstream,
    log: RequestLog,
}

impl Forwarder {
    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let record = |status: StatusCode, secrets: Vec<String>, refused: Option<String>| {
            (self.log)(RequestRecord {
                method: method.clone(),
                path: path.clone(),
                status: status.as_u16(),
                secrets,
                refused,
            })
        };
        if let Err(why) = self.check_host(&req) {
            record(
                StatusCode::MISDIRECTED_REQUEST,
                Vec::new(),
                Some(why.clone()),
            );
            return text(StatusCode::MISDIRECTED_REQUEST, &why);
        }
        let secrets = self.interceptor.substitute(&self.name, req.headers_mut());
        let upgrade = req
            .headers()
            .contains_key(hyper::header::UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let sent = match &self.upstream {
            Upstream::Http1(sender) => {
                let mut sender = sender.lock().await;
                match sender.ready().await {
                    Ok(()) => sender.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Upstream::Http2(sender) => {
                let mut sender = sender.clone();
                match sender.ready().await {
                    Ok(()) => sender.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
        };
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => {
                let why = format!("the upstream {} failed: {e}", self.name);
                record(StatusCode::BAD_GATEWAY, secrets, Some(why.clone()));
                return text(StatusCode::BAD_GATEWAY, &why);
            }
        };
        record(response.status(), secrets, None);
        if let (Some(client_side), StatusCode::SWITCHING_PROTOCOLS) = (upgrade, response.status()) {
            let upstream_side = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(client), Ok(upstream)) = (client_side.await, upstream_side.await) else {
                    return;
                };
                let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
        response.map(BodyExt::boxed)
    }

    /// The request's own host (`:authority`, else `Host`) must be the
    /// connection's: the secrets bound to it are the ones applied.
    fn check_host(&self, req: &Request<Incoming>) -> Result<(), String> {
        let named = match req.uri().authority() {
            Some(authority) => authority.as_str().to_string(),
            None => match req.headers().get(hyper::header::HOST) {
                Some(host) => host
                    .to_str()
                    .map_err(|_| "the Host header is not text".to_string())?
                    .to_string(),
                None => return Err("the request names no host".into()),
            },
        };
        match parse_host(&named) {
            Ok(HostPort {
                host: HostSpec::Name(n),
                ..
            }) if n == self.name => Ok(()),
            _ => Err(format!(
                "a request on the connection to {} names another host ({named})",
                self.name
            )),
        }
    }
}
