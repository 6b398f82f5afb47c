//! Open file handles: the table of handle ids, and one worker task per handle
//! that applies its Write/Read/Close requests strictly in arrival order.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::Arc;

use sandbox_proto::{AgentError, Reply, MAX_CHUNK};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::OwnedSemaphorePermit;

use crate::agent::Agent;
use crate::files::{self, FileError};

/// Handles open at once.
pub const MAX_HANDLES: usize = 64;

pub enum HandleOp {
    Write(Vec<u8>),
    Read(u32),
    Close,
}

/// A queued request; the permit is the request's share of the in-flight budget.
pub struct HandleJob {
    id: u64,
    op: HandleOp,
    permit: OwnedSemaphorePermit,
}

#[derive(Default)]
pub struct HandleTable {
    last: u64,
    // Unbounded, but every queued job holds an in-flight permit, so the total is bounded.
    open: HashMap<u64, UnboundedSender<HandleJob>>,
}

/// Opens a file (for writing when `mode` is given) and replies with its handle.
pub async fn open(
    agent: Arc<Agent>,
    id: u64,
    path: String,
    mode: Option<u32>,
    permit: OwnedSemaphorePermit,
) {
    let reply = match open_handle(&agent, path, mode).await {
        Ok(reply) => reply,
        Err(e) => Reply::Error(e.into()),
    };
    let _ = agent.outbox.reply(id, reply).await;
    drop(permit);
}

async fn open_handle(
    agent: &Arc<Agent>,
    path: String,
    mode: Option<u32>,
) -> Result<Reply, FileError> {
    // Checked before opening too, so a refused OpenWrite does not truncate the file.
    if agent.handles().open.len() >= MAX_HANDLES {
        return Err(FileError::TooManyHandles(MAX_HANDLES));
    }
    let opened_path = path.clone();
    let (file, size) = tokio::task::spawn_blocking(move || match mode {
        Some(mode) => files::open_write(&opened_path, mode).map(|file| (file, 0)),
        None => files::open_read(&opened_path),
    })
    .await
    .map_err(|e| FileError::Io {
        path: path.clone(),
        source: io::Error::other(e.to_string()),
    })??;
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = {
        let mut table = agent.handles();
        if table.open.len() >= MAX_HANDLES {
            return Err(FileError::TooManyHandles(MAX_HANDLES));
        }
        table.last += 1;
        let handle = table.last;
        table.open.insert(handle, tx);
        handle
    };
    let worker = Worker {
        agent: agent.clone(),
        handle,
        path,
        writable: mode.is_some(),
    };
    tokio::spawn(worker.run(file, rx));
    Ok(Reply::Opened { handle, size })
}

/// Queues a request for its handle's worker; unknown handles are answered at once.
pub fn submit(
    agent: &Arc<Agent>,
    id: u64,
    handle: u64,
    op: HandleOp,
    permit: OwnedSemaphorePermit,
) {
    let sender = {
        let mut table = agent.handles();
        // Close removes the handle now, so requests after it are refused even
        // while the worker is still finishing the ones before it.
        if matches!(op, HandleOp::Close) {
            table.open.remove(&handle)
        } else {
            table.open.get(&handle).cloned()
        }
    };
    let job = HandleJob { id, op, permit };
    let refused = match sender {
        Some(sender) => match sender.send(job) {
            Ok(()) => return,
            Err(mpsc::error::SendError(job)) => job,
        },
        None => job,
    };
    let error = AgentError::from(FileError::UnknownHandle(handle));
    agent.reply_later(refused.id, Reply::Error(error), refused.permit);
}

struct Worker {
    agent: Arc<Agent>,
    handle: u64,
    path: String,
    writable: bool,
}

impl Worker {
    async fn run(self, file: File, mut jobs: UnboundedReceiver<HandleJob>) {
        let mut file = Some(Arc::new(file));
        while let Some(job) = jobs.recv().await {
            let result = match (job.op, &file) {
                (_, None) => Err(FileError::UnknownHandle(self.handle)),
                (HandleOp::Write(data), Some(f)) => self.write(f.clone(), data).await,
                (HandleOp::Read(max), Some(f)) => self.read(f.clone(), max).await,
                (HandleOp::Close, Some(_)) => match file.take() {
                    Some(f) => self.close(f),
                    None => Err(FileError::UnknownHandle(self.handle)),
                },
            };
            let reply = result.unwrap_or_else(|e| Reply::Error(e.into()));
            let _ = self.agent.outbox.reply(job.id, reply).await;
            drop(job.permit);
        }
    }

    async fn write(&self, file: Arc<File>, data: Vec<u8>) -> Result<Reply, FileError> {
        if !self.writable {
            return Err(FileError::WrongMode(self.handle, "writing"));
        }
        self.blocking(move || (&*file).write_all(&data)).await?;
        Ok(Reply::Ok)
    }

    async fn read(&self, file: Arc<File>, max: u32) -> Result<Reply, FileError> {
        if self.writable {
            return Err(FileError::WrongMode(self.handle, "reading"));
        }
        let max = usize::try_from(max).unwrap_or(MAX_CHUNK).min(MAX_CHUNK);
        let data = self.blocking(move || read_up_to(&file, max)).await?;
        Ok(Reply::Data(data))
    }

    /// Closes without fsync: the sandbox's disk does not outlive it, a
    /// snapshot captures the page cache, and every process in the sandbox
    /// sees the data as soon as write returns. close() errors are reported.
    fn close(&self, file: Arc<File>) -> Result<Reply, FileError> {
        // No blocking call holds a clone any more: each was awaited.
        let Ok(file) = Arc::try_unwrap(file) else {
            return Ok(Reply::Ok);
        };
        let raw = OwnedFd::from(file).into_raw_fd();
        // SAFETY: `raw` came out of an OwnedFd just now, so this is its only owner
        // and it is closed exactly once.
        if unsafe { libc::close(raw) } < 0 {
            return Err(self.io(io::Error::last_os_error()));
        }
        Ok(Reply::Ok)
    }

    async fn blocking<T, F>(&self, call: F) -> Result<T, FileError>
    where
        T: Send + 'static,
        F: FnOnce() -> io::Result<T> + Send + 'static,
    {
        match tokio::task::spawn_blocking(call).await {
            Ok(result) => result.map_err(|e| self.io(e)),
            Err(e) => Err(self.io(io::Error::other(e.to_string()))),
        }
    }

    fn io(&self, source: io::Error) -> FileError {
        FileError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// Fills up to `max` bytes, stopping early only at end of file.
fn read_up_to(mut file: &File, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut filled = 0;
    while filled < max {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}
