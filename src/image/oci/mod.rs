//! Images pulled from OCI registries (`image: "node:20"`). A pull resolves
//! the reference through the registry gate ([`gate`]: upstream namespace,
//! deny list), checks every blob's digest, and unpacks each layer once into
//! a directory of its own ([`store`]), which creates stack as overlay
//! lowers. A reference already pulled resolves from the store with no
//! network; `POST /v1/images` pulls again to follow a moved tag.

mod auth;
mod error;
mod gate;
mod prune;
mod pull;
mod reference;
mod store;
pub mod unpack;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::Client;

pub use error::{RegistryError, RegistryErrorKind};
pub use reference::is_reference;
pub use store::{PulledImage, MAX_LAYERS};

use super::Image;
use crate::net::upstream::UpstreamConfig;

/// The registry settings of the daemon's config.
#[derive(Debug, Clone, Default)]
pub struct RegistrySettings {
    /// `host[:port]` of registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// `host[:port]` of registries the deny list does not apply to (a
    /// registry on the host's private network).
    pub private: Vec<String>,
    /// The 0600 credentials file (`auths` of Docker's config.json).
    pub auth_file: Option<PathBuf>,
    /// `host[:port]` of the only registries pulls may use; empty: any.
    pub allowed: Vec<String>,
}

/// The daemon's puller. Cheap to share; the gate and the client start on
/// the first pull.
pub struct Registry {
    store: store::Store,
    settings: RegistrySettings,
    upstream: UpstreamConfig,
    started: tokio::sync::OnceCell<(gate::Gate, Client)>,
    /// One pull per reference at a time; the others wait and then find it
    /// stored.
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Pulls hold it shared, a prune exclusively: a layer a pull has
    /// unpacked but not yet recorded is never taken for garbage.
    pruning: tokio::sync::RwLock<()>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// The puller of pulled images under `dir` (`<images_dir>/oci`).
    pub fn new(dir: PathBuf, settings: RegistrySettings, upstream: UpstreamConfig) -> Self {
        Registry {
            store: store::Store::new(dir),
            settings,
            upstream,
            started: tokio::sync::OnceCell::new(),
            flights: Mutex::new(HashMap::new()),
            pruning: tokio::sync::RwLock::new(()),
        }
    }

    /// The image for `image`, pulling it on first use.
    pub async fn resolve(&self, image: &str) -> Result<Image, RegistryError> {
        let reference = reference::parse(image)?;
        let canonical = reference::canonical(&reference);
        let pulled = match self.store.by_reference(&canonical) {
            Some(pulled) => pulled,
            None => self.pull_once(image, false, None).await?,
        };
        self.store.touch(&pulled.digest);
        self.store.image(&pulled, &canonical)
    }

    /// Removes pulled images and layers nothing uses: `in_use` holds layer
    /// directories something stacks on, `keep` manifest digests to keep.
    pub async fn prune(
        &self,
        in_use: HashSet<PathBuf>,
        keep: HashSet<String>,
    ) -> Result<crate::image::PruneReport, RegistryError> {
        let _exclusive = self.pruning.write().await;
        let store = self.store.clone();
        let dir = store.dir().to_path_buf();
        tokio::task::spawn_blocking(move || store.prune(&in_use, &keep))
            .await
            .map_err(|e| RegistryError::io("prune", &dir, std::io::Error::other(e)))?
    }

    /// Pulls `image` again (a tag may have moved), storing only what is
    /// new; layer bytes go to `progress` as they arrive.
    pub async fn pull(
        &self,
        image: &str,
        progress: Option<crate::image::ProgressSink>,
    ) -> Result<PulledImage, RegistryError> {
        self.pull_once(image, true, progress).await
    }

    /// A stored image by manifest digest (a sandbox's or snapshot's base).
    pub fn by_digest(&self, digest: &str) -> Option<Image> {
        let pulled = self.store.by_digest(digest)?;
        let name = pulled.references.first().cloned().unwrap_or_default();
        self.store.image(&pulled, &name).ok()
    }

    /// Every pulled image.
    pub fn list(&self) -> Vec<PulledImage> {
        self.store.list()
    }

    async fn pull_once(
        &self,
        image: &str,
        refresh: bool,
        progress: Option<crate::image::ProgressSink>,
    ) -> Result<PulledImage, RegistryError> {
        let reference = reference::parse(image)?;
        let canonical = reference::canonical(&reference);
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(flights.entry(canonical.clone()).or_default())
        };
        let registry = reference.registry().to_string();
        if !self.settings.allowed.is_empty() && !self.settings.allowed.contains(&registry) {
            return Err(RegistryError::NotAllowed {
                registry,
                allowed: self.settings.allowed.join(", "),
            });
        }
        let _turn = flight.lock().await;
        let _not_pruning = self.pruning.read().await;
        if !refresh {
            if let Some(pulled) = self.store.by_reference(&canonical) {
                return Ok(pulled);
            }
        }
        let (gate, client) = self.start().await?;
        let auth = auth::for_registry(self.settings.auth_file.as_deref(), &registry)?;
        let authority = dialled_authority(&reference, &self.settings.insecure);
        let explain = |e: OciDistributionError| explain(e, gate, &registry, &authority, &canonical);
        let result = pull::PullContext {
            client,
            auth,
            reference,
            canonical: canonical.clone(),
            store: &self.store,
            explain: &explain,
            progress,
        }
        .pull()
        .await;
        if let Ok(mut flights) = self.flights.lock() {
            if Arc::strong_count(&flight) <= 2 {
                flights.remove(&canonical);
            }
        }
        match &result {
            Ok(p) => tracing::info!(image = %canonical, digest = %p.digest, "image pulled"),
            Err(e) => tracing::warn!(image = %canonical, "pull failed: {e}"),
        }
        result
    }

    async fn start(&self) -> Result<&(gate::Gate, Client), RegistryError> {
        self.started
            .get_or_try_init(|| async {
                self.store.open()?;
                // The OCI client's TLS is rustls without a chosen provider;
                // the daemon uses ring everywhere.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let upstream = self.upstream.clone();
                let private = self.settings.private.clone();
                let gate =
                    tokio::task::spawn_blocking(move || gate::Gate::start(&upstream, &private))
                        .await
                        .map_err(|e| RegistryError::Gate(e.to_string()))?
                        .map_err(RegistryError::Gate)?;
                let config = ClientConfig {
                    protocol: ClientProtocol::HttpsExcept(self.settings.insecure.clone()),
                    platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
                    connect_timeout: Some(Duration::from_secs(15)),
                    read_timeout: Some(Duration::from_secs(60)),
                    user_agent: "sandboxd",
                    https_proxy: Some(gate.url().to_string()),
                    http_proxy: Some(gate.url().to_string()),
                    ..Default::default()
                };
                let client = Client::try_from(config)
                    .map_err(|e| RegistryError::Gate(format!("the OCI client: {e}")))?;
                Ok((gate, client))
            })
            .await
    }
}

/// The `host:port` the gate sees for `reference`'s registry.
fn dialled_authority(reference: &oci_client::Reference, insecure: &[String]) -> String {
    let host = reference.resolve_registry();
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        return host.to_string();
    }
    let port = if insecure.iter().any(|i| i == host) {
        80
    } else {
        443
    };
    format!("{host}:{port}")
}

/// The client's error as the user should read it.
fn explain(
    error: OciDistributionError,
    gate: &gate::Gate,
    registry: &str,
    authority: &str,
    reference: &str,
) -> RegistryError {
    use OciDistributionError as E;
    let unreachable = |detail: String| match gate.refusal(authority) {
        Some(gate::DialFailure::Denied(reason)) => RegistryError::AddressRefused {
            registry: registry.to_string(),
            reason,
        },
        Some(gate::DialFailure::Failed(reason)) => RegistryError::Unreachable {
            registry: registry.to_string(),
            detail: reason,
        },
        None => RegistryError::Unreachable {
            registry: registry.to_string(),
            detail,
        },
    };
    match error {
        E::DigestError(oci_client::errors::DigestError::VerificationError { expected, .. }) => {
            RegistryError::DigestMismatch {
                reference: reference.to_string(),
                digest: expected,
            }
        }
        E::ImageManifestNotFoundError(detail) => RegistryError::NotFound {
            reference: reference.to_string(),
            detail,
        },
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            }) =>
        {
            RegistryError::NotFound {
                reference: reference.to_string(),
                detail: envelope.to_string(),
            }
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::Unauthorized
                        | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            RegistryError::Unauthorized {
                registry: registry.to_string(),
                reference: reference.to_string(),
                detail: envelope.to_string(),
            }
        }
        E::ServerError {
            code: 404, message, ..
        } => RegistryError::NotFound {
            reference: reference.to_string(),
            detail: message,
        },
        E::ServerError {
            code: 502, message, ..
        } => unreachable(message),
        E::UnauthorizedError { url } => RegistryError::Unauthorized {
            registry: registry.to_string(),
            reference: reference.to_string(),
            detail: format!("401 from {url}"),
        },
        E::AuthenticationFailure(detail) => RegistryError::Unauthorized {
            registry: registry.to_string(),
            reference: reference.to_string(),
            detail,
        },
        E::RequestError(e) => {
            let mut detail = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                detail.push_str(": ");
                detail.push_str(&s.to_string());
                source = s.source();
            }
            unreachable(detail)
        }
        other => RegistryError::Malformed {
            reference: reference.to_string(),
            detail: other.to_string(),
        },
    }
}
