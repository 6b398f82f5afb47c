//! Brokered secrets, on the supervisor's side: for a connection to a host
//! one of the sandbox's secrets is bound to, the proxy terminates TLS with a
//! leaf the daemon issued for that host, opens its own TLS connection to the
//! real host (verified against the system roots and `egress_extra_ca`), and
//! forwards each HTTP request with the secrets' placeholders replaced by
//! their values in its header values ([`substitute`]). Every other
//! connection stays an opaque tunnel. [`Brokered`] is what the daemon sends
//! (over the supervisor's socket, never in a file); [`Interceptor`] holds it
//! and answers the proxy; [`forward`] carries one intercepted connection.

pub mod forward;
pub mod substitute;
pub mod tls;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use crate::secrets::spec::BoundHost;
use substitute::Swap;
use tls::UpstreamTls;

/// The secrets one sandbox binds, with their values and a leaf for each
/// host they are bound to. Replaces what the supervisor held before.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Brokered {
    pub secrets: Vec<BrokeredSecret>,
    pub leaves: Vec<LeafCert>,
}

impl std::fmt::Debug for Brokered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brokered")
            .field(
                "secrets",
                &self.secrets.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("leaves", &self.leaves.len())
            .finish()
    }
}

/// One bound secret. The value is wiped from memory when dropped, and
/// never printed.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokeredSecret {
    pub name: String,
    /// What the sandbox holds in `$NAME` instead of the value.
    pub placeholder: String,
    pub value: String,
    /// `api.example.com` or `*.example.com`, as validated by the daemon.
    pub hosts: Vec<String>,
}

impl Drop for BrokeredSecret {
    fn drop(&mut self) {
        self.value.zeroize();
    }
}

/// A leaf certificate for one bound host, with the chain up to (and
/// including) the daemon's CA, and its PKCS#8 key (wiped when dropped).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct LeafCert {
    pub host: String,
    pub chain: Vec<Vec<u8>>,
    pub key_der: Vec<u8>,
}

impl Drop for LeafCert {
    fn drop(&mut self) {
        self.key_der.zeroize();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("secret {name}: host entry {host:?}: {reason}")]
    Host {
        name: String,
        host: String,
        reason: String,
    },
    #[error("the leaf for {host}: {reason}")]
    Leaf { host: String, reason: String },
}

struct ActiveSecret {
    name: String,
    placeholder: String,
    value: Zeroizing<String>,
    hosts: Vec<BoundHost>,
}

#[derive(Default)]
struct Bound {
    secrets: Vec<ActiveSecret>,
    leaves: Vec<(BoundHost, Arc<CertifiedKey>)>,
}

/// What the proxy asks about secrets, and their substitution counts.
pub struct Interceptor {
    bound: RwLock<Arc<Bound>>,
    /// Made at the first intercepted connection: most sandboxes never make
    /// one, and parsing the system's trust bundle cost every create about
    /// 2 ms. Why there is none: intercepted hosts are then refused with
    /// the reason.
    upstream: OnceLock<Result<UpstreamTls, String>>,
    extra_ca: Vec<PathBuf>,
    substituted: Mutex<BTreeMap<String, u64>>,
}

impl Interceptor {
    /// Nothing bound yet; upstream roots from the system and `extra_ca`,
    /// read when first needed.
    pub fn new(extra_ca: &[PathBuf]) -> Interceptor {
        Interceptor {
            bound: RwLock::new(Arc::default()),
            upstream: OnceLock::new(),
            extra_ca: extra_ca.to_vec(),
            substituted: Mutex::new(BTreeMap::new()),
        }
    }

    fn bound(&self) -> Arc<Bound> {
        Arc::clone(&self.bound.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `brokered` in force for the next request of every connection.
    pub fn set(&self, brokered: &Brokered) -> Result<(), InterceptError> {
        let mut secrets = Vec::new();
        for secret in &brokered.secrets {
            let hosts = secret
                .hosts
                .iter()
                .map(|h| {
                    BoundHost::parse(h, true).map_err(|e| InterceptError::Host {
                        name: secret.name.clone(),
                        host: h.clone(),
                        reason: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            secrets.push(ActiveSecret {
                name: secret.name.clone(),
                placeholder: secret.placeholder.clone(),
                value: Zeroizing::new(secret.value.clone()),
                hosts,
            });
        }
        let mut leaves = Vec::new();
        for leaf in &brokered.leaves {
            let fail = |reason: String| InterceptError::Leaf {
                host: leaf.host.clone(),
                reason,
            };
            let host = BoundHost::parse(&leaf.host, true).map_err(|e| fail(e.to_string()))?;
            let key =
                tls::certified_key(&leaf.chain, &leaf.key_der).map_err(|e| fail(e.to_string()))?;
            leaves.push((host, key));
        }
        *self.bound.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Bound { secrets, leaves });
        Ok(())
    }

    /// Whether connections to `name` (normalised) are intercepted: a bound
    /// secret names it and a leaf covers it.
    pub fn intercepts(&self, name: &str) -> bool {
        let bound = self.bound();
        bound
            .secrets
            .iter()
            .any(|s| s.hosts.iter().any(|h| h.matches(name)))
            && bound.leaves.iter().any(|(h, _)| h.matches(name))
    }

    /// The hosts of every bound secret, as allow-list entries: reachable
    /// whatever the requested policy says.
    pub fn allow_entries(&self) -> Vec<String> {
        let mut entries: Vec<String> = self
            .bound()
            .secrets
            .iter()
            .flat_map(|s| s.hosts.iter().map(BoundHost::entry))
            .collect();
        entries.sort();
        entries.dedup();
        entries
    }

    fn leaf_for(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.bound()
            .leaves
            .iter()
            .find(|(h, _)| h.matches(name))
            .map(|(_, k)| Arc::clone(k))
    }

    fn upstream_tls(&self) -> Result<&UpstreamTls, String> {
        self.upstream
            .get_or_init(|| {
                tls::upstream_roots(&self.extra_ca)
                    .and_then(UpstreamTls::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Replaces the placeholders of the secrets bound to `name` in
    /// `headers`, with the values in force now; returns the secrets used.
    pub fn substitute(&self, name: &str, headers: &mut hyper::HeaderMap) -> Vec<String> {
        let bound = self.bound();
        let swaps: Vec<Swap<'_>> = bound
            .secrets
            .iter()
            .filter(|s| s.hosts.iter().any(|h| h.matches(name)))
            .map(|s| Swap {
                name: &s.name,
                placeholder: &s.placeholder,
                value: s.value.as_str(),
            })
            .collect();
        let used: Vec<String> = substitute::substitute_headers(headers, &swaps)
            .into_iter()
            .map(String::from)
            .collect();
        if !used.is_empty() {
            let mut counts = self.substituted.lock().unwrap_or_else(|e| e.into_inner());
            for name in &used {
                *counts.entry(name.clone()).or_default() += 1;
            }
        }
        used
    }

    /// Requests each secret was put into, since the supervisor started.
    pub fn substitution_counts(&self) -> Vec<(String, u64)> {
        self.substituted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}
