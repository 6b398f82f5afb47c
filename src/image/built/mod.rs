//! Declarative images: a spec (`{"base": ..., "python_version": "3.11",
//! "python_packages": [...], "system_packages": [...], "commands": [...],
//! "env": {...}, "workdir": ...}`) is built once per content address (the
//! spec, its base's digest, the package sources) in a build sandbox and
//! kept as one more overlay layer over its base.
//!
//! This module is the build's plan and its record: validating a spec
//! ([`spec`]), what the base is (read with [`crate::image::Layered`]), the steps to run
//! ([`steps`]), the hosts a build may reach ([`sources`]) and the built
//! images on disk ([`store`]). Running a build is the sandbox manager's
//! (`sandbox/builds.rs`): it needs a sandbox.

mod error;
pub mod sources;
pub mod spec;
pub mod steps;
pub mod store;

pub use error::SpecError;
pub use sources::PackageSources;
pub use spec::{ImageSpec, Plan};
pub use store::{BuiltImage, BuiltStore};

/// Checks `plan` against its resolved base `base` (named `base_name`):
/// a Python version needs a Debian base of the suite that ships it, and
/// system packages need apt. Returns whether the base has the asked
/// Python already.
pub fn check_base(
    plan: &Plan,
    base_name: &str,
    base: &crate::image::Layered,
) -> Result<bool, SpecError> {
    let release = base.os_release();
    let found = || match &release {
        Some(r) => format!(
            "{}{}",
            r.id,
            r.codename
                .as_deref()
                .map(|c| format!(" {c}"))
                .unwrap_or_default()
        ),
        None => "an image without /etc/os-release".to_string(),
    };
    let debian = release.as_ref().filter(|r| r.id == "debian");
    if let Some((version, suite)) = &plan.python {
        let Some(debian) = debian else {
            return Err(SpecError::NotDebian {
                base: base_name.to_string(),
                found: found(),
            });
        };
        let base_suite = debian.codename.clone().unwrap_or_default();
        if &base_suite != suite {
            let ships = spec::PYTHON_VERSIONS
                .iter()
                .find(|p| p.suite == base_suite)
                .map(|p| p.version.to_string())
                .unwrap_or_else(|| "none of the supported versions".to_string());
            return Err(SpecError::SuiteMismatch {
                version: version.clone(),
                suite: suite.clone(),
                base: base_name.to_string(),
                base_suite: if base_suite.is_empty() {
                    "of an unnamed release".into()
                } else {
                    base_suite
                },
                ships,
            });
        }
    }
    let python_installed = match &plan.python {
        Some((version, _)) => base.find(&format!("usr/bin/python{version}")).is_some(),
        None => true,
    };
    if plan.uses_apt(python_installed) && base.find("usr/bin/apt-get").is_none() {
        return Err(SpecError::NoApt {
            base: base_name.to_string(),
            found: found(),
        });
    }
    Ok(python_installed)
}
