//! Values at rest: sealed with XChaCha20-Poly1305 under a 32-byte key file
//! (0600) that the daemon makes on first use. The secret's name is the
//! associated data, so a sealed value copied under another name does not
//! open. The random 24-byte nonce is stored in front of the ciphertext.

use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("the secrets key {path}: {message}")]
    Key { path: String, message: String },
    #[error(
        "the sealed value of secret {0:?} does not open with the secrets key: the key file was \
         replaced or the store was copied from another host; delete the secret and create it again"
    )]
    Open(String),
}

/// Seals and opens values under the daemon's key.
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl Sealer {
    /// Loads the key at `path`, making it (0600, fsynced) when absent.
    pub fn load_or_create(path: &Path) -> Result<Sealer, SealError> {
        let key = read_or_create_key(path)?;
        Ok(Sealer {
            cipher: XChaCha20Poly1305::new(key.as_slice().into()),
        })
    }

    pub fn seal(&self, name: &str, value: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let payload = Payload {
            msg: value,
            aad: name.as_bytes(),
        };
        // Encryption fails only for messages beyond the cipher's limits
        // (256 GiB); values are capped far below.
        let sealed = self
            .cipher
            .encrypt(XNonce::from_slice(&nonce), payload)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    pub fn open(&self, name: &str, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::Open(name.to_string()));
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let payload = Payload {
            msg: body,
            aad: name.as_bytes(),
        };
        self.cipher
            .decrypt(XNonce::from_slice(nonce), payload)
            .map(Zeroizing::new)
            .map_err(|_| SealError::Open(name.to_string()))
    }
}

fn read_or_create_key(path: &Path) -> Result<Zeroizing<Vec<u8>>, SealError> {
    let fail = |message: String| SealError::Key {
        path: path.display().to_string(),
        message,
    };
    match crate::private_file::read(path) {
        Ok(bytes) if bytes.len() == KEY_LEN => Ok(bytes),
        Ok(bytes) => Err(fail(format!(
            "holds {} bytes, not {KEY_LEN}; restore the original key file",
            bytes.len()
        ))),
        Err(e) if e.is_not_found() => {
            let key = Zeroizing::new(rand::random::<[u8; KEY_LEN]>().to_vec());
            crate::private_file::write(path, &key).map_err(|e| fail(e.to_string()))?;
            Ok(key)
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_value_opens_under_its_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let sealer = Sealer::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = sealer.seal("A", b"sk-live-123");
        assert!(!sealed.windows(11).any(|w| w == b"sk-live-123"));
        assert_eq!(
            sealer.open("A", &sealed).unwrap().as_slice(),
            b"sk-live-123"
        );
        assert!(sealer.open("B", &sealed).is_err());
        // The same key is loaded again after a restart.
        let again = Sealer::load_or_create(&path).unwrap();
        assert_eq!(again.open("A", &sealed).unwrap().as_slice(), b"sk-live-123");
        // Another key does not open it.
        let other = Sealer::load_or_create(&dir.path().join("other.key")).unwrap();
        assert!(other.open("A", &sealed).is_err());
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        Sealer::load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Sealer::load_or_create(&path).err().unwrap().to_string();
        assert!(err.contains("chmod 600"), "{err}");
    }
}
