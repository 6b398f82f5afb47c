//! Process stdin: one writer task per process that applies WriteStdin and
//! CloseStdin in arrival order, writing without blocking the agent, and
//! refuses what is still queued once the process is gone.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use sandbox_proto::{AgentError, ErrorKind, Reply};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::{watch, OwnedSemaphorePermit};

use crate::agent::Agent;
use crate::fds;

pub enum StdinOp {
    Write(Vec<u8>),
    Close,
}

/// A queued request; the permit is its share of the in-flight budget, which
/// is what bounds this (otherwise unbounded) queue.
pub struct StdinJob {
    id: u64,
    op: StdinOp,
    permit: OwnedSemaphorePermit,
}

/// The ends of a process's stdin queue. `gone` fires (its sender is dropped)
/// when the process leaves the table.
pub struct StdinQueue {
    pub jobs: UnboundedReceiver<StdinJob>,
    pub gone: watch::Receiver<()>,
}

/// Makes the queue for a new process; the table keeps the two senders.
pub fn queue() -> (UnboundedSender<StdinJob>, watch::Sender<()>, StdinQueue) {
    let (jobs_tx, jobs) = mpsc::unbounded_channel();
    let (gone_tx, gone) = watch::channel(());
    (jobs_tx, gone_tx, StdinQueue { jobs, gone })
}

/// Routes a request to the process's writer.
pub fn submit(agent: &Arc<Agent>, id: u64, proc: u64, op: StdinOp, permit: OwnedSemaphorePermit) {
    let job = StdinJob { id, op, permit };
    let sender = agent.procs().stdin(proc);
    let (job, error) = match sender {
        Ok(sender) => match sender.send(job) {
            Ok(()) => return,
            Err(mpsc::error::SendError(job)) => (job, gone(proc)),
        },
        Err(e) => (job, e.into()),
    };
    agent.reply_later(job.id, Reply::Error(error), job.permit);
}

fn gone(proc: u64) -> AgentError {
    AgentError::new(
        ErrorKind::UnknownProcess,
        format!("process {proc} has exited or did not start"),
    )
}

/// Runs the writer for `proc`. With no descriptor (the spawn failed) it only
/// refuses what was queued.
pub fn start(agent: Arc<Agent>, proc: u64, fd: Option<OwnedFd>, mut queue: StdinQueue) {
    tokio::spawn(async move {
        let mut pipe = match fd.map(register).transpose() {
            Ok(pipe) => pipe,
            Err(e) => {
                eprintln!("sandbox-agent: stdin of process {proc}: {e}");
                None
            }
        };
        loop {
            let job = tokio::select! {
                biased;
                _ = queue.gone.changed() => break,
                job = queue.jobs.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
            };
            let result = match job.op {
                StdinOp::Write(data) => match &pipe {
                    Some(pipe) => tokio::select! {
                        biased;
                        _ = queue.gone.changed() => Err(gone(proc)),
                        written = write_all(pipe, &data) => written.map_err(|e| write_error(proc, e)),
                    },
                    None => Err(AgentError::new(
                        ErrorKind::InvalidInput,
                        format!("stdin of process {proc} is closed"),
                    )),
                },
                StdinOp::Close => {
                    pipe = None;
                    Ok(())
                }
            };
            let reply = match result {
                Ok(()) => Reply::Ok,
                Err(e) => Reply::Error(e),
            };
            let _ = agent.outbox.reply(job.id, reply).await;
            drop(job.permit);
        }
        drop(pipe);
        queue.jobs.close();
        while let Ok(job) = queue.jobs.try_recv() {
            let _ = agent.outbox.error(job.id, gone(proc)).await;
        }
    });
}

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    fds::set_nonblocking(fd.as_raw_fd(), true)?;
    fds::register(fd, Interest::WRITABLE)
}

fn write_error(proc: u64, err: io::Error) -> AgentError {
    if err.raw_os_error() == Some(libc::EPIPE) {
        return AgentError::new(
            ErrorKind::Other,
            format!("process {proc} has closed its stdin"),
        );
    }
    AgentError::new(
        ErrorKind::Other,
        format!("writing stdin of process {proc}: {err}"),
    )
}

async fn write_all(pipe: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let written = pipe
            .async_io(Interest::WRITABLE, |fd| {
                // SAFETY: writes at most data.len() bytes from a slice we borrow.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            })
            .await;
        match written {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
