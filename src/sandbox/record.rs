//! The persisted record of one sandbox.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::{Limits, RuntimeKind, SandboxState, Usage};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub state: SandboxState,
    pub runtime: RuntimeKind,
    pub image: String,
    pub image_digest: String,
    pub limits: Limits,
    pub ttl_seconds: i64,
    /// Milliseconds since the epoch when the TTL ends; `None` for no TTL.
    pub expires_at_ms: Option<u64>,
    pub created_at: String,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub cgroups_path: String,
    #[serde(alias = "shim_pid")]
    pub supervisor_pid: i32,
    /// The sandbox's first process (a container's agent, a microVM's
    /// VMM), through which the host reaches a container's root
    /// (`runtime::mount_ns::HostRoot`); 0 in records of older builds.
    #[serde(default)]
    pub init_pid: i32,
    pub oom_kills: u64,
    pub failure: Option<String>,
    /// Made ahead of demand and not yet handed to a caller.
    #[serde(default)]
    pub pooled: bool,
    /// A pooled sandbox a claim has begun to change, as daemons before
    /// supervisor protocol 18 journaled it before the claim's first change
    /// (recovery removes such a sandbox instead of pooling it again). Now
    /// the supervisor's health says so (`claimed`), and nothing sets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claiming: bool,
    /// The supervisor's last event already in the daemon's event log.
    #[serde(default)]
    pub supervisor_events_seen: u64,
    /// UUIDs of the GPUs it holds until it is removed; a restart rebuilds
    /// the GPU allocation from these.
    #[serde(default)]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub usage: Usage,
    /// The caller's key for retrying this create safely. Deleting the
    /// sandbox frees the key: the record is gone, so a later create with it
    /// makes a new sandbox.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// [`CreateRequest::digest`](crate::model::CreateRequest::digest) of the
    /// keyed request that made it, so the key used with another body is a
    /// 409. `None` without a key, and in records written before it was kept
    /// (any body then counts as a retry, as it did).
    #[serde(default)]
    pub request_digest: Option<String>,
    /// The egress policy in force, as requested with the daemon's default
    /// already applied (so a record never depends on a later default).
    #[serde(default)]
    pub network: crate::net::policy::NetworkPolicy,
    /// The snapshot whose layers this sandbox's root stacks on (a
    /// filesystem snapshot used as its image, or a memory snapshot it was
    /// forked from); it cannot be removed while the sandbox lives.
    #[serde(default)]
    pub base_snapshot: Option<String>,
    /// A microVM's own host uid and gid: its VMM drops to it, so no two
    /// VMMs can signal or read each other.
    #[serde(default)]
    pub vm_uid: Option<u32>,
    /// The brokered secrets it binds, with its placeholders (never a value).
    #[serde(default)]
    pub secrets: Vec<crate::secrets::SecretBinding>,
    /// Ports exposed through the ingress (preview URLs).
    #[serde(default)]
    pub ports: Vec<crate::model::ExposedPort>,
    /// The uid and gid processes run as when a start names none: the image
    /// config's `User`, else root.
    #[serde(default)]
    pub process_user: Option<(u32, u32)>,
    /// Left running under a supervisor of another protocol version (found
    /// at recovery): failed to this daemon, yet its sandbox still holds its
    /// resources. Not stored: each start checks the supervisor again.
    #[serde(skip)]
    pub foreign_supervisor: bool,
    /// Its root is these host directories (top first), not an image.
    #[serde(default)]
    pub host_rootfs: Vec<std::path::PathBuf>,
    /// It uses this network namespace (a CRI pod's), not one of its own.
    #[serde(default)]
    pub join_netns: Option<std::path::PathBuf>,
    /// Its hostname when the create named one (else its id).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Host files and directories bound into its root.
    #[serde(default)]
    pub volumes: Vec<crate::model::HostVolume>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// When a TTL given now ends; -1 means never.
pub fn expiry(ttl_seconds: i64) -> Option<u64> {
    (ttl_seconds >= 0).then(|| now_ms().saturating_add((ttl_seconds as u64).saturating_mul(1000)))
}
