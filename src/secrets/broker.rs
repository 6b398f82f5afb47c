//! The secret store and the bindings of secrets to sandboxes. Records live
//! in the daemon's store (the value sealed); the key and the CA are made
//! on first use. A value leaves this module only opened into a
//! [`Brokered`] for a supervisor's socket.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::authority::{Authority, AuthorityError};
use super::seal::{SealError, Sealer};
use super::spec::{self, SpecError, MAX_BOUND};
use crate::net::intercept::{Brokered, BrokeredSecret, LeafCert};
use crate::store::{Store, StoreError};

/// Every placeholder starts with this, so one is recognisable in a log or a
/// request (and a scanner can tell it is not a real key).
pub const PLACEHOLDER_PREFIX: &str = "sandboxd-placeholder-";

/// Where a sandbox with bound secrets finds its trust bundle, and the
/// variables that name it for Python, curl, Node, pip and git.
pub const TRUST_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";
pub const TRUST_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
];

const KEY_FILE: &str = "secrets.key";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{0}")]
    Invalid(#[from] SpecError),
    #[error("no secret named {0:?}; create it first (sandboxctl secret create {0} --host HOST)")]
    NotFound(String),
    #[error("secrets: no secret named {0:?}; create it first (sandboxctl secret create {0} --host HOST)")]
    UnknownBinding(String),
    #[error("secrets: {count} named; a sandbox may bind at most {MAX_BOUND}")]
    TooManyBound { count: usize },
    #[error("a secret named {0:?} exists; rotate it (PUT /v1/secrets/{0}) or delete it first")]
    Exists(String),
    #[error("value, hosts: a rotation names a new value, new hosts, or both")]
    NothingToChange,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    Authority(#[from] AuthorityError),
}

/// A secret as stored: its value sealed (hex).
#[derive(Clone, Serialize, Deserialize)]
struct StoredSecret {
    name: String,
    /// Validated entries: `api.example.com` or `*.example.com`.
    hosts: Vec<String>,
    created_at: String,
    rotated_at: Option<String>,
    sealed: String,
}

/// What the API shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<String>,
    pub created_at: String,
    /// When its value or hosts last changed; absent until then.
    pub rotated_at: Option<String>,
}

impl StoredSecret {
    fn info(&self) -> SecretInfo {
        SecretInfo {
            name: self.name.clone(),
            hosts: self.hosts.clone(),
            created_at: self.created_at.clone(),
            rotated_at: self.rotated_at.clone(),
        }
    }
}

pub struct NewSecret {
    pub name: String,
    pub value: Zeroizing<Vec<u8>>,
    pub hosts: Vec<String>,
    /// `*.wildcard` hosts are refused unless this is set.
    pub allow_wildcards: bool,
}

#[derive(Default)]
pub struct SecretChange {
    pub value: Option<Zeroizing<Vec<u8>>>,
    pub hosts: Option<Vec<String>>,
    pub allow_wildcards: bool,
}

/// A secret bound to one sandbox: `$name` there holds `placeholder`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBinding {
    pub name: String,
    pub placeholder: String,
}

pub struct SecretBroker {
    store: Arc<Store>,
    state_dir: PathBuf,
    /// Serialises changes, so a name is checked and written as one step.
    writing: Mutex<()>,
    /// Bumped by every rotation and deletion, so a sandbox being set up
    /// while one happens can tell it was told too early.
    generation: std::sync::atomic::AtomicU64,
    /// Bumped after every write of the store's secrets (a creation too),
    /// so [`Self::all_stored`] knows its copy is current.
    written: std::sync::atomic::AtomicU64,
    /// The stored secrets as read at `written`'s value, values still
    /// sealed: a create or pool claim binding secrets reads no store.
    read: Mutex<Option<(u64, Arc<Vec<StoredSecret>>)>>,
    sealer: Mutex<Option<Arc<Sealer>>>,
    authority: Mutex<Option<Arc<Authority>>>,
    /// The trust bundle a fresh sandbox of an image needs, by image
    /// digest (`None`: the image's own already holds the CA). The CA is
    /// the daemon's for its whole life, so a bundle never goes stale.
    image_bundles: Mutex<HashMap<String, Option<Arc<ImageTrustBundle>>>>,
}

/// The trust bundle a fresh sandbox of an image gets: the image's own
/// bundle (the host's where the image has none), then the daemon's CA.
#[derive(Debug)]
pub struct ImageTrustBundle {
    pub bytes: Vec<u8>,
    /// How many leading bytes are the image's own bundle as the image
    /// holds it (0 where it has none).
    image_part: usize,
}

impl ImageTrustBundle {
    /// What a root whose bundle is still the image's needs appended, and
    /// the length that bundle has; `None` where the image has none.
    pub fn appended_to_image(&self) -> Option<(u64, &[u8])> {
        let tail = self.bytes.get(self.image_part..)?;
        (self.image_part > 0).then_some((self.image_part as u64, tail))
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl SecretBroker {
    pub fn new(store: Arc<Store>, state_dir: PathBuf) -> SecretBroker {
        SecretBroker {
            store,
            state_dir,
            writing: Mutex::new(()),
            generation: Default::default(),
            written: Default::default(),
            read: Mutex::new(None),
            sealer: Mutex::new(None),
            authority: Mutex::new(None),
            image_bundles: Mutex::new(HashMap::new()),
        }
    }

    fn sealer(&self) -> Result<Arc<Sealer>, SecretError> {
        let mut slot = self.sealer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sealer) = &*slot {
            return Ok(Arc::clone(sealer));
        }
        let sealer = Arc::new(Sealer::load_or_create(&self.state_dir.join(KEY_FILE))?);
        *slot = Some(Arc::clone(&sealer));
        Ok(sealer)
    }

    /// The CA, made on first use.
    pub fn authority(&self) -> Result<Arc<Authority>, SecretError> {
        let mut slot = self.authority.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(authority) = &*slot {
            return Ok(Arc::clone(authority));
        }
        let authority = Arc::new(Authority::load_or_create(&self.state_dir)?);
        *slot = Some(Arc::clone(&authority));
        Ok(authority)
    }

    /// Every stored secret, read from the store only after a write. The
    /// count is loaded before the read: a write racing it bumps the count
    /// after its own store write, so the copy is read again next time.
    fn all_stored(&self) -> Result<Arc<Vec<StoredSecret>>, SecretError> {
        let written = self.written.load(std::sync::atomic::Ordering::Acquire);
        if let Some((at, all)) = &*self.read.lock().unwrap_or_else(|e| e.into_inner()) {
            if *at == written {
                return Ok(Arc::clone(all));
            }
        }
        let all = Arc::new(self.store.all_secrets::<StoredSecret>()?);
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some((written, Arc::clone(&all)));
        Ok(all)
    }

    fn stored(&self, name: &str) -> Result<Option<StoredSecret>, SecretError> {
        Ok(self.all_stored()?.iter().find(|s| s.name == name).cloned())
    }

    pub fn list(&self) -> Result<Vec<SecretInfo>, SecretError> {
        let mut all: Vec<SecretInfo> = self.all_stored()?.iter().map(StoredSecret::info).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    pub fn get(&self, name: &str) -> Result<SecretInfo, SecretError> {
        self.stored(name)?
            .map(|s| s.info())
            .ok_or_else(|| SecretError::NotFound(name.to_string()))
    }

    pub fn create(&self, new: NewSecret) -> Result<SecretInfo, SecretError> {
        spec::validate_name(&new.name)?;
        let hosts = spec::validate_hosts(&new.hosts, new.allow_wildcards)?;
        spec::validate_value(&new.value)?;
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if self.stored(&new.name)?.is_some() {
            return Err(SecretError::Exists(new.name));
        }
        let sealed = self.sealer()?.seal(&new.name, &new.value);
        let record = StoredSecret {
            name: new.name.clone(),
            hosts: hosts.iter().map(|h| h.entry()).collect(),
            created_at: now(),
            rotated_at: None,
            sealed: hex::encode(sealed),
        };
        // Counted even when it failed: it may have been written.
        let written = self.store.put_secret(&record.name, &record);
        self.wrote();
        written?;
        tracing::info!(secret = %record.name, hosts = ?record.hosts, "secret created");
        Ok(record.info())
    }

    /// Replaces the value and/or the hosts; bound sandboxes are told by
    /// the caller.
    pub fn rotate(&self, name: &str, change: SecretChange) -> Result<SecretInfo, SecretError> {
        if change.value.is_none() && change.hosts.is_none() {
            return Err(SecretError::NothingToChange);
        }
        let hosts = change
            .hosts
            .as_ref()
            .map(|h| spec::validate_hosts(h, change.allow_wildcards))
            .transpose()?;
        if let Some(value) = &change.value {
            spec::validate_value(value)?;
        }
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut record = self
            .stored(name)?
            .ok_or_else(|| SecretError::NotFound(name.to_string()))?;
        if let Some(hosts) = hosts {
            record.hosts = hosts.iter().map(|h| h.entry()).collect();
        }
        if let Some(value) = &change.value {
            record.sealed = hex::encode(self.sealer()?.seal(name, value));
        }
        record.rotated_at = Some(now());
        // Counted even when it failed: it may have been written.
        let written = self.store.put_secret(name, &record);
        self.wrote();
        written?;
        self.bump();
        tracing::info!(secret = %name, hosts = ?record.hosts, value_changed = change.value.is_some(), "secret rotated");
        Ok(record.info())
    }

    pub fn delete(&self, name: &str) -> Result<(), SecretError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if self.stored(name)?.is_none() {
            return Err(SecretError::NotFound(name.to_string()));
        }
        // Counted even when it failed: it may have been written.
        let written = self.store.remove_secret(name);
        self.wrote();
        written?;
        self.bump();
        tracing::info!(secret = %name, "secret deleted");
        Ok(())
    }

    fn wrote(&self) {
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn bump(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Changes so far (rotations and deletions).
    /// Whether any secret is stored (false when the store cannot be read).
    pub fn any_stored(&self) -> bool {
        self.list().is_ok_and(|secrets| !secrets.is_empty())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a secret named `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool, SecretError> {
        Ok(self.stored(name)?.is_some())
    }

    /// New bindings for a create's `secrets`: each name must exist; each
    /// gets a fresh random placeholder. Duplicates are bound once.
    pub fn bind(&self, names: &[String]) -> Result<Vec<SecretBinding>, SecretError> {
        if names.len() > MAX_BOUND {
            return Err(SecretError::TooManyBound { count: names.len() });
        }
        if names.is_empty() {
            // Most creates bind nothing: no store read for them.
            return Ok(Vec::new());
        }
        let stored = self.all_stored()?;
        let mut bindings: Vec<SecretBinding> = Vec::new();
        for name in names {
            if !stored.iter().any(|s| &s.name == name) {
                return Err(SecretError::UnknownBinding(name.clone()));
            }
            if bindings.iter().any(|b| &b.name == name) {
                continue;
            }
            bindings.push(SecretBinding {
                name: name.clone(),
                placeholder: format!(
                    "{PLACEHOLDER_PREFIX}{}",
                    hex::encode(rand::random::<[u8; 20]>())
                ),
            });
        }
        Ok(bindings)
    }

    /// What the supervisor of a sandbox with `bindings` is told: each
    /// binding whose secret still exists, with its value opened, and a leaf
    /// for every host.
    pub fn brokered(&self, bindings: &[SecretBinding]) -> Result<Brokered, SecretError> {
        let mut out = Brokered::default();
        if bindings.is_empty() {
            return Ok(out);
        }
        let stored = self.all_stored()?;
        let authority = self.authority()?;
        let sealer = self.sealer()?;
        let mut hosts: Vec<String> = Vec::new();
        for binding in bindings {
            let Some(secret) = stored.iter().find(|s| s.name == binding.name) else {
                continue;
            };
            let sealed =
                hex::decode(&secret.sealed).map_err(|_| SealError::Open(secret.name.clone()))?;
            let value = sealer.open(&secret.name, &sealed)?;
            // Validated printable ASCII when stored.
            let value = String::from_utf8_lossy(&value).into_owned();
            out.secrets.push(BrokeredSecret {
                name: secret.name.clone(),
                placeholder: binding.placeholder.clone(),
                value,
                hosts: secret.hosts.clone(),
            });
            hosts.extend(secret.hosts.iter().cloned());
        }
        hosts.sort();
        hosts.dedup();
        for host in hosts {
            let leaf = authority.leaf(&host)?;
            out.leaves.push(LeafCert {
                host,
                chain: vec![leaf.cert_der.clone(), authority.cert_der().to_vec()],
                key_der: leaf.key_der.to_vec(),
            });
        }
        Ok(out)
    }

    /// What [`Self::image_trust_bundle`] made for image `digest` already,
    /// if it did: a caller whose read of the image's bundle can fail asks
    /// first, and reads only when it must.
    pub fn known_image_bundle(&self, digest: &str) -> Option<Option<Arc<ImageTrustBundle>>> {
        self.image_bundles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .cloned()
    }

    /// The bundle a sandbox of image `digest` whose trust bundle is still
    /// the image's (`image_roots` reads it) must get, made once per image:
    /// `None` when the image's bundle already holds the CA (an image made
    /// from a sandbox that had secrets).
    pub fn image_trust_bundle(
        &self,
        digest: &str,
        image_roots: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Result<Option<Arc<ImageTrustBundle>>, SecretError> {
        if let Some(known) = self.known_image_bundle(digest) {
            return Ok(known);
        }
        let roots = image_roots();
        let bundle = if self.trusts_authority(roots.as_deref())? {
            None
        } else {
            Some(Arc::new(self.trust_bundle_of(roots)?))
        };
        self.image_bundles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(digest.to_string(), bundle.clone());
        Ok(bundle)
    }

    /// Whether `roots` (a trust bundle) already holds the daemon's CA.
    pub fn trusts_authority(&self, roots: Option<&[u8]>) -> Result<bool, SecretError> {
        let Some(roots) = roots else {
            return Ok(false);
        };
        let authority = self.authority()?;
        Ok(String::from_utf8_lossy(roots).contains(authority.cert_pem().trim()))
    }

    /// The trust bundle a sandbox with bound secrets gets: its image's own
    /// roots (the host's when it has none), then the daemon's CA.
    pub fn trust_bundle(&self, image_roots: Option<Vec<u8>>) -> Result<Vec<u8>, SecretError> {
        Ok(self.trust_bundle_of(image_roots)?.bytes)
    }

    fn trust_bundle_of(
        &self,
        image_roots: Option<Vec<u8>>,
    ) -> Result<ImageTrustBundle, SecretError> {
        let image_roots = image_roots.filter(|r| !r.is_empty());
        let image_part = image_roots.as_ref().map_or(0, Vec::len);
        let mut bundle = image_roots
            .or_else(|| {
                crate::net::intercept::tls::SYSTEM_BUNDLES
                    .iter()
                    .find_map(|p| std::fs::read(p).ok())
            })
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(b"# sandboxd secrets broker CA\n");
        bundle.extend_from_slice(self.authority()?.cert_pem().as_bytes());
        Ok(ImageTrustBundle {
            bytes: bundle,
            image_part,
        })
    }
}

/// The environment a sandbox with `bindings` adds: each secret's
/// placeholder, and the trust bundle's variables.
pub fn binding_env(bindings: &[SecretBinding]) -> Vec<(String, String)> {
    if bindings.is_empty() {
        return Vec::new();
    }
    let mut env: Vec<(String, String)> = bindings
        .iter()
        .map(|b| (b.name.clone(), b.placeholder.clone()))
        .collect();
    env.extend(
        TRUST_ENV
            .iter()
            .map(|k| (k.to_string(), TRUST_BUNDLE_PATH.to_string())),
    );
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker() -> (tempfile::TempDir, SecretBroker) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("s.redb")).unwrap());
        let broker = SecretBroker::new(store, dir.path().to_path_buf());
        (dir, broker)
    }

    fn new(name: &str, value: &str) -> NewSecret {
        NewSecret {
            name: name.into(),
            value: Zeroizing::new(value.as_bytes().to_vec()),
            hosts: vec!["api.example.test".into()],
            allow_wildcards: false,
        }
    }

    #[test]
    fn values_are_sealed_in_the_store_and_never_listed() {
        let (dir, broker) = broker();
        let info = broker.create(new("OPENAI_API_KEY", "sk-real-1")).unwrap();
        assert_eq!(info.hosts, vec!["api.example.test"]);
        assert!(matches!(
            broker.create(new("OPENAI_API_KEY", "x")),
            Err(SecretError::Exists(_))
        ));
        let listed = format!("{:?}", broker.list().unwrap());
        assert!(!listed.contains("sk-real-1"), "{listed}");
        drop(broker);
        let raw = std::fs::read(dir.path().join("s.redb")).unwrap();
        assert!(!raw.windows(9).any(|w| w == b"sk-real-1"));
    }

    #[test]
    fn an_images_trust_bundle_is_made_once_and_none_when_it_holds_the_ca() {
        let (_dir, broker) = broker();
        let reads = std::cell::Cell::new(0);
        let roots = || {
            reads.set(reads.get() + 1);
            Some(b"-----BEGIN CERTIFICATE-----\nimage root\n-----END CERTIFICATE-----".to_vec())
        };
        let made = broker
            .image_trust_bundle("sha256:a", roots)
            .unwrap()
            .unwrap();
        let again = broker
            .image_trust_bundle("sha256:a", roots)
            .unwrap()
            .unwrap();
        assert_eq!(reads.get(), 1, "the image's bundle is read once");
        assert!(broker
            .known_image_bundle("sha256:a")
            .is_some_and(|b| b.is_some()));
        assert!(broker.known_image_bundle("sha256:c").is_none());
        assert!(Arc::ptr_eq(&made, &again));
        let text = String::from_utf8_lossy(&made.bytes);
        assert!(
            text.starts_with("-----BEGIN CERTIFICATE-----\nimage root"),
            "{text}"
        );
        assert!(broker.trusts_authority(Some(&made.bytes)).unwrap());
        // A root still holding the image's bundle takes the rest appended.
        let image_part = roots().unwrap();
        let (length, tail) = made.appended_to_image().unwrap();
        assert_eq!(length, image_part.len() as u64);
        assert_eq!([&image_part[..], tail].concat(), made.bytes);
        assert!(String::from_utf8_lossy(tail).starts_with("\n# sandboxd secrets broker CA\n"));
        // An image with no bundle of its own gets the host's: nothing in
        // its roots to append to.
        let hosts = broker
            .image_trust_bundle("sha256:none", || None)
            .unwrap()
            .unwrap();
        assert!(hosts.appended_to_image().is_none());
        // An image made from a sandbox that had secrets already holds it.
        let held = made.bytes.clone();
        assert!(broker
            .image_trust_bundle("sha256:b", || Some(held))
            .unwrap()
            .is_none());
        assert!(!broker.trusts_authority(None).unwrap());
    }

    #[test]
    fn bindings_get_fresh_placeholders_and_the_current_secrets() {
        let (_dir, broker) = broker();
        broker.create(new("A", "value-1")).unwrap();
        let err = broker.bind(&["B".into()]).unwrap_err().to_string();
        assert!(err.contains("secrets:") && err.contains("\"B\""), "{err}");
        let first = broker.bind(&["A".into(), "A".into()]).unwrap();
        let second = broker.bind(&["A".into()]).unwrap();
        assert_eq!(first.len(), 1);
        assert!(first[0].placeholder.starts_with(PLACEHOLDER_PREFIX));
        assert_ne!(first[0].placeholder, second[0].placeholder);
        let brokered = broker.brokered(&first).unwrap();
        assert_eq!(brokered.secrets[0].value, "value-1");
        assert_eq!(brokered.leaves.len(), 1);
        broker
            .rotate(
                "A",
                SecretChange {
                    value: Some(Zeroizing::new(b"value-2".to_vec())),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(broker.brokered(&first).unwrap().secrets[0].value, "value-2");
        broker.delete("A").unwrap();
        assert!(broker.brokered(&first).unwrap().secrets.is_empty());
        // Read once already: a secret made since is found too.
        broker.create(new("B", "value-b")).unwrap();
        let b = broker.bind(&["B".into()]).unwrap();
        assert_eq!(broker.brokered(&b).unwrap().secrets[0].value, "value-b");
    }
}
