//! The control socket (`--control-sock PATH`): a Unix stream socket the
//! daemon's supervisor uses to pause, resume and snapshot a running VM.
//!
//! Protocol: one command per line, one answer line per command.
//!
//! ```text
//! pause            -> ok
//! resume           -> ok
//! status           -> ok running | ok paused
//! snapshot DIR     -> ok <bytes-written> <ms>     (the VM stays paused)
//! attach-disk N    -> ok <sectors>   (a read-only descriptor rides with the
//!                                     line as SCM_RIGHTS; N is an empty slot)
//! detach-disk N    -> ok 0
//! anything else    -> error <message>
//! ```
//!
//! The jailed VMM can open nothing new, so a disk for a slot comes as a
//! descriptor the supervisor opened: descriptors received on a connection
//! wait, oldest first, for the `attach-disk` that takes them.
//!
//! Lines are at most [`MAX_LINE`] bytes (a longer one is answered with an
//! error and the connection closed); at most [`MAX_CLIENTS`] connections at
//! once. Commands from all connections are serialised by the handle.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::handle::MachineHandle;

/// Longest command line accepted (a snapshot path fits easily).
pub const MAX_LINE: usize = 4096;
/// Most connections served at once.
pub const MAX_CLIENTS: usize = 4;
/// Most received descriptors waiting for their command on one connection.
const MAX_PENDING_FDS: usize = 4;

/// A connection's byte stream that keeps the descriptors arriving with it.
struct FdStream {
    stream: UnixStream,
    pending: VecDeque<File>,
}

impl Read for FdStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (n, file) = self
            .stream
            .recv_with_fd(buf)
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        if let Some(file) = file {
            // Beyond the cap a descriptor is closed: a client sending them
            // without commands gets no more held for it.
            if self.pending.len() < MAX_PENDING_FDS {
                self.pending.push_back(file);
            }
        }
        Ok(n)
    }
}

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket: remove it or choose another --control-sock")]
    PathExists(String),
    /// bind/listen or the thread failed.
    #[error("cannot listen on control socket {path}: {source}; check that its directory exists and is writable")]
    Listen {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A listening control socket; dropping it stops accepting and removes the
/// socket file.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    listener: UnixListener,
    ino: u64,
}

impl ControlServer {
    /// Listens on `path` (a stale socket there is replaced) and serves
    /// `handle` on a thread.
    pub fn spawn(path: &Path, handle: MachineHandle) -> Result<Self, ControlError> {
        let display = path.display().to_string();
        let listen = |source| ControlError::Listen {
            path: display.clone(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(listen)?,
            Ok(_) => return Err(ControlError::PathExists(display)),
            Err(_) => {}
        }
        let listener = UnixListener::bind(path).map_err(listen)?;
        let ino = std::fs::metadata(path).map_err(listen)?.ino();
        let accept = listener.try_clone().map_err(listen)?;
        thread::Builder::new()
            .name("vmm-control".into())
            .spawn(move || accept_loop(&accept, &handle))
            .map_err(listen)?;
        Ok(ControlServer {
            path: path.to_owned(),
            listener,
            ino,
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        // SAFETY: shutdown(2) on a socket this server owns; it makes the
        // accept thread's blocked accept(2) return, ending that thread.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        // Remove the path only if it is still this server's socket.
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(listener: &UnixListener, handle: &MachineHandle) {
    let clients = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else {
            // Shut down (the server was dropped) or out of descriptors.
            return;
        };
        if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.write_all(b"error too many control connections; close one\n");
            continue;
        }
        let handle = handle.clone();
        let count = clients.clone();
        let spawned = thread::Builder::new()
            .name("vmm-control-conn".into())
            .spawn(move || {
                serve(stream, &handle);
                count.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            clients.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one line of at most MAX_LINE bytes; `Ok(None)` at EOF.
fn read_line(reader: &mut impl BufRead) -> io::Result<Option<Result<String, ()>>> {
    let mut buf = Vec::new();
    let n = reader
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        // Too long, or EOF in the middle of a line.
        return Ok(Some(Err(())));
    }
    buf.pop();
    Ok(Some(String::from_utf8(buf).map_err(|_| ())))
}

fn serve(stream: UnixStream, handle: &MachineHandle) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut out = write_half;
    let mut reader = BufReader::new(FdStream {
        stream,
        pending: VecDeque::new(),
    });
    loop {
        let reply = match read_line(&mut reader) {
            Ok(None) | Err(_) => return,
            Ok(Some(Err(()))) => {
                let _ = out.write_all(
                    format!("error command line longer than {MAX_LINE} bytes or not UTF-8\n")
                        .as_bytes(),
                );
                return;
            }
            Ok(Some(Ok(line))) => {
                let pending = &mut reader.get_mut().pending;
                let reply = execute_with(line.trim_end_matches('\r'), handle, pending);
                // A descriptor belongs to the line it came with: one left
                // by a refused command never reaches a later attach.
                pending.clear();
                reply
            }
        };
        if out.write_all(format!("{reply}\n").as_bytes()).is_err() {
            return;
        }
    }
}

/// Runs one command that needs no descriptor; returns the answer line
/// (without newline).
pub fn execute(line: &str, handle: &MachineHandle) -> String {
    execute_with(line, handle, &mut VecDeque::new())
}

/// Runs one command, taking the oldest of `pending` for an `attach-disk`.
fn execute_with(line: &str, handle: &MachineHandle, pending: &mut VecDeque<File>) -> String {
    let (cmd, arg) = line.split_once(' ').unwrap_or((line, ""));
    let slot = |arg: &str| {
        arg.parse::<usize>()
            .map_err(|_| format!("error {cmd} takes a disk number, got {arg:?}"))
    };
    match cmd {
        "attach-disk" => {
            let disk = match slot(arg.trim()) {
                Ok(disk) => disk,
                Err(e) => return e,
            };
            let Some(file) = pending.pop_front() else {
                return "error attach-disk needs a read-only disk descriptor sent with its line (SCM_RIGHTS)".into();
            };
            return match handle.change_medium(disk, Some(file)) {
                Ok(sectors) => format!("ok {sectors}"),
                Err(e) => format!("error {}", e.to_string().replace('\n', " ")),
            };
        }
        "detach-disk" => {
            return match slot(arg.trim()).map(|disk| handle.change_medium(disk, None)) {
                Ok(Ok(sectors)) => format!("ok {sectors}"),
                Ok(Err(e)) => format!("error {}", e.to_string().replace('\n', " ")),
                Err(e) => e,
            };
        }
        _ => {}
    }
    let result = match (cmd, arg.trim()) {
        ("pause", "") => handle.pause().map(|()| "ok".to_owned()),
        ("resume", "") => handle.resume().map(|()| "ok".to_owned()),
        ("status", "") => Ok(if handle.is_paused() {
            "ok paused".to_owned()
        } else {
            "ok running".to_owned()
        }),
        ("snapshot", dir) if !dir.is_empty() => handle.snapshot(Path::new(dir)).map(|r| {
            format!(
                "ok {} {:.3}",
                r.bytes_written,
                r.elapsed.as_secs_f64() * 1000.0
            )
        }),
        _ => {
            return format!(
                "error unknown command {line:?}: use pause, resume, status, snapshot DIR, attach-disk N or detach-disk N"
            )
        }
    };
    result.unwrap_or_else(|e| format!("error {}", e.to_string().replace('\n', " ")))
}
