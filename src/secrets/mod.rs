//! Brokered secrets, on the daemon's side: the store of named secrets whose
//! values are sealed at rest ([`seal`]) and never shown, what a name, host
//! and value may be ([`spec`]), the CA whose leaves the sandboxes' proxies
//! present for bound hosts ([`authority`]), and [`SecretBroker`], which
//! binds secrets to sandboxes as per-sandbox placeholders and builds what a
//! supervisor is told ([`crate::net::intercept::Brokered`]).

pub mod authority;
mod broker;
pub mod seal;
pub mod spec;

pub use broker::{
    binding_env, ImageTrustBundle, NewSecret, SecretBinding, SecretBroker, SecretChange,
    SecretError, SecretInfo, PLACEHOLDER_PREFIX, TRUST_BUNDLE_PATH, TRUST_ENV,
};

/// Marks the calling process non-dumpable: no core dump of a process that
/// holds secrets' values, and its memory and /proc files are closed to
/// everyone without CAP_SYS_PTRACE. A later execve resets it.
pub fn make_undumpable() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
