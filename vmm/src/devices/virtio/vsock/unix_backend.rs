//! The host side of virtio-vsock: a multiplexer between the guest's vsock
//! streams and host Unix sockets (Firecracker's convention, see the module
//! above). It owns a listening socket, the accepted and connected streams and
//! an epoll instance over all of them; the device's worker polls that epoll
//! fd and calls [`VsockUnixBackend::notify`], feeds it the guest's packets
//! ([`send_pkt`](VsockUnixBackend::send_pkt)) and asks it for packets to
//! deliver ([`recv_pkt`](VsockUnixBackend::recv_pkt)).
//!
//! Flow control (virtio 1.x 5.10.6.3): each side tells the other its receive
//! buffer size (`buf_alloc`) and how much it has consumed (`fwd_cnt`); a
//! sender never has more than `buf_alloc` bytes in flight. Towards the
//! guest the backend reads from a host stream only as much as the guest has
//! room for, and asks for credit when it has none. From the guest it buffers
//! at most [`CONN_BUF_SIZE`] bytes per connection (the credit it grants);
//! a guest that sends beyond its credit gets its connection reset.
//!
//! Everything is bounded: connections ([`MAX_CONNECTIONS`]), pending
//! handshakes, queued resets, the `CONNECT` line, per-connection buffers.
//! Sockets are non-blocking and epoll is level-triggered with interest
//! narrowed to what can make progress, so no state spins the worker.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::device::VsockError;
use super::packet::{VsockHeader, MAX_PKT_DATA};
use super::{
    HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM, VSOCK_OP_CREDIT_REQUEST,
    VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_REQUEST, VSOCK_OP_RESPONSE, VSOCK_OP_RST, VSOCK_OP_RW,
    VSOCK_OP_SHUTDOWN,
};

/// Receive buffer granted to the guest per connection (its credit).
pub const CONN_BUF_SIZE: u32 = 64 * 1024;
/// Most connections (established or being set up) per VM.
pub const MAX_CONNECTIONS: usize = 256;
/// Most host connections that have not sent their `CONNECT` line yet.
pub const MAX_HANDSHAKES: usize = 32;
/// Most resets waiting for an RX buffer; beyond, resets are dropped (the
/// guest's side then times out, as with a lost packet).
pub const MAX_PENDING_RSTS: usize = 1024;
/// Longest `CONNECT <port>\n` line.
pub const MAX_CONNECT_LINE: usize = 32;
/// A host connection must send its `CONNECT` line within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The guest must accept or refuse a host connection within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After the VMM shuts a connection down both ways, the guest must reset it
/// within this, or the VMM resets it.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// First local port for host-initiated connections (Firecracker's choice:
/// well above the ports guests listen on).
const FIRST_LOCAL_PORT: u32 = 1 << 30;

/// A connection, by (host-side port, guest-side port).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ConnKey {
    local_port: u32,
    peer_port: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    /// Host-initiated: REQUEST queued or sent, waiting for the guest.
    LocalInit,
    /// Data flows.
    Established,
    /// The VMM sent SHUTDOWN both ways and waits for the guest's RST.
    Closing,
}

// Control packets a connection owes the guest, in the order they are sent.
const P_REQUEST: u8 = 1;
const P_RESPONSE: u8 = 2;
const P_SHUTDOWN: u8 = 4;
const P_CREDIT_UPDATE: u8 = 8;
const P_CREDIT_REQUEST: u8 = 16;

struct Connection {
    stream: UnixStream,
    key: ConnKey,
    state: ConnState,
    /// Control packets owed (P_*).
    pending: u8,
    /// Flags for the owed SHUTDOWN.
    shutdown_flags: u32,
    in_rxq: bool,
    /// The host stream has (or may have) bytes for the guest.
    data_ready: bool,
    /// A CREDIT_REQUEST went out and no credit came back yet.
    credit_requested: bool,
    /// SHUTDOWN flags the guest sent.
    peer_shut: u32,
    /// The host stream reached EOF.
    host_eof: bool,
    /// The host stream hung up or failed; it is out of the epoll set.
    hup: bool,
    /// Reset once the guest's buffered data is written (the guest shut down
    /// both ways while data was still buffered).
    close_after_flush: bool,
    /// Events the stream is registered for, when registered.
    interest: Option<EventSet>,
    deadline: Option<Instant>,
    // Guest -> host: bytes buffered, bytes written to the stream.
    tx_buf: VecDeque<u8>,
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    // Host -> guest: the guest's credit and what was sent against it.
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    rx_cnt: Wrapping<u32>,
}

impl Connection {
    fn new(stream: UnixStream, key: ConnKey, state: ConnState) -> Self {
        Connection {
            stream,
            key,
            state,
            pending: 0,
            shutdown_flags: 0,
            in_rxq: false,
            data_ready: false,
            credit_requested: false,
            peer_shut: 0,
            host_eof: false,
            hup: false,
            close_after_flush: false,
            interest: None,
            deadline: None,
            tx_buf: VecDeque::new(),
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
        }
    }

    /// Bytes the guest can take now.
    fn peer_credit(&self) -> usize {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight) as usize
    }

    fn wants_to_read(&self) -> bool {
        self.state == ConnState::Established
            && !self.data_ready
            && !self.host_eof
            && !self.hup
            && self.peer_shut & SHUTDOWN_RCV == 0
    }

    /// Whether serving this connection could produce a packet now.
    fn has_rx(&self) -> bool {
        self.pending != 0
            || (self.state == ConnState::Established
                && self.data_ready
                && self.peer_shut & SHUTDOWN_RCV == 0
                && !self.host_eof
                && (self.peer_credit() > 0 || !self.credit_requested))
    }

    /// A header for `op` on this connection, carrying the current credit.
    fn header(&mut self, guest_cid: u64, op: u16, flags: u32) -> VsockHeader {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        VsockHeader {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: self.key.local_port,
            dst_port: self.key.peer_port,
            len: 0,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: CONN_BUF_SIZE,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Writes buffered guest data to the stream until it would block.
    fn flush(&mut self) -> io::Result<()> {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    // n <= 64 KiB: the cast cannot truncate.
                    self.fwd_cnt += Wrapping(n as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A host connection that has not sent its `CONNECT` line yet.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

/// The vsock multiplexer. See the module documentation.
pub struct VsockUnixBackend {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    epoll: Epoll,
    conns: HashMap<ConnKey, Connection>,
    by_fd: HashMap<RawFd, ConnKey>,
    handshakes: HashMap<RawFd, Handshake>,
    rxq: VecDeque<ConnKey>,
    rsts: VecDeque<VsockHeader>,
    next_local_port: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for VsockUnixBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockUnixBackend")
            .field("guest_cid", &self.guest_cid)
            .field("uds_path", &self.uds_path)
            .field("connections", &self.conns.len())
            .field("handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

/// Longest Unix socket path (sun_path holds 108 bytes with the NUL).
pub const MAX_UDS_PATH: usize = 107;
/// Room kept for the `_<port>` suffix of guest-initiated connections.
const PORT_SUFFIX_MAX: usize = 11;

impl VsockUnixBackend {
    /// Listens on `uds_path` for host connections to the guest `guest_cid`.
    /// A stale socket file at the path (from a VMM that died) is replaced;
    /// any other file there is an error.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, VsockError> {
        let display = uds_path.display().to_string();
        let len = uds_path.as_os_str().len();
        if len + PORT_SUFFIX_MAX > MAX_UDS_PATH {
            return Err(VsockError::PathTooLong { path: display, len });
        }
        match std::fs::symlink_metadata(uds_path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(uds_path).map_err(|source| VsockError::Bind {
                    path: display.clone(),
                    source,
                })?;
            }
            Ok(_) => return Err(VsockError::PathExists(display)),
            Err(_) => {}
        }
        let listener = UnixListener::bind(uds_path).map_err(|source| VsockError::Bind {
            path: display.clone(),
            source,
        })?;
        let setup = |source| VsockError::Setup(source);
        listener.set_nonblocking(true).map_err(setup)?;
        let epoll = Epoll::new().map_err(setup)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, listener.as_raw_fd() as u64),
            )
            .map_err(setup)?;
        Ok(VsockUnixBackend {
            guest_cid,
            uds_path: uds_path.to_owned(),
            listener,
            epoll,
            conns: HashMap::new(),
            by_fd: HashMap::new(),
            handshakes: HashMap::new(),
            rxq: VecDeque::new(),
            rsts: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            buf: vec![0; MAX_PKT_DATA],
        })
    }

    /// The guest's CID.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// The listening socket's path.
    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// The epoll fd to watch: readable when [`notify`](Self::notify) has
    /// work.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Open connections (established or being set up).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Whether [`recv_pkt`](Self::recv_pkt) may have a packet.
    pub fn has_pending_rx(&self) -> bool {
        !self.rsts.is_empty() || !self.rxq.is_empty()
    }

    /// Closes every connection (device reset, restore): host streams see
    /// EOF, nothing is sent to the guest. The listener stays.
    pub fn reset_connections(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for key in keys {
            self.remove(key);
        }
        for (fd, _) in self.handshakes.drain() {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        self.rxq.clear();
        self.rsts.clear();
    }

    fn reply_rst(&mut self, to: &VsockHeader) {
        if self.rsts.len() >= MAX_PENDING_RSTS {
            return;
        }
        self.rsts.push_back(VsockHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: to.dst_port,
            dst_port: to.src_port,
            len: 0,
            type_: to.type_,
            op: VSOCK_OP_RST,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        });
    }

    fn enqueue(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.in_rxq && conn.has_rx() {
                conn.in_rxq = true;
                self.rxq.push_back(key);
            }
        }
    }

    fn remove(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.remove(&key) {
            let fd = conn.stream.as_raw_fd();
            self.by_fd.remove(&fd);
            if conn.interest.is_some() {
                let _ = self
                    .epoll
                    .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
        }
    }

    /// Resets a connection: RST to the guest, the host stream closed.
    fn kill(&mut self, key: ConnKey) {
        if self.conns.contains_key(&key) {
            self.reply_rst(&VsockHeader {
                src_port: key.peer_port,
                dst_port: key.local_port,
                type_: TYPE_STREAM,
                ..VsockHeader::default()
            });
            self.remove(key);
        }
    }

    /// Registers the stream for what can make progress now.
    fn update_interest(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if conn.hup {
            return;
        }
        let mut want = EventSet::empty();
        if conn.wants_to_read() {
            want |= EventSet::IN;
        }
        if !conn.tx_buf.is_empty() {
            want |= EventSet::OUT;
        }
        if conn.interest == Some(want) {
            return;
        }
        let fd = conn.stream.as_raw_fd();
        let op = if conn.interest.is_some() {
            ControlOperation::Modify
        } else {
            ControlOperation::Add
        };
        match self.epoll.ctl(op, fd, EpollEvent::new(want, fd as u64)) {
            Ok(()) => conn.interest = Some(want),
            // Cannot happen for a valid open socket; without readiness
            // events the connection could stall, so reset it.
            Err(_) => self.kill(key),
        }
    }

    /// Handles a packet the guest sent.
    pub fn send_pkt(&mut self, hdr: &VsockHeader, data: &[u8]) {
        // Packets not from this guest to the host are dropped: the spec
        // gives them no answer, and a reset would go to the wrong place.
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            return;
        }
        if hdr.type_ != TYPE_STREAM {
            if hdr.op != VSOCK_OP_RST {
                self.reply_rst(hdr);
            }
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        let Some(conn) = self.conns.get_mut(&key) else {
            match hdr.op {
                VSOCK_OP_REQUEST => self.connect_to_host(key, hdr),
                VSOCK_OP_RST => {}
                _ => self.reply_rst(hdr),
            }
            return;
        };
        conn.peer_buf_alloc = hdr.buf_alloc;
        conn.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        if conn.peer_credit() > 0 {
            conn.credit_requested = false;
        }
        match hdr.op {
            VSOCK_OP_RESPONSE if conn.state == ConnState::LocalInit => {
                conn.state = ConnState::Established;
                conn.deadline = None;
                let line = format!("OK {}\n", key.local_port);
                // A fresh socket's buffer holds a short line; a partial
                // write means the peer is not reading at all.
                match conn.stream.write(line.as_bytes()) {
                    Ok(n) if n == line.len() => {}
                    _ => return self.kill(key),
                }
            }
            VSOCK_OP_RW if conn.state == ConnState::Established => {
                if conn.peer_shut & SHUTDOWN_SEND != 0 {
                    return self.kill(key);
                }
                if conn.tx_buf.len() + data.len() > CONN_BUF_SIZE as usize {
                    // Beyond the credit the VMM granted: a broken driver.
                    return self.kill(key);
                }
                conn.tx_buf.extend(data);
                if let Err(()) = self.flush(key) {
                    return;
                }
            }
            VSOCK_OP_CREDIT_UPDATE => {}
            VSOCK_OP_CREDIT_REQUEST => conn.pending |= P_CREDIT_UPDATE,
            VSOCK_OP_SHUTDOWN => {
                conn.peer_shut |= hdr.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if conn.peer_shut == SHUTDOWN_RCV | SHUTDOWN_SEND {
                    if conn.tx_buf.is_empty() {
                        // Linux waits for this RST to finish its close.
                        return self.kill(key);
                    }
                    conn.close_after_flush = true;
                } else if conn.peer_shut & SHUTDOWN_SEND != 0 && conn.tx_buf.is_empty() {
                    let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                }
            }
            VSOCK_OP_RST => return self.remove(key),
            // RESPONSE or RW out of state, a second REQUEST, unknown ops.
            _ => return self.kill(key),
        }
        self.enqueue(key);
        self.update_interest(key);
    }

    /// Answers a guest packet whose header parsed but whose data did not
    /// (truncated, oversized, outside RAM): its connection is reset, or an
    /// RST answers it if it has none.
    pub fn reject(&mut self, hdr: &VsockHeader) {
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        if self.conns.contains_key(&key) {
            self.kill(key);
        } else if hdr.op != VSOCK_OP_RST {
            self.reply_rst(hdr);
        }
    }

    /// Writes what the connection has buffered; resets it on a write error.
    fn flush(&mut self, key: ConnKey) -> Result<(), ()> {
        let Some(conn) = self.conns.get_mut(&key) else {
            return Err(());
        };
        if conn.flush().is_err() {
            self.kill(key);
            return Err(());
        }
        if conn.tx_buf.is_empty() {
            if conn.close_after_flush {
                self.kill(key);
                return Err(());
            }
            if conn.peer_shut & SHUTDOWN_SEND != 0 {
                let _ = conn.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        // Tell the guest about freed buffer space once half of it is free
        // again: often enough that a sender never waits on a stale view,
        // rarely enough not to double the packet count.
        if (conn.fwd_cnt - conn.last_fwd_cnt_sent).0 >= CONN_BUF_SIZE / 2 {
            conn.pending |= P_CREDIT_UPDATE;
        }
        self.enqueue(key);
        self.update_interest(key);
        Ok(())
    }

    /// A guest connection to host port `key.local_port`: connect to
    /// `<uds_path>_<port>`, answer RESPONSE, or RST if nothing listens.
    fn connect_to_host(&mut self, key: ConnKey, hdr: &VsockHeader) {
        if self.conns.len() >= MAX_CONNECTIONS {
            return self.reply_rst(hdr);
        }
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{}", key.local_port));
        let stream = match connect_nonblocking(Path::new(&path)) {
            Ok(s) => s,
            Err(_) => return self.reply_rst(hdr),
        };
        let mut conn = Connection::new(stream, key, ConnState::Established);
        conn.peer_buf_alloc = hdr.buf_alloc;
        conn.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        conn.pending = P_RESPONSE;
        self.by_fd.insert(conn.stream.as_raw_fd(), key);
        self.conns.insert(key, conn);
        self.enqueue(key);
        self.update_interest(key);
    }

    /// The next packet for the guest, with at most `room` data bytes (the
    /// RX buffer's space after the header); its data is the returned slice.
    pub fn recv_pkt(&mut self, room: usize) -> Option<(VsockHeader, &[u8])> {
        let (hdr, len) = self.next_rx(room)?;
        Some((hdr, &self.buf[..len]))
    }

    fn next_rx(&mut self, room: usize) -> Option<(VsockHeader, usize)> {
        loop {
            if let Some(rst) = self.rsts.pop_front() {
                return Some((rst, 0));
            }
            let key = self.rxq.pop_front()?;
            let guest_cid = self.guest_cid;
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.in_rxq = false;
            if let Some((op, flags)) = take_pending(conn) {
                let hdr = conn.header(guest_cid, op, flags);
                self.enqueue(key);
                return Some((hdr, 0));
            }
            if !conn.has_rx() {
                continue;
            }
            let credit = conn.peer_credit();
            if credit == 0 {
                conn.credit_requested = true;
                let hdr = conn.header(guest_cid, VSOCK_OP_CREDIT_REQUEST, 0);
                return Some((hdr, 0));
            }
            let n = room.min(credit).min(MAX_PKT_DATA);
            if n == 0 {
                // An RX buffer with room for a header only: wait for a
                // bigger one rather than spin on this one.
                conn.in_rxq = true;
                self.rxq.push_front(key);
                return None;
            }
            match conn.stream.read(&mut self.buf[..n]) {
                Ok(0) => {
                    conn.host_eof = true;
                    conn.data_ready = false;
                    conn.pending |= P_SHUTDOWN;
                    if conn.hup {
                        // Gone both ways: the guest may neither send nor
                        // receive; it must reset within CLOSE_TIMEOUT.
                        conn.shutdown_flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
                        conn.state = ConnState::Closing;
                        conn.deadline = Some(Instant::now() + CLOSE_TIMEOUT);
                    } else {
                        // Half-closed: the host sends no more but may still
                        // read what the guest sends.
                        conn.shutdown_flags = SHUTDOWN_SEND;
                    }
                    self.enqueue(key);
                    self.update_interest(key);
                }
                Ok(len) => {
                    conn.rx_cnt += Wrapping(len as u32);
                    let hdr = VsockHeader {
                        len: len as u32,
                        ..conn.header(guest_cid, VSOCK_OP_RW, 0)
                    };
                    self.enqueue(key);
                    return Some((hdr, len));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.data_ready = false;
                    self.update_interest(key);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => self.enqueue(key),
                Err(_) => self.kill(key),
            }
        }
    }

    /// Handles whatever the sockets have for the VMM: new host connections,
    /// `CONNECT` lines, readable and writable streams, hang-ups.
    pub fn notify(&mut self) {
        let mut events = [EpollEvent::default(); 32];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(_) => return,
        };
        for event in &events[..n] {
            let fd = event.data() as RawFd;
            let set = event.event_set();
            if fd == self.listener.as_raw_fd() {
                self.accept_all();
            } else if self.handshakes.contains_key(&fd) {
                self.read_handshake(fd);
            } else if let Some(&key) = self.by_fd.get(&fd) {
                self.stream_event(key, set);
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                // WouldBlock ends the batch; other errors (EMFILE, a
                // connection reset before accept) leave the backlog to the
                // next readiness event.
                Err(_) => return,
            };
            if self.handshakes.len() >= MAX_HANDSHAKES
                || self.conns.len() + self.handshakes.len() >= MAX_CONNECTIONS
                || stream.set_nonblocking(true).is_err()
            {
                continue; // dropped: the host sees the connection closed
            }
            let fd = stream.as_raw_fd();
            if self
                .epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, fd as u64),
                )
                .is_err()
            {
                continue;
            }
            self.handshakes.insert(
                fd,
                Handshake {
                    stream,
                    line: Vec::with_capacity(MAX_CONNECT_LINE),
                    deadline: Instant::now() + HANDSHAKE_TIMEOUT,
                },
            );
        }
    }

    fn drop_handshake(&mut self, fd: RawFd) -> Option<Handshake> {
        let hs = self.handshakes.remove(&fd)?;
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        Some(hs)
    }

    /// Reads the `CONNECT <port>\n` line one byte at a time, so that bytes
    /// the host sends after it stay in the socket for the guest.
    fn read_handshake(&mut self, fd: RawFd) {
        let Some(hs) = self.handshakes.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match hs.stream.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => break parse_connect(&hs.line),
                Ok(1) if hs.line.len() < MAX_CONNECT_LINE => hs.line.push(byte[0]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EOF, an overlong line, an error.
                _ => break None,
            }
        };
        let Some(hs) = self.drop_handshake(fd) else {
            return;
        };
        let Some(peer_port) = port else {
            return; // dropping the stream closes it: the host sees EOF
        };
        if self.conns.len() >= MAX_CONNECTIONS {
            return;
        }
        let Some(local_port) = self.alloc_local_port() else {
            return;
        };
        let key = ConnKey {
            local_port,
            peer_port,
        };
        let mut conn = Connection::new(hs.stream, key, ConnState::LocalInit);
        conn.pending = P_REQUEST;
        conn.deadline = Some(Instant::now() + CONNECT_TIMEOUT);
        self.by_fd.insert(fd, key);
        self.conns.insert(key, conn);
        self.enqueue(key);
        // Registered for hang-ups only until the guest accepts.
        self.update_interest(key);
    }

    fn alloc_local_port(&mut self) -> Option<u32> {
        // At most MAX_CONNECTIONS ports are taken, so this ends quickly.
        for _ in 0..=MAX_CONNECTIONS {
            let port = self.next_local_port;
            self.next_local_port = self
                .next_local_port
                .checked_add(1)
                .unwrap_or(FIRST_LOCAL_PORT);
            if !self.conns.keys().any(|k| k.local_port == port) {
                return Some(port);
            }
        }
        None
    }

    fn stream_event(&mut self, key: ConnKey, set: EventSet) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if set.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            // Hang-ups are reported whatever the interest, so the stream
            // leaves the epoll set; what it still holds is read through the
            // RX path, which then sees EOF.
            conn.hup = true;
            if conn.interest.take().is_some() {
                let _ = self.epoll.ctl(
                    ControlOperation::Delete,
                    conn.stream.as_raw_fd(),
                    EpollEvent::default(),
                );
            }
            if conn.state == ConnState::LocalInit {
                return self.kill(key);
            }
            conn.data_ready = true;
        }
        if set.contains(EventSet::IN) {
            conn.data_ready = true;
        }
        if set.contains(EventSet::OUT) && !conn.hup && self.flush(key).is_err() {
            return;
        }
        self.enqueue(key);
        self.update_interest(key);
    }

    /// How long until a handshake or connection times out.
    pub fn next_timeout(&self) -> Option<Duration> {
        let now = Instant::now();
        self.handshakes
            .values()
            .map(|h| h.deadline)
            .chain(self.conns.values().filter_map(|c| c.deadline))
            .min()
            .map(|d| d.saturating_duration_since(now))
    }

    /// Drops handshakes and resets connections whose time is up.
    pub fn tick(&mut self) {
        let now = Instant::now();
        let late: Vec<RawFd> = self
            .handshakes
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(&fd, _)| fd)
            .collect();
        for fd in late {
            self.drop_handshake(fd);
        }
        let late: Vec<ConnKey> = self
            .conns
            .values()
            .filter(|c| c.deadline.is_some_and(|d| d <= now))
            .map(|c| c.key)
            .collect();
        for key in late {
            self.kill(key);
        }
    }
}

impl Drop for VsockUnixBackend {
    fn drop(&mut self) {
        // The path is this VMM's; leave no stale socket behind.
        let _ = std::fs::remove_file(&self.uds_path);
    }
}

/// Takes the next owed control packet: (op, flags).
fn take_pending(conn: &mut Connection) -> Option<(u16, u32)> {
    let order = [
        (P_REQUEST, VSOCK_OP_REQUEST),
        (P_RESPONSE, VSOCK_OP_RESPONSE),
        (P_CREDIT_UPDATE, VSOCK_OP_CREDIT_UPDATE),
        (P_CREDIT_REQUEST, VSOCK_OP_CREDIT_REQUEST),
        // Last: data already owed goes out before the shutdown.
        (P_SHUTDOWN, VSOCK_OP_SHUTDOWN),
    ];
    let (bit, op) = order.into_iter().find(|(bit, _)| conn.pending & bit != 0)?;
    conn.pending &= !bit;
    let flags = if op == VSOCK_OP_SHUTDOWN {
        conn.shutdown_flags
    } else {
        0
    };
    Some((op, flags))
}

/// Parses `CONNECT <port>` (an optional trailing `\r` is accepted).
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let port = line.strip_prefix(b"CONNECT ")?;
    if port.is_empty() || port.len() > 10 || !port.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(port).ok()?.parse().ok()
}

/// Connects to the Unix socket at `path` without blocking: a listener with
/// a full backlog refuses (EAGAIN) instead of stalling the device thread.
fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket no one else owns; the stream closes it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: `addr` is a valid, initialised sockaddr_un and the length
    // passed is its size.
    let rc = unsafe {
        libc::connect(
            fd,
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    const CID: u64 = 3;

    fn temp_path(tag: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "vsk-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn guest_hdr(op: u16, src_port: u32, dst_port: u32) -> VsockHeader {
        VsockHeader {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            len: 0,
            type_: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: 4096,
            fwd_cnt: 0,
        }
    }

    /// Polls the backend until it has a packet (or 5 s pass).
    fn next(b: &mut VsockUnixBackend) -> Option<(VsockHeader, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            b.notify();
            if let Some((h, d)) = b.recv_pkt(4096) {
                return Some((h, d.to_vec()));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Connects as the host and completes CONNECT/REQUEST/RESPONSE.
    fn host_connect(b: &mut VsockUnixBackend, port: u32) -> (UnixStream, u32) {
        let mut s = UnixStream::connect(b.uds_path()).expect("connect");
        s.write_all(format!("CONNECT {port}\n").as_bytes())
            .expect("write");
        let (req, _) = next(b).expect("request");
        assert_eq!(req.op, VSOCK_OP_REQUEST);
        assert_eq!((req.dst_cid, req.dst_port), (CID, port));
        assert_eq!(req.src_cid, HOST_CID);
        assert!(req.src_port >= FIRST_LOCAL_PORT);
        b.send_pkt(&guest_hdr(VSOCK_OP_RESPONSE, port, req.src_port), &[]);
        let mut line = String::new();
        BufReader::new(s.try_clone().expect("clone"))
            .read_line(&mut line)
            .expect("OK line");
        assert_eq!(line, format!("OK {}\n", req.src_port));
        (s, req.src_port)
    }

    #[test]
    fn host_connect_echo_and_close() {
        let path = temp_path("echo");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let (mut s, local) = host_connect(&mut b, 1024);
        s.write_all(b"ping").expect("write");
        let (rw, data) = next(&mut b).expect("data");
        assert_eq!(
            (rw.op, rw.len, data.as_slice()),
            (VSOCK_OP_RW, 4, &b"ping"[..])
        );
        assert_eq!(rw.buf_alloc, CONN_BUF_SIZE);
        let mut reply = guest_hdr(VSOCK_OP_RW, 1024, local);
        reply.len = 4;
        reply.fwd_cnt = 4;
        b.send_pkt(&reply, b"pong");
        let mut got = [0u8; 4];
        s.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"pong");
        // The host closes: the guest is told, then resets, and it is gone.
        drop(s);
        let (shut, _) = next(&mut b).expect("shutdown");
        assert_eq!(shut.op, VSOCK_OP_SHUTDOWN);
        assert_eq!(shut.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
        b.send_pkt(&guest_hdr(VSOCK_OP_RST, 1024, local), &[]);
        assert_eq!(b.connection_count(), 0);
        drop(b);
        assert!(!path.exists(), "socket removed on drop");
    }

    #[test]
    fn guest_refusal_closes_the_host_stream() {
        let path = temp_path("refuse");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let mut s = UnixStream::connect(&path).expect("connect");
        s.write_all(b"CONNECT 9999\n").expect("write");
        let (req, _) = next(&mut b).expect("request");
        b.send_pkt(&guest_hdr(VSOCK_OP_RST, 9999, req.src_port), &[]);
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        assert!(buf.is_empty(), "closed without OK");
        assert_eq!(b.connection_count(), 0);
    }

    #[test]
    fn bad_connect_lines_are_closed() {
        let path = temp_path("bad");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        for line in [
            &b"CONNECT\n"[..],
            b"CONNECT x\n",
            b"CONNECT 99999999999\n",
            b"HELLO 1\n",
            &[b'A'; 100][..],
        ] {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.write_all(line).expect("write");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let deadline = Instant::now() + Duration::from_secs(5);
            while b.handshakes.is_empty() && Instant::now() < deadline {
                b.notify();
            }
            b.notify();
            let mut buf = Vec::new();
            // Closed: EOF, or a reset when the VMM left bytes unread.
            match s.read_to_end(&mut buf) {
                Ok(_) => assert!(buf.is_empty()),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            }
            assert!(!b.has_pending_rx(), "nothing sent to the guest");
        }
        assert_eq!(parse_connect(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT 1024\r"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT +1"), None);
        assert_eq!(parse_connect(b"CONNECT 4294967296"), None);
    }

    #[test]
    fn guest_initiated_connections_use_the_port_suffixed_path() {
        let path = temp_path("out");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let mut listen_path = path.clone().into_os_string();
        listen_path.push("_52");
        let listener = UnixListener::bind(&listen_path).expect("bind");
        b.send_pkt(&guest_hdr(VSOCK_OP_REQUEST, 5000, 52), &[]);
        let (resp, _) = next(&mut b).expect("response");
        assert_eq!(resp.op, VSOCK_OP_RESPONSE);
        assert_eq!((resp.src_port, resp.dst_port), (52, 5000));
        let (mut host, _) = listener.accept().expect("accept");
        let mut rw = guest_hdr(VSOCK_OP_RW, 5000, 52);
        rw.len = 3;
        b.send_pkt(&rw, b"abc");
        let mut got = [0u8; 3];
        host.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"abc");
        host.write_all(b"xyz").expect("write");
        let (back, data) = next(&mut b).expect("data");
        assert_eq!((back.op, data.as_slice()), (VSOCK_OP_RW, &b"xyz"[..]));
        assert_eq!(back.fwd_cnt, 3, "the guest's 3 bytes were forwarded");
        // Nobody listens on port 53: reset.
        b.send_pkt(&guest_hdr(VSOCK_OP_REQUEST, 5001, 53), &[]);
        let (rst, _) = next(&mut b).expect("rst");
        assert_eq!(
            (rst.op, rst.dst_port, rst.src_port),
            (VSOCK_OP_RST, 5001, 53)
        );
        let _ = std::fs::remove_file(&listen_path);
    }

    #[test]
    fn stray_and_foreign_packets() {
        let path = temp_path("stray");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        // Data on no connection: RST.
        b.send_pkt(&guest_hdr(VSOCK_OP_RW, 1, 2), b"x");
        let (rst, _) = b.recv_pkt(0).expect("rst");
        assert_eq!(rst.op, VSOCK_OP_RST);
        // RST on no connection: nothing. Wrong CIDs: dropped.
        b.send_pkt(&guest_hdr(VSOCK_OP_RST, 1, 2), &[]);
        let mut foreign = guest_hdr(VSOCK_OP_REQUEST, 1, 2);
        foreign.src_cid = 7;
        b.send_pkt(&foreign, &[]);
        foreign.src_cid = CID;
        foreign.dst_cid = 9;
        b.send_pkt(&foreign, &[]);
        assert!(!b.has_pending_rx());
        // Not a stream: RST.
        let mut dgram = guest_hdr(VSOCK_OP_REQUEST, 1, 2);
        dgram.type_ = 2;
        b.send_pkt(&dgram, &[]);
        assert_eq!(b.recv_pkt(0).map(|(h, _)| h.op), Some(VSOCK_OP_RST));
        // Resets are bounded.
        for i in 0..(MAX_PENDING_RSTS as u32 + 10) {
            b.send_pkt(&guest_hdr(VSOCK_OP_RW, i, 2), &[]);
        }
        assert_eq!(b.rsts.len(), MAX_PENDING_RSTS);
    }

    #[test]
    fn credit_limits_what_the_guest_is_sent() {
        let path = temp_path("credit");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let mut s = UnixStream::connect(&path).expect("connect");
        s.write_all(b"CONNECT 7\n").expect("write");
        let (req, _) = next(&mut b).expect("request");
        let mut resp = guest_hdr(VSOCK_OP_RESPONSE, 7, req.src_port);
        resp.buf_alloc = 4;
        b.send_pkt(&resp, &[]);
        let mut line = [0u8; 14];
        s.read_exact(&mut line).expect("OK line");
        s.write_all(b"0123456789").expect("write");
        let (first, data) = next(&mut b).expect("data");
        assert_eq!((first.op, data.as_slice()), (VSOCK_OP_RW, &b"0123"[..]));
        // Out of credit: the backend asks for more and then waits.
        let (ask, _) = next(&mut b).expect("credit request");
        assert_eq!(ask.op, VSOCK_OP_CREDIT_REQUEST);
        b.notify();
        assert!(b.recv_pkt(4096).is_none());
        let mut update = guest_hdr(VSOCK_OP_CREDIT_UPDATE, 7, req.src_port);
        update.buf_alloc = 4;
        update.fwd_cnt = 4;
        b.send_pkt(&update, &[]);
        let (second, data) = next(&mut b).expect("more data");
        assert_eq!((second.op, data.as_slice()), (VSOCK_OP_RW, &b"4567"[..]));
        // A small RX buffer limits a packet too.
        update.fwd_cnt = 8;
        b.send_pkt(&update, &[]);
        b.notify();
        let (third, data) = b.recv_pkt(1).map(|(h, d)| (h, d.to_vec())).expect("data");
        assert_eq!((third.len, data.as_slice()), (1, &b"8"[..]));
    }

    #[test]
    fn a_guest_exceeding_its_credit_is_reset() {
        let path = temp_path("overrun");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let (s, local) = host_connect(&mut b, 9);
        // The host does not read; the socket buffer fills, then the VMM's
        // buffer (the guest's credit), then the guest sends more.
        let chunk = vec![0u8; 60 * 1024];
        let mut rw = guest_hdr(VSOCK_OP_RW, 9, local);
        rw.len = chunk.len() as u32;
        for _ in 0..64 {
            b.send_pkt(&rw, &chunk);
            if b.connection_count() == 0 {
                break;
            }
        }
        assert_eq!(b.connection_count(), 0, "overrun connection was reset");
        let (rst, _) = b.recv_pkt(0).expect("rst");
        assert_eq!(rst.op, VSOCK_OP_RST);
        drop(s);
    }

    #[test]
    fn guest_shutdown_flushes_then_resets() {
        let path = temp_path("gshut");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let (mut s, local) = host_connect(&mut b, 11);
        let mut rw = guest_hdr(VSOCK_OP_RW, 11, local);
        rw.len = 2;
        b.send_pkt(&rw, b"hi");
        let mut shut = guest_hdr(VSOCK_OP_SHUTDOWN, 11, local);
        shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
        b.send_pkt(&shut, &[]);
        let (rst, _) = b.recv_pkt(0).expect("rst");
        assert_eq!(rst.op, VSOCK_OP_RST);
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read");
        assert_eq!(got, b"hi");
        assert_eq!(b.connection_count(), 0);
    }

    #[test]
    fn unanswered_requests_and_silent_hosts_time_out() {
        let path = temp_path("timeout");
        let mut b = VsockUnixBackend::new(CID, &path).expect("backend");
        let _silent = UnixStream::connect(&path).expect("connect");
        b.notify();
        assert_eq!(b.handshakes.len(), 1);
        assert!(b.next_timeout().is_some_and(|d| d <= HANDSHAKE_TIMEOUT));
        for h in b.handshakes.values_mut() {
            h.deadline = Instant::now();
        }
        b.tick();
        assert!(b.handshakes.is_empty());

        let mut s = UnixStream::connect(&path).expect("connect");
        s.write_all(b"CONNECT 5\n").expect("write");
        let (req, _) = next(&mut b).expect("request");
        assert_eq!(req.op, VSOCK_OP_REQUEST);
        for c in b.conns.values_mut() {
            c.deadline = Some(Instant::now());
        }
        b.tick();
        assert_eq!(b.connection_count(), 0);
        assert_eq!(b.recv_pkt(0).map(|(h, _)| h.op), Some(VSOCK_OP_RST));
    }

    #[test]
    fn stale_sockets_are_replaced_other_files_are_not() {
        let path = temp_path("stale");
        drop(UnixListener::bind(&path).expect("bind"));
        assert!(path.exists());
        let b = VsockUnixBackend::new(CID, &path).expect("stale socket replaced");
        drop(b);
        std::fs::write(&path, b"not a socket").expect("file");
        assert!(matches!(
            VsockUnixBackend::new(CID, &path),
            Err(VsockError::PathExists(_))
        ));
        std::fs::remove_file(&path).expect("cleanup");
        let long = PathBuf::from(format!("/tmp/{}", "x".repeat(100)));
        assert!(matches!(
            VsockUnixBackend::new(CID, &long),
            Err(VsockError::PathTooLong { .. })
        ));
    }
}
