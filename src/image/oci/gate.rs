//! The registry gate: a small HTTP proxy on loopback that every registry
//! request of this daemon goes through (the OCI client takes a proxy, not a
//! connector). It dials from the upstream namespace (`upstream_netns`) and
//! applies the egress deny list, so an image reference cannot make the
//! daemon reach the host's private network (`169.254.169.254/x`,
//! `10.0.0.5:5000/x`); registries listed in `private_registries` skip the
//! list. Blob redirects to a CDN come back through here too.
//!
//! It takes `CONNECT host:port` (HTTPS registries) and absolute-form
//! requests (plain-HTTP ones), and only from a client that presents the
//! gate's random credentials, so other local users cannot borrow it.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::net::deny::{host_interface_addresses, DenyList};
use crate::net::upstream::UpstreamConfig;

const HEAD_LIMIT: usize = 16 * 1024;
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
const RESOLVE_DEADLINE: Duration = Duration::from_secs(10);

/// Why the gate could not connect a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialFailure {
    /// Every address of the registry is on the deny list.
    Denied(String),
    /// It resolved to allowed addresses, and none answered.
    Failed(String),
}

impl std::fmt::Display for DialFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialFailure::Denied(r) | DialFailure::Failed(r) => f.write_str(r),
        }
    }
}

type Refusals = Arc<Mutex<HashMap<String, DialFailure>>>;

/// A running gate: where it listens and the credentials it wants.
#[derive(Debug)]
pub struct Gate {
    url: String,
    refusals: Refusals,
}

impl Gate {
    /// Binds on loopback here, then serves from a thread that moved into
    /// the upstream namespace (so its outgoing sockets are made there).
    /// `exempt`: `host` or `host:port` entries the deny list does not apply to.
    pub fn start(upstream: &UpstreamConfig, exempt: &[String]) -> Result<Gate, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("binding on 127.0.0.1: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listener: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let password = hex::encode(rand::random::<[u8; 16]>());
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("sandboxd:{password}"))
        );
        let refusals: Refusals = Arc::new(Mutex::new(HashMap::new()));
        let exempt: HashSet<String> = exempt.iter().map(|e| e.to_ascii_lowercase()).collect();
        let upstream = upstream.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let shared = Arc::clone(&refusals);
        std::thread::Builder::new()
            .name("registry-gate".into())
            .spawn(move || {
                let started = (|| {
                    upstream.enter().map_err(|e| e.to_string())?;
                    let deny = DenyList::new(
                        host_interface_addresses()
                            .map_err(|e| format!("listing addresses: {e}"))?,
                    );
                    let resolver = upstream.resolver().map_err(|e| e.to_string())?;
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>((deny, resolver, runtime))
                })();
                let (deny, resolver, runtime) = match started {
                    Ok(parts) => {
                        let _ = ready_tx.send(Ok(()));
                        parts
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let policy = Arc::new(Policy {
                    deny,
                    resolver,
                    exempt,
                    expected,
                    refusals: shared,
                });
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("registry gate: {e}");
                            return;
                        }
                    };
                    loop {
                        let Ok((conn, _)) = listener.accept().await else {
                            continue;
                        };
                        let policy = Arc::clone(&policy);
                        tokio::spawn(async move {
                            if let Err(e) = policy.serve(conn).await {
                                tracing::debug!("registry gate: {e}");
                            }
                        });
                    }
                });
            })
            .map_err(|e| format!("spawning its thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "its thread ended before it was ready".to_string())??;
        Ok(Gate {
            url: format!("http://sandboxd:{password}@{addr}"),
            refusals,
        })
    }

    /// The proxy URL, credentials included, for the OCI client.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Why the gate last failed to connect `authority` (`host:port`), if
    /// its last attempt failed.
    pub fn refusal(&self, authority: &str) -> Option<DialFailure> {
        self.refusals
            .lock()
            .ok()
            .and_then(|r| r.get(&authority.to_ascii_lowercase()).cloned())
    }
}

struct Policy {
    deny: DenyList,
    resolver: hickory_resolver::TokioResolver,
    exempt: HashSet<String>,
    expected: String,
    refusals: Refusals,
}

/// A parsed request head: where it goes and whether it is a tunnel.
struct Target {
    host: String,
    port: u16,
    tunnel: bool,
}

impl Policy {
    async fn serve(&self, mut client: TcpStream) -> Result<(), String> {
        let head = tokio::time::timeout(HEAD_DEADLINE, read_head(&mut client))
            .await
            .map_err(|_| "no request head in time".to_string())??;
        let text = String::from_utf8_lossy(&head.bytes[..head.end]).into_owned();
        let authorized = text
            .lines()
            .skip(1)
            .any(|line| proxy_authorization(line).is_some_and(|v| v == self.expected));
        if !authorized {
            client
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"sandboxd\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .ok();
            return Err("a client without the gate's credentials".into());
        }
        let target = parse_target(&text).ok_or("an unsupported request")?;
        let authority = format!("{}:{}", target.host, target.port);
        let dialled = self.dial(&target, &authority).await;
        if let Ok(mut r) = self.refusals.lock() {
            match &dialled {
                Ok(_) => r.remove(&authority.to_ascii_lowercase()),
                Err(failure) => r.insert(authority.to_ascii_lowercase(), failure.clone()),
            };
        }
        let upstream = match dialled {
            Ok(stream) => stream,
            Err(failure) => {
                let body = format!("{authority}: {failure}");
                let answer = format!(
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                client.write_all(answer.as_bytes()).await.ok();
                return Err(body);
            }
        };
        let mut upstream = upstream;
        if target.tunnel {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .map_err(|e| e.to_string())?;
        } else {
            // Plain HTTP: the request goes on as it came (servers take the
            // absolute form), less the gate's own credentials.
            let forwarded: String = text
                .split_inclusive("\r\n")
                .filter(|line| proxy_authorization(line).is_none())
                .collect();
            upstream
                .write_all(forwarded.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
        }
        // Whatever the client sent after its head goes on first.
        upstream
            .write_all(&head.bytes[head.end..])
            .await
            .map_err(|e| e.to_string())?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Resolves and connects, skipping addresses the deny list refuses.
    async fn dial(&self, target: &Target, authority: &str) -> Result<TcpStream, DialFailure> {
        let exempt = self.exempt.contains(&authority.to_ascii_lowercase())
            || self.exempt.contains(&target.host.to_ascii_lowercase());
        let addrs: Vec<IpAddr> = match target.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::time::timeout(
                RESOLVE_DEADLINE,
                self.resolver.lookup_ip(target.host.as_str()),
            )
            .await
            .map_err(|_| DialFailure::Failed("resolving it timed out".into()))?
            .map_err(|e| DialFailure::Failed(format!("resolving it failed: {e}")))?
            .iter()
            .collect(),
        };
        let mut refused = None;
        let mut last_error = None;
        for ip in addrs {
            if !exempt {
                if let Some(reason) = self.deny.check(ip) {
                    refused = Some(format!(
                        "its address {ip} is a {reason}, which the egress deny list refuses"
                    ));
                    continue;
                }
            }
            let addr = SocketAddr::new(ip, target.port);
            match tokio::time::timeout(CONNECT_DEADLINE, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(e)) => last_error = Some(format!("connecting to {addr}: {e}")),
                Err(_) => last_error = Some(format!("connecting to {addr} timed out")),
            }
        }
        Err(match (last_error, refused) {
            (Some(e), _) => DialFailure::Failed(e),
            (None, Some(r)) => DialFailure::Denied(r),
            (None, None) => DialFailure::Failed("it resolves to no address".into()),
        })
    }
}

/// The value of `line` when it is a `Proxy-Authorization` header.
fn proxy_authorization(line: &str) -> Option<&str> {
    let (name, value) = line.split_once(':')?;
    name.trim()
        .eq_ignore_ascii_case("proxy-authorization")
        .then(|| value.trim())
}

struct Head {
    bytes: Vec<u8>,
    /// Where the head ends (after the blank line).
    end: usize,
}

async fn read_head(stream: &mut TcpStream) -> Result<Head, String> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the client closed before its request head ended".into());
        }
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(pos) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Head {
                bytes,
                end: pos + 4,
            });
        }
        if bytes.len() > HEAD_LIMIT {
            return Err("a request head over 16 KiB".into());
        }
    }
}

/// `CONNECT host:port HTTP/1.1` or `GET http://host[:port]/path HTTP/1.1`.
fn parse_target(head: &str) -> Option<Target> {
    let line = head.lines().next()?;
    let mut words = line.split(' ');
    let method = words.next()?;
    let target = words.next()?;
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, 443)?;
        return Some(Target {
            host,
            port,
            tunnel: true,
        });
    }
    let rest = target.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = split_authority(authority, 80)?;
    Some(Target {
        host,
        port,
        tunnel: false,
    })
}

fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()?),
        _ => (authority, default_port),
    };
    Some((host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_from_connect_and_absolute_forms() {
        let t = parse_target("CONNECT registry-1.docker.io:443 HTTP/1.1\r\n").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.tunnel),
            ("registry-1.docker.io", 443, true)
        );
        let t = parse_target("GET http://127.0.0.1:5000/v2/ HTTP/1.1\r\n").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.tunnel),
            ("127.0.0.1", 5000, false)
        );
        let t = parse_target("GET http://[::1]/v2/ HTTP/1.1\r\n").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("[::1]", 80));
        assert!(parse_target("GET /v2/ HTTP/1.1\r\n").is_none());
        assert!(parse_target("GET http://user@host/ HTTP/1.1\r\n").is_none());
    }
}
