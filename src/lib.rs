//! sandboxd: a single-node worker daemon that runs untrusted code in throwaway sandboxes.
//!
//! The daemon (`src/main.rs`) serves the API in [`api`]; each sandbox is owned by
//! a small supervisor process ([`supervisor`]) that outlives daemon restarts and talks
//! to the in-sandbox agent with the protocol in the `sandbox-proto` crate.

/// The supervisor protocol's version as a literal, so that `sandboxd
/// --version` can name it (`concat!` takes literals only); see
/// [`supervisor::protocol::SUPERVISOR_PROTOCOL_VERSION`].
#[macro_export]
macro_rules! supervisor_protocol_version {
    () => {
        21
    };
}

pub mod api;
pub mod background_priority;
pub mod config;
pub mod disk;
pub mod gpu;
pub mod image;
pub mod ingress;
pub mod metrics;
pub mod model;
pub mod net;
pub mod pidfd;
pub mod private_file;
pub mod runtime;
pub mod sandbox;
pub mod secrets;
pub mod store;
pub mod supervisor;
