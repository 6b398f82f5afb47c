//! pathrs' handle on `/proc`, made once per supervisor before its create.
//!
//! libcontainer and libcgroups open every `/proc` file through pathrs,
//! which mounts a private, detached procfs (`fsopen`, `fsmount`) the first
//! time a process asks and keeps it for the process's life. The first to
//! ask in a create was libcontainer's intermediate process, so each create
//! mounted a procfs there and dissolved it again when that process exited.
//! Made in the supervisor, the handle is what the intermediate and init
//! processes (clones of it) find already made.

/// Makes the process's procfs handle; a failure only leaves the making to
/// whoever asks first, as before.
pub fn prepare() {
    if let Err(e) = pathrs::procfs::ProcfsHandle::new() {
        tracing::debug!("making pathrs' procfs handle ahead of the create: {e}");
    }
}
