//! The remote API's bearer tokens. The tokens file holds one `NAME
//! sha256:HEX` line per token: only hashes, so reading the file gives no
//! token away. A token is 32 random bytes (base64url, `sbd_` prefix): high
//! entropy, so one SHA-256 is enough (no password hashing needed). Names
//! tell holders apart in the log: a scheduler and an operator hold
//! different ones.

use std::path::Path;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::private_file::{self, PrivateFileError};

const TOKEN_PREFIX: &str = "sbd_";
const HASH_PREFIX: &str = "sha256:";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("tokens file {path}: {source}")]
    File {
        path: String,
        source: PrivateFileError,
    },
    #[error("tokens file {path}, line {line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("a token named {0:?} exists; remove it first (sandboxd token rm {0})")]
    Exists(String),
    #[error("no token is named {0:?}; `sandboxd token ls` lists them")]
    NotFound(String),
    #[error("token names are 1 to 64 letters, digits, '-', '_' or '.', got {0:?}")]
    BadName(String),
}

struct Entry {
    name: String,
    hash: [u8; 32],
}

/// The tokens the remote API accepts.
#[derive(Default)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl TokenSet {
    /// Reads the tokens file; an absent file is an empty set (the caller
    /// decides whether that may serve).
    pub fn load(path: &Path) -> Result<TokenSet, TokenError> {
        match private_file::read(path) {
            Ok(bytes) => Self::parse(path, &String::from_utf8_lossy(&bytes)),
            Err(e) if e.is_not_found() => Ok(TokenSet::default()),
            Err(source) => Err(TokenError::File {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<TokenSet, TokenError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let bad = |message: &str| TokenError::Parse {
                path: path.display().to_string(),
                line: index + 1,
                message: message.to_string(),
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(digest), None) = (words.next(), words.next(), words.next())
            else {
                return Err(bad("expected `NAME sha256:HEX`"));
            };
            if !valid_name(name) {
                return Err(bad(
                    "the name must be 1 to 64 letters, digits, '-', '_' or '.'",
                ));
            }
            let mut hash = [0u8; 32];
            digest
                .strip_prefix(HASH_PREFIX)
                .and_then(|h| hex::decode_to_slice(h, &mut hash).ok())
                .ok_or_else(|| {
                    bad("the hash must be `sha256:` and 64 hex digits (tokens themselves never go in this file)")
                })?;
            if entries.iter().any(|e| e.name == name) {
                return Err(bad("this name is used by an earlier line"));
            }
            entries.push(Entry {
                name: name.to_string(),
                hash,
            });
        }
        Ok(TokenSet { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// The name of the token `presented` is, if any. Every entry is
    /// compared, each in constant time, so the answer's timing says
    /// nothing about how close a guess was.
    pub fn verify(&self, presented: &str) -> Option<&str> {
        let presented = hash(presented);
        let mut found = None;
        for entry in &self.entries {
            let equal: bool = entry.hash.ct_eq(&presented).into();
            if equal && found.is_none() {
                found = Some(entry.name.as_str());
            }
        }
        found
    }

    fn render(&self) -> String {
        let mut text = String::from(
            "# sandboxd remote API tokens: NAME sha256:HASH (sandboxd token create|ls|rm)\n",
        );
        for entry in &self.entries {
            text.push_str(&format!(
                "{} {HASH_PREFIX}{}\n",
                entry.name,
                hex::encode(entry.hash)
            ));
        }
        text
    }

    fn save(&self, path: &Path) -> Result<(), TokenError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| TokenError::File {
                path: path.display().to_string(),
                source: e.into(),
            })?;
        }
        private_file::write(path, self.render().as_bytes()).map_err(|e| TokenError::File {
            path: path.display().to_string(),
            source: e.into(),
        })
    }
}

/// Adds a token named `name` to the file at `path` (made when absent) and
/// returns it: the one time it is shown.
pub fn create(path: &Path, name: &str) -> Result<String, TokenError> {
    if !valid_name(name) {
        return Err(TokenError::BadName(name.to_string()));
    }
    let mut set = TokenSet::load(path)?;
    if set.entries.iter().any(|e| e.name == name) {
        return Err(TokenError::Exists(name.to_string()));
    }
    let token = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
    );
    set.entries.push(Entry {
        name: name.to_string(),
        hash: hash(&token),
    });
    set.save(path)?;
    Ok(token)
}

/// Removes the token named `name` from the file at `path`.
pub fn remove(path: &Path, name: &str) -> Result<(), TokenError> {
    let mut set = TokenSet::load(path)?;
    let before = set.entries.len();
    set.entries.retain(|e| e.name != name);
    if set.entries.len() == before {
        return Err(TokenError::NotFound(name.to_string()));
    }
    set.save(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_tokens_verify_by_name_and_the_file_holds_only_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-tokens");
        let scheduler = create(&path, "scheduler").unwrap();
        let operator = create(&path, "operator").unwrap();
        assert!(scheduler.starts_with(TOKEN_PREFIX) && scheduler.len() > 40);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&scheduler) && !text.contains(&operator[4..]));
        assert!(text.contains("scheduler sha256:"), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let set = TokenSet::load(&path).unwrap();
        assert_eq!(set.verify(&scheduler), Some("scheduler"));
        assert_eq!(set.verify(&operator), Some("operator"));
        assert_eq!(set.verify(""), None);
        assert_eq!(set.verify(&scheduler[..scheduler.len() - 1]), None);
        assert_eq!(set.verify(&format!("{scheduler}x")), None);

        assert!(matches!(
            create(&path, "operator"),
            Err(TokenError::Exists(_))
        ));
        remove(&path, "operator").unwrap();
        let set = TokenSet::load(&path).unwrap();
        assert_eq!(set.verify(&operator), None);
        assert_eq!(set.verify(&scheduler), Some("scheduler"));
        assert!(matches!(
            remove(&path, "operator"),
            Err(TokenError::NotFound(_))
        ));
    }

    #[test]
    fn bad_files_and_names_are_refused_saying_where() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-tokens");
        assert!(TokenSet::load(&path).unwrap().is_empty());
        assert!(matches!(create(&path, "a b"), Err(TokenError::BadName(_))));
        for (text, needle) in [
            ("ops sbd_plaintexttoken\n", "line 1"),
            ("# c\nops sha256:abcd\n", "line 2"),
            ("ops sha256:{h}\nops sha256:{h}\n", "earlier line"),
            ("o/ps sha256:{h}\n", "name"),
        ] {
            let text = text.replace("{h}", &"a".repeat(64));
            private_file::write(&path, text.as_bytes()).unwrap();
            let err = TokenSet::load(&path).err().unwrap().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        private_file::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = TokenSet::load(&path).err().unwrap().to_string();
        assert!(err.contains("chmod 600"), "{err}");
    }
}
