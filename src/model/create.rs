//! What a create asks for, once the API has parsed it: the manager's input.

use std::collections::BTreeMap;

use super::RuntimeKind;
use crate::net::policy::NetworkPolicy;

/// A sandbox to make. `None` fields take the daemon's defaults; the
/// manager validates every value before anything is made.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub image: Option<String>,
    /// `None`: a container, or for a fork the snapshot's own kind.
    pub runtime: Option<RuntimeKind>,
    pub cpu: Option<f64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    pub pids: Option<u64>,
    /// -1 means no TTL.
    pub ttl_seconds: Option<i64>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub gpu: Option<String>,
    pub gpu_count: Option<u32>,
    /// As asked; the daemon's `default_egress` applies when it names nothing.
    pub network: NetworkPolicy,
    /// A memory snapshot to fork.
    pub from_snapshot: Option<String>,
}
