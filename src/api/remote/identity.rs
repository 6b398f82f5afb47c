//! The remote API's TLS identity: the operator's certificate and key files,
//! or a self-signed pair (`api-tls.crt`, `api-tls.key` 0600) made in the
//! state dir on first use. Clients that cannot check it against a CA pin
//! its SHA-256 fingerprint, which `sandboxd --print-fingerprint` prints.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use crate::config::RemoteApiSettings;
use crate::private_file;

const SELF_SIGNED_CERT: &str = "api-tls.crt";
const SELF_SIGNED_KEY: &str = "api-tls.key";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the remote API's TLS {what} {path}: {message}")]
    File {
        what: &'static str,
        path: String,
        message: String,
    },
    #[error("making the remote API's self-signed certificate: {0}")]
    Generate(String),
    #[error("the remote API's TLS configuration: {0}")]
    Config(String),
}

/// A certificate chain and its key, as the listener serves them.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Loads the configured pair, or the self-signed one in `state_dir`
    /// (made when absent, for the names in `names`).
    pub fn load_or_make(
        settings: &RemoteApiSettings,
        state_dir: &Path,
    ) -> Result<Identity, IdentityError> {
        if let Some((cert, key)) = &settings.tls_files {
            return Self::load(cert, key);
        }
        let cert = state_dir.join(SELF_SIGNED_CERT);
        let key = state_dir.join(SELF_SIGNED_KEY);
        if !key.exists() {
            make_self_signed(&cert, &key, settings.listen)?;
        }
        Self::load(&cert, &key)
    }

    pub fn load(cert: &Path, key: &Path) -> Result<Identity, IdentityError> {
        let fail = |what, path: &Path, message: String| IdentityError::File {
            what,
            path: path.display().to_string(),
            message,
        };
        let pem = std::fs::read(cert).map_err(|e| fail("certificate", cert, e.to_string()))?;
        let chain = rustls_pemfile::certs(&mut pem.as_slice())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail("certificate", cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(fail(
                "certificate",
                cert,
                "holds no PEM CERTIFICATE block".into(),
            ));
        }
        let pem = private_file::read(key).map_err(|e| fail("key", key, e.to_string()))?;
        let key_der = rustls_pemfile::private_key(&mut pem.as_slice())
            .map_err(|e| fail("key", key, e.to_string()))?
            .ok_or_else(|| fail("key", key, "holds no PEM private key".into()))?;
        Ok(Identity {
            chain,
            key: key_der,
        })
    }

    /// SHA-256 of the leaf certificate (DER), 64 lowercase hex digits.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.chain[0])
    }

    /// The listener's rustls configuration (HTTP/1.1 only, as the API is).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, IdentityError> {
        self.server_config_offering(&[b"http/1.1"])
    }

    /// A rustls configuration that offers `alpn`, in order of preference.
    pub fn server_config_offering(
        &self,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ServerConfig>, IdentityError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| IdentityError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(self.chain.clone(), self.key.clone_key())
        .map_err(|e| IdentityError::Config(format!("certificate and key do not match: {e}")))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// A self-signed ECDSA certificate for the loopback names, this host's
/// name and the listening address.
fn make_self_signed(
    cert: &Path,
    key: &Path,
    listen: Option<std::net::SocketAddr>,
) -> Result<(), IdentityError> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(host) = nix::unistd::gethostname() {
        names.extend(host.to_str().map(str::to_string));
    }
    if let Some(ip) = listen.map(|a| a.ip()).filter(|ip| !ip.is_unspecified()) {
        names.push(ip.to_string());
    }
    names.dedup();
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| IdentityError::Generate(e.to_string()))?;
    if let Some(dir) = key.parent() {
        std::fs::create_dir_all(dir).map_err(|e| IdentityError::Generate(e.to_string()))?;
    }
    // The certificate first: a key without its certificate would be
    // taken for a finished pair by the next start.
    private_file::write(cert, made.cert.pem().as_bytes())
        .map_err(|e| IdentityError::Generate(format!("{}: {e}", cert.display())))?;
    private_file::write(key, made.key_pair.serialize_pem().as_bytes())
        .map_err(|e| IdentityError::Generate(format!("{}: {e}", key.display())))?;
    tracing::info!(cert = %cert.display(), "made a self-signed certificate for the remote API");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_identity_is_made_once_and_serves() {
        let dir = tempfile::tempdir().unwrap();
        let settings = RemoteApiSettings {
            listen: Some("127.0.0.1:8443".parse().unwrap()),
            tls_files: None,
            tokens_file: dir.path().join("api-tokens"),
        };
        let first = Identity::load_or_make(&settings, dir.path()).unwrap();
        let again = Identity::load_or_make(&settings, dir.path()).unwrap();
        assert_eq!(first.fingerprint(), again.fingerprint());
        assert_eq!(first.fingerprint().len(), 64);
        first.server_config().unwrap();
        // The operator's own pair is used as given.
        let named = RemoteApiSettings {
            tls_files: Some((
                dir.path().join(SELF_SIGNED_CERT),
                dir.path().join(SELF_SIGNED_KEY),
            )),
            ..settings
        };
        let own = Identity::load_or_make(&named, Path::new("/nonexistent")).unwrap();
        assert_eq!(own.fingerprint(), first.fingerprint());
        let missing = RemoteApiSettings {
            tls_files: Some((dir.path().join("no.crt"), dir.path().join("no.key"))),
            ..named
        };
        let err = Identity::load_or_make(&missing, dir.path()).err().unwrap();
        assert!(err.to_string().contains("no.crt"), "{err}");
    }
}
