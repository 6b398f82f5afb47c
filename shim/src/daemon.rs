//! The shim's client of sandboxd's API on its Unix socket: blocking
//! HTTP/1.1, one connection per call, as the shim's ttrpc handlers are
//! blocking threads. Small on purpose: no maintained synchronous HTTP crate
//! speaks over a Unix socket without unstable APIs, and the shim needs only
//! JSON calls and one streamed (chunked) body.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// How long one call may take to be answered (a wait asks for less).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The socket a sandboxd started on its defaults serves.
pub const DEFAULT_SOCKET: &str = "/run/sandboxd/sandboxd.sock";
/// Names another socket (set in containerd's environment).
pub const SOCKET_ENV: &str = "SANDBOXD_SOCKET";

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot reach sandboxd at {socket}: {source} (is it running? set {SOCKET_ENV} in containerd's environment if it listens elsewhere)")]
    Connect {
        socket: String,
        source: std::io::Error,
    },
    #[error("talking to sandboxd: {0}")]
    Io(#[from] std::io::Error),
    #[error("sandboxd answered {status} {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    #[error("sandboxd's answer is not what the shim expects: {0}")]
    Protocol(String),
}

/// sandboxd's API.
#[derive(Debug, Clone)]
pub struct Daemon {
    socket: PathBuf,
}

impl Daemon {
    /// The daemon at `$SANDBOXD_SOCKET`, else at the default socket.
    pub fn from_env() -> Daemon {
        let socket = std::env::var_os(SOCKET_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        Daemon { socket }
    }

    /// A JSON call; the answer's body as JSON (`Null` when empty).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DaemonError> {
        let body = body.map(|b| b.to_string().into_bytes());
        let mut reader = self.send(method, path, body.as_deref(), Some(CALL_TIMEOUT))?;
        let mut text = Vec::new();
        reader.read_to_end(&mut text)?;
        if text.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&text).map_err(|e| DaemonError::Protocol(e.to_string()))
    }

    /// A call with a raw body (stdin bytes); the answer is discarded.
    pub fn send_bytes(&self, method: &str, path: &str, body: &[u8]) -> Result<(), DaemonError> {
        let mut reader = self.send(method, path, Some(body), Some(CALL_TIMEOUT))?;
        std::io::copy(&mut reader, &mut std::io::sink())?;
        Ok(())
    }

    /// A call whose answer is read as it comes (NDJSON output): a reader of
    /// the body, already past a successful status.
    pub fn stream(&self, path: &str) -> Result<Body, DaemonError> {
        self.send("GET", path, None, None)
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        read_timeout: Option<Duration>,
    ) -> Result<Body, DaemonError> {
        let mut stream =
            UnixStream::connect(&self.socket).map_err(|source| DaemonError::Connect {
                socket: self.socket.display().to_string(),
                source,
            })?;
        // A wedged daemon must not hold a ttrpc handler forever.
        stream.set_write_timeout(Some(CALL_TIMEOUT))?;
        stream.set_read_timeout(read_timeout)?;
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: sandboxd\r\nConnection: close\r\n");
        if let Some(body) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        if let Some(body) = body {
            stream.write_all(body)?;
        }
        let mut reader = BufReader::new(stream);
        let (status, chunked) = read_head(&mut reader)?;
        let mut body = Body {
            reader,
            chunked,
            left_in_chunk: 0,
            done: false,
        };
        if !(200..300).contains(&status) {
            let mut text = Vec::new();
            body.read_to_end(&mut text)?;
            let value: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
            let code = value["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let message = value["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&text).into_owned());
            return Err(DaemonError::Refused {
                status,
                code,
                message,
            });
        }
        Ok(body)
    }
}

/// The status line and headers; whether the body is chunked.
fn read_head(reader: &mut impl BufRead) -> Result<(u16, bool), DaemonError> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DaemonError::Protocol(format!("status line {line:?}")))?;
    let mut chunked = false;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(DaemonError::Protocol("the headers ended early".into()));
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Ok((status, chunked));
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }
}

/// An answer's body, de-chunked; with `Connection: close` a plain body
/// ends where the connection does.
pub struct Body {
    reader: BufReader<UnixStream>,
    chunked: bool,
    left_in_chunk: usize,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if !self.chunked {
            return self.reader.read(buf);
        }
        if self.left_in_chunk == 0 {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or_default();
            self.left_in_chunk = usize::from_str_radix(size, 16).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("chunk size {line:?}"),
                )
            })?;
            if self.left_in_chunk == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(self.left_in_chunk);
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.left_in_chunk -= n;
        if self.left_in_chunk == 0 {
            let mut crlf = [0u8; 2];
            self.reader.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}
