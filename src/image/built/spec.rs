//! A declarative image as a request writes it (`{"base": ..., "python_version":
//! "3.11", "python_packages": [...], ...}`), its validation into a [`Plan`],
//! and the content address a plan and its resolved base make.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::SpecError;
use super::sources::PackageSources;

/// Part of every build's address: bump it when the same spec would build
/// to something else (the steps or the layer's format changed).
pub const BUILD_FORMAT: &str = "sandboxd-build-v1";

/// Python versions a spec may ask for, with the Debian suite that ships
/// each as its `python3`, and the base a spec without one starts from.
pub const PYTHON_VERSIONS: &[PythonVersion] = &[
    PythonVersion {
        version: "3.11",
        suite: "bookworm",
        default_base: "python",
    },
    PythonVersion {
        version: "3.13",
        suite: "trixie",
        default_base: "docker.io/library/debian:trixie",
    },
];

const MAX_PACKAGES: usize = 256;
const MAX_COMMANDS: usize = 64;
const MAX_COMMAND_BYTES: usize = 64 << 10;
const MAX_PACKAGE_BYTES: usize = 256;
const MAX_ENV: usize = 128;

/// A Python version, the suite that ships it, and its default base image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonVersion {
    pub version: &'static str,
    pub suite: &'static str,
    pub default_base: &'static str,
}

/// A declarative image, as asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// An image name or registry reference; default: the Python version's
    /// base, else the daemon's default image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `3.11` or `python3.11`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_version: Option<String>,
    /// Requirements as pip takes them (`pandas==2.2.3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_packages: Vec<String>,
    /// Debian package names, optionally `name=version`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_packages: Vec<String>,
    /// Shell commands run in order, as root, after the packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// The image's environment: every build command's and every process's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory of every process (made when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// A validated spec with its defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub base: String,
    /// The asked version (normalised) and the suite that ships it.
    pub python: Option<(String, String)>,
    pub python_packages: Vec<String>,
    pub system_packages: Vec<String>,
    pub commands: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
}

impl ImageSpec {
    /// Validates the spec; `default_image` is the base when neither `base`
    /// nor `python_version` names one.
    pub fn plan(&self, default_image: &str) -> Result<Plan, SpecError> {
        let python = self
            .python_version
            .as_deref()
            .map(python_version)
            .transpose()?;
        for (field, list) in [
            ("python_packages", &self.python_packages),
            ("system_packages", &self.system_packages),
        ] {
            if list.len() > MAX_PACKAGES {
                return Err(SpecError::TooMany {
                    field,
                    count: list.len(),
                    max: MAX_PACKAGES,
                });
            }
        }
        for package in &self.python_packages {
            check_requirement(package)?;
        }
        for package in &self.system_packages {
            check_deb(package)?;
        }
        if self.commands.len() > MAX_COMMANDS {
            return Err(SpecError::TooMany {
                field: "commands",
                count: self.commands.len(),
                max: MAX_COMMANDS,
            });
        }
        if let Some(bad) = self
            .commands
            .iter()
            .find(|c| c.trim().is_empty() || c.len() > MAX_COMMAND_BYTES || c.contains('\0'))
        {
            return Err(SpecError::Command {
                command: shorten(bad),
            });
        }
        if self.env.len() > MAX_ENV {
            return Err(SpecError::TooMany {
                field: "env",
                count: self.env.len(),
                max: MAX_ENV,
            });
        }
        if let Some((key, _)) = self
            .env
            .iter()
            .find(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
        {
            return Err(SpecError::Env { key: shorten(key) });
        }
        if let Some(dir) = &self.workdir {
            let escapes = dir.split('/').any(|part| part == "..");
            if !dir.starts_with('/') || escapes || dir.contains('\0') || dir.len() > 4096 {
                return Err(SpecError::Workdir { dir: shorten(dir) });
            }
        }
        let base = match (&self.base, &python) {
            (Some(base), _) if base.trim().is_empty() => return Err(SpecError::EmptyBase),
            (Some(base), _) => base.clone(),
            (None, Some(python)) => python.default_base.to_string(),
            (None, None) => default_image.to_string(),
        };
        Ok(Plan {
            base,
            python: python.map(|p| (p.version.to_string(), p.suite.to_string())),
            python_packages: self.python_packages.clone(),
            system_packages: self.system_packages.clone(),
            commands: self.commands.clone(),
            env: self.env.clone(),
            workdir: self.workdir.clone(),
        })
    }
}

impl Plan {
    /// Whether the build installs Debian packages.
    pub fn uses_apt(&self, python_installed: bool) -> bool {
        !self.system_packages.is_empty() || (self.python.is_some() && !python_installed)
    }

    /// The content address (hex) of this plan over the base with manifest
    /// or recipe digest `base_digest`, fetching from `sources`: what two
    /// requests must share to share a build.
    pub fn address(&self, base_digest: &str, sources: &PackageSources) -> String {
        #[derive(Serialize)]
        struct Addressed<'a> {
            format: &'static str,
            base_digest: &'a str,
            plan: &'a Plan,
            pip_index_url: Option<&'a str>,
            apt_sources: &'a [String],
        }
        let pip = !self.python_packages.is_empty();
        let addressed = Addressed {
            format: BUILD_FORMAT,
            base_digest,
            plan: self,
            pip_index_url: pip.then_some(sources.pip_index_url.as_str()),
            apt_sources: &sources.apt_sources,
        };
        // Strings, vectors and BTreeMaps: serialising cannot fail.
        let canonical = serde_json::to_vec(&addressed).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }
}

/// `3.11` or `python3.11`, if a supported version.
pub fn python_version(asked: &str) -> Result<PythonVersion, SpecError> {
    let bare = asked.trim().strip_prefix("python").unwrap_or(asked.trim());
    PYTHON_VERSIONS
        .iter()
        .find(|p| p.version == bare)
        .copied()
        .ok_or_else(|| SpecError::PythonVersion {
            asked: shorten(asked),
            supported: supported_pythons(),
        })
}

/// `3.11 (Debian bookworm), 3.13 (Debian trixie)`.
pub fn supported_pythons() -> String {
    PYTHON_VERSIONS
        .iter()
        .map(|p| format!("{} (Debian {})", p.version, p.suite))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A pip requirement: no option (a leading `-` would be one), no control
/// characters. It goes to pip as one argument, never through a shell.
fn check_requirement(package: &str) -> Result<(), SpecError> {
    let bad = package.trim().is_empty()
        || package.starts_with('-')
        || package.len() > MAX_PACKAGE_BYTES
        || package.chars().any(char::is_control);
    if bad {
        return Err(SpecError::Package {
            field: "python_packages",
            package: shorten(package),
            rule: "a requirement as pip takes it (\"pandas==2.2.3\"), not an option",
        });
    }
    Ok(())
}

/// A Debian package name, optionally `=version`.
fn check_deb(package: &str) -> Result<(), SpecError> {
    let (name, version) = match package.split_once('=') {
        Some((name, version)) => (name, Some(version)),
        None => (package, None),
    };
    let name_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.len() >= 2
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(&b));
    let version_ok = version.is_none_or(|v| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+~:-".contains(&b))
    });
    if !name_ok || !version_ok || package.len() > MAX_PACKAGE_BYTES {
        return Err(SpecError::Package {
            field: "system_packages",
            package: shorten(package),
            rule: "a Debian package name (a-z, 0-9, '+', '.', '-'), optionally =version",
        });
    }
    Ok(())
}

fn shorten(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> PackageSources {
        PackageSources::default()
    }

    #[test]
    fn both_spellings_of_a_python_version_are_one() {
        let a = ImageSpec {
            python_version: Some("3.11".into()),
            ..ImageSpec::default()
        };
        let b = ImageSpec {
            python_version: Some("python3.11".into()),
            ..ImageSpec::default()
        };
        let (a, b) = (a.plan("python").unwrap(), b.plan("python").unwrap());
        assert_eq!(a, b);
        assert_eq!(a.python, Some(("3.11".into(), "bookworm".into())));
        assert_eq!(
            a.address("sha256:x", &sources()),
            b.address("sha256:x", &sources())
        );
    }

    #[test]
    fn another_python_version_lists_the_supported_ones() {
        let spec = ImageSpec {
            python_version: Some("3.9".into()),
            ..ImageSpec::default()
        };
        let message = spec.plan("python").unwrap_err().to_string();
        assert!(message.contains("3.11 (Debian bookworm)"), "{message}");
        assert!(message.contains("3.13 (Debian trixie)"), "{message}");
    }

    #[test]
    fn the_base_defaults_to_the_python_versions_then_the_daemons() {
        let trixie = ImageSpec {
            python_version: Some("3.13".into()),
            ..ImageSpec::default()
        };
        assert_eq!(
            trixie.plan("python").unwrap().base,
            "docker.io/library/debian:trixie"
        );
        assert_eq!(
            ImageSpec::default().plan("busybox").unwrap().base,
            "busybox"
        );
    }

    #[test]
    fn options_and_odd_names_are_not_packages() {
        for bad in ["-e", "--index-url=http://x", "a\nb", ""] {
            let spec = ImageSpec {
                python_packages: vec![bad.into()],
                ..ImageSpec::default()
            };
            assert!(spec.plan("python").is_err(), "{bad:?}");
        }
        for bad in ["-y", "Git", "g", "git;rm", "git=", "git=1 2"] {
            let spec = ImageSpec {
                system_packages: vec![bad.into()],
                ..ImageSpec::default()
            };
            assert!(spec.plan("python").is_err(), "{bad:?}");
        }
        // Positive control: ordinary packages pass.
        let spec = ImageSpec {
            python_packages: vec!["pandas==2.2.3".into(), "requests[socks] >= 2".into()],
            system_packages: vec!["git".into(), "libc6=2.36-9+deb12u4".into(), "g++".into()],
            ..ImageSpec::default()
        };
        spec.plan("python").unwrap();
    }

    #[test]
    fn workdir_is_absolute_without_parent_steps() {
        for bad in ["work", "/a/../b", ""] {
            let spec = ImageSpec {
                workdir: Some(bad.into()),
                ..ImageSpec::default()
            };
            assert!(spec.plan("python").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_address_follows_the_base_the_packages_and_the_sources() {
        let spec = ImageSpec {
            python_packages: vec!["pandas".into()],
            ..ImageSpec::default()
        };
        let plan = spec.plan("python").unwrap();
        let base = plan.address("sha256:a", &sources());
        assert_ne!(base, plan.address("sha256:b", &sources()));
        let other_index = PackageSources {
            pip_index_url: "http://10.0.0.1/simple".into(),
            ..sources()
        };
        assert_ne!(base, plan.address("sha256:a", &other_index));
        let mut more = plan.clone();
        more.python_packages.push("numpy".into());
        assert_ne!(base, more.address("sha256:a", &sources()));
        assert_eq!(base, plan.address("sha256:a", &sources()));
    }
}
