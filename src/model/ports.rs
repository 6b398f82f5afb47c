//! A sandbox port exposed through the ingress (a preview URL): what was
//! asked, and what the record keeps of it (never the token itself).

use serde::{Deserialize, Serialize};

/// How a caller proves it may use an exposed port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortAuth {
    /// A per-port bearer token (the default: secure unless asked otherwise).
    #[default]
    Token,
    /// Public: anyone who reaches the ingress may use it.
    None,
}

/// What the ingress speaks to the app.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortProtocol {
    /// HTTP(S) on the ingress listeners, routed by host name or path.
    #[default]
    Http,
    /// A raw TCP stream on a host port of its own.
    Tcp,
}

/// A port to expose, as asked (validated by the manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PortRequest {
    pub port: u32,
    pub auth: PortAuth,
    pub protocol: PortProtocol,
}

impl PortRequest {
    /// What `ports: [N]` on a create means.
    pub fn http(port: u32) -> Self {
        PortRequest {
            port,
            auth: PortAuth::Token,
            protocol: PortProtocol::Http,
        }
    }
}

/// An exposed port as the sandbox's record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedPort {
    pub port: u16,
    pub protocol: PortProtocol,
    pub auth: PortAuth,
    /// SHA-256 (hex) of the token, for token auth.
    pub token_sha256: Option<String>,
    /// The host port a raw TCP exposure listens on.
    pub host_port: Option<u16>,
}
