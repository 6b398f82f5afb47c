//! The agent's shared state (outbox, process table, file handles, request
//! budget) and its lifecycle: start the writer and the reaper, say Hello, serve
//! requests until the link ends, then kill what is left.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use sandbox_proto::{AgentMessage, Reply, PROTOCOL_VERSION};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::dispatch;
use crate::handles::HandleTable;
use crate::link::{self, Link, LinkError, Outbox};
use crate::process::ProcTable;
use crate::reaper;

/// Requests being worked on at once; more are refused rather than queued, so a
/// flood of requests costs bounded memory.
pub const MAX_IN_FLIGHT: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("setting up: {0}")]
    Setup(#[source] io::Error),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("link writer failed: {0}")]
    Writer(String),
}

pub struct Agent {
    pub outbox: Outbox,
    procs: Mutex<ProcTable>,
    handles: Mutex<HandleTable>,
    pub in_flight: Arc<Semaphore>,
    /// Spawns hold it shared from fork until their pid is in the table; the
    /// reaper takes it exclusively. Without it the reaper could collect a child
    /// before it is known (losing its Exit), or collect a child whose exec
    /// failed before std's own waitpid for it.
    pub spawn_gate: tokio::sync::RwLock<()>,
}

impl Agent {
    fn new(outbox: Outbox) -> Self {
        Self {
            outbox,
            procs: Mutex::new(ProcTable::default()),
            handles: Mutex::new(HandleTable::default()),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            spawn_gate: tokio::sync::RwLock::new(()),
        }
    }

    // A panic while holding a table lock leaves the table consistent enough
    // (every update is a single map operation), so poisoning is ignored.
    pub fn procs(&self) -> MutexGuard<'_, ProcTable> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn handles(&self) -> MutexGuard<'_, HandleTable> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a reply from its own task, so the caller (the frame reader) never
    /// waits for the outbox; the request's budget is released once it is queued.
    pub fn reply_later(&self, id: u64, reply: Reply, permit: OwnedSemaphorePermit) {
        let outbox = self.outbox.clone();
        tokio::spawn(async move {
            let _ = outbox.reply(id, reply).await;
            drop(permit);
        });
    }
}

/// Dials the host again once a link is gone; a microVM's agent has one.
pub type Redial = fn() -> io::Result<OwnedFd>;

/// Runs the agent on an open link until the host goes away (Ok) or the link
/// breaks the protocol (Err). With `redial` (a microVM's agent) a link the
/// host dropped is followed by a new one, served by the same agent with its
/// processes and handles: a VM restored from a snapshot finds its vsock
/// connection reset and must go on where the snapshot left it. The host
/// learns of each link from its Hello.
pub async fn run(link_fd: OwnedFd, redial: Option<Redial>) -> Result<(), RunError> {
    // Registered before the first spawn so no child's SIGCHLD is missed.
    let sigchld = signal(SignalKind::child()).map_err(RunError::Setup)?;
    let (outbox, frames) = Outbox::new();
    let frames: link::Frames = Arc::new(tokio::sync::Mutex::new(frames));
    let agent = Arc::new(Agent::new(outbox));
    tokio::spawn(reaper::run(agent.clone(), sigchld));
    let mut link_fd = link_fd;
    let result = loop {
        if let Err(e) = serve_link(&agent, link_fd, frames.clone()).await {
            break Err(e);
        }
        let Some(redial) = redial else { break Ok(()) };
        link_fd = match tokio::task::spawn_blocking(redial).await {
            Ok(Ok(fd)) => fd,
            // No host to serve any more: the VM is being stopped.
            Ok(Err(_)) => break Ok(()),
            Err(e) => break Err(RunError::Writer(e.to_string())),
        };
    };
    // As PID 1 the kernel would kill everything anyway; outside a pid namespace
    // (tests) this keeps processes from outliving the agent.
    agent.procs().kill_all();
    result
}

/// Serves one link: Hello first (ahead of anything queued for the host
/// meanwhile), then requests and the outbox until the host goes (Ok).
async fn serve_link(
    agent: &Arc<Agent>,
    link_fd: OwnedFd,
    frames: link::Frames,
) -> Result<(), RunError> {
    let link = Arc::new(Link::new(link_fd).map_err(RunError::Setup)?);
    let hello = sandbox_proto::encode(&AgentMessage::Hello {
        version: PROTOCOL_VERSION,
    })
    .map_err(|e| RunError::Writer(e.to_string()))?;
    match link.write_all(&hello).await {
        Ok(()) => {}
        Err(e) if host_gone(&e) => return Ok(()),
        Err(e) => return Err(RunError::Link(LinkError::Io(e))),
    }
    let mut writer = tokio::spawn(link::write_loop(link.clone(), frames));
    let result = tokio::select! {
        served = dispatch::serve(agent.clone(), link) => match served {
            Err(LinkError::Io(e)) if host_gone(&e) => Ok(()),
            other => other.map_err(RunError::from),
        },
        written = &mut writer => match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if host_gone(&e) => Ok(()),
            Ok(Err(e)) => Err(RunError::Link(LinkError::Io(e))),
            Err(e) => Err(RunError::Writer(e.to_string())),
        },
    };
    // The writer holds the outbox's queue; the next link's takes it over.
    writer.abort();
    let _ = writer.await;
    result
}

fn host_gone(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
    )
}
