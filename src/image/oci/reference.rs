//! Which image names are registry references, and their canonical form.
//! A bare name (`python`, a snapshot id) stays a local image: only a name
//! with a tag, a digest or a path (`node:20`, `library/node`,
//! `app@sha256:...`) goes to a registry, so a mistyped local name is a 404
//! rather than a pull from Docker Hub.

use oci_client::Reference;

use super::RegistryError;

/// Whether `image` is meant as a registry reference.
pub fn is_reference(image: &str) -> bool {
    image.contains([':', '/', '@'])
}

/// Parses `image` with Docker Hub's defaults for short names (`node:20` is
/// `docker.io/library/node:20`, no tag is `latest`).
pub fn parse(image: &str) -> Result<Reference, RegistryError> {
    if image.len() > 512 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(RegistryError::InvalidReference {
            reference: image.chars().take(80).collect(),
            reason: "too long or has blanks".into(),
        });
    }
    image
        .parse::<Reference>()
        .map_err(|e| RegistryError::InvalidReference {
            reference: image.to_string(),
            reason: e.to_string(),
        })
}

/// `registry/repository:tag` or `...@digest`, as stored and shown.
pub fn canonical(reference: &Reference) -> String {
    reference.whole()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_get_docker_hub_defaults() {
        assert_eq!(
            canonical(&parse("node:20").unwrap()),
            "docker.io/library/node:20"
        );
        assert_eq!(
            canonical(&parse("team/app").unwrap()),
            "docker.io/team/app:latest"
        );
        let pinned = parse("127.0.0.1:5000/team/app@sha256:0123456789012345678901234567890123456789012345678901234567890123").unwrap();
        assert_eq!(pinned.registry(), "127.0.0.1:5000");
        assert_eq!(pinned.repository(), "team/app");
        assert!(pinned.digest().is_some());
    }

    #[test]
    fn bare_names_stay_local_and_bad_ones_are_refused() {
        assert!(!is_reference("python"));
        assert!(is_reference("python:3.12-slim"));
        assert!(is_reference("docker.io/library/python"));
        assert!(parse("Node:20").is_err());
        assert!(parse("node:20 ; rm").is_err());
        assert!(parse("a@sha256:short").is_err());
    }
}
