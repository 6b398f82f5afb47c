//! The HTTP/1.1 client of sandboxd's `/v1` API over its Unix socket, or
//! over TCP + TLS with a bearer token ([`crate::remote`]): one
//! connection per request (the CLI makes few, and it keeps the client free of pool
//! state), JSON in and out, streamed bodies for file transfers and process
//! output, and the daemon's one error shape turned into an [`ApiError`].

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::{Bytes, BytesMut};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use sandboxd::api::types::ErrorBody;

use crate::remote::Remote;

/// A request body: empty, a buffer, or a stream read from a file or stdin.
/// Unsync because a stream's reader need not be `Sync`, and hyper does not ask it.
pub type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Largest JSON or error body the CLI buffers; lists of many sandboxes fit easily,
/// and a bound keeps a misbehaving peer from eating memory.
const MAX_JSON_BODY: usize = 64 << 20;

/// Read size for streamed uploads.
const CHUNK: usize = 64 << 10;

/// An error the daemon reported in its `{"error": {...}}` shape (or, failing that,
/// a non-2xx status with whatever body came). Displays as the message alone,
/// because that is what the user is told.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// Builds the error from a non-2xx response body.
    pub fn from_body(status: StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(e) => ApiError {
                status,
                message: e.error.message,
            },
            Err(_) => {
                // Not our shape (a proxy, or a daemon bug): show the start of the body.
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let shown: String = text.chars().take(200).collect();
                let message = if shown.is_empty() {
                    format!("daemon answered HTTP {status}")
                } else {
                    format!("daemon answered HTTP {status}: {shown}")
                };
                ApiError { status, message }
            }
        }
    }
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body that streams `reader` in chunks, so a large upload is never held in
/// memory whole.
pub fn reader_body<R: AsyncRead + Send + Unpin + 'static>(reader: R) -> Body {
    let stream = futures::stream::try_unfold(reader, |mut r| async move {
        let mut buf = BytesMut::with_capacity(CHUNK);
        let n = r.read_buf(&mut buf).await?;
        if n == 0 {
            Ok(None)
        } else {
            Ok(Some((Frame::data(buf.freeze()), r)))
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

/// Percent-encodes a query value. `/` stays readable since it is legal in a
/// query and paths are the common value.
pub fn enc_query(s: &str) -> String {
    encode(s, true)
}

/// Percent-encodes one path segment (a `/` inside it would change the route).
pub fn enc_seg(s: &str) -> String {
    encode(s, false)
}

/// The route of one sandbox, its id percent-encoded.
pub fn sandbox_uri(id: &str) -> String {
    format!("/v1/sandboxes/{}", enc_seg(id))
}

fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        let plain = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/');
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Clone)]
pub struct Client {
    endpoint: Endpoint,
}

#[derive(Clone)]
enum Endpoint {
    Socket(PathBuf),
    Remote(Arc<Remote>),
}

/// A connection of either endpoint.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Client {
    pub fn new(socket: &Path) -> Self {
        Client {
            endpoint: Endpoint::Socket(socket.to_path_buf()),
        }
    }

    pub fn remote(remote: Remote) -> Self {
        Client {
            endpoint: Endpoint::Remote(Arc::new(remote)),
        }
    }

    async fn connect(&self) -> Result<Box<dyn Io>> {
        match &self.endpoint {
            Endpoint::Socket(socket) => {
                let stream = UnixStream::connect(socket).await.with_context(|| {
                    format!(
                        "cannot connect to sandboxd at {} (set --socket or SANDBOXD_SOCKET)",
                        socket.display()
                    )
                })?;
                Ok(Box::new(stream))
            }
            Endpoint::Remote(remote) => {
                let tcp = TcpStream::connect((remote.host.as_str(), remote.port))
                    .await
                    .with_context(|| {
                        format!("cannot connect to sandboxd at https://{}", remote.authority)
                    })?;
                let _ = tcp.set_nodelay(true);
                let tls = tokio_rustls::TlsConnector::from(Arc::clone(&remote.tls))
                    .connect(remote.server_name.clone(), tcp)
                    .await
                    .with_context(|| {
                        format!("TLS with sandboxd at https://{} failed", remote.authority)
                    })?;
                Ok(Box::new(tls))
            }
        }
    }

    /// Sends one request on a fresh connection and returns the response with its
    /// body unread, whatever the status.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        body: Body,
        content_type: Option<&str>,
        content_length: Option<u64>,
    ) -> Result<Response<Incoming>> {
        let stream = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with sandboxd failed")?;
        // The connection task must outlive this call: streamed response bodies
        // are read through it after `send` returns.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder().method(method).uri(uri);
        match &self.endpoint {
            Endpoint::Socket(_) => req = req.header(HOST, "sandboxd"),
            Endpoint::Remote(remote) => {
                req = req.header(HOST, remote.authority.as_str());
                if let Some(token) = &remote.token {
                    let mut value = HeaderValue::try_from(format!("Bearer {}", token.as_str()))
                        .context("the token holds characters a header cannot carry")?;
                    value.set_sensitive(true);
                    req = req.header(AUTHORIZATION, value);
                }
            }
        }
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        if let Some(len) = content_length {
            req = req.header(CONTENT_LENGTH, len);
        }
        let req = req.body(body).context("building the request")?;
        sender
            .send_request(req)
            .await
            .with_context(|| format!("request to sandboxd failed ({uri})"))
    }

    /// Like [`send`](Self::send), but a non-2xx answer becomes an [`ApiError`].
    pub async fn send_ok(
        &self,
        method: Method,
        uri: &str,
        body: Body,
        content_type: Option<&str>,
        content_length: Option<u64>,
    ) -> Result<Response<Incoming>> {
        let resp = self
            .send(method, uri, body, content_type, content_length)
            .await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = read_all(resp.into_body(), MAX_JSON_BODY)
            .await
            .unwrap_or_default();
        Err(ApiError::from_body(status, &body).into())
    }

    /// Sends an optional JSON body; a non-2xx answer becomes an [`ApiError`].
    async fn send_json(
        &self,
        method: Method,
        uri: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Response<Incoming>> {
        let (body, ct) = match body {
            Some(b) => (
                full(serde_json::to_vec(b).context("encoding the request")?),
                Some("application/json"),
            ),
            None => (empty(), None),
        };
        self.send_ok(method, uri, body, ct, None).await
    }

    /// A call whose answer is JSON: returns it parsed and as the raw bytes, so
    /// `--json` can print exactly what the daemon said.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        body: Option<&impl Serialize>,
    ) -> Result<(T, Bytes)> {
        let resp = self.send_json(method, uri, body).await?;
        let raw = read_all(resp.into_body(), MAX_JSON_BODY).await?;
        let parsed = serde_json::from_slice(&raw)
            .with_context(|| format!("unexpected answer from sandboxd to {uri}"))?;
        Ok((parsed, raw))
    }

    /// A call whose answer carries no body worth reading (204).
    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<&impl Serialize>,
    ) -> Result<()> {
        let resp = self.send_json(method, uri, body).await?;
        // Drain so the connection ends cleanly; the content does not matter.
        let _ = read_all(resp.into_body(), MAX_JSON_BODY).await;
        Ok(())
    }
}

/// Reads a whole body, refusing one larger than `limit`.
pub async fn read_all(mut body: Incoming, limit: usize) -> Result<Bytes> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the answer from sandboxd")?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                anyhow::bail!("answer from sandboxd is larger than {limit} bytes");
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// Next data chunk of a streamed body (trailers are skipped), `None` at the end.
pub async fn next_chunk(body: &mut Incoming) -> Option<Result<Bytes, hyper::Error>> {
    loop {
        match body.frame().await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_paths_readable_and_escapes_the_rest() {
        assert_eq!(enc_query("/tmp/a b.txt"), "/tmp/a%20b.txt");
        assert_eq!(enc_query("a&b=c?#"), "a%26b%3Dc%3F%23");
        assert_eq!(enc_query("é"), "%C3%A9");
        assert_eq!(enc_seg("a/b"), "a%2Fb");
        assert_eq!(enc_seg("sb-01_x.y~"), "sb-01_x.y~");
    }

    #[test]
    fn error_bodies_become_messages() {
        let e = ApiError::from_body(
            StatusCode::SERVICE_UNAVAILABLE,
            br#"{"error":{"code":"no_capacity","message":"not enough memory","resource":"memory"}}"#,
        );
        assert_eq!(e.to_string(), "not enough memory");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);

        let e = ApiError::from_body(StatusCode::BAD_GATEWAY, b"upstream broke");
        assert_eq!(
            e.to_string(),
            "daemon answered HTTP 502 Bad Gateway: upstream broke"
        );
        let e = ApiError::from_body(StatusCode::INTERNAL_SERVER_ERROR, b"");
        assert_eq!(
            e.to_string(),
            "daemon answered HTTP 500 Internal Server Error"
        );
    }
}
