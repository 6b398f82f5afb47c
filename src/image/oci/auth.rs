//! Registry credentials: a 0600 file named by `registry_auth_file`, in the
//! `auths` form of Docker's `config.json` (so `docker login`'s file works):
//! `{"auths": {"registry.example.com": {"auth": "<base64 user:pass>"}}}` or
//! with `username` and `password`. Read on each pull, so a rotated password
//! needs no restart; never logged, never in a response.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use super::RegistryError;

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: HashMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The credentials for `registry` (as written in the reference, e.g.
/// `docker.io` or `127.0.0.1:5000`), anonymous when there are none.
pub fn for_registry(file: Option<&Path>, registry: &str) -> Result<RegistryAuth, RegistryError> {
    let Some(path) = file else {
        return Ok(RegistryAuth::Anonymous);
    };
    let fail = |detail: String| RegistryError::Credentials {
        path: PathBuf::from(path),
        detail,
    };
    let bytes = crate::private_file::read(path).map_err(|e| fail(e.to_string()))?;
    let parsed: AuthFile = serde_json::from_slice(&bytes)
        .map_err(|e| fail(format!("not a {{\"auths\": {{...}}}} JSON file: {e}")))?;
    let names = aliases(registry);
    let Some(entry) = parsed.auths.iter().find_map(|(key, entry)| {
        let key = key
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        names.contains(&key).then_some(entry)
    }) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(user.clone(), password.clone()));
    }
    let encoded = entry.auth.as_deref().ok_or_else(|| {
        fail(format!(
            "the entry for {registry} has neither auth nor username and password"
        ))
    })?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            fail(format!(
                "the auth of {registry} is not base64 of user:password"
            ))
        })?;
    let (user, password) = decoded.split_once(':').ok_or_else(|| {
        fail(format!(
            "the auth of {registry} is not base64 of user:password"
        ))
    })?;
    Ok(RegistryAuth::Basic(user.to_string(), password.to_string()))
}

/// Docker Hub goes by several names in credential files.
fn aliases(registry: &str) -> Vec<&str> {
    match registry {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => {
            vec!["docker.io", "index.docker.io", "registry-1.docker.io"]
        }
        other => vec![other],
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        f
    }

    #[test]
    fn docker_config_entries_give_basic_credentials() {
        let f = file(
            r#"{"auths": {"https://index.docker.io/v1/": {"auth": "dXNlcjpwYXNz"},
                          "127.0.0.1:5000": {"username": "u", "password": "p:w"}}}"#,
            0o600,
        );
        let hub = for_registry(Some(f.path()), "docker.io").unwrap();
        assert!(matches!(hub, RegistryAuth::Basic(u, p) if u == "user" && p == "pass"));
        let local = for_registry(Some(f.path()), "127.0.0.1:5000").unwrap();
        assert!(matches!(local, RegistryAuth::Basic(u, p) if u == "u" && p == "p:w"));
        let other = for_registry(Some(f.path()), "ghcr.io").unwrap();
        assert!(matches!(other, RegistryAuth::Anonymous));
    }

    #[test]
    fn a_file_others_can_read_is_refused() {
        let f = file(r#"{"auths": {}}"#, 0o644);
        let err = for_registry(Some(f.path()), "docker.io").unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
}
