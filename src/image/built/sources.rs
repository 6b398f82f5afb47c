//! Where builds fetch packages from (the daemon's `pip_index_url` and
//! `apt_sources`), and the hosts a build sandbox's egress allow list holds
//! for them: nothing else is reachable from a build.

use serde::Serialize;

/// PyPI's index, and the host its files are served from.
pub const PYPI_INDEX: &str = "https://pypi.org/simple";
const PYPI_FILES_HOST: &str = "files.pythonhosted.org";

/// The package sources of the daemon's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PackageSources {
    /// A PEP 503 index (`https://pypi.org/simple`).
    pub pip_index_url: String,
    /// `sources.list` lines a build uses instead of the base image's own
    /// (`deb [trusted=yes] http://mirror/ ./`); empty: the image's own.
    pub apt_sources: Vec<String>,
}

impl Default for PackageSources {
    fn default() -> Self {
        PackageSources {
            pip_index_url: PYPI_INDEX.to_string(),
            apt_sources: Vec::new(),
        }
    }
}

impl PackageSources {
    /// The hosts pip needs: the index's, and PyPI's file host with PyPI.
    pub fn pip_hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = url_host(&self.pip_index_url).into_iter().collect();
        if hosts.iter().any(|h| h == "pypi.org") {
            hosts.push(PYPI_FILES_HOST.to_string());
        }
        hosts
    }

    /// The index's host when it is plain HTTP (pip refuses it unless told
    /// to trust it; the egress allow list still decides what it reaches).
    pub fn pip_trusted_host(&self) -> Option<String> {
        self.pip_index_url
            .starts_with("http://")
            .then(|| url_host(&self.pip_index_url))
            .flatten()
    }
}

/// The hosts the URLs in apt source text name: one-line (`deb URL suite
/// ...`) and deb822 (`URIs: URL ...`) forms alike.
pub fn apt_hosts(text: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        for word in line.split_whitespace() {
            if let Some(host) = url_host(word) {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
    }
    hosts
}

/// The host of an `http(s)://` URL, without user info, port or brackets.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        host_port.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pypi_brings_its_file_host() {
        assert_eq!(
            PackageSources::default().pip_hosts(),
            ["pypi.org", "files.pythonhosted.org"]
        );
        let local = PackageSources {
            pip_index_url: "http://203.0.113.11:8080/simple/".into(),
            apt_sources: Vec::new(),
        };
        assert_eq!(local.pip_hosts(), ["203.0.113.11"]);
        assert_eq!(local.pip_trusted_host().as_deref(), Some("203.0.113.11"));
        assert_eq!(PackageSources::default().pip_trusted_host(), None);
    }

    #[test]
    fn apt_hosts_come_from_both_source_formats() {
        let text = "deb http://deb.debian.org/debian bookworm main\n\
                    # deb http://commented.example/debian x main\n\
                    deb [trusted=yes] http://user:pw@[2001:db8::1]:8080/ ./\n\
                    Types: deb\nURIs: https://security.debian.org/debian-security\n";
        assert_eq!(
            apt_hosts(text),
            ["deb.debian.org", "2001:db8::1", "security.debian.org"]
        );
        assert!(apt_hosts("deb file:/srv/repo ./").is_empty());
    }
}
