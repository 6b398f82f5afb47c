//! Sandboxes as the daemon sees them: the persisted record, the request
//! validation, and the manager that creates, finds, expires and tears down
//! sandboxes. Everything inside a sandbox goes through its supervisor.

mod background;
mod boot_templates;
pub mod builds;
pub mod capacity;
mod create;
mod error;
pub mod events;
mod images;
mod made_ahead;
mod manager;
mod net_slots;
mod network;
mod pod_roots;
pub mod port_links;
mod ports;
mod record;
mod recovery;
mod secrets;
mod snapshots;
mod standby;
mod teardown;
#[cfg(test)]
mod tests;
mod validate;
mod warm_pool;
mod watch;

pub use error::SandboxError;
pub use manager::Manager;
pub use pod_roots::validated_root_name;
pub use ports::{token_matches, DialError, IngressRouteError, PortGrant};
pub use record::SandboxRecord;
pub use snapshots::index::{SnapshotKind, SnapshotView};
pub use validate::{sandbox_path, validated_env, validated_limits};
pub use watch::Answered;
