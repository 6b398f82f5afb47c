//! Output readers: one task per stdout/stderr pipe (or PTY master) that
//! forwards what the process writes as Output messages, in order, and stops
//! at EOF or when the process's supervisor gives up on the pipe.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use sandbox_proto::{AgentMessage, Stream, MAX_CHUNK};
use tokio::io::Interest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::agent::Agent;
use crate::fds;

/// Bytes per Output message.
pub const READ_CHUNK: usize = 64 * 1024;
const _: () = assert!(READ_CHUNK <= MAX_CHUNK);

/// What a stopped reader still forwards of what is already in its pipe:
/// the most an unprivileged process can make a pipe hold (Linux's default
/// `pipe-max-size`), so a writer that never stops cannot keep it going.
/// (Root in a microVM guest may grow its pipe past it; the rest is cut.)
const DRAIN_LIMIT: usize = 1024 * 1024;

/// Starts forwarding `fd`. The task ends at EOF, when the link is gone, or when
/// `stop` turns true (a descendant kept the pipe open after the process exited).
pub fn start(
    agent: &Arc<Agent>,
    proc: u64,
    stream: Stream,
    fd: OwnedFd,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let agent = agent.clone();
    tokio::spawn(async move {
        if let Err(e) = forward(&agent, proc, stream, fd, stop).await {
            eprintln!("sandbox-agent: reading {stream:?} of process {proc}: {e}");
        }
    })
}

async fn forward(
    agent: &Agent,
    proc: u64,
    stream: Stream,
    fd: OwnedFd,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    fds::set_nonblocking(fd.as_raw_fd(), true)?;
    let fd = fds::register(fd, Interest::READABLE)?;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let read = tokio::select! {
            // Checked first so a pipe that never runs dry still stops.
            biased;
            _ = stop.wait_for(|stop| *stop) => None,
            read = fd.async_io(Interest::READABLE, |fd| read(fd.as_raw_fd(), &mut buf)) => Some(read),
        };
        let Some(read) = read else {
            return drain(agent, proc, stream, fd.get_ref().as_raw_fd(), &mut buf).await;
        };
        match read {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if !send(agent, proc, stream, &buf[..n]).await {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A PTY master reads EIO once every slave descriptor is closed: EOF.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Forwards one chunk; false once the link is gone.
async fn send(agent: &Agent, proc: u64, stream: Stream, data: &[u8]) -> bool {
    let message = AgentMessage::Output {
        proc,
        stream,
        data: data.to_vec(),
    };
    agent.outbox.send(&message).await.is_ok()
}

/// After a stop: what the process wrote before it ended may still sit in
/// the pipe, unread only because this task had not run yet (a busy or slow
/// guest); it is forwarded, up to [`DRAIN_LIMIT`], without waiting for more.
async fn drain(
    agent: &Agent,
    proc: u64,
    stream: Stream,
    fd: i32,
    buf: &mut [u8],
) -> io::Result<()> {
    let mut drained = 0;
    while drained < DRAIN_LIMIT {
        // The descriptor is non-blocking: an empty pipe is EAGAIN.
        match read(fd, buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                drained += n;
                if !send(agent, proc, stream, &buf[..n]).await {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reads at most buf.len() bytes into a buffer we exclusively borrow.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}
