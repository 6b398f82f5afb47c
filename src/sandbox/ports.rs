//! Exposed ports (preview URLs): expose, unexpose, rotate a token, list,
//! and what the ingress asks of a request (is this port exposed, dial it).
//! The record keeps each exposure with its token's SHA-256 only, so a token
//! is seen once, in the answer that made it.

use std::net::{IpAddr, SocketAddr};

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::manager::not_running;
use super::{Manager, SandboxError, SandboxRecord};
use crate::model::{ExposedPort, PortAuth, PortProtocol, PortRequest};
use crate::supervisor::client::{CallError, SupervisorClient};
use crate::supervisor::protocol::SupervisorErrorKind;

/// An exposed port with the token just made for it (expose, rotate, a
/// create that exposes), which is the only time it is shown.
#[derive(Debug, Clone)]
pub struct PortGrant {
    pub exposed: ExposedPort,
    pub token: Option<String>,
}

/// Why the ingress cannot take a request to a sandbox's port.
#[derive(Debug, thiserror::Error)]
pub enum IngressRouteError {
    #[error("no sandbox {0}")]
    NoSandbox(String),
    #[error("port {port} of sandbox {sandbox} is not exposed")]
    NotExposed { sandbox: String, port: u16 },
    #[error("sandbox {0} is not running")]
    NotRunning(String),
}

/// Why a connection into the sandbox was not made.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// Nothing listens on the port (yet): the caller may retry.
    #[error("{0}")]
    NothingListening(String),
    #[error("{0}")]
    Failed(String),
}

fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `presented` is the token whose hash is `expected_sha256`,
/// compared in constant time.
pub fn token_matches(expected_sha256: &str, presented: &str) -> bool {
    let presented = token_hash(presented);
    bool::from(presented.as_bytes().ct_eq(expected_sha256.as_bytes()))
}

fn validated_port(port: u32) -> Result<u16, SandboxError> {
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            SandboxError::bad(
                "invalid_port",
                format!("port {port} is not a TCP port; give one in 1..65535"),
            )
        })?;
    if crate::net::proxy::is_sandboxd_port(port) {
        return Err(SandboxError::bad(
            "invalid_port",
            format!("port {port} is sandboxd's own (the egress proxy or DNS) in every sandbox; serve the app on another port"),
        ));
    }
    Ok(port)
}

impl Manager {
    /// Checks what the daemon's configuration allows before anything is made.
    pub(super) fn check_port_request(&self, req: &PortRequest) -> Result<u16, SandboxError> {
        let port = validated_port(req.port)?;
        if !self.config.ingress.enabled() {
            return Err(SandboxError::bad(
                "ingress_disabled",
                "this daemon serves no preview URLs: set ingress_listen (and ingress_domain for host-name URLs) in its configuration",
            ));
        }
        if req.protocol == PortProtocol::Tcp && self.config.ingress.tcp_ports.is_none() {
            return Err(SandboxError::bad(
                "ingress_disabled",
                "this daemon exposes no raw TCP ports: set ingress_tcp_ports (a range FIRST-LAST) in its configuration",
            ));
        }
        Ok(port)
    }

    /// Exposes a port of a ready sandbox; the answer carries its token.
    pub async fn expose_port(&self, id: &str, req: PortRequest) -> Result<PortGrant, SandboxError> {
        self.ready(id)?;
        let port = self.check_port_request(&req)?;
        let token = (req.auth == PortAuth::Token).then(new_token);
        let tcp = match req.protocol {
            PortProtocol::Tcp => Some(self.bind_tcp_port()?),
            PortProtocol::Http => None,
        };
        let exposed = ExposedPort {
            port,
            protocol: req.protocol,
            auth: req.auth,
            token_sha256: token.as_deref().map(token_hash),
            host_port: tcp.as_ref().map(|(_, host_port)| *host_port),
        };
        self.edit_ports(id, |ports| {
            if ports.iter().any(|p| p.port == port) {
                return Err(SandboxError::Conflict {
                    code: "port_already_exposed",
                    message: format!(
                        "port {port} of sandbox {id} is already exposed; unexpose it first, or rotate its token"
                    ),
                });
            }
            ports.push(exposed.clone());
            ports.sort_by_key(|p| p.port);
            Ok(())
        })?;
        if let Some((listener, _)) = tcp {
            self.links.add_tcp(id, port, listener);
        }
        tracing::info!(sandbox = %id, port, protocol = ?req.protocol, auth = ?req.auth, "port exposed");
        Ok(PortGrant { exposed, token })
    }

    /// Changes a caller's sandbox's exposed ports under the records lock
    /// and persists the record; `edit`'s refusal changes nothing.
    fn edit_ports<T>(
        &self,
        id: &str,
        edit: impl FnOnce(&mut Vec<ExposedPort>) -> Result<T, SandboxError>,
    ) -> Result<T, SandboxError> {
        let (record, edited) = {
            let mut records = self.records();
            let current = records
                .get_mut(id)
                .filter(|r| !r.pooled)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            let edited = edit(&mut current.ports)?;
            (current.clone(), edited)
        };
        self.persist(&record)?;
        Ok(edited)
    }

    /// The first free host port of `ingress_tcp_ports`, bound on the first
    /// ingress address (the one raw TCP exposures listen on).
    fn bind_tcp_port(&self) -> Result<(std::net::TcpListener, u16), SandboxError> {
        let Some((first, last)) = self.config.ingress.tcp_ports else {
            return Err(SandboxError::internal("no ingress_tcp_ports"));
        };
        let ip = self
            .raw_tcp_ip()
            .ok_or_else(|| SandboxError::internal("no ingress_listen"))?;
        let taken: Vec<u16> = self
            .records()
            .values()
            .flat_map(|r| r.ports.iter().filter_map(|p| p.host_port))
            .collect();
        for host_port in first..=last {
            if taken.contains(&host_port) {
                continue;
            }
            if let Ok(listener) = listen_tcp(ip, host_port) {
                return Ok((listener, host_port));
            }
        }
        Err(SandboxError::Unavailable {
            resource: "ingress_tcp_ports",
            message: format!(
                "every host port of ingress_tcp_ports ({first}-{last}) is in use; unexpose a raw TCP port or widen the range"
            ),
        })
    }

    /// Stops exposing a port; its open connections end at once.
    pub fn unexpose_port(&self, id: &str, port: u32) -> Result<(), SandboxError> {
        let port = validated_port(port)?;
        self.edit_ports(id, |ports| {
            let before = ports.len();
            ports.retain(|p| p.port != port);
            if ports.len() == before {
                return Err(not_exposed(id, port));
            }
            Ok(())
        })?;
        self.links.close_port(id, port);
        tracing::info!(sandbox = %id, port, "port unexposed");
        Ok(())
    }

    /// A new token for a token port; the old one stops working at once
    /// (connections it opened are closed too).
    pub fn rotate_port_token(&self, id: &str, port: u32) -> Result<PortGrant, SandboxError> {
        let port = validated_port(port)?;
        let token = new_token();
        let exposed = self.edit_ports(id, |ports| {
            let exposed = ports
                .iter_mut()
                .find(|p| p.port == port)
                .ok_or_else(|| not_exposed(id, port))?;
            if exposed.auth != PortAuth::Token {
                return Err(SandboxError::Conflict {
                    code: "port_public",
                    message: format!(
                        "port {port} of sandbox {id} is public (auth none) and has no token; unexpose it and expose it with auth \"token\""
                    ),
                });
            }
            exposed.token_sha256 = Some(token_hash(&token));
            Ok(exposed.clone())
        })?;
        // A raw TCP port's listener stays: it sees the port still exposed
        // on the same host port and carries on with the new token.
        self.links.close_port(id, port);
        Ok(PortGrant {
            exposed,
            token: Some(token),
        })
    }

    /// The address raw TCP exposures listen on: the first listener's.
    fn raw_tcp_ip(&self) -> Option<IpAddr> {
        self.config.ingress.listen.first().map(SocketAddr::ip)
    }

    /// Serves a raw TCP exposure again on its host port (after a daemon
    /// restart).
    pub(super) fn rebind_tcp(&self, id: &str, port: u16, host_port: u16) {
        let Some(ip) = self.raw_tcp_ip() else {
            return;
        };
        match listen_tcp(ip, host_port) {
            Ok(listener) => self.links.add_tcp(id, port, listener),
            Err(e) => {
                tracing::warn!(sandbox = %id, port, host_port, "raw TCP exposure not served: {e}")
            }
        }
    }

    /// The ports a caller's sandbox exposes.
    pub fn exposed_ports(&self, id: &str) -> Result<Vec<ExposedPort>, SandboxError> {
        Ok(self.record(id)?.ports)
    }

    /// The TCP ports something in the sandbox listens on.
    pub async fn listening_ports(
        &self,
        id: &str,
    ) -> Result<Vec<sandbox_proto::ListeningSocket>, SandboxError> {
        let mut client = self.connect(id).await?;
        // As every supervisor call: a sandbox that stopped meanwhile (its
        // TTL ran out) is a 409, not an internal error.
        Ok(client.listening_ports().await?)
    }

    /// The exposure a request to `port` of sandbox `id` goes to.
    pub fn ingress_route(&self, id: &str, port: u16) -> Result<ExposedPort, IngressRouteError> {
        let records = self.records();
        let record = records
            .get(id)
            .filter(|r| !r.pooled)
            .ok_or_else(|| IngressRouteError::NoSandbox(id.to_string()))?;
        let exposed = record
            .ports
            .iter()
            .find(|p| p.port == port)
            .ok_or_else(|| IngressRouteError::NotExposed {
                sandbox: id.to_string(),
                port,
            })?;
        if record.state != crate::model::SandboxState::Ready {
            return Err(IngressRouteError::NotRunning(id.to_string()));
        }
        Ok(exposed.clone())
    }

    /// A connection to the app on `port`, made by the sandbox's supervisor
    /// inside its network namespace.
    pub async fn dial_port(&self, id: &str, port: u16) -> Result<std::net::TcpStream, DialError> {
        let client = SupervisorClient::connect(&self.paths(id).socket())
            .await
            .map_err(|e| DialError::Failed(not_running(id, e).to_string()))?;
        client.dial(port).await.map_err(|e| match e {
            CallError::Refused(refusal) if refusal.kind == SupervisorErrorKind::Refused => {
                DialError::NothingListening(refusal.message)
            }
            other => DialError::Failed(format!("reaching port {port} of sandbox {id}: {other}")),
        })
    }

    /// Exposes the ports a create asked for (and a fork's source had) on
    /// a sandbox just made; a port exposed already (a retried keyed
    /// create) gets a fresh token instead.
    pub(super) async fn expose_on_create(
        &self,
        record: &SandboxRecord,
        wanted: &[PortRequest],
    ) -> Result<Vec<PortGrant>, SandboxError> {
        let mut grants = Vec::new();
        for req in wanted {
            let exposed = record.ports.iter().find(|p| u32::from(p.port) == req.port);
            let grant = match exposed {
                Some(e) if e.auth == PortAuth::Token => {
                    self.rotate_port_token(&record.id, req.port)?
                }
                Some(e) => PortGrant {
                    exposed: e.clone(),
                    token: None,
                },
                None => self.expose_port(&record.id, *req).await?,
            };
            grants.push(grant);
        }
        Ok(grants)
    }
}

/// A non-blocking listener on `ip:port`, for the ingress's runtime.
fn listen_tcp(ip: IpAddr, port: u16) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn not_exposed(id: &str, port: u16) -> SandboxError {
    SandboxError::NotFound {
        code: "port_not_exposed",
        message: format!("port {port} of sandbox {id} is not exposed; GET /v1/sandboxes/{id}/ports lists those that are"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_its_hash_only() {
        let token = new_token();
        let hash = token_hash(&token);
        assert!(token_matches(&hash, &token));
        assert!(!token_matches(&hash, &new_token()));
        assert!(!token_matches(&hash, ""));
        assert_eq!(token.len(), 43, "32 bytes, base64url without padding");
    }

    #[test]
    fn ports_outside_the_tcp_range_are_refused() {
        assert!(validated_port(0).is_err());
        assert!(validated_port(65536).is_err());
        assert_eq!(validated_port(65535).ok(), Some(65535));
        assert_eq!(validated_port(1).ok(), Some(1));
        assert!(validated_port(u32::from(crate::net::proxy::PROXY_PORT)).is_err());
    }
}
