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

use super::auth;
use super::body::{BoxError, IngressBody, Metered, OnEnd};
use super::counted::Counted;
use super::pages::{page, redirect};
use super::route::{route, split_label, Route, RouteError};
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
            let Some((sandbox, port)) = uri.host().and_then(split_label) else {
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
    /// The client reaches the ingress over TLS: its own, or a proxy's in
    /// front (`ingress_public_url` with https).
    secure: bool,
}

const NEEDS_TOKEN: &str = "This preview URL needs its token: send it as Authorization: Bearer TOKEN or X-Sandbox-Token: TOKEN, or open the URL once with ?sandbox_token=TOKEN.";
const PATH_FORM_TOKENS: &str = "Path-form preview URLs take their token in a header only (Authorization: Bearer TOKEN or X-Sandbox-Token: TOKEN): every sandbox shares their origin, so a browser session there would be open to the others. For a browser, use the host-name URL (ingress_domain).";
const FOREIGN_ORIGIN: &str = "This preview URL's cookie was sent by a page of another origin; open the URL itself, or send the token in a header.";

/// What a token check decided.
enum TokenCheck {
    /// Go on; the token to strip if it came in a header.
    Passed(Option<String>),
    /// `?sandbox_token=` with the right token: set the cookie, redirect.
    SetCookie { token: String, location: String },
}

/// Response headers an app may not send through the ingress: a service
/// worker allowed above its own URL could watch other URLs of the origin.
const APP_HEADERS_DROPPED: [&str; 1] = ["service-worker-allowed"];

/// Headers that belong to one hop, not forwarded (but `Connection` and
/// `Upgrade` of an upgrade).
const HOP_BY_HOP: [&str; 4] = ["keep-alive", "proxy-connection", "te", "trailer"];

impl HttpIngress {
    pub fn new(manager: Arc<Manager>, tls: bool) -> Arc<Self> {
        let secure = tls
            || manager
                .config
                .ingress
                .public_url
                .as_ref()
                .is_some_and(|u| u.https);
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
            secure,
        })
    }

    /// Whether the request may use a token port, and how it showed it.
    fn check_token(
        &self,
        headers: &hyper::HeaderMap,
        route: &Route,
        host: &str,
        expected: &str,
    ) -> Result<TokenCheck, (StatusCode, &'static str)> {
        let presented = auth::presented(headers, &route.path_and_query);
        // The path form shares one origin among every sandbox: a page of
        // one could use another's cookie, so it takes headers only.
        let browser_session = route.prefix.is_none();
        if let Some((query_token, clean)) = presented.query {
            if !browser_session {
                return Err((StatusCode::UNAUTHORIZED, PATH_FORM_TOKENS));
            }
            if !token_matches(expected, &query_token) {
                return Err((StatusCode::UNAUTHORIZED, NEEDS_TOKEN));
            }
            // `//host` or `/\host` would send the browser elsewhere.
            let location = format!("/{}", clean.trim_start_matches(['/', '\\']));
            return Ok(TokenCheck::SetCookie {
                token: query_token,
                location,
            });
        }
        if let Some(matched) = presented
            .headers
            .into_iter()
            .find(|t| token_matches(expected, t))
        {
            return Ok(TokenCheck::Passed(Some(matched)));
        }
        if browser_session && presented.cookies.iter().any(|t| token_matches(expected, t)) {
            if auth::foreign_origin(headers, host).is_some() {
                return Err((StatusCode::FORBIDDEN, FOREIGN_ORIGIN));
            }
            return Ok(TokenCheck::Passed(None));
        }
        Err((StatusCode::UNAUTHORIZED, NEEDS_TOKEN))
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
            match self.check_token(
                req.headers(),
                &route,
                host.as_deref().unwrap_or(""),
                expected,
            ) {
                Ok(TokenCheck::Passed(presented)) => token = presented,
                Ok(TokenCheck::SetCookie { token, location }) => {
                    let cookie = auth::set_cookie(&token, self.secure);
                    self.manager.metrics.ingress_request("302");
                    return redirect(&location, Some(&cookie));
                }
                Err((status, why)) => return self.refused(status, why),
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
            if self.secure { "https" } else { "http" },
        );
        set(
            &mut parts.headers,
            HeaderName::from_static("x-forwarded-host"),
            &original_host,
        );
        parts.headers.remove("x-forwarded-prefix");
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
        for name in APP_HEADERS_DROPPED {
            response.headers_mut().remove(name);
        }
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
    let mut client = TokioIo::new(client);
    let mut app = Counted::new(TokioIo::new(app), link.byte_counter());
    let cut = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut app) => false,
        _ = link.closed.cancelled() => true,
    };
    end.bytes_in.store(app.written, Ordering::Relaxed);
    drop(link);
    end.ended(app.read, cut);
}
