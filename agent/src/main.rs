//! sandbox-agent: PID 1 of every sandbox.
//!
//! The container runtime starts it with a connected stream socket to the host
//! on fd 3 (`SANDBOX_AGENT_FD` overrides the number). In a microVM the guest
//! kernel starts it as init with `SANDBOX_AGENT_VM=1`; it then builds its own
//! root and connects to the host over vsock first (`vm_init`). It greets the
//! host with `Hello`, then serves the agent protocol from `sandbox-proto`: it spawns processes (each in its own session,
//! cgroup and credentials, optionally on a PTY or from run-code), streams their
//! output and exit status, feeds their stdin, delivers signals, and reads and
//! writes files. As PID 1 it reaps every process in the sandbox. When the link
//! closes, the agent exits, which tears the sandbox down.
//!
//! Every buffer is bounded: frames by `MAX_FRAME`, queued descriptors, live
//! processes, open handles and in-flight requests by fixed limits, and output by
//! a small outbox that pushes back on the processes when the host reads slowly.
//!
//! It is built as a static binary (`-C target-feature=+crt-static`) and needs
//! nothing from the image: no NSS, no shared libraries.

mod agent;
mod codefile;
mod dispatch;
mod errors;
mod fds;
mod files;
mod forward;
mod guest_groups;
mod guest_roots;
mod guest_volumes;
mod handles;
mod launch;
mod link;
mod listening;
mod output;
mod process;
mod pty;
mod reaper;
mod stdin;
mod vm_init;
mod volume_replace;
mod warm;

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use sandbox_proto::{AGENT_LINK_ENV, AGENT_LINK_FD};

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{AGENT_LINK_ENV}={0:?} is not a descriptor number")]
    BadFdVariable(String),
    #[error("link descriptor {0} is not open: {1}")]
    LinkNotOpen(RawFd, io::Error),
    #[error("starting the runtime: {0}")]
    Runtime(io::Error),
    #[error(transparent)]
    Run(#[from] agent::RunError),
}

fn main() {
    if vm_init::requested() {
        vm_main();
    }
    let code = match start() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandbox-agent: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn start() -> Result<(), StartError> {
    let fd = link_fd()?;
    // SAFETY: F_GETFD only inspects the descriptor number.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(StartError::LinkNotOpen(fd, io::Error::last_os_error()));
    }
    fill_standard_fds();
    // SAFETY: this descriptor was handed to the agent at exec as its link;
    // nothing else in the process refers to it, so the agent owns it.
    let link = unsafe { OwnedFd::from_raw_fd(fd) };
    serve(link, None)
}

/// PID 1 of a microVM: build the root, connect, serve, and end the VM when
/// the link ends or anything fails (init must not exit).
fn vm_main() -> ! {
    // A panic here would end init and panic the kernel; catching it (the
    // default hook has already printed it on the console) ends the VM the
    // same way as any other failure.
    let ran = std::panic::catch_unwind(|| match vm_init::boot() {
        Ok(link) => {
            fill_standard_fds();
            if let Err(e) = serve(link, Some(vm_init::redial)) {
                vm_init::console(&format!("sandbox-agent: {e}; shutting the VM down"));
            }
        }
        Err(e) => vm_init::console(&format!(
            "sandbox-agent: VM init failed: {e}; shutting the VM down"
        )),
    });
    if ran.is_err() {
        vm_init::console("sandbox-agent: panicked (see above); shutting the VM down");
    }
    vm_init::shut_down()
}

/// Serves the protocol on a connected link until it ends (and with
/// `redial`, on the links after it).
fn serve(link: OwnedFd, redial: Option<agent::Redial>) -> Result<(), StartError> {
    mark_inherited_cloexec();
    become_subreaper();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let result = runtime.block_on(agent::run(link, redial));
    // Do not wait for blocking file operations that may never return (a hung
    // filesystem): the agent is exiting either way.
    runtime.shutdown_background();
    Ok(result?)
}

fn link_fd() -> Result<RawFd, StartError> {
    match std::env::var(AGENT_LINK_ENV) {
        Ok(value) => match value.trim().parse::<RawFd>() {
            Ok(fd) if fd >= 0 => Ok(fd),
            _ => Err(StartError::BadFdVariable(value)),
        },
        Err(_) => Ok(AGENT_LINK_FD),
    }
}

/// Opens /dev/null on any of fds 0-2 that are closed, so no pipe or file the
/// agent opens later lands there and receives its diagnostics.
fn fill_standard_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only inspects the descriptor number.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 {
            continue;
        }
        // open returns the lowest free number, which is `fd` here; it stays
        // open for the agent's life on purpose.
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            std::mem::forget(OwnedFd::from(null));
        }
    }
}

/// Whatever else the runtime left open must not leak into spawned processes.
fn mark_inherited_cloexec() {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on open
    // descriptors; failure (an old kernel) leaves them as they were.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
}

/// Outside a pid namespace (tests, debugging) orphans would go to the real
/// init; as a subreaper the agent still reaps them. A no-op as PID 1.
fn become_subreaper() {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
}
