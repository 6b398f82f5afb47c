//! The supervisor's end of the agent link: request/reply matching by id,
//! descriptor passing for spawns, and the stream of unsolicited output and
//! exit messages. Everything the agent sends is untrusted: frames are bounded
//! by the codec, unknown reply ids are ignored, and any protocol breach ends
//! the link (and so the sandbox) rather than the supervisor.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use sandbox_proto::{
    AgentMessage, ExitStatus, FrameDecoder, Reply, Request, RequestBody, Stream,
    OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the sandbox agent is gone: {0}")]
    Closed(String),
    /// The request reached the agent, which did not answer in time.
    #[error("the sandbox agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The link stayed busy (other requests being written) until the
    /// deadline: this request was never sent.
    #[error("the link to the sandbox agent stayed busy for {0:?}; the request was not sent")]
    NotSent(Duration),
    #[error("the sandbox agent broke the protocol: {0}")]
    Protocol(String),
}

/// Messages the agent sends without being asked.
#[derive(Debug)]
pub enum LinkEvent {
    Output {
        proc: u64,
        stream: Stream,
        data: Vec<u8>,
    },
    Exit {
        proc: u64,
        status: ExitStatus,
    },
    /// The link ended; no further events follow.
    Closed(String),
}

/// Where a link's request ids start: at random, not at 1. An agent
/// restored from a snapshot (a fork, by CRIU or the VMM) may still answer
/// a request of its parent's supervisor that timed out there; counting
/// from 1 again, the fork's supervisor would sooner or later send a
/// request under that id and take the stale answer for its own. Among
/// 2^62 starts, a parent's few ids are never met.
fn first_request_id() -> u64 {
    (rand::random::<u64>() >> 2) + 1
}

/// The reply `rx` waits for, by `until`.
async fn await_reply(
    rx: oneshot::Receiver<Reply>,
    until: tokio::time::Instant,
    deadline: Duration,
) -> Result<Reply, LinkError> {
    match tokio::time::timeout_at(until, rx).await {
        Ok(reply) => {
            reply.map_err(|_| LinkError::Closed("the link closed before the reply".into()))
        }
        Err(_) => Err(LinkError::Timeout(deadline)),
    }
}

pub struct AgentLink {
    stream: UnixStream,
    write_lock: tokio::sync::Mutex<()>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    /// Read-held by every call until its reply; see [`Self::try_pause`].
    gate: Arc<tokio::sync::RwLock<()>>,
    next_id: AtomicU64,
    closed: Mutex<Option<String>>,
    /// The protocol the agent speaks: its Hello's, or a restored agent's
    /// Health answer's ([`Self::set_agent_version`]).
    agent_version: AtomicU32,
}

impl AgentLink {
    /// Wraps the host end of the link, waits for the agent's hello, and starts
    /// the reader. Events arrive on the returned channel.
    /// Takes over the host end of the link. A freshly started agent says
    /// Hello first, awaited for `hello_deadline`; one restored from a
    /// checkpoint (`None`) said it long ago to another supervisor.
    pub async fn establish(
        fd: OwnedFd,
        hello_deadline: Option<Duration>,
    ) -> Result<(Arc<Self>, mpsc::Receiver<LinkEvent>), LinkError> {
        let std_stream = std::os::unix::net::UnixStream::from(fd);
        std_stream
            .set_nonblocking(true)
            .map_err(|e| LinkError::Closed(e.to_string()))?;
        let stream =
            UnixStream::from_std(std_stream).map_err(|e| LinkError::Closed(e.to_string()))?;
        let link = Arc::new(Self {
            stream,
            write_lock: tokio::sync::Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            gate: Arc::new(tokio::sync::RwLock::new(())),
            next_id: AtomicU64::new(first_request_id()),
            closed: Mutex::new(None),
            agent_version: AtomicU32::new(OLDEST_PROTOCOL_VERSION),
        });
        let mut decoder = FrameDecoder::new();
        if let Some(hello_deadline) = hello_deadline {
            link.await_hello(&mut decoder, hello_deadline).await?;
        }
        // Bounded, so a flood of output pushes back on the agent (and through
        // it on the sandbox's processes) instead of growing memory here.
        let (events, rx) = mpsc::channel(256);
        let reader = Arc::clone(&link);
        tokio::spawn(async move { reader.read_loop(decoder, events).await });
        Ok((link, rx))
    }

    async fn await_hello(
        &self,
        decoder: &mut FrameDecoder,
        hello_deadline: Duration,
    ) -> Result<(), LinkError> {
        let first = tokio::time::timeout(hello_deadline, self.read_message(decoder))
            .await
            .map_err(|_| LinkError::Timeout(hello_deadline))??;
        match first {
            AgentMessage::Hello { version } => self.set_agent_version(version)?,
            other => {
                return Err(LinkError::Protocol(format!(
                    "expected hello, got {other:?}"
                )))
            }
        }
        Ok(())
    }

    /// What the agent said it speaks (a restored agent says it in its
    /// answer to Health, not in a Hello); a protocol this supervisor does
    /// not speak is a breach.
    pub fn set_agent_version(&self, version: u32) -> Result<(), LinkError> {
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(LinkError::Protocol(format!(
                "agent speaks protocol {version}, this supervisor {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"
            )));
        }
        self.agent_version.store(version, Ordering::Relaxed);
        Ok(())
    }

    pub fn agent_version(&self) -> u32 {
        self.agent_version.load(Ordering::Relaxed)
    }

    async fn read_message(&self, decoder: &mut FrameDecoder) -> Result<AgentMessage, LinkError> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(frame) = decoder
                .next_frame()
                .map_err(|e| LinkError::Protocol(e.to_string()))?
            {
                return sandbox_proto::decode(&frame)
                    .map_err(|e| LinkError::Protocol(e.to_string()));
            }
            self.stream
                .readable()
                .await
                .map_err(|e| LinkError::Closed(e.to_string()))?;
            match self.stream.try_read(&mut buf) {
                Ok(0) => return Err(LinkError::Closed("the agent closed its link".into())),
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(LinkError::Closed(e.to_string())),
            }
        }
    }

    async fn read_loop(
        self: Arc<Self>,
        mut decoder: FrameDecoder,
        events: mpsc::Sender<LinkEvent>,
    ) {
        let reason = loop {
            let message = match self.read_message(&mut decoder).await {
                Ok(m) => m,
                Err(e) => break e.to_string(),
            };
            let event = match message {
                AgentMessage::Reply { id, reply } => {
                    let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(&id));
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(reply);
                    }
                    continue;
                }
                AgentMessage::Output { proc, stream, data } => {
                    LinkEvent::Output { proc, stream, data }
                }
                AgentMessage::Exit { proc, status } => LinkEvent::Exit { proc, status },
                AgentMessage::Hello { .. } => break "the agent said hello twice".to_string(),
            };
            if events.send(event).await.is_err() {
                break "the supervisor stopped listening".to_string();
            }
        };
        if let Ok(mut closed) = self.closed.lock() {
            *closed = Some(reason.clone());
        }
        // Dropping the waiters fails every call in flight at once.
        if let Ok(mut pending) = self.pending.lock() {
            pending.clear();
        }
        let _ = events.send(LinkEvent::Closed(reason)).await;
    }

    /// Holds new requests back (they wait) while the guard lives; `None`
    /// when requests are in flight. A checkpoint takes it: a request the
    /// agent has not answered would be answered again by every fork.
    pub fn try_pause(&self) -> Option<tokio::sync::RwLockWriteGuard<'_, ()>> {
        self.gate.try_write().ok()
    }

    /// Sends one request (with descriptors, for a spawn) and waits for its reply.
    pub async fn call(
        &self,
        body: RequestBody,
        fds: &[RawFd],
        deadline: Duration,
    ) -> Result<Reply, LinkError> {
        let _gate = self.gate.read().await;
        let (id, frame, rx) = self.register(body)?;
        let until = tokio::time::Instant::now() + deadline;
        let result = async {
            self.write_frame(&frame, fds, until, deadline).await?;
            await_reply(rx, until, deadline).await
        }
        .await;
        self.forget(id);
        result
    }

    /// Sends one request now and returns what waits for its reply: a call
    /// made after this returns goes out after it, and the agent reads its
    /// link in order, so it handles this one first.
    pub async fn send(
        self: &Arc<Self>,
        body: RequestBody,
        deadline: Duration,
    ) -> Result<impl std::future::Future<Output = Result<Reply, LinkError>>, LinkError> {
        let gate = Arc::clone(&self.gate).read_owned().await;
        let (id, frame, rx) = self.register(body)?;
        let until = tokio::time::Instant::now() + deadline;
        if let Err(e) = self.write_frame(&frame, &[], until, deadline).await {
            self.forget(id);
            return Err(e);
        }
        let link = Arc::clone(self);
        Ok(async move {
            let reply = await_reply(rx, until, deadline).await;
            link.forget(id);
            drop(gate);
            reply
        })
    }

    /// A request's frame, with a waiter registered for its reply; refused
    /// once the link is closed.
    fn register(
        &self,
        body: RequestBody,
    ) -> Result<(u64, Vec<u8>, oneshot::Receiver<Reply>), LinkError> {
        if let Some(reason) = self.closed.lock().ok().and_then(|c| c.clone()) {
            return Err(LinkError::Closed(reason));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = sandbox_proto::encode(&Request { id, body })
            .map_err(|e| LinkError::Protocol(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(id, tx);
        }
        Ok((id, frame, rx))
    }

    /// Drops request `id`'s waiter, answered or not.
    fn forget(&self, id: u64) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&id);
        }
    }

    /// Writes one frame by `until`. A frame the deadline cuts off after its
    /// first byte leaves the agent reading the next request's bytes as the
    /// rest of this one, so the link is shut down instead (its reader then
    /// reports it closed, and the sandbox fails); one that never started is
    /// only late.
    async fn write_frame(
        &self,
        frame: &[u8],
        fds: &[RawFd],
        until: tokio::time::Instant,
        deadline: Duration,
    ) -> Result<(), LinkError> {
        let _guard = tokio::time::timeout_at(until, self.write_lock.lock())
            .await
            .map_err(|_| LinkError::NotSent(deadline))?;
        let raw = self.stream.as_raw_fd();
        let mut sent = 0;
        while sent < frame.len() {
            let rest = &frame[sent..];
            // Descriptors ride on the first byte of the frame only.
            let with_fds = sent == 0 && !fds.is_empty();
            let write = self.stream.async_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(rest)];
                let cmsg = [ControlMessage::ScmRights(fds)];
                let cmsgs: &[ControlMessage] = if with_fds { &cmsg } else { &[] };
                sendmsg::<()>(raw, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            });
            match tokio::time::timeout_at(until, write).await {
                Ok(Ok(n)) => sent += n,
                Ok(Err(e)) => return Err(LinkError::Closed(e.to_string())),
                Err(_) if sent == 0 => return Err(LinkError::NotSent(deadline)),
                Err(_) => {
                    let reason = format!(
                        "a request was cut off after {sent} of its {} bytes by its {deadline:?} deadline",
                        frame.len()
                    );
                    if let Ok(mut closed) = self.closed.lock() {
                        *closed = Some(reason.clone());
                    }
                    let _ = nix::sys::socket::shutdown(raw, nix::sys::socket::Shutdown::Both);
                    return Err(LinkError::Closed(reason));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream as StdStream;

    /// What an agent says first on its link.
    fn say_hello(agent: &mut StdStream) {
        use std::io::Write;
        let hello = sandbox_proto::encode(&AgentMessage::Hello {
            version: PROTOCOL_VERSION,
        })
        .expect("encode");
        agent.write_all(&hello).expect("hello");
    }

    /// The host's side of a link whose agent said hello, and its events
    /// (kept by the caller: the reader stops once nobody listens).
    async fn link_over(host: StdStream) -> (Arc<AgentLink>, mpsc::Receiver<LinkEvent>) {
        AgentLink::establish(OwnedFd::from(host), Some(Duration::from_secs(5)))
            .await
            .expect("hello")
    }

    /// The agent's side of a link: says hello, then returns the id of the
    /// first request it reads.
    fn fake_agent(mut agent: StdStream) -> std::thread::JoinHandle<u64> {
        use std::io::Read;
        std::thread::spawn(move || {
            say_hello(&mut agent);
            let mut decoder = FrameDecoder::new();
            let mut buf = [0u8; 4096];
            loop {
                if let Some(frame) = decoder.next_frame().expect("frame") {
                    let request: Request = sandbox_proto::decode(&frame).expect("request");
                    return request.id;
                }
                let n = agent.read(&mut buf).expect("read");
                assert!(n > 0, "the link closed before a request");
                decoder.push(&buf[..n]);
            }
        })
    }

    #[tokio::test]
    async fn a_request_the_busy_link_never_wrote_is_not_sent_not_late() {
        let (host, mut agent) = StdStream::pair().expect("socketpair");
        say_hello(&mut agent);
        let (link, _events) = link_over(host).await;
        // Another request holds the writer past this one's deadline.
        let writing = link.write_lock.lock().await;
        let queued = link
            .call(RequestBody::Health, &[], Duration::from_millis(50))
            .await;
        assert!(matches!(queued, Err(LinkError::NotSent(_))), "{queued:?}");
        drop(writing);
        // Control: written and unanswered is late.
        let late = link
            .call(RequestBody::Health, &[], Duration::from_millis(50))
            .await;
        assert!(matches!(late, Err(LinkError::Timeout(_))), "{late:?}");
    }

    #[tokio::test]
    async fn a_request_cut_off_by_its_deadline_closes_the_link() {
        let (host, mut agent) = StdStream::pair().expect("socketpair");
        say_hello(&mut agent);
        let (link, _events) = link_over(host).await;
        // Positive control: an unanswered small request is only late.
        let late = link
            .call(RequestBody::Health, &[], Duration::from_millis(50))
            .await;
        assert!(matches!(late, Err(LinkError::Timeout(_))), "{late:?}");
        // The agent reads nothing, so a frame larger than the socket's
        // buffers stops part way.
        let big = RequestBody::Write {
            handle: 1,
            data: vec![0; 900 << 10],
        };
        let cut = link.call(big, &[], Duration::from_millis(200)).await;
        let Err(LinkError::Closed(reason)) = cut else {
            panic!("a cut-off frame left the link open: {cut:?}");
        };
        assert!(reason.contains("cut off"), "{reason}");
        let after = link
            .call(RequestBody::Health, &[], Duration::from_millis(50))
            .await;
        assert!(matches!(after, Err(LinkError::Closed(_))), "{after:?}");
        drop(agent);
    }

    #[tokio::test]
    async fn links_do_not_start_counting_requests_at_the_same_id() {
        let mut firsts = Vec::new();
        for _ in 0..2 {
            let (host, agent) = StdStream::pair().expect("socketpair");
            let agent = fake_agent(agent);
            let (link, _events) = link_over(host).await;
            // Unanswered: the fake agent only reads it.
            let _ = link
                .call(RequestBody::Health, &[], Duration::from_millis(200))
                .await;
            firsts.push(agent.join().expect("fake agent"));
        }
        assert!(firsts.iter().all(|&id| id > 0), "{firsts:?}");
        assert_ne!(
            firsts[0], firsts[1],
            "a fork's link would reuse its parent's ids"
        );
    }
}
