//! The link to the host: the socket itself (receiving bytes together with
//! SCM_RIGHTS descriptors, writing whole frames), the FIFO queue of received
//! descriptors, and the outbox through which every task sends its messages to
//! the single writer.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};
use sandbox_proto::{encode, AgentError, AgentMessage, ErrorKind, FrameError, Reply};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

use crate::fds;

/// Descriptors the host may have queued ahead of the Spawn frames that claim them.
pub const MAX_QUEUED_FDS: usize = 16;

/// Queue entries, claimed or overflowed, before the link is considered abusive.
/// Overflowed descriptors keep a placeholder so later spawns still line up with
/// the descriptors meant for them.
const MAX_QUEUE_SLOTS: usize = 1024;

/// One recvmsg never carries more descriptors than the kernel's SCM_MAX_FD.
const SCM_MAX_FD: usize = 253;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("link i/o: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame from host: {0}")]
    Frame(#[from] FrameError),
    #[error("host sent more than {MAX_QUEUE_SLOTS} unclaimed descriptors")]
    DescriptorFlood,
    #[error("control data truncated: descriptors from the host were lost")]
    ControlTruncated,
}

/// The connected socket to the host, shared by the reader and the writer.
pub struct Link {
    fd: AsyncFd<OwnedFd>,
}

impl Link {
    /// Takes over the link descriptor: nonblocking, close-on-exec, registered with tokio.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        fds::set_nonblocking(fd.as_raw_fd(), true)?;
        fds::set_cloexec(fd.as_raw_fd())?;
        Ok(Self {
            fd: fds::register(fd, Interest::READABLE | Interest::WRITABLE)?,
        })
    }

    /// Receives bytes into `buf`, appending any passed descriptors to `fds`.
    /// Returns 0 when the host has closed the link.
    pub async fn recv(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, LinkError> {
        loop {
            // ERROR too: a vsock connection the transport reset (a restored
            // VM's) polls as EPOLLERR alone, which is not read readiness, so
            // a reader waiting only for that would never learn the link died.
            match self
                .fd
                .async_io(Interest::READABLE | Interest::ERROR, |fd| {
                    recv_with_fds(fd.as_raw_fd(), buf, fds)
                })
                .await
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Err(LinkError::ControlTruncated)
                }
                other => return Ok(other?),
            }
        }
    }

    /// Writes one whole frame, waiting for the socket as long as the host is slow.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let sent = self
                .fd
                .async_io(Interest::WRITABLE, |fd| {
                    socket::send(fd.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL)
                        .map_err(io::Error::from)
                })
                .await;
            match sent {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut cmsg = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        fd,
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    // cmsgs() refuses (ENOBUFS) when the kernel truncated the control data.
    for message in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            for raw_fd in raw {
                // SAFETY: the kernel just installed this descriptor in our table for
                // us (SCM_RIGHTS); nothing else refers to it, so we own it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw_fd) });
            }
        }
    }
    Ok(msg.bytes)
}

/// Descriptors received from the host, claimed in arrival order by Spawn frames.
#[derive(Default)]
pub struct FdQueue {
    /// `None` marks a descriptor that arrived while the queue was full and was closed.
    slots: VecDeque<Option<OwnedFd>>,
    live: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("spawn declares {wanted} cgroup descriptors but only {got} were passed")]
    Missing { wanted: usize, got: usize },
    #[error("a descriptor for this spawn was dropped: more than {MAX_QUEUED_FDS} were queued")]
    Overflowed,
}

impl FdQueue {
    pub fn push(&mut self, fd: OwnedFd) -> Result<(), LinkError> {
        if self.slots.len() >= MAX_QUEUE_SLOTS {
            return Err(LinkError::DescriptorFlood);
        }
        if self.live >= MAX_QUEUED_FDS {
            drop(fd);
            self.slots.push_back(None);
        } else {
            self.live += 1;
            self.slots.push_back(Some(fd));
        }
        Ok(())
    }

    /// Takes the next `n` descriptors. On error the claimed slots are still
    /// consumed (and closed), so the frames after this one stay aligned.
    pub fn claim(&mut self, n: usize) -> Result<Vec<OwnedFd>, ClaimError> {
        let got = n.min(self.slots.len());
        let mut fds = Vec::with_capacity(got);
        let mut overflowed = false;
        for slot in self.slots.drain(..got) {
            match slot {
                Some(fd) => {
                    self.live -= 1;
                    fds.push(fd);
                }
                None => overflowed = true,
            }
        }
        if got < n {
            return Err(ClaimError::Missing { wanted: n, got });
        }
        if overflowed {
            return Err(ClaimError::Overflowed);
        }
        Ok(fds)
    }
}

/// Frames waiting for the writer. Small, so a host that stops reading stops the
/// output readers (and through the pipes the processes) instead of growing memory.
pub const OUTBOX_FRAMES: usize = 16;

/// The sending side of the writer task's queue; every task holds a clone.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Vec<u8>>,
}

/// The writer has stopped: the link is gone and the agent is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("link writer has stopped")]
pub struct Closed;

impl Outbox {
    pub fn new() -> (Self, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(OUTBOX_FRAMES);
        (Self { tx }, rx)
    }

    pub async fn send(&self, message: &AgentMessage) -> Result<(), Closed> {
        match encode(message) {
            Ok(frame) => self.tx.send(frame).await.map_err(|_| Closed),
            // Only replies can outgrow a frame (output chunks are bounded by the
            // readers) and `reply` handles those, so this is a bug, not input.
            Err(e) => {
                eprintln!("sandbox-agent: dropping unencodable message: {e}");
                Ok(())
            }
        }
    }

    /// Sends the reply to request `id`; a reply too big for one frame becomes an error reply.
    pub async fn reply(&self, id: u64, reply: Reply) -> Result<(), Closed> {
        let frame = match encode(&AgentMessage::Reply { id, reply }) {
            Ok(frame) => frame,
            Err(e) => {
                let error = AgentError::new(ErrorKind::Other, format!("reply does not fit: {e}"));
                let message = AgentMessage::Reply {
                    id,
                    reply: Reply::Error(error),
                };
                encode(&message).map_err(|_| Closed)?
            }
        };
        self.tx.send(frame).await.map_err(|_| Closed)
    }

    pub async fn error(&self, id: u64, error: AgentError) -> Result<(), Closed> {
        self.reply(id, Reply::Error(error)).await
    }
}

/// The outbox's queue, kept across links: a microVM's agent serves a new
/// link after a restore, and the writer of each link takes it in turn.
pub type Frames = std::sync::Arc<tokio::sync::Mutex<mpsc::Receiver<Vec<u8>>>>;

/// The one task that writes to the link. Returns when the link fails or every
/// outbox is gone.
pub async fn write_loop(link: std::sync::Arc<Link>, frames: Frames) -> io::Result<()> {
    let mut rx = frames.lock().await;
    while let Some(frame) = rx.recv().await {
        link.write_all(&frame).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").expect("open /dev/null"))
    }

    /// A socket that polls as an error and nothing else wakes the reader,
    /// which gets the error. A connected UDP socket whose peer port is
    /// closed does that (EPOLLERR with EPOLLOUT, no EPOLLIN), as a reset
    /// vsock link does (EPOLLERR alone).
    #[tokio::test]
    async fn a_link_that_polls_only_as_an_error_wakes_its_reader() {
        let closed_port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("find a free port");
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        socket.connect(closed_port).expect("connect");
        // Nothing listens there: the kernel answers with ICMP port
        // unreachable, which sets the socket's error.
        socket.send(b"x").expect("send");
        let link = Link::new(OwnedFd::from(socket)).expect("link");
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let received = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            link.recv(&mut buf, &mut fds),
        )
        .await
        .expect("the reader was never woken by the socket's error");
        match received {
            Err(LinkError::Io(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}")
            }
            other => panic!("expected the socket's error, got {other:?}"),
        }
    }

    #[test]
    fn claims_in_arrival_order_and_reports_shortfall() {
        let mut queue = FdQueue::default();
        let a = fd();
        let b = fd();
        let ra = a.as_raw_fd();
        queue.push(a).expect("push");
        queue.push(b).expect("push");
        let first = queue.claim(1).expect("claim");
        assert_eq!(first[0].as_raw_fd(), ra);
        assert_eq!(
            queue.claim(2).map(|v| v.len()),
            Err(ClaimError::Missing { wanted: 2, got: 1 })
        );
        // The shortfall consumed the remaining descriptor.
        assert!(queue.claim(0).expect("empty claim").is_empty());
        assert_eq!(queue.live, 0);
    }

    #[test]
    fn overflow_keeps_later_claims_aligned() {
        let mut queue = FdQueue::default();
        for _ in 0..MAX_QUEUED_FDS + 2 {
            queue.push(fd()).expect("push");
        }
        assert_eq!(
            queue.claim(MAX_QUEUED_FDS).expect("claim").len(),
            MAX_QUEUED_FDS
        );
        assert_eq!(queue.claim(2).map(|v| v.len()), Err(ClaimError::Overflowed));
        queue.push(fd()).expect("push after drain");
        assert_eq!(queue.claim(1).expect("claim").len(), 1);
    }
}
