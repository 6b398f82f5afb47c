//! What a create asks for, once the API has parsed it: the manager's input.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::RuntimeKind;
use crate::net::policy::NetworkPolicy;

/// A sandbox to make. `None` fields take the daemon's defaults; the
/// manager validates every value before anything is made. Serialize is for
/// [`CreateRequest::digest`] only: it is no wire format.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CreateRequest {
    pub image: Option<String>,
    /// A declarative image, built before the create when not built yet
    /// (instead of `image`).
    pub image_spec: Option<crate::image::built::ImageSpec>,
    /// `None`: a container, or for a fork the snapshot's own kind.
    pub runtime: Option<RuntimeKind>,
    pub cpu: Option<f64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    pub pids: Option<u64>,
    /// Left out of the digest when not asked, so a key a daemon before
    /// this field bound still matches its retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
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
    /// Brokered secrets to bind, by name.
    pub secrets: Vec<String>,
    /// Ports to expose through the ingress once it is ready.
    pub ports: Vec<super::PortRequest>,
    /// Directories on the daemon's host, top first, owned by host ids,
    /// stacked read-only as the root instead of an image (a root
    /// filesystem containerd unpacked for its shim). Local callers only.
    pub host_rootfs: Vec<std::path::PathBuf>,
    /// A network namespace on the daemon's host (a CRI pod's, made by CNI)
    /// to use instead of making one. Local callers only; containers only.
    pub join_netns: Option<std::path::PathBuf>,
    /// The hostname inside (default: the sandbox's id). Containers only.
    pub hostname: Option<String>,
    /// Host files and directories bound into the sandbox's root (a
    /// `ctr run --mount`); a microVM's are copied into its guest. Local
    /// callers only.
    pub volumes: Vec<super::HostVolume>,
}

/// The image name a sandbox made from `host_rootfs` is recorded under.
pub const HOST_ROOTFS_IMAGE: &str = "host-rootfs";

impl CreateRequest {
    /// What an idempotency key is bound to: the sha256 (hex) of the request
    /// as asked, the key itself left out, so a retry can be told from a
    /// different request reusing the key. The serialisation is canonical:
    /// fields in declaration order and the maps are BTreeMaps, so the order
    /// a body lists `env` or `labels` in does not matter. Defaults are not
    /// applied first: `{}` and `{"image": <the default>}` are different
    /// requests.
    pub fn digest(&self) -> String {
        let unkeyed = CreateRequest {
            idempotency_key: None,
            ..self.clone()
        };
        // Plain data (strings, numbers, BTreeMaps): serialising cannot fail.
        let canonical = serde_json::to_vec(&unkeyed).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreateRequest {
        CreateRequest {
            image: Some("python".into()),
            memory_mib: Some(256),
            env: [("A", "1"), ("B", "2")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            idempotency_key: Some("job-1".into()),
            ..CreateRequest::default()
        }
    }

    #[test]
    fn the_same_request_has_the_same_digest_whatever_its_key() {
        let first = request();
        assert_eq!(first.digest(), request().digest());
        let rekeyed = CreateRequest {
            idempotency_key: Some("job-2".into()),
            ..request()
        };
        assert_eq!(
            first.digest(),
            rekeyed.digest(),
            "the key is not part of it"
        );
    }

    #[test]
    fn env_order_does_not_change_the_digest() {
        let mut reversed = request();
        reversed.env = [("B", "2"), ("A", "1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(request().digest(), reversed.digest());
    }

    #[test]
    fn a_changed_field_changes_the_digest() {
        let base = request().digest();
        let changed = [
            CreateRequest {
                memory_mib: Some(512),
                ..request()
            },
            CreateRequest {
                image: Some("busybox".into()),
                ..request()
            },
            CreateRequest {
                runtime: Some(RuntimeKind::Vm),
                ..request()
            },
            CreateRequest {
                network: NetworkPolicy {
                    block_network: Some(true),
                    allow_list: None,
                },
                ..request()
            },
            CreateRequest {
                cpu_shares: Some(512),
                ..request()
            },
        ];
        for other in changed {
            assert_ne!(base, other.digest(), "{other:?}");
        }
        // A field a daemon before it did not have is left out when not
        // asked, so keys bound by that daemon still match their retries.
        let canonical = serde_json::to_string(&request()).expect("json");
        assert!(!canonical.contains("cpu_shares"), "{canonical}");
        let mut more_env = request();
        more_env.env.insert("C".into(), "3".into());
        assert_ne!(base, more_env.digest());
    }
}
