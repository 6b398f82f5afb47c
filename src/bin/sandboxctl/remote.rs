//! The remote endpoint: sandboxd's API over TCP + TLS (`--url
//! https://host:port`) with a bearer token. The daemon's certificate is
//! checked against the system's CAs (plus `--ca-file`), or, for a
//! self-signed one, pinned by its SHA-256 fingerprint
//! (`sandboxd --print-fingerprint` on the daemon's host).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Where and how to reach a remote daemon.
pub struct Remote {
    pub host: String,
    pub port: u16,
    /// `host:port`, the `Host` header.
    pub authority: String,
    pub server_name: ServerName<'static>,
    pub tls: Arc<rustls::ClientConfig>,
    pub token: Option<Zeroizing<String>>,
}

/// How the user asked to reach the daemon remotely.
pub struct RemoteOptions<'a> {
    pub url: &'a str,
    pub token_file: Option<&'a Path>,
    /// A token from the environment (SANDBOXD_TOKEN), never from argv.
    pub token: Option<String>,
    pub fingerprint: Option<&'a str>,
    pub ca_file: Option<&'a Path>,
}

impl Remote {
    pub fn new(options: RemoteOptions<'_>) -> Result<Remote> {
        let (host, port) = parse_url(options.url)?;
        let token = match (options.token_file, options.token) {
            (Some(path), _) => Some(read_token(path)?),
            (None, Some(token)) => Some(Zeroizing::new(token.trim().to_string())),
            (None, None) => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .context("TLS setup")?;
        let mut tls = match options.fingerprint {
            Some(pin) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned {
                    fingerprint: normalise_fingerprint(pin)?,
                    provider,
                }))
                .with_no_client_auth(),
            None => {
                let extra: Vec<PathBuf> =
                    options.ca_file.map(Path::to_path_buf).into_iter().collect();
                let roots = sandboxd::net::intercept::tls::upstream_roots(&extra)
                    .context("loading the CAs to check the daemon's certificate with")?;
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.clone())
            .with_context(|| format!("{host:?} is not a host name or address"))?;
        Ok(Remote {
            authority: if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            },
            host,
            port,
            server_name,
            tls: Arc::new(tls),
            token,
        })
    }
}

/// `https://host[:port]` with no path (the API's routes are its own).
fn parse_url(url: &str) -> Result<(String, u16)> {
    let Some(rest) = url.strip_prefix("https://") else {
        bail!("--url {url:?}: the remote API speaks TLS only: give https://HOST:PORT");
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') || rest.contains('?') || rest.contains('@') {
        bail!("--url {url:?}: give https://HOST:PORT, without a path, query or user");
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .with_context(|| format!("--url {url:?}: unclosed [ in the address"))?;
        (host, after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        bail!("--url {url:?}: no host");
    }
    let port = match port {
        Some(p) => p
            .parse()
            .with_context(|| format!("--url {url:?}: {p:?} is not a port"))?,
        None => 443,
    };
    Ok((host.to_string(), port))
}

fn read_token(path: &Path) -> Result<Zeroizing<String>> {
    let text = Zeroizing::new(
        std::fs::read_to_string(path)
            .with_context(|| format!("reading the token file {}", path.display()))?,
    );
    let token = text.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(Zeroizing::new(token.to_string()))
}

/// 64 lowercase hex digits from `AB:CD:...`, `sha256:abcd...` or plain hex.
pub fn normalise_fingerprint(given: &str) -> Result<String> {
    let trimmed = given.trim();
    let hex_part = match trimmed.get(..7) {
        Some(prefix) if prefix.eq_ignore_ascii_case("sha256:") => &trimmed[7..],
        _ => trimmed,
    };
    let digits: String = hex_part
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "TLS fingerprint {given:?} is not a SHA-256 (64 hex digits, colons allowed); `sandboxd --print-fingerprint` prints it"
        );
    }
    Ok(digits)
}

/// Accepts exactly the certificate with the pinned fingerprint, and checks
/// that the server holds its key (the handshake signature).
#[derive(Debug)]
struct Pinned {
    fingerprint: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = hex::encode(Sha256::digest(end_entity.as_ref()));
        if seen == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the daemon's certificate has fingerprint {seen}, not the pinned {}",
                self.fingerprint
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_fingerprints_are_read_in_their_usual_spellings() {
        assert_eq!(parse_url("https://h:8443").unwrap(), ("h".into(), 8443));
        assert_eq!(parse_url("https://h/").unwrap(), ("h".into(), 443));
        assert_eq!(parse_url("https://[::1]:9").unwrap(), ("::1".into(), 9));
        for bad in ["http://h:1", "https://h:1/v1", "https://:1", "https://h:x"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let plain = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(normalise_fingerprint(&plain).unwrap(), plain);
        assert_eq!(normalise_fingerprint(&colons).unwrap(), plain);
        assert_eq!(
            normalise_fingerprint(&format!("SHA256:{colons}")).unwrap(),
            plain
        );
        assert!(normalise_fingerprint("abcd").is_err());
    }
}
