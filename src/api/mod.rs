//! The HTTP/1.1 + JSON API under `/v1`, served on the daemon's Unix socket
//! and, with `api_listen`, over TCP + TLS to token holders ([`remote`]).

mod answered_body;
#[cfg(test)]
mod contract_tests;
pub mod error;
mod events;
mod extract;
mod files;
mod gpus;
mod images;
mod ports;
mod processes;
pub mod remote;
mod roots;
mod sandboxes;
mod secrets;
pub mod server;
mod snapshots;
pub mod types;
pub mod views;

/// The OpenAPI document of this API, kept in the repo at `api/openapi.json`.
pub const OPENAPI: &str = include_str!("../../api/openapi.json");
