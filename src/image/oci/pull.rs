//! One pull: manifest (an index resolved to linux/amd64), config, then each
//! layer not already stored, downloaded (digest-checked by the client) and
//! unpacked beside the store, then renamed into place.

use std::io::Read;
use std::path::{Path, PathBuf};

use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::store::{hex_of, now_unix, PulledImage, Store, MAX_LAYERS};
use super::unpack::unpack_layer;
use super::RegistryError;
use crate::image::{CountingWriter, ProgressSink};

/// Disk kept free beside the image store.
const DISK_RESERVE: u64 = 256 << 20;

/// Where a pull's errors point: the reference, and the registry's
/// host:port as dialled (for the gate's refusals).
pub(super) struct PullContext<'a> {
    pub client: &'a Client,
    pub auth: RegistryAuth,
    pub reference: Reference,
    pub canonical: String,
    pub store: &'a Store,
    /// Maps a client error to the gate's reason when it refused the dial.
    pub explain: &'a (dyn Fn(OciDistributionError) -> RegistryError + Send + Sync),
    /// Where the bytes of each layer are reported as they arrive.
    pub progress: Option<ProgressSink>,
}

impl PullContext<'_> {
    pub(super) async fn pull(&self) -> Result<PulledImage, RegistryError> {
        let (manifest, digest) = self
            .client
            .pull_manifest(&self.reference, &self.auth)
            .await
            .map_err(self.explain)?;
        let platform_ref = match manifest {
            OciManifest::Image(_) => self.reference.clone_with_digest(digest),
            OciManifest::ImageIndex(index) => {
                match oci_client::client::linux_amd64_resolver(&index.manifests) {
                    Some(d) => self.reference.clone_with_digest(d),
                    None => {
                        let offered: Vec<String> = index
                            .manifests
                            .iter()
                            .filter_map(|m| m.platform.as_ref())
                            .map(|p| format!("{}/{}", p.os, p.architecture))
                            .collect();
                        return Err(RegistryError::NoPlatform {
                            reference: self.canonical.clone(),
                            offered: if offered.is_empty() {
                                "no platforms".into()
                            } else {
                                offered.join(", ")
                            },
                        });
                    }
                }
            }
        };
        let (manifest, digest, config) = self
            .client
            .pull_manifest_and_config(&platform_ref, &self.auth)
            .await
            .map_err(self.explain)?;
        if let Some(have) = self.store.by_digest(&digest) {
            return self.store.save(&have, &self.canonical);
        }
        let config: serde_json::Value =
            serde_json::from_str(&config).map_err(|e| RegistryError::Malformed {
                reference: self.canonical.clone(),
                detail: format!("its config is not JSON: {e}"),
            })?;
        let (os, arch) = (
            config["os"].as_str().unwrap_or("linux"),
            config["architecture"].as_str().unwrap_or("amd64"),
        );
        if os != "linux" || arch != "amd64" {
            return Err(RegistryError::NoPlatform {
                reference: self.canonical.clone(),
                offered: format!("{os}/{arch}"),
            });
        }
        if manifest.layers.is_empty() || manifest.layers.len() > MAX_LAYERS {
            return Err(RegistryError::Malformed {
                reference: self.canonical.clone(),
                detail: format!(
                    "it has {} layers; sandboxd stacks 1 to {MAX_LAYERS}",
                    manifest.layers.len()
                ),
            });
        }
        self.check_space(&manifest.layers)?;
        let mut size_bytes = 0;
        for layer in &manifest.layers {
            size_bytes += self.fetch_layer(&platform_ref, layer).await?;
        }
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let c = &config["config"];
        let image = PulledImage {
            last_used_at: None,
            shared_layers: 0,
            references: Vec::new(),
            digest,
            config_digest: manifest.config.digest.clone(),
            layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
            size_bytes,
            env: strings(&c["Env"]),
            working_dir: c["WorkingDir"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(String::from),
            user: c["User"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(String::from),
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            pulled_at_unix: now_unix(),
        };
        self.store.save(&image, &self.canonical)
    }

    /// Refuses a pull whose compressed layers alone would not fit.
    fn check_space(&self, layers: &[OciDescriptor]) -> Result<(), RegistryError> {
        let needed: u64 = layers
            .iter()
            .filter(|l| hex_of(&l.digest).is_some_and(|h| !self.store.layer_dir(h).is_dir()))
            .map(|l| l.size.max(0) as u64)
            .sum();
        let free = free_bytes(self.store.dir())?;
        if needed.saturating_add(DISK_RESERVE) > free {
            return Err(RegistryError::NoSpace {
                reference: self.canonical.clone(),
                needed,
                free,
                path: self.store.dir().to_path_buf(),
            });
        }
        Ok(())
    }

    /// Downloads and unpacks one layer unless it is stored; its unpacked size.
    async fn fetch_layer(
        &self,
        reference: &Reference,
        layer: &OciDescriptor,
    ) -> Result<u64, RegistryError> {
        let hex = hex_of(&layer.digest).ok_or_else(|| RegistryError::Malformed {
            reference: self.canonical.clone(),
            detail: format!("layer digest {} is not sha256", layer.digest),
        })?;
        let dest = self.store.layer_dir(hex);
        if dest.is_dir() {
            return Ok(0);
        }
        if layer.media_type.contains("zstd") || layer.media_type.contains("foreign") {
            return Err(RegistryError::UnsupportedLayer {
                reference: self.canonical.clone(),
                digest: layer.digest.clone(),
                media_type: layer.media_type.clone(),
            });
        }
        let tmp = self.store.tmp_dir();
        let nonce = hex::encode(rand::random::<[u8; 8]>());
        let blob = tmp.join(format!("{hex}.{nonce}.blob"));
        let unpacked = tmp.join(format!("{hex}.{nonce}.dir"));
        let cleanup = Cleanup(vec![blob.clone(), unpacked.clone()]);
        let file = tokio::fs::File::create(&blob)
            .await
            .map_err(|e| RegistryError::io("create", &blob, e))?;
        let mut counted = CountingWriter::new(
            file,
            self.progress.clone(),
            &layer.digest,
            layer.size.max(0) as u64,
        );
        self.client
            .pull_blob(reference, layer, &mut counted)
            .await
            .map_err(self.explain)?;
        counted.finish();
        let limit = free_bytes(self.store.dir())?.saturating_sub(DISK_RESERVE);
        let (blob_path, dir) = (blob.clone(), unpacked.clone());
        let digest = layer.digest.clone();
        let canonical = self.canonical.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            std::fs::create_dir(&dir).map_err(|e| RegistryError::io("create", &dir, e))?;
            let file = std::fs::File::open(&blob_path)
                .map_err(|e| RegistryError::io("open", &blob_path, e))?;
            let mut reader = std::io::BufReader::new(file);
            let gzip = {
                use std::io::BufRead;
                let head = reader
                    .fill_buf()
                    .map_err(|e| RegistryError::io("read", &blob_path, e))?;
                head.starts_with(&[0x1f, 0x8b])
            };
            let stream: Box<dyn Read> = if gzip {
                Box::new(flate2::read::MultiGzDecoder::new(reader))
            } else {
                Box::new(reader)
            };
            unpack_layer(stream, &dir, limit)
                .map(|s| s.bytes)
                .map_err(|source| RegistryError::Unpack {
                    reference: canonical,
                    digest,
                    source,
                })
        })
        .await
        .map_err(|e| RegistryError::io("unpack", &unpacked, std::io::Error::other(e)))??;
        match std::fs::rename(&unpacked, &dest) {
            Ok(()) => {}
            // Another pull stored the same layer meanwhile: keep theirs.
            Err(_) if dest.is_dir() => {}
            Err(e) => return Err(RegistryError::io("rename into place", &dest, e)),
        }
        drop(cleanup);
        Ok(bytes)
    }
}

/// Removes what a failed or finished fetch left in `tmp/`.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in &self.0 {
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn free_bytes(path: &Path) -> Result<u64, RegistryError> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|e| RegistryError::io("measure free space of", path, e.into()))?;
    Ok(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}
