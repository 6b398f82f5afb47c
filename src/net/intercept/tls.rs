//! TLS on both sides of an intercepted connection: the trust roots the
//! upstream side verifies against (the host's system roots plus
//! `egress_extra_ca`), the client configurations per ALPN offer, the
//! server configuration for one leaf, and the stream that replays the
//! ClientHello the proxy already read.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where Linux distributions keep the system's trust bundle, in the order
/// they are tried (Debian/Ubuntu, Fedora/RHEL, Alpine/Arch and others).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("reading trust roots from {path}: {message}")]
    Roots { path: String, message: String },
    #[error("no trust roots: none of {SYSTEM_BUNDLES:?} exists and egress_extra_ca names none")]
    NoRoots,
    #[error("building the TLS configuration: {0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM files at `paths`.
fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let fail = |message: String| TlsSetupError::Roots {
        path: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    rustls_pemfile::certs(&mut bytes.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))
}

/// The roots upstream certificates are verified against: the first system
/// bundle found, plus every certificate in `extra`.
pub fn upstream_roots(extra: &[PathBuf]) -> Result<rustls::RootCertStore, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(bundle) = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
        // A bundle may hold a certificate webpki cannot parse: skip it, as
        // every TLS stack does, rather than trust nothing.
        roots.add_parsable_certificates(read_pem_certs(bundle)?);
    }
    for path in extra {
        let certs = read_pem_certs(path)?;
        if certs.is_empty() {
            return Err(TlsSetupError::Roots {
                path: path.display().to_string(),
                message: "holds no PEM certificate".into(),
            });
        }
        for cert in certs {
            roots.add(cert).map_err(|e| TlsSetupError::Roots {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsSetupError::NoRoots);
    }
    Ok(roots)
}

/// Client configurations for the upstream side, one per ALPN offer.
pub struct UpstreamTls {
    /// Offers `h2` then `http/1.1`.
    pub h2_or_http1: Arc<rustls::ClientConfig>,
    /// Offers `http/1.1` only.
    pub http1: Arc<rustls::ClientConfig>,
    /// Offers nothing (the client offered no ALPN).
    pub none: Arc<rustls::ClientConfig>,
}

impl UpstreamTls {
    pub fn new(roots: rustls::RootCertStore) -> Result<UpstreamTls, TlsSetupError> {
        let roots = Arc::new(roots);
        let build = |alpn: &[&[u8]]| -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsSetupError::Config(e.to_string()))?
                .with_root_certificates(Arc::clone(&roots))
                .with_no_client_auth();
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(config))
        };
        Ok(UpstreamTls {
            h2_or_http1: build(&[ALPN_H2, ALPN_HTTP1])?,
            http1: build(&[ALPN_HTTP1])?,
            none: build(&[])?,
        })
    }

    /// The configuration that offers upstream what the sandbox's client
    /// offered (of `h2` and `http/1.1`), so both sides speak alike.
    pub fn for_client_offer(&self, offered: &[Vec<u8>]) -> Arc<rustls::ClientConfig> {
        let has = |p: &[u8]| offered.iter().any(|o| o.as_slice() == p);
        if has(ALPN_H2) {
            Arc::clone(&self.h2_or_http1)
        } else if has(ALPN_HTTP1) {
            Arc::clone(&self.http1)
        } else {
            Arc::clone(&self.none)
        }
    }
}

/// A leaf as rustls serves it.
pub fn certified_key(
    chain: &[Vec<u8>],
    key_der: &[u8],
) -> Result<Arc<CertifiedKey>, TlsSetupError> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec()));
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsSetupError::Config(e.to_string()))?;
    let chain = chain
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

/// The sandbox-facing configuration: `leaf`, and the one ALPN protocol the
/// upstream chose (none when it chose none).
pub fn server_config(
    leaf: Arc<CertifiedKey>,
    alpn: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneCert(leaf)));
    config.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
    Ok(Arc::new(config))
}

/// The sandbox's side of an intercepted connection: first the bytes the
/// proxy already read (the ClientHello), then the socket; bytes both ways
/// are counted.
pub struct Rewound<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
    pub counted: Arc<AtomicU64>,
}

impl<S> Rewound<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Rewound {
            counted: Arc::new(AtomicU64::new(prefix.len() as u64)),
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.counted.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &polled {
            self.counted.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_prefix_is_read_first_then_the_stream() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b" world")
            .await
            .unwrap();
        drop(a);
        let mut rewound = Rewound::new(b"hello".to_vec(), b);
        let mut all = String::new();
        rewound.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
        assert_eq!(rewound.counted.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn the_upstream_offer_follows_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["x.test".into()]).unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.cert.pem()).unwrap();
        let tls = UpstreamTls::new(upstream_roots(&[path]).unwrap()).unwrap();
        let h2 = tls.for_client_offer(&[b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert_eq!(h2.alpn_protocols.len(), 2);
        let h1 = tls.for_client_offer(&[b"http/1.1".to_vec()]);
        assert_eq!(h1.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(tls.for_client_offer(&[]).alpn_protocols.is_empty());
    }
}
