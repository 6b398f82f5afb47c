//! Image name rules. Names become file names under the cache and recipe dirs, so the
//! rule leaves no room for path tricks (`/`, `..`, leading dots, NUL, uppercase that
//! collides on case-insensitive tools).

use super::ImageError;

/// Longest accepted image name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Accepts `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn validate_name(name: &str) -> Result<(), ImageError> {
    let bytes = name.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if first_ok && rest_ok && bytes.len() <= MAX_NAME_LEN {
        Ok(())
    } else {
        Err(ImageError::InvalidName {
            name: name.chars().take(80).collect(),
        })
    }
}
