//! One HTTP request through the ingress: routed (host name or path), its
//! token checked, its credentials stripped, and forwarded over a pooled
//! keep-alive connection into the sandbox (dialled by the sandbox's
//! supervisor inside its namespace). Websocket upgrades become a tunnel;
//! bodies stream both ways.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::auth::{self, Presented};
use super::body::{BoxError, IngressBody, Metered, OnEnd};
use super::pages::{page, redirect};
use super::route::{route, Route, RouteError};
use crate::config::IngressHostHeader;
use crate::model::{PortAuth, PortProtocol};
use crate::sandbox::{token_matches, DialError, IngressRouteError, Manager};

/// Opens connections into sandboxes for the pooled client: the URI's
/// authority is `<sandbox-id>-<port>`.
#[derive(Clone)]
pub struct SandboxConnector {
    manager: Arc<Manager>,
}

impl tower_service::Service<Uri> for SandboxConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = DialError;
    type Future = BoxFuture<'static, Result<Self::Response, DialError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let manager = Arc::clone(&self.manager);
        Box::pin(async move {
            let target = uri
                .host()
                .and_then(|h| h.rsplit_once('-'))
                .and_then(|(id, port)| Some((id.to_string(), port.parse::<u16>().ok()?)));
            let Some((sandbox, port)) = target else {
                return Err(DialError::Failed(format!("no sandbox port in {uri}")));
            };
            let stream = manager.dial_port(&sandbox, port).await?;
            let stream = tokio::net::TcpStream::from_std(stream)
                .map_err(|e| DialError::Failed(format!("adopting the socket: {e}")))?;
            Ok(TokioIo::new(stream))
        })
    }
}

pub struct HttpIngress {
    manager: Arc<Manager>,
    client: Client<SandboxConnector, IngressBody>,
    tls: bool,
}

/// Headers that belong to one hop, not forwarded (but `Connection` and
/// `Upgrade` of an upgrade).
const HOP_BY_HOP: [&str; 4] = ["keep-alive", "proxy-connection", "te", "trailer"];

impl HttpIngress {
    pub fn new(manager: Arc<Manager>, tls: bool) -> Arc<Self> {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .pool_max_idle_per_host(32)
            .set_host(false)
            .build(SandboxConnector {
                manager: Arc::clone(&manager),
            });
        Arc::new(HttpIngress {
            manager,
            client,
            tls,
        })
    }

    fn refused(&self, status: StatusCode, detail: &str) -> Response<IngressBody> {
        self.manager.metrics.ingress_request(status.as_str());
        page(status, detail)
    }

    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<IngressBody> {
        let started = Instant::now();
        let settings = &self.manager.config.ingress;
        let host = req
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()));
        let path_and_query = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let route = match route(settings.domain.as_deref(), host.as_deref(), &path_and_query) {
            Ok(r) => r,
            Err(RouteError::Malformed(why)) => return self.refused(StatusCode::BAD_REQUEST, &why),
            Err(RouteError::AddSlash(location)) => return redirect(&location, None),
            Err(e @ RouteError::NoRoute) => {
                return self.refused(StatusCode::NOT_FOUND, &e.to_string())
            }
        };
        let exposed = match self.manager.ingress_route(&route.sandbox, route.port) {
            Ok(e) => e,
            Err(e @ (IngressRouteError::NoSandbox(_) | IngressRouteError::NotExposed { .. })) => {
                return self.refused(StatusCode::NOT_FOUND, &e.to_string())
            }
            Err(e @ IngressRouteError::NotRunning(_)) => {
                return self.refused(StatusCode::BAD_GATEWAY, &e.to_string())
            }
        };
        if exposed.protocol == PortProtocol::Tcp {
            return self.refused(
                StatusCode::NOT_FOUND,
                &format!(
                    "port {} of sandbox {} is a raw TCP port: connect to its address",
                    route.port, route.sandbox
                ),
            );
        }
        let mut token = None;
        if exposed.auth == PortAuth::Token {
            let expected = exposed.token_sha256.as_deref().unwrap_or("");
            match auth::presented(req.headers(), &route.path_and_query) {
                Some(Presented::Query { token, clean }) if token_matches(expected, &token) => {
                    let location = format!("{}{clean}", route.prefix.as_deref().unwrap_or(""));
                    let cookie = auth::set_cookie(&token, route.prefix.as_deref(), self.tls);
                    self.manager.metrics.ingress_request("302");
                    return redirect(&location, Some(&cookie));
                }
                Some(Presented::Header(presented)) if token_matches(expected, &presented) => {
                    token = Some(presented)
                }
                _ => {
                    return self.refused(
                        StatusCode::UNAUTHORIZED,
                        "This preview URL needs its token: send it as Authorization: Bearer TOKEN or X-Sandbox-Token: TOKEN, or open the URL once with ?sandbox_token=TOKEN.",
                    )
                }
            }
        }
        let max = settings.max_connections;
        let Ok(link) = self.manager.links.open(&route.sandbox, route.port, max) else {
            return self.refused(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "sandbox {} has {max} connections open through the ingress already; retry when one ends",
                    route.sandbox
                ),
            );
        };
        let upgrade = req
            .headers()
            .contains_key(UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        auth::strip(&mut parts.headers, token.as_deref());
        for name in HOP_BY_HOP {
            parts.headers.remove(name);
        }
        if upgrade.is_none() {
            parts.headers.remove(CONNECTION);
        }
        let original_host = host.clone().unwrap_or_default();
        let app_host = match settings.host_header {
            IngressHostHeader::Original => original_host.clone(),
            IngressHostHeader::Localhost => format!("localhost:{}", route.port),
        };
        set(&mut parts.headers, HOST, &app_host);
        let forwarded_for = match parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
        {
            Some(earlier) => format!("{earlier}, {}", peer.ip()),
            None => peer.ip().to_string(),
        };
        set(
            &mut parts.headers,
            HeaderName::from_static("x-forwarded-for"),
            &forwarded_for,
        );
        set(
            &mut parts.headers,
            HeaderName::from_static("x-forwarded-proto"),
            if self.tls { "https" } else { "http" },
        );
        set(
            &mut parts.headers,
            HeaderName::from_static("x-forwarded-host"),
            &original_host,
        );
        if let Some(prefix) = &route.prefix {
            set(
                &mut parts.headers,
                HeaderName::from_static("x-forwarded-prefix"),
                prefix,
            );
        }
        let uri = format!(
            "http://{}-{}{}",
            route.sandbox, route.port, route.path_and_query
        );
        parts.uri = match uri.parse() {
            Ok(u) => u,
            Err(e) => {
                return self.refused(StatusCode::BAD_REQUEST, &format!("the request's path: {e}"))
            }
        };
        // Apps speak HTTP/1.1; an HTTP/2 client's streams each take a
        // pooled connection of their own.
        parts.version = Version::HTTP_11;
        let bytes_in = Arc::new(AtomicU64::new(0));
        let request_body = Metered::new(
            body,
            link.byte_counter(),
            link.closed.clone(),
            Some(Box::new(StoreCount(Arc::clone(&bytes_in)))),
        );
        let upstream = Request::from_parts(parts, request_body.boxed());
        let method = upstream.method().to_string();
        let path = route
            .path_and_query
            .split('?')
            .next()
            .unwrap_or("/")
            .to_string();
        let mut response = match self.client.request(upstream).await {
            Ok(r) => r,
            Err(e) => {
                let detail = dial_failure(&e).unwrap_or_else(|| {
                    format!(
                        "port {} of sandbox {} did not answer: {e}",
                        route.port, route.sandbox
                    )
                });
                tracing::info!(sandbox = %route.sandbox, port = route.port, %method, %path, status = 502, "ingress: {detail}");
                return self.refused(StatusCode::BAD_GATEWAY, &detail);
            }
        };
        let status = response.status();
        let end = RequestEnd {
            manager: Arc::clone(&self.manager),
            route: route.clone(),
            method,
            path,
            status: status.as_u16(),
            bytes_in,
            started,
            link: None,
        };
        if let (Some(client_side), StatusCode::SWITCHING_PROTOCOLS) = (upgrade, status) {
            let app_side = hyper::upgrade::on(&mut response);
            tokio::spawn(tunnel(client_side, app_side, link, end));
            return response.map(|b| b.map_err(BoxError::from).boxed());
        }
        let counter = link.byte_counter();
        let closed = link.closed.clone();
        let end = RequestEnd {
            link: Some(link),
            ..end
        };
        response.map(|b| Metered::new(b, counter, closed, Some(Box::new(end))).boxed())
    }
}

fn set(headers: &mut hyper::HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// The dial's own words when the client's error is a failed dial.
fn dial_failure(e: &hyper_util::client::legacy::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(dial) = err.downcast_ref::<DialError>() {
            return Some(match dial {
                DialError::NothingListening(why) => {
                    format!("{why}. Start the server (or wait for it to listen) and retry.")
                }
                DialError::Failed(why) => why.clone(),
            });
        }
        source = err.source();
    }
    None
}

/// Bytes of one request's body, for its log line.
struct StoreCount(Arc<AtomicU64>);

impl OnEnd for StoreCount {
    fn ended(&mut self, bytes: u64, _cut: bool) {
        self.0.store(bytes, Ordering::Relaxed);
    }
}

/// Ends a request: its link is released, its line logged, its metrics counted.
struct RequestEnd {
    manager: Arc<Manager>,
    route: Route,
    method: String,
    path: String,
    status: u16,
    bytes_in: Arc<AtomicU64>,
    started: Instant,
    link: Option<crate::sandbox::port_links::LinkGuard>,
}

impl OnEnd for RequestEnd {
    fn ended(&mut self, bytes_out: u64, cut: bool) {
        self.link = None;
        let bytes_in = self.bytes_in.load(Ordering::Relaxed);
        self.manager
            .metrics
            .ingress_request(&self.status.to_string());
        self.manager.metrics.ingress_bytes(bytes_in, bytes_out);
        tracing::info!(
            sandbox = %self.route.sandbox,
            port = self.route.port,
            method = %self.method,
            path = %self.path,
            status = self.status,
            bytes_in,
            bytes_out,
            duration_ms = self.started.elapsed().as_millis() as u64,
            cut,
            "ingress request"
        );
    }
}

/// A websocket (or other upgrade): bytes both ways until either side
/// closes or the port is closed.
async fn tunnel(
    client_side: hyper::upgrade::OnUpgrade,
    app_side: hyper::upgrade::OnUpgrade,
    link: crate::sandbox::port_links::LinkGuard,
    mut end: RequestEnd,
) {
    let (Ok(client), Ok(app)) = (client_side.await, app_side.await) else {
        end.ended(0, false);
        return;
    };
    let (mut client, mut app) = (TokioIo::new(client), TokioIo::new(app));
    let counter = link.byte_counter();
    let (moved, cut) = tokio::select! {
        moved = tokio::io::copy_bidirectional(&mut client, &mut app) => (moved.unwrap_or((0, 0)), false),
        _ = link.closed.cancelled() => ((0, 0), true),
    };
    counter.fetch_add(moved.0 + moved.1, Ordering::Relaxed);
    end.bytes_in.store(moved.0, Ordering::Relaxed);
    drop(link);
    end.ended(moved.1, cut);
}
