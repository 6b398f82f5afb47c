//! The daemon's certificate authority for intercepted hosts: an ECDSA P-256
//! key (`secrets-ca.key`, 0600) and its self-signed certificate
//! (`secrets-ca.crt`) in the state dir, made on first use. Only sandboxes
//! with bound secrets trust it. The key never leaves the daemon: a
//! supervisor is given a leaf for each bound host (cached here), never the
//! CA key.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use zeroize::Zeroizing;

use crate::private_file::write as write_private;

const CA_KEY_FILE: &str = "secrets-ca.key";
const CA_CERT_FILE: &str = "secrets-ca.crt";
const CA_NAME: &str = "sandboxd secrets broker CA";

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("the secrets CA in {dir}: {message}")]
    Files { dir: String, message: String },
    #[error("issuing a certificate for {host}: {message}")]
    Issue { host: String, message: String },
}

/// A leaf certificate and its key (PKCS#8 DER), as a supervisor serves it.
pub struct Leaf {
    pub cert_der: Vec<u8>,
    pub key_der: Zeroizing<Vec<u8>>,
}

pub struct Authority {
    key: KeyPair,
    /// The certificate leaves are signed with: the stored CA's subject and
    /// key, so what it signs verifies against the stored certificate.
    issuer: Certificate,
    cert_pem: String,
    cert_der: Vec<u8>,
    leaves: Mutex<HashMap<String, Arc<Leaf>>>,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    name.push(DnType::OrganizationName, "sandboxd");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl Authority {
    /// Loads the CA from `state_dir`, making it when absent.
    pub fn load_or_create(state_dir: &Path) -> Result<Authority, AuthorityError> {
        let fail = |message: String| AuthorityError::Files {
            dir: state_dir.display().to_string(),
            message,
        };
        let key_path = state_dir.join(CA_KEY_FILE);
        let cert_path = state_dir.join(CA_CERT_FILE);
        let (key, cert_pem) = match std::fs::read_to_string(&key_path) {
            Ok(pem) => {
                let pem = Zeroizing::new(pem);
                let key = KeyPair::from_pem(&pem)
                    .map_err(|e| fail(format!("{CA_KEY_FILE} does not parse: {e}")))?;
                let cert_pem = std::fs::read_to_string(&cert_path).map_err(|e| {
                    fail(format!(
                        "{CA_CERT_FILE}: {e}; move {CA_KEY_FILE} aside to make a new CA"
                    ))
                })?;
                (key, cert_pem)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
                let cert = ca_params()
                    .self_signed(&key)
                    .map_err(|e| fail(e.to_string()))?;
                let key_pem = Zeroizing::new(key.serialize_pem());
                write_private(&key_path, key_pem.as_bytes()).map_err(|e| fail(e.to_string()))?;
                write_private(&cert_path, cert.pem().as_bytes())
                    .map_err(|e| fail(e.to_string()))?;
                (key, cert.pem())
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        let cert_der = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .map(|c| c.to_vec())
            .ok_or_else(|| fail(format!("{CA_CERT_FILE} holds no certificate")))?;
        let issuer = ca_params()
            .self_signed(&key)
            .map_err(|e| fail(e.to_string()))?;
        Ok(Authority {
            key,
            issuer,
            cert_pem,
            cert_der,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM) sandboxes with bound secrets trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// A leaf for `name` (a normalised host, or `*.suffix`), issued once
    /// and cached.
    pub fn leaf(&self, name: &str) -> Result<Arc<Leaf>, AuthorityError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leaf) = leaves.get(name) {
            return Ok(Arc::clone(leaf));
        }
        let fail = |message: String| AuthorityError::Issue {
            host: name.to_string(),
            message,
        };
        let key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
        let mut params =
            CertificateParams::new(vec![name.to_string()]).map_err(|e| fail(e.to_string()))?;
        params
            .distinguished_name
            .push(DnType::CommonName, name.to_string());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let (from, to) = validity_years();
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        let cert = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(|e| fail(e.to_string()))?;
        let leaf = Arc::new(Leaf {
            cert_der: cert.der().to_vec(),
            key_der: Zeroizing::new(key.serialize_der()),
        });
        leaves.insert(name.to_string(), Arc::clone(&leaf));
        Ok(leaf)
    }
}

/// From the start of last year to the start of the year after next: long
/// enough for any sandbox, and clients that check dates see a sane range.
fn validity_years() -> (i32, i32) {
    let now = humantime::format_rfc3339(std::time::SystemTime::now()).to_string();
    let year: i32 = now.get(..4).and_then(|y| y.parse().ok()).unwrap_or(2026);
    (year - 1, year + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_survives_a_restart_and_its_leaves_verify() {
        let dir = tempfile::tempdir().unwrap();
        let first = Authority::load_or_create(dir.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(CA_KEY_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let again = Authority::load_or_create(dir.path()).unwrap();
        assert_eq!(first.cert_pem(), again.cert_pem());
        let leaf = again.leaf("api.example.test").unwrap();
        assert!(Arc::ptr_eq(&leaf, &again.leaf("api.example.test").unwrap()));

        // A leaf from the reloaded CA verifies against the stored certificate.
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                first.cert_der().to_vec(),
            ))
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        use rustls::client::danger::ServerCertVerifier;
        let cert = rustls::pki_types::CertificateDer::from(leaf.cert_der.clone());
        let name = rustls::pki_types::ServerName::try_from("api.example.test").unwrap();
        verifier
            .verify_server_cert(&cert, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
        let other = rustls::pki_types::ServerName::try_from("other.example.test").unwrap();
        assert!(verifier
            .verify_server_cert(&cert, &[], &other, &[], rustls::pki_types::UnixTime::now())
            .is_err());
    }
}
