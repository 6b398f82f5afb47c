//! The brokered-secrets tests' API server: HTTPS (HTTP/2 and HTTP/1.1 by
//! ALPN, a test CA for `api.example.test` and `second.example.test`) and
//! cleartext HTTP, on [`ECHO_IP`] in the upstream's server namespace. It
//! records what each request carried (the headers a secret goes into, the
//! body, the connection) for the test to read, and answers with a short
//! JSON line; `/ws` is a websocket echo; `/bytes/N` streams N bytes.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::upstream::{Upstream, ECHO_IP};

/// Names the echo server's certificate covers.
pub const ECHO_NAMES: [&str; 2] = ["api.example.test", "second.example.test"];

/// One request as the server got it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub tls: bool,
    pub version: String,
    pub method: String,
    pub path: String,
    /// `:authority` or `Host`.
    pub host: String,
    pub authorization: Option<String>,
    pub api_key: Option<String>,
    pub body: Vec<u8>,
    /// Which connection it came on (numbered per server).
    pub connection: u64,
}

pub struct Echo {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// PEM of the test CA: the daemon's `egress_extra_ca`.
    pub ca_pem: String,
    pub ca_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Echo {
    /// Starts the servers in `upstream`'s server namespace.
    pub fn start(upstream: &Upstream) -> Echo {
        let (tls, ca_pem) =
            super::upstream::test_tls("sandboxd echo test CA", &ECHO_NAMES, &[b"h2", b"http/1.1"]);
        let ns = upstream.server_netns();
        let (https, http) = sandboxd::net::plumbing::in_netns(&ns, || {
            (
                std::net::TcpListener::bind((ECHO_IP, 443)),
                std::net::TcpListener::bind((ECHO_IP, 80)),
            )
        })
        .expect("enter the server namespace");
        let (https, http) = (https.expect("bind :443"), http.expect("bind :80"));
        https.set_nonblocking(true).expect("nonblocking");
        http.set_nonblocking(true).expect("nonblocking");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(https, http, tls, shared));
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_path = dir.path().join("echo-ca.pem");
        std::fs::write(&ca_path, &ca_pem).expect("write CA");
        Echo {
            seen,
            ca_pem,
            ca_path,
            _dir: dir,
        }
    }

    /// Every request so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Requests whose path is `path`.
    pub fn seen_at(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

async fn serve(
    https: std::net::TcpListener,
    http: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let https = tokio::net::TcpListener::from_std(https).expect("listener");
    let http = tokio::net::TcpListener::from_std(http).expect("listener");
    let connections = Arc::new(AtomicU64::new(0));
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let plain_seen = Arc::clone(&seen);
    let plain_connections = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((stream, _)) = http.accept().await {
            let n = plain_connections.fetch_add(1, Ordering::Relaxed);
            let seen = Arc::clone(&plain_seen);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req| handle(req, false, n, Arc::clone(&seen)));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    while let Ok((stream, _peer)) = https.accept().await {
        let n = connections.fetch_add(1, Ordering::Relaxed);
        let acceptor = acceptor.clone();
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let service =
                hyper::service::service_fn(move |req| handle(req, true, n, Arc::clone(&seen)));
            let io = TokioIo::new(stream);
            if h2 {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await;
            } else {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .with_upgrades()
                    .await;
            }
        });
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

async fn handle(
    mut req: Request<Incoming>,
    tls: bool,
    connection: u64,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Body>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let host = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| header("host"))
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let mut record = Seen {
        tls,
        version: format!("{:?}", req.version()),
        method: req.method().to_string(),
        path: path.clone(),
        host,
        authorization: header("authorization"),
        api_key: header("x-api-key"),
        body: Vec::new(),
        connection,
    };
    if path == "/ws" {
        let key = header("sec-websocket-key").unwrap_or_default();
        seen.lock().expect("seen").push(record);
        let accept = {
            let mut sha = Sha1::new();
            sha.update(key.as_bytes());
            sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
            base64::engine::general_purpose::STANDARD.encode(sha.finalize())
        };
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                websocket_echo(TokioIo::new(upgraded)).await;
            }
        });
        let response = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", accept)
            .body(full(Bytes::new()))
            .expect("response");
        return Ok(response);
    }
    if let Some(n) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        seen.lock().expect("seen").push(record);
        return Ok(Response::new(stream_bytes(n)));
    }
    record.body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    // Not the headers themselves: a response is never rewritten, so an
    // upstream that echoed a key would hand it to the sandbox.
    let answer = json!({
        "version": record.version,
        "host": record.host,
        "body_bytes": record.body.len(),
    });
    seen.lock().expect("seen").push(record);
    Ok(Response::new(full(answer.to_string())))
}

/// `n` bytes of 'x' in 256 KiB frames, streamed.
fn stream_bytes(n: u64) -> Body {
    const BLOCK: u64 = 256 * 1024;
    let block = Bytes::from(vec![b'x'; BLOCK as usize]);
    let frames = futures::stream::unfold(n, move |left| {
        let block = block.clone();
        async move {
            if left == 0 {
                return None;
            }
            let take = left.min(BLOCK);
            Some((
                Ok::<_, Infallible>(Frame::data(block.slice(..take as usize))),
                left - take,
            ))
        }
    });
    StreamBody::new(frames).boxed()
}

/// Echoes each text or binary frame back (unmasked) until a close frame.
async fn websocket_echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: S) {
    loop {
        let mut head = [0u8; 2];
        if io.read_exact(&mut head).await.is_err() {
            return;
        }
        let opcode = head[0] & 0x0f;
        let masked = head[1] & 0x80 != 0;
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            len = u64::from(io.read_u16().await.unwrap_or(0));
        } else if len == 127 {
            len = io.read_u64().await.unwrap_or(0);
        }
        let mut mask = [0u8; 4];
        if masked && io.read_exact(&mut mask).await.is_err() {
            return;
        }
        let mut payload = vec![0u8; len as usize];
        if io.read_exact(&mut payload).await.is_err() {
            return;
        }
        if masked {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        if opcode == 0x8 {
            let _ = io.write_all(&[0x88, 0]).await;
            return;
        }
        let mut frame = vec![0x80 | opcode];
        if payload.len() < 126 {
            frame.push(payload.len() as u8);
        } else {
            frame.push(126);
            frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        frame.extend_from_slice(&payload);
        if io.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// Where a test's own client reaches the echo server (from the upstream side).
pub fn echo_addr(port: u16) -> SocketAddr {
    SocketAddr::new(ECHO_IP.parse().expect("ip"), port)
}
