//! Sandboxes as the daemon sees them: the persisted record, the request
//! validation, and the manager that creates, finds, expires and tears down
//! sandboxes. Everything inside a sandbox goes through its supervisor.

pub mod capacity;
mod error;
pub mod events;
mod manager;
mod record;
mod teardown;
mod validate;

pub use error::SandboxError;
pub use manager::Manager;
pub use record::SandboxRecord;
pub use validate::{sandbox_path, validated_env, validated_limits};
