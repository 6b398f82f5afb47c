//! nftables in this process: the system's `libnftables.so.1` (what the
//! `nft` binary itself runs on, in Debian's `libnftables1`), loaded once
//! with dlopen, running an nft document inside a given network namespace.
//! It spares every namespace an `nft` process (about 4 ms of exec, dynamic
//! linking and library start-up per namespace on the dev host, against
//! under 1 ms for the same ruleset here). Where the library cannot be
//! loaded, [`library`] says so and callers run the binary instead.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, OnceLock};

/// The soname Debian's `libnftables1` installs (ABI 1 since nftables 0.9).
const SONAME: &str = "libnftables.so.1";
/// `NFT_CTX_DEFAULT` for `nft_ctx_new`.
const NFT_CTX_DEFAULT: u32 = 0;
/// `NFT_CTX_OUTPUT_JSON`: JSON out, and input read as JSON, as `nft -j`.
const NFT_CTX_OUTPUT_JSON: c_uint = 1 << 4;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type SetFlags = unsafe extern "C" fn(*mut c_void, c_uint);
type Buffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// The library's entry points this module calls, resolved once.
pub struct Library {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    output_set_flags: SetFlags,
    buffer_output: Buffer,
    buffer_error: Buffer,
    get_output_buffer: GetBuffer,
    get_error_buffer: GetBuffer,
    run_cmd_from_buffer: RunCmd,
    /// One run at a time: a context is never shared, but every run fills
    /// and releases process-wide state of the library's (its interface
    /// cache, among others).
    runs: Mutex<()>,
    /// Keeps the entry points above mapped.
    _lib: libloading::Library,
}

/// Why a run in the library failed.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("entering the network namespace: {0}")]
    Setns(std::io::Error),
    #[error("the nft document holds a NUL byte")]
    Nul,
    #[error("making the thread that enters the namespace: {0}")]
    Thread(std::io::Error),
    #[error("giving the thread a descriptor table of its own: {0}")]
    Unshare(std::io::Error),
    #[error("no netlink socket can be opened (the library would exit the process): {0}")]
    Netlink(std::io::Error),
    #[error("could not make a context or its output buffers")]
    Context,
    #[error("the document was refused: {0}")]
    Refused(String),
    #[error("the thread running it panicked")]
    Panicked,
}

/// The loaded library, or `None` where it is not installed (or lacks an
/// entry point), once per process.
pub fn library() -> Option<&'static Library> {
    static LOADED: OnceLock<Option<Library>> = OnceLock::new();
    LOADED
        .get_or_init(|| match Library::load() {
            Ok(lib) => Some(lib),
            Err(e) => {
                tracing::info!(
                    "libnftables not loaded ({e}); rules are loaded with the nft binary"
                );
                None
            }
        })
        .as_ref()
}

impl Library {
    fn load() -> Result<Library, libloading::Error> {
        // SAFETY: loading libnftables runs its ELF constructors, which only
        // set up its own state; the symbols are read with the types of
        // <nftables/libnftables.h>, unchanged across ABI 1.
        unsafe {
            let lib = libloading::Library::new(SONAME)?;
            Ok(Library {
                ctx_new: *lib.get::<CtxNew>(b"nft_ctx_new\0")?,
                ctx_free: *lib.get::<CtxFree>(b"nft_ctx_free\0")?,
                output_set_flags: *lib.get::<SetFlags>(b"nft_ctx_output_set_flags\0")?,
                buffer_output: *lib.get::<Buffer>(b"nft_ctx_buffer_output\0")?,
                buffer_error: *lib.get::<Buffer>(b"nft_ctx_buffer_error\0")?,
                get_output_buffer: *lib.get::<GetBuffer>(b"nft_ctx_get_output_buffer\0")?,
                get_error_buffer: *lib.get::<GetBuffer>(b"nft_ctx_get_error_buffer\0")?,
                run_cmd_from_buffer: *lib.get::<RunCmd>(b"nft_run_cmd_from_buffer\0")?,
                runs: Mutex::new(()),
                _lib: lib,
            })
        }
    }

    /// Runs `document` (nft JSON, or a command such as `list ruleset`)
    /// inside the network namespace `netns`; returns what nft printed, as
    /// JSON. The run happens on a thread of its own that first takes a
    /// descriptor table of its own (the library opens its netlink sockets
    /// without close-on-exec, and a process another thread spawns meanwhile
    /// must not inherit a root-owned socket into a namespace that becomes a
    /// sandbox's), then enters the namespace (its sockets are opened there)
    /// and ends, so no other thread changes namespace or sees its sockets.
    pub fn run_in(&self, netns: &File, document: &str) -> Result<String, LibraryError> {
        let document = CString::new(document).map_err(|_| LibraryError::Nul)?;
        let netns = netns.as_raw_fd();
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("libnftables".into())
                .spawn_scoped(scope, || {
                    // SAFETY: unshare(CLONE_FILES) gives this thread a copy
                    // of the descriptor table, which every descriptor the
                    // rest of the process owns keeps its own entry in.
                    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
                        return Err(LibraryError::Unshare(std::io::Error::last_os_error()));
                    }
                    // SAFETY: `netns` is the caller's namespace descriptor,
                    // open for the whole scope (and copied into this
                    // thread's table); setns changes this thread alone.
                    if unsafe { libc::setns(netns, libc::CLONE_NEWNET) } != 0 {
                        return Err(LibraryError::Setns(std::io::Error::last_os_error()));
                    }
                    netlink_available()?;
                    self.run(&document)
                })
                .map_err(LibraryError::Thread)?
                .join()
                .unwrap_or(Err(LibraryError::Panicked))
        })
    }

    fn run(&self, document: &CStr) -> Result<String, LibraryError> {
        let _one = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the context is made, used and freed here alone; the
        // buffers it returns are NUL-terminated strings it owns, copied
        // out before it is freed.
        unsafe {
            let ctx = (self.ctx_new)(NFT_CTX_DEFAULT);
            if ctx.is_null() {
                return Err(LibraryError::Context);
            }
            (self.output_set_flags)(ctx, NFT_CTX_OUTPUT_JSON);
            // Unbuffered, it would print to the daemon's own stdout.
            if (self.buffer_output)(ctx) != 0 || (self.buffer_error)(ctx) != 0 {
                (self.ctx_free)(ctx);
                return Err(LibraryError::Context);
            }
            let status = (self.run_cmd_from_buffer)(ctx, document.as_ptr());
            let text = |buffer: *const c_char| {
                if buffer.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(buffer).to_string_lossy().into_owned()
                }
            };
            let result = if status == 0 {
                Ok(text((self.get_output_buffer)(ctx)))
            } else {
                Err(LibraryError::Refused(
                    text((self.get_error_buffer)(ctx)).trim().to_string(),
                ))
            };
            (self.ctx_free)(ctx);
            result
        }
    }
}

/// Whether this thread can open the netlink sockets a run needs: the
/// library exits the process when it cannot (1.0.x `netlink_init_error`).
/// The thread's descriptor table is its own, so what succeeds here still
/// succeeds when the library opens the same sockets.
fn netlink_available() -> Result<(), LibraryError> {
    for protocol in [libc::NETLINK_NETFILTER, libc::NETLINK_ROUTE] {
        // SAFETY: socket takes plain integers and returns a new descriptor
        // or -1; the descriptor is closed at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(LibraryError::Netlink(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just opened here and nothing else holds it.
        unsafe { libc::close(fd) };
    }
    Ok(())
}
