//! Root-only: preview URLs (docs/preview-urls.md). Python servers in real
//! container sandboxes are reached through the daemon's ingress listener on
//! loopback: by host name and by path, over HTTP/1.1, h2c and h2 under TLS,
//! as websockets, server-sent events and 200 MB bodies; token URLs, raw TCP
//! ports, forks, the per-sandbox connection cap, deletion and bad input.
//! The servers are Python's standard library only (the `python` image has
//! no more); the clients are hyper, a hand-written websocket and curl.
//! Nothing leaves the machine.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use common::Daemon;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::Rng;
use serde_json::{json, Value};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upstream::{Upstream, BODY, SERVER_IPS};

/// The daemons' `ingress_domain`.
const DOMAIN: &str = "sbx.test";
/// How long anything may take before a test gives up on it.
const WAIT: Duration = Duration::from_secs(30);
/// A sandbox id no daemon made.
const UNKNOWN: &str = "sb-000000000000";
const MIB: usize = 1 << 20;
/// The large bodies: 200 MiB each way.
const BIG: usize = 200 * MIB;
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The HTTP app (`python3 -c APP PORT [BIND]`). `GET` of any path answers
/// what it got as JSON (method, path, headers, its hostname, `$MARK`);
/// `/count` a counter that counts up; `/ws` is a websocket that greets and
/// echoes each frame with `echo:` before it; `/sse?release=FILE` writes one
/// event, then waits for FILE before the second; `/download?bytes=N&tag=T`
/// streams N bytes and `/sent?tag=T` says their sha256; `POST` hashes the
/// body it reads (Content-Length or chunked).
const APP: &str = r#"
import base64, hashlib, json, os, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(sys.argv[1])
BIND = sys.argv[2] if len(sys.argv) > 2 else '0.0.0.0'
GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
COUNTER = [0]
LOCK = threading.Lock()
SENT = {}


def read_exact(f, n):
    data = b''
    while len(data) < n:
        chunk = f.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(f):
    head = read_exact(f, 2)
    if head is None:
        return None
    opcode, masked, n = head[0] & 0x0F, head[1] & 0x80, head[1] & 0x7F
    if n >= 126:
        ext = read_exact(f, 2 if n == 126 else 8)
        if ext is None:
            return None
        n = int.from_bytes(ext, 'big')
    mask = read_exact(f, 4) if masked else b'\0\0\0\0'
    payload = read_exact(f, n) if n else b''
    if mask is None or payload is None:
        return None
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def send_frame(f, opcode, payload):
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, 'big')
    else:
        head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, 'big')
    f.write(head + payload)


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
        pass

    def reply(self, status, body, close=False):
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        if close:
            self.send_header('Connection', 'close')
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def info(self):
        return {
            'method': self.command,
            'path': self.path,
            'version': self.request_version,
            'headers': [[k.lower(), v] for k, v in self.headers.items()],
            'hostname': socket.gethostname(),
            'mark': os.environ.get('MARK', ''),
            'port': PORT,
        }

    def do_GET(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == '/count':
            with LOCK:
                n = COUNTER[0]
                COUNTER[0] += 1
            body = {'count': n, 'hostname': socket.gethostname()}
            self.reply(200, json.dumps(body).encode(), close=True)
        elif url.path == '/ws':
            self.websocket()
        elif url.path == '/sse':
            self.sse(query['release'][0])
        elif url.path == '/download':
            self.download(int(query['bytes'][0]), query['tag'][0])
        elif url.path == '/sent':
            tag = query['tag'][0]
            deadline = time.monotonic() + 30
            while tag not in SENT and time.monotonic() < deadline:
                time.sleep(0.05)
            self.reply(200, json.dumps(SENT.get(tag)).encode())
        else:
            self.reply(200, json.dumps(self.info()).encode())

    def do_POST(self):
        digest, size, kept = hashlib.sha256(), 0, b''
        for chunk in self.body_chunks():
            digest.update(chunk)
            size += len(chunk)
            if len(kept) < 4096:
                kept += chunk[:4096]
        info = self.info()
        info.update(sha256=digest.hexdigest(), bytes=size,
                    body=kept[:4096].decode('utf-8', 'replace'))
        self.reply(200, json.dumps(info).encode())

    def body_chunks(self):
        if 'chunked' in self.headers.get('Transfer-Encoding', '').lower():
            while True:
                size = int(self.rfile.readline().split(b';')[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b'\r\n', b'\n', b''):
                        pass
                    return
                yield from self.exactly(size)
                self.rfile.readline()
        else:
            yield from self.exactly(int(self.headers.get('Content-Length', '0')))

    def exactly(self, left):
        while left:
            data = self.rfile.read(min(left, 1 << 20))
            if not data:
                raise EOFError('body cut short')
            left -= len(data)
            yield data

    def websocket(self):
        key = self.headers['Sec-WebSocket-Key']
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest())
        self.send_response(101, 'Switching Protocols')
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept', accept.decode())
        self.end_headers()
        self.close_connection = True
        send_frame(self.wfile, 1, ('hello from ' + socket.gethostname()).encode())
        while True:
            frame = read_frame(self.rfile)
            if frame is None:
                return
            opcode, payload = frame
            if opcode == 8:
                send_frame(self.wfile, 8, payload[:2])
                return
            if opcode == 9:
                send_frame(self.wfile, 10, payload)
            elif opcode in (1, 2):
                send_frame(self.wfile, opcode, b'echo:' + payload)

    def chunk(self, data):
        self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))

    def sse(self, release):
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.send_header('Cache-Control', 'no-cache')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        self.chunk(b'data: one\n\n')
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.chunk(b'data: two\n\n')
        self.wfile.write(b'0\r\n\r\n')

    def download(self, n, tag):
        self.send_response(200)
        self.send_header('Content-Type', 'application/octet-stream')
        self.send_header('Content-Length', str(n))
        self.end_headers()
        digest, block, i, left = hashlib.sha256(), os.urandom(1 << 20), 0, n
        while left:
            chunk = (i.to_bytes(8, 'little') + block[8:])[:left]
            digest.update(chunk)
            self.wfile.write(chunk)
            left -= len(chunk)
            i += 1
        SENT[tag] = {'sha256': digest.hexdigest(), 'bytes': n}


ThreadingHTTPServer((BIND, PORT), Handler).serve_forever()
"#;

/// A raw TCP echo server on each port of its argv: it notes each accepted
/// connection in /tmp/accepts-PORT, greets with `hi PORT\n`, then echoes.
const TCP_ECHO: &str = r#"
import socket, sys, threading

def serve(conn, port):
    with open('/tmp/accepts-%d' % port, 'a') as f:
        f.write('accepted\n')
    try:
        conn.sendall(b'hi %d\n' % port)
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
    except OSError:
        pass
    conn.close()

def listen(port):
    open('/tmp/accepts-%d' % port, 'a').close()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(('0.0.0.0', port))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, port), daemon=True).start()

ports = [int(p) for p in sys.argv[1:]]
for port in ports[1:]:
    threading.Thread(target=listen, args=(port,), daemon=True).start()
listen(ports[0])
"#;

// ---------------------------------------------------------------------------
// The daemon with its ingress
// ---------------------------------------------------------------------------

/// A daemon whose ingress listens on a loopback port of its own.
struct Ingress {
    daemon: Daemon,
    /// The ingress listener.
    addr: SocketAddr,
    /// The test CA, when the ingress serves TLS (its files live in `_tls`).
    ca: Option<PathBuf>,
    _tls: Option<tempfile::TempDir>,
}

impl Deref for Ingress {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// `FIRST-LAST`: `n` loopback ports in a row that are free now, below the
/// ephemeral range.
fn free_port_range(n: u16) -> (u16, u16) {
    let mut rng = rand::thread_rng();
    for _ in 0..500 {
        let first: u16 = rng.gen_range(20_000..32_000);
        if (first..first + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return (first, first + n - 1);
        }
    }
    panic!("no {n} free loopback ports in a row between 20000 and 32000");
}

impl Ingress {
    /// A daemon with `--ingress-listen 127.0.0.1:PORT --ingress-domain
    /// sbx.test` and `extra`.
    fn start(extra: &[String]) -> Ingress {
        Self::start_with(extra, None)
    }

    /// The same, serving TLS with a certificate for `*.sbx.test` and
    /// `sbx.test` from a test CA.
    fn start_tls(extra: &[String]) -> Ingress {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_with(extra, Some(dir))
    }

    fn start_with(extra: &[String], tls: Option<tempfile::TempDir>) -> Ingress {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut flags: Vec<String> = vec![
            "--ingress-listen".into(),
            addr.to_string(),
            "--ingress-domain".into(),
            DOMAIN.into(),
        ];
        let mut ca = None;
        if let Some(dir) = &tls {
            let (cert, key, ca_path) = write_tls_files(dir.path());
            flags.extend([
                "--ingress-tls-cert".into(),
                cert.display().to_string(),
                "--ingress-tls-key".into(),
                key.display().to_string(),
            ]);
            ca = Some(ca_path);
        }
        flags.extend(extra.iter().cloned());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let daemon = Daemon::start_with(&flags);
        // READY means serving: the listener is up by now.
        if let Err(e) = std::net::TcpStream::connect(addr) {
            panic!(
                "the ingress does not listen on {addr} after READY: {e}\n{}",
                log_tail(&daemon)
            );
        }
        Ingress {
            daemon,
            addr,
            ca,
            _tls: tls,
        }
    }

    /// `Host` for the path form: the listener's own address.
    fn plain(&self) -> String {
        self.addr.to_string()
    }

    /// One request on a fresh connection; panics when no answer comes.
    async fn request(
        &self,
        method: Method,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", host);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .expect("a request");
        let what = format!("{method} {path} (Host: {host})");
        let answer = tokio::time::timeout(WAIT, async {
            let response = open(self.addr, request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes()
                .to_vec();
            Ok::<_, String>(Reply {
                status,
                headers,
                body,
            })
        })
        .await;
        match answer {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => panic!("{what}: {e}\n{}", log_tail(self)),
            Err(_) => panic!("{what}: no answer in {WAIT:?}\n{}", log_tail(self)),
        }
    }

    async fn get(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.request(Method::GET, host, path, headers, Vec::new())
            .await
    }

    /// GETs until the answer is not a 502 (the app is not listening yet).
    async fn await_app(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let deadline = Instant::now() + WAIT;
        loop {
            let reply = self.get(host, path, headers).await;
            if reply.status != StatusCode::BAD_GATEWAY {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "GET {path} (Host: {host}) was still a 502 after {WAIT:?}: {reply}\n{}",
                log_tail(self)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST /v1/sandboxes/{id}/ports`, asserting a 201.
    async fn expose(&self, id: &str, body: Value) -> Value {
        let (status, v) = self.try_expose(id, &body).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "expose {body} on {id}: {v}\n{}",
            log_tail(self)
        );
        v
    }

    async fn try_expose(&self, id: &str, body: &Value) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports"),
            Some(body.clone()),
        )
        .await
    }

    /// A create through the API, asserting a 201; the whole answer.
    async fn create_full(&self, body: Value) -> Value {
        let (status, v) = self
            .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
            .await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "create {body}: {v}\n{}",
            log_tail(self)
        );
        v
    }

    /// `GET /v1/sandboxes/{id}/ports?listening=true`, until each of
    /// `ports` is listed as listening.
    async fn await_listening(&self, id: &str, ports: &[u16]) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, v) = self
                .call(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/ports?listening=true"),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{v}");
            let listening = v["listening"].as_array().cloned().unwrap_or_default();
            if ports
                .iter()
                .all(|p| listening.iter().any(|l| l["port"] == *p))
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "ports {ports:?} were not listed as listening after {WAIT:?}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The sandbox's view.
    async fn view(&self, id: &str) -> Value {
        let (status, v) = self
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }
}

/// A CA and a certificate it signed for `*.sbx.test` and `sbx.test`, as
/// PEM files in `dir`: (certificate, key, CA).
fn write_tls_files(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    use std::os::unix::fs::PermissionsExt;
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sandboxd ingress test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec![format!("*.{DOMAIN}"), DOMAIN.to_string()])
        .expect("leaf params")
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("leaf certificate");
    let (cert, key, ca_path) = (
        dir.join("ingress.crt"),
        dir.join("ingress.key"),
        dir.join("ca.pem"),
    );
    std::fs::write(&cert, leaf.pem()).expect("write the certificate");
    std::fs::write(&key, leaf_key.serialize_pem()).expect("write the key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(&ca_path, ca.pem()).expect("write the CA");
    (cert, key, ca_path)
}

/// The last lines of the daemon's log, for failure messages.
fn log_tail(daemon: &Daemon) -> String {
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().collect();
    format!(
        "daemon log (last lines):\n{}",
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

/// `<id>-<port>.sbx.test`.
fn host(id: &str, port: u16) -> String {
    format!("{id}-{port}.{DOMAIN}")
}

// ---------------------------------------------------------------------------
// HTTP through hyper
// ---------------------------------------------------------------------------

/// Sends `request` on a fresh HTTP/1.1 connection to `addr`.
async fn open<B>(addr: SocketAddr, request: Request<B>) -> Result<Response<Incoming>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))
}

/// An answer from the ingress.
struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    /// A header's value ("" when absent).
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (what the app says it got).
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self}"))
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.text();
        let cut: String = text.chars().take(2000).collect();
        write!(f, "{} {:?} {cut}", self.status, self.headers)
    }
}

/// The first value of header `name` among those the app got.
fn seen_header(seen: &Value, name: &str) -> Option<String> {
    seen["headers"]
        .as_array()?
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_str())
        .map(String::from)
}

/// The attributes of a `Set-Cookie` value, lower-cased names: the first is
/// the cookie itself.
fn cookie_attributes(set_cookie: &str) -> Vec<(String, String)> {
    set_cookie
        .split(';')
        .map(|part| {
            let part = part.trim();
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .collect()
}

/// The path and query of a redirect's `Location` (absolute or not).
fn location_path(location: &str) -> String {
    match location.split_once("://") {
        Some((_, rest)) => rest
            .find('/')
            .map(|at| rest[at..].to_string())
            .unwrap_or_else(|| "/".into()),
        None => location.to_string(),
    }
}

/// Reads frames of `body` into `got` until it holds `needle`; false when
/// the body ended or `within` passed first.
async fn read_until(
    body: &mut Incoming,
    got: &mut Vec<u8>,
    needle: &[u8],
    within: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while memchr::memmem::find(&got[..], needle).is_none() {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    got.extend_from_slice(&data);
                }
            }
            _ => return false,
        }
    }
    true
}

/// The sum of the `sandboxd_ingress_bytes_total` samples, once above zero.
async fn await_ingress_bytes_metric(daemon: &Daemon) -> f64 {
    let name = "sandboxd_ingress_bytes_total";
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
        assert_eq!(status, StatusCode::OK);
        let metrics = String::from_utf8_lossy(&metrics).into_owned();
        let total: f64 = metrics
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if total > 0.0 {
            return total;
        }
        assert!(
            Instant::now() < deadline,
            "no {name} above zero after {WAIT:?} in\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---------------------------------------------------------------------------
// A websocket client, by hand
// ---------------------------------------------------------------------------

struct WebSocket {
    stream: TcpStream,
    /// Read but not yet taken.
    buf: Vec<u8>,
}

/// Opens a websocket at `path` through the ingress at `addr`. `Err` holds
/// the answer's head when it was not a 101 (or why there was none).
async fn websocket(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<WebSocket, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let key = b64.encode(rand::random::<[u8; 16]>());
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("write the upgrade: {e}"))?;
    let mut buf = Vec::new();
    let end = loop {
        if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            break end;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, stream.read(&mut chunk))
            .await
            .map_err(|_| format!("no answer to the upgrade in {WAIT:?}"))?
            .map_err(|e| format!("read the answer: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed before a whole answer: {:?}",
                String::from_utf8_lossy(&buf)
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let answer = String::from_utf8_lossy(&buf[..end]).into_owned();
    if !answer.starts_with("HTTP/1.1 101") {
        return Err(answer);
    }
    let accept = b64.encode(Sha1::digest(format!("{key}{WEBSOCKET_GUID}").as_bytes()));
    assert!(
        answer
            .lines()
            .any(|l| l.split_once(':').is_some_and(|(name, value)| name
                .eq_ignore_ascii_case("sec-websocket-accept")
                && value.trim() == accept)),
        "no Sec-WebSocket-Accept: {accept} in {answer}"
    );
    buf.drain(..end + 4);
    Ok(WebSocket { stream, buf })
}

impl WebSocket {
    /// Sends one masked frame with FIN set.
    async fn send(&mut self, opcode: u8, payload: &[u8]) {
        let mut frame = vec![0x80 | opcode];
        let len = payload.len();
        if len < 126 {
            frame.push(0x80 | len as u8);
        } else if len < 65536 {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream
            .write_all(&frame)
            .await
            .expect("write a websocket frame");
    }

    /// Reads until `buf` holds `n` bytes; false at the end of the stream.
    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = vec![0u8; 65536];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(got) => self.buf.extend_from_slice(&chunk[..got]),
            }
        }
        true
    }

    /// The next frame (opcode, payload), `None` at the end of the stream.
    async fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        if !self.fill(2).await {
            return None;
        }
        let opcode = self.buf[0] & 0x0f;
        assert_eq!(self.buf[1] & 0x80, 0, "a server frame must not be masked");
        let (len, at) = match self.buf[1] & 0x7f {
            126 => {
                if !self.fill(4).await {
                    return None;
                }
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                if !self.fill(10).await {
                    return None;
                }
                let mut len = [0u8; 8];
                len.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(len) as usize, 10)
            }
            n => (n as usize, 2),
        };
        if !self.fill(at + len).await {
            return None;
        }
        let payload = self.buf[at..at + len].to_vec();
        self.buf.drain(..at + len);
        Some((opcode, payload))
    }

    /// The next frame, which must come within [`WAIT`].
    async fn next(&mut self) -> (u8, Vec<u8>) {
        match tokio::time::timeout(WAIT, self.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => panic!("the websocket closed while a frame was awaited"),
            Err(_) => panic!("no websocket frame in {WAIT:?}"),
        }
    }

    /// The next frame, which must be text.
    async fn text(&mut self) -> String {
        let (opcode, payload) = self.next().await;
        assert_eq!(opcode, 1, "not a text frame: {payload:?}");
        String::from_utf8(payload).expect("UTF-8 text")
    }

    /// Whether the connection ends (EOF or an error) within `within`;
    /// whatever still arrives before that is discarded.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        let mut chunk = vec![0u8; 65536];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// A websocket that must open; retries a 503 for a few seconds (a request
/// that just ended may hold its slot of the cap a moment longer).
async fn websocket_ok(addr: SocketAddr, host: &str, path: &str) -> WebSocket {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match websocket(addr, host, path, &[]).await {
            Ok(ws) => return ws,
            Err(head) if head.starts_with("HTTP/1.1 503") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("websocket {path} (Host: {host}) did not open: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// curl
// ---------------------------------------------------------------------------

/// What `curl -sS -w '\n%{http_code} %{http_version}' ARGS` gave.
struct Curl {
    ok: bool,
    code: u16,
    version: String,
    /// Stdout less the status line (with `-i`, the head too).
    body: String,
    stderr: String,
}

impl std::fmt::Display for Curl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "curl ok={} code={} version={} body={} stderr={}",
            self.ok, self.code, self.version, self.body, self.stderr
        )
    }
}

async fn curl(args: &[&str]) -> Curl {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(args)
        .output()
        .await
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_str()));
    let mut words = tail.split_whitespace();
    Curl {
        ok: out.status.success(),
        code: words.next().and_then(|c| c.parse().ok()).unwrap_or(0),
        version: words.next().unwrap_or("").to_string(),
        body: body.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

// ---------------------------------------------------------------------------
// Sandboxes and their apps
// ---------------------------------------------------------------------------

/// Starts the HTTP app on `port` (bound to `bind`) in `id`, in the background.
async fn start_app(daemon: &Daemon, id: &str, port: u16, bind: &str) -> u64 {
    daemon
        .start_process(
            id,
            json!({"argv": ["python3", "-c", APP, port.to_string(), bind]}),
        )
        .await
}

/// Runs `script` in `id` and returns its stdout, asserting it exits 0.
async fn sh_ok(daemon: &Daemon, id: &str, script: &str) -> String {
    let run = daemon.sh(id, script).await;
    assert_eq!(
        run.exit_code(),
        Some(0),
        "{script}\nstdout: {}\nstderr: {}",
        run.out(),
        run.err()
    );
    run.out()
}

/// Reads exactly `n` bytes from `stream` within [`WAIT`].
async fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(WAIT, stream.read_exact(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{n} bytes did not arrive in {WAIT:?}"))
        .unwrap_or_else(|e| panic!("reading {n} bytes: {e}"));
    buf
}

/// Whether `stream` ends (EOF or error) within `within`, and what arrived
/// before it did.
async fn ends_within(stream: &mut TcpStream, within: Duration) -> (bool, Vec<u8>) {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 65536];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (true, got),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
            Err(_) => return (false, got),
        }
    }
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn http_h2c_websockets_and_events_reach_the_app_by_host_and_by_path() {
    require_host!();
    let ingress = Ingress::start(&[]);
    let id = ingress.create(json!({"image": "python"})).await;
    let name = host(&id, 8000);
    let plain = ingress.plain();

    // Exposed before anything listens: a 502 until the app is up. The app
    // listens on 127.0.0.1 only, which the supervisor's dial reaches.
    let exposed = ingress
        .expose(&id, json!({"port": 8000, "auth": "none"}))
        .await;
    assert_eq!(exposed["port"], 8000, "{exposed}");
    assert_eq!(exposed["protocol"], "http", "{exposed}");
    assert_eq!(exposed["auth"], "none", "{exposed}");
    assert!(
        exposed["token"].is_null(),
        "a public port has no token: {exposed}"
    );
    let url = exposed["url"].as_str().unwrap_or("");
    assert!(
        url.starts_with("http://") && url.contains(&name),
        "{exposed}"
    );
    let path_url = exposed["path_url"].as_str().unwrap_or("");
    assert!(path_url.ends_with(&format!("/{id}/8000/")), "{exposed}");
    let early = ingress.get(&name, "/", &[]).await;
    assert_eq!(early.status, StatusCode::BAD_GATEWAY, "{early}");
    start_app(&ingress, &id, 8000, "127.0.0.1").await;

    // Host form: the request reaches the app as it came, forwarded headers
    // added.
    let reply = ingress
        .await_app(&name, "/rest/of/it?q=1", &[("x-probe", "host-form")])
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = reply.json();
    assert_eq!(seen["path"], "/rest/of/it?q=1", "{seen}");
    assert_eq!(seen["hostname"], id.as_str(), "{seen}");
    assert_eq!(seen_header(&seen, "host"), Some(name.clone()), "{seen}");
    assert_eq!(seen_header(&seen, "x-probe").as_deref(), Some("host-form"));
    assert_eq!(
        seen_header(&seen, "x-forwarded-proto").as_deref(),
        Some("http"),
        "{seen}"
    );
    assert_eq!(
        seen_header(&seen, "x-forwarded-host"),
        Some(name.clone()),
        "{seen}"
    );
    assert!(
        seen_header(&seen, "x-forwarded-for").is_some_and(|v| v.contains("127.0.0.1")),
        "{seen}"
    );

    // Path form: the prefix is stripped and said in X-Forwarded-Prefix.
    let reply = ingress
        .get(&plain, &format!("/{id}/8000/rest/of/it?q=1"), &[])
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = reply.json();
    assert_eq!(seen["path"], "/rest/of/it?q=1", "{seen}");
    assert_eq!(seen["hostname"], id.as_str(), "{seen}");
    assert_eq!(
        seen_header(&seen, "x-forwarded-prefix"),
        Some(format!("/{id}/8000")),
        "{seen}"
    );
    // Without the trailing slash: a redirect to the form with it.
    let reply = ingress.get(&plain, &format!("/{id}/8000"), &[]).await;
    assert!(reply.status.is_redirection(), "{reply}");
    assert!(
        location_path(&reply.header("location")).starts_with(&format!("/{id}/8000/")),
        "{reply}"
    );

    // Keep-alive: three requests on one connection.
    let stream = TcpStream::connect(ingress.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for n in 0..3 {
        let request = Request::builder()
            .uri(format!("/kept/{n}"))
            .header("host", &name)
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = tokio::time::timeout(WAIT, sender.send_request(request))
            .await
            .expect("an answer in time")
            .unwrap_or_else(|e| panic!("request {n} on a kept-alive connection: {e}"));
        assert_eq!(response.status(), StatusCode::OK);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let seen: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(seen["path"], format!("/kept/{n}"), "{seen}");
    }
    drop(sender);

    // The sandbox's view lists the port.
    let view = ingress.view(&id).await;
    assert!(
        view["ports"]
            .as_array()
            .is_some_and(|ports| ports.iter().any(|p| p["port"] == 8000)),
        "{view}"
    );

    // h2c with prior knowledge (Host carries the listener's port here).
    let resolve = format!("{name}:{}:127.0.0.1", ingress.addr.port());
    let h2_url = format!("http://{name}:{}/h2c", ingress.addr.port());
    let got = curl(&["--http2-prior-knowledge", "--resolve", &resolve, &h2_url]).await;
    assert!(got.ok && got.code == 200 && got.version == "2", "{got}");
    let seen: Value = serde_json::from_str(&got.body).expect("JSON");
    assert_eq!(seen["path"], "/h2c", "{seen}");
    assert_eq!(seen["hostname"], id.as_str(), "{seen}");
    let got = curl(&[
        "--http2-prior-knowledge",
        "--resolve",
        &resolve,
        "--data-binary",
        "sent over h2c",
        &h2_url,
    ])
    .await;
    assert!(got.ok && got.code == 200 && got.version == "2", "{got}");
    let seen: Value = serde_json::from_str(&got.body).expect("JSON");
    assert_eq!(seen["method"], "POST", "{seen}");
    assert_eq!(seen["body"], "sent over h2c", "{seen}");

    // A websocket, host form: a greeting, then echoes of text (short and
    // past 64 KiB) and binary frames, then a clean close.
    let mut ws = websocket(ingress.addr, &name, "/ws", &[])
        .await
        .unwrap_or_else(|e| panic!("websocket: {e}\n{}", log_tail(&ingress)));
    assert_eq!(ws.text().await, format!("hello from {id}"));
    for word in ["one", "two", "three"] {
        ws.send(1, word.as_bytes()).await;
        assert_eq!(ws.text().await, format!("echo:{word}"));
    }
    let long = "x".repeat(70_000);
    ws.send(1, long.as_bytes()).await;
    assert_eq!(ws.text().await, format!("echo:{long}"));
    ws.send(2, &[0, 1, 2, 255]).await;
    assert_eq!(ws.next().await, (2, b"echo:\x00\x01\x02\xff".to_vec()));
    ws.send(8, &1000u16.to_be_bytes()).await;
    assert_eq!(ws.next().await.0, 8, "the app's close frame");
    // And by path.
    let mut ws = websocket(ingress.addr, &plain, &format!("/{id}/8000/ws"), &[])
        .await
        .unwrap_or_else(|e| panic!("websocket by path: {e}"));
    assert_eq!(ws.text().await, format!("hello from {id}"));
    ws.send(1, b"by path").await;
    assert_eq!(ws.text().await, "echo:by path");
    drop(ws);

    // Server-sent events: the first event arrives while the app still
    // waits for the test to release it.
    let request = Request::builder()
        .uri("/sse?release=/tmp/release-sse")
        .header("host", &name)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = tokio::time::timeout(WAIT, open(ingress.addr, request))
        .await
        .expect("the head of the event stream in time")
        .expect("the event stream");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut got = Vec::new();
    assert!(
        read_until(
            &mut body,
            &mut got,
            b"data: one\n\n",
            Duration::from_secs(15)
        )
        .await,
        "the first event did not come while the app waited: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(1), body.frame())
            .await
            .is_err(),
        "the stream went on before the app was released"
    );
    sh_ok(&ingress, &id, "touch /tmp/release-sse").await;
    assert!(
        read_until(
            &mut body,
            &mut got,
            b"data: two\n\n",
            Duration::from_secs(15)
        )
        .await,
        "the second event did not come: {:?}",
        String::from_utf8_lossy(&got)
    );

    // The bytes count in the sandbox's usage and the daemon's metrics.
    let deadline = Instant::now() + WAIT;
    loop {
        let view = ingress.view(&id).await;
        if view["usage"]["ingress_bytes"].as_u64() > Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage.ingress_bytes still not above 0: {view}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    await_ingress_bytes_metric(&ingress).await;

    ingress.delete(&id).await;
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_the_ingress_keeps_serving() {
    require_host!();
    let ingress = Ingress::start(&[]);
    let id = ingress.create(json!({"image": "python"})).await;
    let name = host(&id, 8000);
    let plain = ingress.plain();
    start_app(&ingress, &id, 8000, "0.0.0.0").await;
    // Listening, never exposed.
    ingress
        .start_process(
            &id,
            json!({"argv": ["python3", "-m", "http.server", "8002", "--bind", "127.0.0.1"]}),
        )
        .await;
    ingress
        .expose(&id, json!({"port": 8000, "auth": "none"}))
        .await;
    let good = ingress.await_app(&name, "/good", &[]).await;
    assert_eq!(good.status, StatusCode::OK, "{good}");

    // The API.
    let cases = [
        (
            json!({"port": 0}),
            StatusCode::BAD_REQUEST,
            Some("invalid_port"),
        ),
        (
            json!({"port": 70000}),
            StatusCode::BAD_REQUEST,
            Some("invalid_port"),
        ),
        (
            json!({"port": 8000, "auth": "none"}),
            StatusCode::CONFLICT,
            Some("port_already_exposed"),
        ),
        (
            json!({"port": 8000}),
            StatusCode::CONFLICT,
            Some("port_already_exposed"),
        ),
        // This daemon has no ingress_tcp_ports.
        (
            json!({"port": 8001, "protocol": "tcp", "auth": "none"}),
            StatusCode::BAD_REQUEST,
            Some("ingress_disabled"),
        ),
        (
            json!({"port": 8001, "protocol": "udp"}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            json!({"port": 8001, "auth": "sometimes"}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (json!({"port": "8001"}), StatusCode::BAD_REQUEST, None),
    ];
    for (body, status, code) in cases {
        let (got, v) = ingress.try_expose(&id, &body).await;
        assert_eq!(got, status, "{body}: {v}");
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{body}: {v}");
        }
        assert!(v["error"]["message"].is_string(), "{body}: {v}");
    }
    let (status, v) = ingress.try_expose(UNKNOWN, &json!({"port": 8000})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "sandbox_not_found", "{v}");
    let (status, v) = ingress
        .call(Method::GET, &format!("/v1/sandboxes/{UNKNOWN}/ports"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    for (method, path, status, code) in [
        (
            Method::DELETE,
            format!("/v1/sandboxes/{id}/ports/8001"),
            StatusCode::NOT_FOUND,
            "port_not_exposed",
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/ports/8001/token"),
            StatusCode::NOT_FOUND,
            "port_not_exposed",
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/ports/8000/token"),
            StatusCode::CONFLICT,
            "port_public",
        ),
    ] {
        let (got, v) = ingress.call(method.clone(), &path, None).await;
        assert_eq!(got, status, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {v}");
    }

    // The ingress.
    for (host_header, path, status) in [
        (
            format!("nonsense.{DOMAIN}"),
            "/".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            format!("{id}.{DOMAIN}"),
            "/".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            format!("{id}-http.{DOMAIN}"),
            "/".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (host(UNKNOWN, 80), "/".to_string(), StatusCode::NOT_FOUND),
        (host(UNKNOWN, 8000), "/".to_string(), StatusCode::NOT_FOUND),
        (host(&id, 8001), "/".to_string(), StatusCode::NOT_FOUND),
        (host(&id, 8002), "/".to_string(), StatusCode::NOT_FOUND),
        (
            plain.clone(),
            format!("/{UNKNOWN}/8000/"),
            StatusCode::NOT_FOUND,
        ),
        (plain.clone(), format!("/{id}/8001/"), StatusCode::NOT_FOUND),
    ] {
        let reply = ingress.get(&host_header, &path, &[]).await;
        assert_eq!(
            reply.status, status,
            "GET {path} (Host: {host_header}): {reply}"
        );
    }

    // What listens: the app's port (exposed) and the other server's (not);
    // a port nobody listens on is not there.
    let listed = ingress.await_listening(&id, &[8000, 8002]).await;
    let listening = listed["listening"].as_array().expect("listening");
    let entry = |port: u16| listening.iter().find(|l| l["port"] == port);
    assert_eq!(
        entry(8000).map(|l| l["exposed"].clone()),
        Some(json!(true)),
        "{listed}"
    );
    assert_eq!(
        entry(8002).map(|l| l["exposed"].clone()),
        Some(json!(false)),
        "{listed}"
    );
    assert!(
        entry(8002).is_some_and(|l| l["address"].is_string()),
        "{listed}"
    );
    assert!(entry(8001).is_none(), "{listed}");
    let ports = listed["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1, "{listed}");
    assert_eq!(ports[0]["port"], 8000, "{listed}");

    // The daemon is healthy, and the good URL still works.
    let (status, health) = ingress.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let reply = ingress.get(&name, "/still", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert_eq!(reply.json()["path"], "/still");

    // Unexposed: its URLs are gone at once; exposed again, back.
    let (status, v) = ingress
        .call(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/ports/8000"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let reply = ingress.get(&name, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply}");
    let reply = ingress.get(&plain, &format!("/{id}/8000/"), &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply}");
    ingress
        .expose(&id, json!({"port": 8000, "auth": "none"}))
        .await;
    let reply = ingress.get(&name, "/again", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    ingress.delete(&id).await;
}

#[tokio::test]
async fn token_urls_admit_only_their_token_and_raw_tcp_ports_too() {
    require_host!();
    let (first, last) = free_port_range(8);
    let ingress = Ingress::start(&["--ingress-tcp-ports".into(), format!("{first}-{last}")]);
    let id = ingress.create(json!({"image": "python"})).await;
    let name = host(&id, 8000);
    let plain = ingress.plain();
    start_app(&ingress, &id, 8000, "0.0.0.0").await;
    ingress
        .start_process(
            &id,
            json!({"argv": ["python3", "-c", TCP_ECHO, "9000", "9001"]}),
        )
        .await;

    // Token auth is the default.
    let exposed = ingress.expose(&id, json!({"port": 8000})).await;
    assert_eq!(exposed["auth"], "token", "{exposed}");
    let token = exposed["token"].as_str().expect("a token").to_string();
    assert!(token.len() >= 16, "{exposed}");
    let bearer = format!("Bearer {token}");
    let ready = ingress
        .await_app(&name, "/", &[("authorization", bearer.as_str())])
        .await;
    assert_eq!(ready.status, StatusCode::OK, "{ready}");

    // No token, or a wrong one in each place: 401.
    let flip = if token.ends_with('x') { 'y' } else { 'x' };
    let wrong = format!("{}{flip}", &token[..token.len() - 1]);
    let wrong_bearer = format!("Bearer {wrong}");
    let wrong_cookie = format!("sandboxd_token={wrong}");
    let wrong_query = format!("/info?sandbox_token={wrong}");
    for (path, headers) in [
        ("/info", vec![]),
        ("/info", vec![("authorization", wrong_bearer.as_str())]),
        ("/info", vec![("x-sandbox-token", wrong.as_str())]),
        ("/info", vec![("cookie", wrong_cookie.as_str())]),
        ("/info", vec![("authorization", "Basic dXNlcjpwYXNz")]),
        (wrong_query.as_str(), vec![]),
    ] {
        let reply = ingress.get(&name, path, &headers).await;
        assert_eq!(
            reply.status,
            StatusCode::UNAUTHORIZED,
            "{path} {headers:?}: {reply}"
        );
    }
    let reply = ingress.get(&plain, &format!("/{id}/8000/info"), &[]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");

    // The right one, each way; the app never sees it, but does see the
    // rest of what was sent.
    let assert_clean = |reply: &Reply, what: &str| {
        assert_eq!(reply.status, StatusCode::OK, "{what}: {reply}");
        let seen = reply.json();
        let text = seen.to_string();
        assert!(
            !text.contains(&token),
            "{what}: the app saw the token: {seen}"
        );
        assert!(!text.contains("sandboxd_token"), "{what}: {seen}");
        assert!(!text.contains("sandbox_token"), "{what}: {seen}");
        assert!(
            seen_header(&seen, "x-sandbox-token").is_none(),
            "{what}: {seen}"
        );
        assert_eq!(
            seen_header(&seen, "x-probe").as_deref(),
            Some("mine"),
            "{what}: {seen}"
        );
        seen
    };
    let reply = ingress
        .get(
            &name,
            "/info",
            &[("authorization", bearer.as_str()), ("x-probe", "mine")],
        )
        .await;
    let seen = assert_clean(&reply, "Bearer");
    assert!(seen_header(&seen, "authorization").is_none(), "{seen}");
    let reply = ingress
        .get(
            &name,
            "/info",
            &[("x-sandbox-token", token.as_str()), ("x-probe", "mine")],
        )
        .await;
    assert_clean(&reply, "X-Sandbox-Token");
    let reply = ingress
        .get(
            &plain,
            &format!("/{id}/8000/info"),
            &[("authorization", bearer.as_str()), ("x-probe", "mine")],
        )
        .await;
    assert_eq!(assert_clean(&reply, "Bearer, path form")["path"], "/info");

    // In the query: a redirect to the URL without it, and a cookie that
    // then works alone. The app's own cookies still reach it.
    let reply = ingress
        .get(&name, &format!("/info?keep=1&sandbox_token={token}"), &[])
        .await;
    assert!(reply.status.is_redirection(), "{reply}");
    let location = location_path(&reply.header("location"));
    assert!(
        location.starts_with("/info")
            && location.contains("keep=1")
            && !location.contains("sandbox_token"),
        "{reply}"
    );
    let set_cookie = reply.header("set-cookie");
    let attributes = cookie_attributes(&set_cookie);
    assert_eq!(attributes[0].0, "sandboxd_token", "{set_cookie}");
    let has = |name: &str| attributes.iter().any(|(n, _)| n == name);
    assert!(has("httponly"), "{set_cookie}");
    assert!(
        attributes
            .iter()
            .any(|(n, v)| n == "samesite" && v.eq_ignore_ascii_case("lax")),
        "{set_cookie}"
    );
    assert!(!has("secure"), "Secure only under TLS: {set_cookie}");
    // Scoped to this URL's host: no Domain, or this very host.
    assert!(
        attributes
            .iter()
            .all(|(n, v)| n != "domain" || v.trim_start_matches('.') == name),
        "{set_cookie}"
    );
    let cookie = format!("theme=dark; sandboxd_token={}", attributes[0].1);
    let reply = ingress
        .get(
            &name,
            &location,
            &[("cookie", cookie.as_str()), ("x-probe", "mine")],
        )
        .await;
    let seen = assert_clean(&reply, "cookie");
    assert_eq!(seen["path"], location.as_str(), "{seen}");
    assert!(
        seen_header(&seen, "cookie").is_some_and(|c| c.contains("theme=dark")),
        "the app's own cookie did not reach it: {seen}"
    );
    // The cookie counts only from the URL's own origin: another
    // sandbox's page (the same site under the domain) gets a 403.
    let own_origin = format!("http://{name}");
    let other_origin = format!(
        "http://{}:{}",
        host("sb-000000000000", 80),
        ingress.addr.port()
    );
    let reply = ingress
        .get(
            &name,
            "/info",
            &[("cookie", cookie.as_str()), ("origin", own_origin.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "its own origin: {reply}");
    for foreign in [
        vec![
            ("cookie", cookie.as_str()),
            ("origin", other_origin.as_str()),
        ],
        vec![("cookie", cookie.as_str()), ("sec-fetch-site", "same-site")],
        vec![
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "cross-site"),
        ],
    ] {
        let reply = ingress.get(&name, "/info", &foreign).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{foreign:?}: {reply}");
    }
    // The token itself, in a header, is no cookie: any origin may send it.
    let reply = ingress
        .get(
            &name,
            "/info",
            &[
                ("x-sandbox-token", token.as_str()),
                ("origin", other_origin.as_str()),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    // A client's X-Forwarded-Prefix is not passed on in the host form.
    let reply = ingress
        .get(
            &name,
            "/info",
            &[
                ("x-sandbox-token", token.as_str()),
                ("x-forwarded-prefix", "/elsewhere"),
                ("x-probe", "mine"),
            ],
        )
        .await;
    let seen = assert_clean(&reply, "a forged prefix");
    assert_eq!(seen_header(&seen, "x-forwarded-prefix"), None, "{seen}");
    // A redirect stays on the host, whatever the path looks like.
    let reply = ingress
        .get(
            &name,
            &format!("//evil.example/x?sandbox_token={token}"),
            &[],
        )
        .await;
    assert!(reply.status.is_redirection(), "{reply}");
    assert_eq!(reply.header("location"), "/evil.example/x", "{reply}");

    // By path every sandbox shares one origin: headers only, no cookie.
    let reply = ingress
        .get(
            &plain,
            &format!("/{id}/8000/info?sandbox_token={token}"),
            &[],
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
    assert!(reply.header("set-cookie").is_empty(), "{reply}");
    assert!(reply.text().contains("header"), "says what to do: {reply}");
    let reply = ingress
        .get(
            &plain,
            &format!("/{id}/8000/info"),
            &[("cookie", cookie.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
    let reply = ingress
        .get(
            &plain,
            &format!("/{id}/8000/info"),
            &[("x-sandbox-token", token.as_str()), ("x-probe", "mine")],
        )
        .await;
    assert_eq!(assert_clean(&reply, "header, path form")["path"], "/info");

    // Listings never carry a token.
    let (_, listed) = ingress
        .call(Method::GET, &format!("/v1/sandboxes/{id}/ports"), None)
        .await;
    assert!(!listed.to_string().contains(&token), "{listed}");
    assert!(listed["ports"][0]["token"].is_null(), "{listed}");
    assert!(!ingress.view(&id).await.to_string().contains(&token));

    // Rotation: the old token (and its cookie) stop at once, the new works.
    let (status, rotated) = ingress
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports/8000/token"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let new_token = rotated["token"].as_str().expect("a new token").to_string();
    assert_ne!(new_token, token);
    let reply = ingress
        .get(&name, "/info", &[("authorization", bearer.as_str())])
        .await;
    assert_eq!(
        reply.status,
        StatusCode::UNAUTHORIZED,
        "the old token: {reply}"
    );
    let reply = ingress
        .get(&name, "/info", &[("cookie", cookie.as_str())])
        .await;
    assert_eq!(
        reply.status,
        StatusCode::UNAUTHORIZED,
        "the old cookie: {reply}"
    );
    let new_bearer = format!("Bearer {new_token}");
    let reply = ingress
        .get(&name, "/info", &[("authorization", new_bearer.as_str())])
        .await;
    assert_eq!(reply.status, StatusCode::OK, "the new token: {reply}");

    // Raw TCP, public: the stream is carried as is, both ways.
    let public = ingress
        .expose(
            &id,
            json!({"port": 9000, "protocol": "tcp", "auth": "none"}),
        )
        .await;
    assert_eq!(public["protocol"], "tcp", "{public}");
    assert!(
        public["url"].is_null() && public["path_url"].is_null(),
        "{public}"
    );
    let public_addr: SocketAddr = public["address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address: {public}"));
    assert!((first..=last).contains(&public_addr.port()), "{public}");
    let guarded = ingress
        .expose(&id, json!({"port": 9001, "protocol": "tcp"}))
        .await;
    assert_eq!(guarded["auth"], "token", "{guarded}");
    let tcp_token = guarded["token"].as_str().expect("a token").to_string();
    let guarded_addr: SocketAddr = guarded["address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address: {guarded}"));
    assert!((first..=last).contains(&guarded_addr.port()), "{guarded}");
    assert_ne!(public_addr, guarded_addr);
    ingress.await_listening(&id, &[9000, 9001]).await;

    let mut stream = TcpStream::connect(public_addr).await.expect("connect");
    assert_eq!(read_exactly(&mut stream, 8).await, b"hi 9000\n");
    let mut blob = vec![0u8; MIB];
    rand::thread_rng().fill(&mut blob[..]);
    let (mut reader, mut writer) = stream.into_split();
    let sent = blob.clone();
    let writing = tokio::spawn(async move {
        writer.write_all(&sent).await.expect("write 1 MiB");
        writer
    });
    let mut echoed = vec![0u8; blob.len()];
    tokio::time::timeout(WAIT, reader.read_exact(&mut echoed))
        .await
        .expect("the echo in time")
        .expect("read the echo");
    assert!(echoed == blob, "the echo differs from what was sent");
    let writer = writing.await.expect("writer");
    let mut stream = reader.reunite(writer).expect("reunite");

    // Token auth: a wrong first line is closed on, never reaching the app;
    // the right one is taken off the stream.
    let mut refused = TcpStream::connect(guarded_addr).await.expect("connect");
    refused.write_all(b"not-the-token\n").await.expect("write");
    let (ended, got) = ends_within(&mut refused, Duration::from_secs(10)).await;
    assert!(ended, "a wrong token's connection stayed open");
    assert!(
        got.is_empty(),
        "a wrong token got {:?}",
        String::from_utf8_lossy(&got)
    );
    let mut admitted = TcpStream::connect(guarded_addr).await.expect("connect");
    admitted
        .write_all(format!("{tcp_token}\n").as_bytes())
        .await
        .expect("write");
    assert_eq!(read_exactly(&mut admitted, 8).await, b"hi 9001\n");
    admitted.write_all(b"ping\n").await.expect("write");
    assert_eq!(read_exactly(&mut admitted, 5).await, b"ping\n");
    let accepts = sh_ok(&ingress, &id, "wc -l < /tmp/accepts-9001").await;
    assert_eq!(accepts.trim(), "1", "connections the app accepted on 9001");
    // A connection that waits while the token is rotated is held to the
    // new one: the old token, sent after the rotation, is refused.
    let mut waiting = TcpStream::connect(guarded_addr).await.expect("connect");
    let (status, rotated) = ingress
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports/9001/token"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    waiting
        .write_all(format!("{tcp_token}\n").as_bytes())
        .await
        .expect("write");
    let (ended, got) = ends_within(&mut waiting, Duration::from_secs(10)).await;
    assert!(ended && got.is_empty(), "a rotated token still got {got:?}");
    let tcp_token_now = rotated["token"].as_str().expect("the new token");
    let mut renewed = TcpStream::connect(guarded_addr).await.expect("connect");
    renewed
        .write_all(format!("{tcp_token_now}\n").as_bytes())
        .await
        .expect("write");
    assert_eq!(read_exactly(&mut renewed, 8).await, b"hi 9001\n");
    let accepts = sh_ok(&ingress, &id, "wc -l < /tmp/accepts-9001").await;
    assert_eq!(
        accepts.trim(),
        "2",
        "the rotated token never reached the app"
    );

    // Unexposing closes the open stream at once, and the address.
    let (status, v) = ingress
        .call(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/ports/9000"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let (ended, _) = ends_within(&mut stream, Duration::from_secs(10)).await;
    assert!(ended, "an open stream outlived its port's unexpose");
    if let Ok(Ok(mut late)) = tokio::time::timeout(WAIT, TcpStream::connect(public_addr)).await {
        let (ended, got) = ends_within(&mut late, Duration::from_secs(10)).await;
        assert!(
            ended && got.is_empty(),
            "an unexposed port answered: {got:?}"
        );
    }

    // No token went into the log (nor the query that carried one).
    let log = ingress.log();
    for secret in [&token, &new_token, &tcp_token] {
        assert!(
            !log.contains(secret.as_str()),
            "a token is in the daemon's log"
        );
    }
    ingress.delete(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_megabytes_stream_each_way() {
    require_host!();
    let ingress = Ingress::start(&[]);
    let id = ingress.create(json!({"image": "python"})).await;
    let name = host(&id, 8000);
    start_app(&ingress, &id, 8000, "0.0.0.0").await;
    ingress
        .expose(&id, json!({"port": 8000, "auth": "none"}))
        .await;
    let ready = ingress.await_app(&name, "/", &[]).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready}");

    // Upload: chunks made (and hashed) as they are sent.
    let mut base = vec![0u8; MIB];
    rand::thread_rng().fill(&mut base[..]);
    let hasher = Arc::new(Mutex::new(Sha256::new()));
    let hashing = Arc::clone(&hasher);
    let chunks = (0..(BIG / MIB) as u64).map(move |i| {
        let mut chunk = base.clone();
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        hashing.lock().expect("hasher").update(&chunk);
        Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
    });
    let request = Request::builder()
        .method(Method::POST)
        .uri("/upload")
        .header("host", &name)
        .header("content-length", BIG.to_string())
        .body(StreamBody::new(futures::stream::iter(chunks)))
        .expect("request");
    let begun = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(120), async {
        let response = open(ingress.addr, request).await?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    })
    .await
    .expect("the upload in 120 s")
    .unwrap_or_else(|e| panic!("upload: {e}\n{}", log_tail(&ingress)));
    let sent = hex::encode(hasher.lock().expect("hasher").clone().finalize());
    assert_eq!(response.0, StatusCode::OK, "{:?}", response.1);
    let got: Value = serde_json::from_slice(&response.1).expect("JSON");
    assert_eq!(got["bytes"], BIG, "{got}");
    assert_eq!(got["sha256"], sent.as_str(), "{got}");
    eprintln!("200 MiB up in {:.1} s", begun.elapsed().as_secs_f64());

    // Download: hashed as it arrives.
    let request = Request::builder()
        .uri(format!("/download?bytes={BIG}&tag=big"))
        .header("host", &name)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let begun = Instant::now();
    let (digest, total) = tokio::time::timeout(Duration::from_secs(120), async {
        let response = open(ingress.addr, request).await?;
        if response.status() != StatusCode::OK {
            return Err(format!("status {}", response.status()));
        }
        let mut body = response.into_body();
        let (mut digest, mut total) = (Sha256::new(), 0usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                digest.update(&data);
                total += data.len();
            }
        }
        Ok::<_, String>((hex::encode(digest.finalize()), total))
    })
    .await
    .expect("the download in 120 s")
    .unwrap_or_else(|e| panic!("download: {e}\n{}", log_tail(&ingress)));
    eprintln!("200 MiB down in {:.1} s", begun.elapsed().as_secs_f64());
    assert_eq!(total, BIG);
    let said = ingress.get(&name, "/sent?tag=big", &[]).await;
    assert_eq!(said.status, StatusCode::OK, "{said}");
    assert_eq!(said.json(), json!({"sha256": digest, "bytes": BIG}));

    // Both bodies count in the sandbox's usage.
    let deadline = Instant::now() + WAIT;
    loop {
        let view = ingress.view(&id).await;
        let counted = view["usage"]["ingress_bytes"].as_u64().unwrap_or(0);
        if counted as usize >= BIG {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage.ingress_bytes {counted} after 200 MiB each way: {view}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ingress.delete(&id).await;
}

#[tokio::test]
async fn tls_serves_h2_and_http1_and_a_blocked_sandbox_stays_blocked() {
    require_host!();
    let upstream = Upstream::start();
    let ingress = Ingress::start_tls(&upstream.daemon_flags());
    let ca = ingress.ca.clone().expect("the test CA");
    let ca = ca.display().to_string();
    let port = ingress.addr.port();
    let id = ingress
        .create(json!({"image": "python", "block_network": true}))
        .await;
    let name = host(&id, 8000);
    let guarded_name = host(&id, 8001);
    start_app(&ingress, &id, 8000, "0.0.0.0").await;
    start_app(&ingress, &id, 8001, "0.0.0.0").await;
    let exposed = ingress
        .expose(&id, json!({"port": 8000, "auth": "none"}))
        .await;
    assert!(
        exposed["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("https://") && u.contains(&name)),
        "{exposed}"
    );
    let guarded = ingress.expose(&id, json!({"port": 8001})).await;
    let token = guarded["token"].as_str().expect("a token").to_string();

    let resolve = |host: &str| format!("{host}:{port}:127.0.0.1");
    let url = |host: &str, path: &str| format!("https://{host}:{port}{path}");
    let (resolve_app, info_url) = (resolve(&name), url(&name, "/info"));
    let tls = ["--cacert", ca.as_str(), "--resolve", resolve_app.as_str()];
    let deadline = Instant::now() + WAIT;
    let got = loop {
        let got = curl(&[&tls[..], &[info_url.as_str()][..]].concat()).await;
        if got.code != 502 {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "still a 502 after {WAIT:?}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // h2 by ALPN, and HTTP/1.1 when that is all the client speaks.
    assert!(
        got.ok && got.code == 200 && got.version == "2",
        "{got}\n{}",
        log_tail(&ingress)
    );
    let seen: Value = serde_json::from_str(&got.body).expect("JSON");
    assert_eq!(seen["hostname"], id.as_str(), "{seen}");
    assert_eq!(
        seen_header(&seen, "x-forwarded-proto").as_deref(),
        Some("https"),
        "{seen}"
    );
    let got = curl(&[&tls[..], &["--http1.1", info_url.as_str()][..]].concat()).await;
    assert!(got.ok && got.code == 200 && got.version == "1.1", "{got}");
    assert_eq!(
        serde_json::from_str::<Value>(&got.body).expect("JSON")["path"],
        "/info"
    );
    // The path form, on the bare domain.
    let (resolve_domain, path_url) = (resolve(DOMAIN), url(DOMAIN, &format!("/{id}/8000/info")));
    let got = curl(&["--cacert", &ca, "--resolve", &resolve_domain, &path_url]).await;
    assert!(got.ok && got.code == 200, "{got}");
    assert_eq!(
        serde_json::from_str::<Value>(&got.body).expect("JSON")["path"],
        "/info"
    );

    // A token in the query under TLS: the cookie is Secure too.
    let resolve_guarded = resolve(&guarded_name);
    let query_url = url(&guarded_name, &format!("/info?sandbox_token={token}"));
    let got = curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &resolve_guarded,
        "-i",
        &query_url,
    ])
    .await;
    assert!(got.ok && (300..400).contains(&got.code), "{got}");
    let set_cookie = got
        .body
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("set-cookie")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Set-Cookie: {got}"));
    let attributes = cookie_attributes(&set_cookie);
    assert_eq!(attributes[0].0, "sandboxd_token", "{set_cookie}");
    assert!(
        attributes.iter().any(|(n, _)| n == "secure"),
        "{set_cookie}"
    );
    assert!(
        attributes.iter().any(|(n, _)| n == "httponly"),
        "{set_cookie}"
    );
    let cookie = format!("Cookie: sandboxd_token={}", attributes[0].1);
    let guarded_url = url(&guarded_name, "/info");
    let got = curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &resolve_guarded,
        "-H",
        &cookie,
        &guarded_url,
    ])
    .await;
    assert!(got.ok && got.code == 200, "{got}");
    assert!(!got.body.contains(&token), "{got}");
    let got = curl(&["--cacert", &ca, "--resolve", &resolve_guarded, &guarded_url]).await;
    assert_eq!(got.code, 401, "{got}");

    // Exposed, the blocked sandbox still reaches nothing outside...
    for target in [
        "http://allowed.example.test/".to_string(),
        format!("http://{}/", SERVER_IPS[0]),
    ] {
        let run = ingress
            .exec(&id, &["curl", "-sS", "--max-time", "5", &target])
            .await;
        assert_ne!(run.exit_code(), Some(0), "{target}: {}", run.out());
        assert!(!run.out().contains(BODY), "{target}: {}", run.out());
    }
    // ...which a sandbox allowed to does reach.
    let allowed = ingress
        .create(json!({"image": "python", "allow_list": ["allowed.example.test"]}))
        .await;
    let run = ingress
        .exec(
            &allowed,
            &[
                "curl",
                "-sS",
                "--max-time",
                "10",
                "http://allowed.example.test/",
            ],
        )
        .await;
    assert_eq!(run.out(), BODY, "the positive control: {}", run.err());
    // And the exposed app still answers.
    let got = curl(&[&tls[..], &[info_url.as_str()][..]].concat()).await;
    assert_eq!(got.code, 200, "{got}");
    ingress.delete(&allowed).await;
    ingress.delete(&id).await;
}

#[tokio::test]
async fn a_fork_answers_on_its_own_url_with_the_state_of_its_source() {
    require_host!();
    if let Some(why) = common::criu_missing() {
        common::skip!(common::Reason::OldCriu, "{why}");
    }
    let ingress = Ingress::start(&[]);
    let created = ingress
        .create_full(json!({"image": "python", "ports": [8000]}))
        .await;
    let source = created["id"].as_str().expect("id").to_string();
    let ports = created["ports"].as_array().cloned().unwrap_or_default();
    assert_eq!(ports.len(), 1, "{created}");
    assert_eq!(ports[0]["port"], 8000, "{created}");
    assert_eq!(ports[0]["auth"], "token", "{created}");
    let source_token = ports[0]["token"].as_str().expect("a token").to_string();
    let source_bearer = format!("Bearer {source_token}");
    let source_name = host(&source, 8000);
    start_app(&ingress, &source, 8000, "0.0.0.0").await;
    let count = |reply: Reply| -> u64 {
        assert_eq!(reply.status, StatusCode::OK, "{reply}");
        reply.json()["count"].as_u64().expect("count")
    };
    let first = ingress
        .await_app(
            &source_name,
            "/count",
            &[("authorization", source_bearer.as_str())],
        )
        .await;
    assert_eq!(count(first), 0);
    let reply = ingress
        .get(
            &source_name,
            "/count",
            &[("authorization", source_bearer.as_str())],
        )
        .await;
    assert_eq!(count(reply), 1);

    let (status, snap) = ingress
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{source}/snapshots"),
            Some(json!({"kind": "memory"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{snap}\n{}",
        log_tail(&ingress)
    );
    let snap_id = snap["id"].as_str().expect("id").to_string();
    // The source goes on from where it stood.
    let reply = ingress
        .get(
            &source_name,
            "/count",
            &[("authorization", source_bearer.as_str())],
        )
        .await;
    assert_eq!(count(reply), 2);

    let forked = ingress.create_full(json!({"from_snapshot": snap_id})).await;
    let fork = forked["id"].as_str().expect("id").to_string();
    let fork_name = host(&fork, 8000);
    let ports = forked["ports"].as_array().cloned().unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p["port"] == 8000)
        .unwrap_or_else(|| panic!("the fork does not list port 8000: {forked}"));
    assert!(
        port["url"].as_str().is_some_and(|u| u.contains(&fork_name)),
        "{forked}"
    );
    assert!(
        port["path_url"]
            .as_str()
            .is_some_and(|u| u.ends_with(&format!("/{fork}/8000/"))),
        "{forked}"
    );
    let fork_token = port["token"].as_str().expect("a fresh token").to_string();
    assert_ne!(fork_token, source_token);
    let fork_bearer = format!("Bearer {fork_token}");

    // The fork's server, already running, counts on from the snapshot.
    let reply = ingress
        .await_app(
            &fork_name,
            "/count",
            &[("authorization", fork_bearer.as_str())],
        )
        .await;
    assert_eq!(count(reply), 2, "the fork's first count");
    // Each goes on from there on its own.
    for (name, bearer, want) in [
        (&source_name, &source_bearer, 3),
        (&fork_name, &fork_bearer, 3),
        (&fork_name, &fork_bearer, 4),
        (&source_name, &source_bearer, 4),
    ] {
        let reply = ingress
            .get(name, "/count", &[("authorization", bearer.as_str())])
            .await;
        assert_eq!(count(reply), want, "{name}");
    }
    // Each token opens its own sandbox's URL only.
    let reply = ingress
        .get(
            &fork_name,
            "/count",
            &[("authorization", source_bearer.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
    let reply = ingress
        .get(
            &source_name,
            "/count",
            &[("authorization", fork_bearer.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
    // The fork's view lists the port, without a token.
    let view = ingress.view(&fork).await;
    assert!(
        view["ports"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["port"] == 8000)),
        "{view}"
    );
    assert!(!view.to_string().contains(&fork_token), "{view}");

    ingress.delete(&fork).await;
    let reply = ingress
        .get(
            &fork_name,
            "/count",
            &[("authorization", fork_bearer.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply}");
    ingress.delete(&source).await;
    let (status, _) = ingress
        .call(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn the_connection_cap_holds_per_sandbox_and_deleting_closes_connections() {
    require_host!();
    let ingress = Ingress::start(&["--ingress-max-connections".into(), "2".into()]);
    let id = ingress.create(json!({"image": "python"})).await;
    let other = ingress.create(json!({"image": "python"})).await;
    let (name, other_name) = (host(&id, 8000), host(&other, 8000));
    let plain = ingress.plain();
    for sandbox in [&id, &other] {
        start_app(&ingress, sandbox, 8000, "0.0.0.0").await;
        ingress
            .expose(sandbox, json!({"port": 8000, "auth": "none"}))
            .await;
    }
    for n in [&name, &other_name] {
        let ready = ingress.await_app(n, "/", &[]).await;
        assert_eq!(ready.status, StatusCode::OK, "{ready}");
    }

    // Two websockets hold the sandbox's two connections: a third request
    // is a 503, another sandbox is not affected.
    let mut first = websocket_ok(ingress.addr, &name, "/ws").await;
    assert_eq!(first.text().await, format!("hello from {id}"));
    let mut second = websocket_ok(ingress.addr, &name, "/ws").await;
    assert_eq!(second.text().await, format!("hello from {id}"));
    let reply = ingress.get(&name, "/third", &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    let reply = ingress.get(&plain, &format!("/{id}/8000/third"), &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    match websocket(ingress.addr, &name, "/ws", &[]).await {
        Ok(_) => panic!("a third websocket opened past the cap of 2"),
        Err(head) => assert!(head.starts_with("HTTP/1.1 503"), "{head}"),
    }
    let reply = ingress.get(&other_name, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "the other sandbox: {reply}");
    second.send(1, b"still here").await;
    assert_eq!(second.text().await, "echo:still here");

    // One closed, a request gets through again.
    first.send(8, &1000u16.to_be_bytes()).await;
    assert_eq!(first.next().await.0, 8);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = ingress.get(&name, "/after", &[]).await;
        if reply.status == StatusCode::OK {
            break;
        }
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
        assert!(
            Instant::now() < deadline,
            "a closed websocket's connection was not given back in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut third = websocket_ok(ingress.addr, &name, "/ws").await;
    assert_eq!(third.text().await, format!("hello from {id}"));

    // Deleted: its open websockets close and its URLs are gone.
    ingress.delete(&id).await;
    assert!(
        second.closed_within(Duration::from_secs(10)).await,
        "a websocket outlived its sandbox by 10 s"
    );
    assert!(
        third.closed_within(Duration::from_secs(10)).await,
        "a websocket outlived its sandbox by 10 s"
    );
    let reply = ingress.get(&name, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply}");
    let reply = ingress.get(&plain, &format!("/{id}/8000/"), &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply}");
    let reply = ingress.get(&other_name, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "the other sandbox: {reply}");
    ingress.delete(&other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sandboxes_answer_each_on_its_own_url() {
    require_host!();
    let ingress = Ingress::start(&["--ingress-host-header".into(), "localhost".into()]);
    let creates = (0..20).map(|i| {
        let ingress = &ingress;
        async move {
            let created = ingress
                .create_full(json!({
                    "image": "python",
                    "memory_mib": 128,
                    "ports": [8000],
                    "env": {"MARK": format!("mark-{i}")},
                }))
                .await;
            let id = created["id"].as_str().expect("id").to_string();
            let ports = created["ports"].as_array().cloned().unwrap_or_default();
            assert_eq!(ports.len(), 1, "{created}");
            assert_eq!(ports[0]["port"], 8000, "{created}");
            let token = ports[0]["token"].as_str().expect("a token").to_string();
            start_app(ingress, &id, 8000, "0.0.0.0").await;
            (id, token, format!("mark-{i}"))
        }
    });
    let sandboxes: Vec<(String, String, String)> = futures::future::join_all(creates).await;
    let tokens: std::collections::BTreeSet<&String> = sandboxes.iter().map(|s| &s.1).collect();
    assert_eq!(tokens.len(), 20, "tokens are not distinct");

    let checks = sandboxes.iter().map(|(id, token, mark)| {
        let ingress = &ingress;
        async move {
            let bearer = format!("Bearer {token}");
            let name = host(id, 8000);
            let reply = ingress
                .await_app(&name, "/who", &[("authorization", bearer.as_str())])
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{id}: {reply}");
            let seen = reply.json();
            assert_eq!(seen["hostname"], id.as_str(), "{seen}");
            assert_eq!(seen["mark"], mark.as_str(), "{seen}");
            // ingress_host_header = localhost: the app sees localhost:PORT,
            // the original in X-Forwarded-Host.
            assert_eq!(
                seen_header(&seen, "host").as_deref(),
                Some("localhost:8000"),
                "{seen}"
            );
            assert_eq!(
                seen_header(&seen, "x-forwarded-host"),
                Some(name.clone()),
                "{seen}"
            );
        }
    });
    futures::future::join_all(checks).await;

    // A token opens its own sandbox's URL, no other.
    let (first, second) = (&sandboxes[0], &sandboxes[1]);
    let reply = ingress
        .get(
            &host(&second.0, 8000),
            "/",
            &[("authorization", format!("Bearer {}", first.1).as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
    // The views list the port, never the token.
    for (id, token, _) in &sandboxes[..3] {
        let view = ingress.view(id).await;
        assert!(
            view["ports"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["port"] == 8000)),
            "{view}"
        );
        assert!(!view.to_string().contains(token.as_str()), "{view}");
    }

    let deletes = sandboxes.iter().map(|(id, _, _)| {
        let ingress = &ingress;
        async move { ingress.delete(id).await }
    });
    futures::future::join_all(deletes).await;
}

#[tokio::test]
async fn without_ingress_listen_exposing_is_refused() {
    require_host!();
    let daemon = Daemon::start();
    let id = daemon.create(json!({"image": "busybox"})).await;
    let (status, v) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports"),
            Some(json!({"port": 8000, "auth": "none"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "ingress_disabled", "{v}");
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox", "ports": [8000]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "ingress_disabled", "{v}");
    // Nothing was made by the refused create.
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    daemon.delete(&id).await;
}

/// A keyed create retried after its answer was lost finds its ports
/// exposed: the retry's answer carries a working token, the lost one's is
/// void. (Authentication comes before the dial, so nothing need listen: a
/// good token gets the 502 of an idle port, a void one the 401.)
#[tokio::test]
async fn a_retried_create_answers_with_a_working_token() {
    require_host!();
    let ingress = Ingress::start(&[]);
    let body = json!({"image": "busybox", "ports": [8000], "idempotency_key": "retry-1"});
    let first = ingress.create_full(body.clone()).await;
    let retried = ingress.create_full(body).await;
    assert_eq!(first["id"], retried["id"], "the same sandbox: {retried}");
    let id = first["id"].as_str().expect("id").to_string();
    let token = |v: &Value| v["ports"][0]["token"].as_str().map(str::to_string);
    let (lost, kept) = (
        token(&first).expect("the first answer's token"),
        token(&retried).expect("the retry's answer carries a token too"),
    );
    assert_ne!(lost, kept);
    let reply = ingress
        .get(&host(&id, 8000), "/", &[("x-sandbox-token", kept.as_str())])
        .await;
    assert_eq!(
        reply.status,
        StatusCode::BAD_GATEWAY,
        "past the token check: {reply}"
    );
    let reply = ingress
        .get(&host(&id, 8000), "/", &[("x-sandbox-token", lost.as_str())])
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply}");
}
