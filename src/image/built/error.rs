//! Why a declarative image cannot be built as asked. Every message names
//! the field and what to write instead; all are the caller's to fix (400).

/// A spec that cannot be built as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("python_version {asked:?} is not offered; supported: {supported}")]
    PythonVersion { asked: String, supported: String },
    #[error("{field} has {count} entries; at most {max} are allowed")]
    TooMany {
        field: &'static str,
        count: usize,
        max: usize,
    },
    #[error("{field}: {package:?} is not {rule}")]
    Package {
        field: &'static str,
        package: String,
        rule: &'static str,
    },
    #[error("commands: {command:?} is empty, has a NUL or is over 64 KiB")]
    Command { command: String },
    #[error("env: {key:?}: names must be non-empty without '=' or NUL, values without NUL")]
    Env { key: String },
    #[error("workdir {dir:?} must be an absolute path without '..'")]
    Workdir { dir: String },
    #[error("base is empty; name an image (\"python\") or a registry reference (\"debian:bookworm\"), or leave it out")]
    EmptyBase,
    #[error("python_version needs a Debian base; {base} is {found}. Leave base out (the version's Debian base is used) or choose a Debian image")]
    NotDebian { base: String, found: String },
    #[error("python {version} comes with Debian {suite}, but {base} is Debian {base_suite}; leave base out, or set python_version to what {base_suite} ships ({ships})")]
    SuiteMismatch {
        version: String,
        suite: String,
        base: String,
        base_suite: String,
        ships: String,
    },
    #[error("system_packages need a Debian base with apt; {base} is {found}")]
    NoApt { base: String, found: String },
}
