//! The virtio-vsock device: three queues (RX, TX, event), the guest CID in
//! config space, and a worker that moves packets between the queues and the
//! Unix-socket backend. TX chains are parsed (bounded, see `packet`) and
//! handed to the backend; RX buffers are filled only while the backend has
//! something to send, and a buffer it cannot use yet goes back to the ring.

use std::io::{self, Write};
use std::os::fd::RawFd;
use std::path::Path;
use std::time::Duration;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::packet;
use super::unix_backend::VsockUnixBackend;
use super::{EVENT_TRANSPORT_RESET, EVQ, MAX_GUEST_CID, MIN_GUEST_CID, RXQ, TXQ};
use crate::devices::virtio::queue::{self, QUEUE_MAX_SIZE};
use crate::devices::virtio::worker::{WorkerError, WorkerHandler, WorkerSlot, HANDLER_TOKEN_BASE};
use crate::devices::virtio::{
    lock, read_config_bytes, ActivateError, DeviceContext, VirtioDevice, INTERRUPT_USED_RING,
    VIRTIO_F_VERSION_1, VIRTIO_ID_VSOCK,
};

/// Errors setting up the vsock device; each says which flag to change.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The CID is reserved or out of range.
    #[error(
        "vsock guest CID {0} is invalid: --vsock-cid must be between {MIN_GUEST_CID} and \
         {MAX_GUEST_CID} (0-2 are reserved)"
    )]
    InvalidCid(u64),
    /// The socket path does not fit a sockaddr_un.
    #[error(
        "vsock socket path {path} is {len} bytes; with the `_<port>` suffix of guest-initiated \
         connections it must fit in 107: choose a shorter --vsock-uds"
    )]
    PathTooLong {
        /// The path.
        path: String,
        /// Its length.
        len: usize,
    },
    /// Something that is not a socket is in the way.
    #[error("{0} exists and is not a socket: remove it or choose another --vsock-uds")]
    PathExists(String),
    /// bind(2) failed.
    #[error("cannot listen on vsock socket {path}: {source}; check that its directory exists and is writable")]
    Bind {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// epoll or socket setup failed.
    #[error("cannot set up the vsock sockets: {0}")]
    Setup(#[source] io::Error),
    /// The worker could not be set up.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// Token of the backend's epoll fd in the worker's epoll set.
const BACKEND_TOKEN: u64 = HANDLER_TOKEN_BASE;

/// The running device.
#[derive(Debug)]
struct VsockWorker {
    backend: VsockUnixBackend,
    ctx: DeviceContext,
    /// Scratch for TX packet data (at most 64 KiB).
    data: Vec<u8>,
    /// Send TRANSPORT_RESET on the event queue (after a restore).
    reset_event_pending: bool,
}

impl VsockWorker {
    /// Hands every TX packet to the backend; returns whether any chain was
    /// used.
    fn process_tx(&mut self) -> bool {
        let VsockWorker {
            backend, ctx, data, ..
        } = self;
        let mem: &GuestMemoryMmap = &ctx.mem;
        let mut queues = lock(&ctx.queues);
        let Some(q) = queues.get_mut(TXQ) else {
            return false;
        };
        let mut used = false;
        // A broken ring (Err) reads as empty: nothing more is taken from it.
        while let Ok(Some(chain)) = queue::pop(q, mem) {
            let head = chain.head_index();
            match packet::read_tx(chain, mem, data) {
                Ok(hdr) => backend.send_pkt(&hdr, data),
                // The header made sense but the rest did not: reset that
                // connection rather than guess at its data.
                Err((Some(hdr), _)) => backend.reject(&hdr),
                // No header: nothing to answer.
                Err((None, _)) => {}
            }
            if queue::add_used(q, mem, head, 0).is_err() {
                break;
            }
            used = true;
        }
        used
    }

    /// Fills RX buffers while the backend has packets; returns whether any
    /// chain was used.
    fn process_rx(&mut self) -> bool {
        let VsockWorker { backend, ctx, .. } = self;
        let mem: &GuestMemoryMmap = &ctx.mem;
        let mut queues = lock(&ctx.queues);
        let Some(q) = queues.get_mut(RXQ) else {
            return false;
        };
        let mut used = false;
        while backend.has_pending_rx() {
            let Ok(Some(chain)) = queue::pop(q, mem) else {
                break;
            };
            let head = chain.head_index();
            let mut writer = match chain.writer(mem) {
                Ok(w) => w,
                Err(_) => {
                    // Outside guest memory: returned unused.
                    if queue::add_used(q, mem, head, 0).is_err() {
                        break;
                    }
                    used = true;
                    continue;
                }
            };
            let room = match packet::rx_capacity(&writer) {
                Ok(room) => room,
                Err(_) => {
                    if queue::add_used(q, mem, head, 0).is_err() {
                        break;
                    }
                    used = true;
                    continue;
                }
            };
            match backend.recv_pkt(room) {
                Some((hdr, data)) => {
                    let len = packet::write_rx(&mut writer, &hdr, data).unwrap_or(0);
                    if queue::add_used(q, mem, head, len).is_err() {
                        break;
                    }
                    used = true;
                }
                None => {
                    queue::undo_pop(q);
                    break;
                }
            }
        }
        used
    }

    /// Sends a pending TRANSPORT_RESET event.
    fn process_evq(&mut self) -> bool {
        if !self.reset_event_pending {
            return false;
        }
        let mem: &GuestMemoryMmap = &self.ctx.mem;
        let mut queues = lock(&self.ctx.queues);
        let Some(q) = queues.get_mut(EVQ) else {
            return false;
        };
        let Ok(Some(chain)) = queue::pop(q, mem) else {
            return false;
        };
        let head = chain.head_index();
        let written = chain
            .writer(mem)
            .ok()
            .and_then(|mut w| w.write_all(&EVENT_TRANSPORT_RESET.to_le_bytes()).ok());
        let len = if written.is_some() { 4 } else { 0 };
        self.reset_event_pending = false;
        queue::add_used(q, mem, head, len).is_ok()
    }

    fn signal(&self, used: bool) {
        if used {
            // See the block device: nothing better to do on failure.
            let _ = self.ctx.interrupt.trigger(INTERRUPT_USED_RING);
        }
    }
}

impl WorkerHandler for VsockWorker {
    fn extra_fds(&self) -> Vec<(RawFd, u64)> {
        vec![(self.backend.epoll_fd(), BACKEND_TOKEN)]
    }

    fn queue_notified(&mut self, index: usize) {
        // After a restore the guest must learn that its connections are gone
        // before it sees a packet of a new one.
        let reset = self.reset_event_pending && self.process_evq();
        let used = reset
            | match index {
                RXQ => self.process_rx(),
                TXQ => {
                    // TX first: the guest's packets often produce replies (a
                    // RESPONSE, an RST, credit) that RX then delivers.
                    let tx = self.process_tx();
                    self.process_rx() || tx
                }
                EVQ => self.process_evq(),
                _ => false,
            };
        self.signal(used);
    }

    fn fd_ready(&mut self, _token: u64) {
        if self.reset_event_pending && self.process_evq() {
            self.signal(true);
        }
        self.backend.notify();
        let used = self.process_rx();
        self.signal(used);
    }

    fn next_timeout(&self) -> Option<Duration> {
        self.backend.next_timeout()
    }

    fn tick(&mut self) {
        self.backend.tick();
        let used = self.process_rx();
        self.signal(used);
    }
}

/// A virtio-vsock device.
#[derive(Debug)]
pub struct Vsock {
    cid: u64,
    backend: Option<VsockUnixBackend>,
    /// Its handler is the running state (connections), kept while paused.
    worker: WorkerSlot<VsockWorker>,
    evts: [EventFd; 3],
    config: [u8; 8],
    /// Set by a restore: the next activation tells the guest that every
    /// connection is gone.
    pub(super) send_reset_event: bool,
}

impl Vsock {
    /// A device for guest `cid` whose host side listens on `uds_path`.
    pub fn new(cid: u64, uds_path: &Path) -> Result<Self, VsockError> {
        if !(MIN_GUEST_CID..=MAX_GUEST_CID).contains(&cid) {
            return Err(VsockError::InvalidCid(cid));
        }
        let backend = VsockUnixBackend::new(cid, uds_path)?;
        Self::with_backend(backend)
    }

    /// A device around an existing backend.
    pub fn with_backend(backend: VsockUnixBackend) -> Result<Self, VsockError> {
        let evt = || {
            EventFd::new(libc::EFD_NONBLOCK).map_err(|source| WorkerError::Setup {
                device: "vsock",
                source,
            })
        };
        Ok(Vsock {
            cid: backend.guest_cid(),
            config: backend.guest_cid().to_le_bytes(),
            backend: Some(backend),
            worker: WorkerSlot::new("vsock"),
            evts: [evt()?, evt()?, evt()?],
            send_reset_event: false,
        })
    }

    /// The guest's CID.
    pub fn cid(&self) -> u64 {
        self.cid
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_MAX_SIZE; 3]
    }

    fn avail_features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.evts
    }

    fn activate(&mut self, ctx: DeviceContext) -> Result<(), ActivateError> {
        if self.worker.is_running() {
            return Err(ActivateError::AlreadyActive);
        }
        let backend = self.backend.take().ok_or(ActivateError::Broken("vsock"))?;
        // One pass over every queue at start: packets queued before
        // activation (or before a snapshot) are not left waiting.
        for evt in &self.evts {
            let _ = evt.write(1);
        }
        let handler = VsockWorker {
            backend,
            ctx,
            data: Vec::new(),
            reset_event_pending: std::mem::take(&mut self.send_reset_event),
        };
        Ok(self.worker.start(handler, &self.evts)?)
    }

    fn is_activated(&self) -> bool {
        self.worker.is_running()
    }

    fn reset(&mut self) {
        // A panicked worker took the backend (and its listener) with it;
        // the device then stays inactive.
        if let Some(mut handler) = self.worker.stop() {
            handler.backend.reset_connections();
            self.backend = Some(handler.backend);
        }
        for evt in &self.evts {
            let _ = evt.read();
        }
    }

    fn device_state(&self) -> crate::devices::virtio::persist::DeviceState {
        crate::devices::virtio::persist::DeviceState::Vsock(self.save())
    }

    fn pause(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.pause()?)
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.resume(&self.evts)?)
    }
}

/// A polling test driver for the device behind a transport: posts RX
/// buffers, sends TX packets, waits for used entries.
#[cfg(test)]
pub(crate) mod test_driver {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::super::packet::{VsockHeader, HDR_SIZE};
    use super::super::{HOST_CID, TYPE_STREAM};
    use crate::devices::virtio::mmio::MmioTransport;
    use crate::devices::virtio::testing::{self, Desc, DriverSetup, GuestQueue, BUFFERS, F_WRITE};
    use crate::devices::virtio::{Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

    /// Guest CID the tests use.
    pub const CID: u64 = 3;
    const RX_BUF: u64 = BUFFERS;
    const RX_BUF_SIZE: u32 = 0x1000;
    const RX_BUFS: u16 = 8;
    const TX_BUF: u64 = BUFFERS + 0x4_0000;
    const EV_BUF: u64 = BUFFERS + 0x6_0000;

    pub struct Driver {
        pub t: MmioTransport,
        pub mem: GuestMemoryMmap,
        rx: GuestQueue,
        tx: GuestQueue,
        ev: GuestQueue,
        /// RX head -> buffer slot.
        rx_slot: Vec<u16>,
    }

    impl Driver {
        pub fn new(dev: Box<dyn VirtioDevice>) -> Self {
            let mem = testing::memory();
            let t = MmioTransport::new(dev, mem.clone(), Arc::new(Interrupt::new().expect("irq")));
            Self::attach(t, mem, true)
        }

        /// Wraps a transport; `init` runs driver initialisation.
        pub fn attach(mut t: MmioTransport, mem: GuestMemoryMmap, init: bool) -> Self {
            let setup = DriverSetup::for_sizes(&[16, 16, 16]);
            let mut d = Driver {
                rx: GuestQueue::new(&mem, setup.queues[0]),
                tx: GuestQueue::new(&mem, setup.queues[1]),
                ev: GuestQueue::new(&mem, setup.queues[2]),
                mem,
                rx_slot: vec![0; 16],
                t: {
                    if init {
                        testing::init_driver(&mut t, &setup, 1 << VIRTIO_F_VERSION_1);
                    }
                    t
                },
            };
            if init {
                for slot in 0..RX_BUFS {
                    d.post_rx(slot);
                }
                d.ev.add_chain(&[Desc {
                    addr: EV_BUF,
                    len: 4,
                    flags: F_WRITE,
                    next: 0,
                }]);
                d.kick(0);
                d.kick(2);
            }
            d
        }

        fn kick(&mut self, q: u32) {
            testing::write32(&mut self.t, 0x50, q);
        }

        fn post_rx(&mut self, slot: u16) {
            let head = self.rx.add_chain(&[Desc {
                addr: RX_BUF + u64::from(slot) * u64::from(RX_BUF_SIZE),
                len: RX_BUF_SIZE,
                flags: F_WRITE,
                next: 0,
            }]);
            self.rx_slot[head as usize] = slot;
        }

        /// Sends one packet from the guest.
        pub fn send(&mut self, op: u16, src_port: u32, dst_port: u32, fwd_cnt: u32, data: &[u8]) {
            let hdr = VsockHeader {
                src_cid: CID,
                dst_cid: HOST_CID,
                src_port,
                dst_port,
                len: data.len() as u32,
                type_: TYPE_STREAM,
                op,
                flags: 0,
                buf_alloc: 4096,
                fwd_cnt,
            };
            self.mem
                .write_slice(&hdr.to_bytes(), GuestAddress(TX_BUF))
                .expect("hdr");
            self.mem
                .write_slice(data, GuestAddress(TX_BUF + HDR_SIZE as u64))
                .expect("data");
            let mut descs = vec![Desc {
                addr: TX_BUF,
                len: HDR_SIZE as u32,
                flags: 0,
                next: 0,
            }];
            if !data.is_empty() {
                descs.push(Desc {
                    addr: TX_BUF + HDR_SIZE as u64,
                    len: data.len() as u32,
                    flags: 0,
                    next: 0,
                });
            }
            self.tx.add_chain(&descs);
            self.kick(1);
            wait(|| (!self.tx.take_used().is_empty()).then_some(())).expect("TX used");
        }

        /// Waits for the next packet from the device and recycles its buffer.
        pub fn recv(&mut self) -> Option<(VsockHeader, Vec<u8>)> {
            let (head, len) = wait(|| {
                let used = self.rx.take_used();
                assert!(
                    used.len() <= 1,
                    "one packet at a time in these tests: {used:?}"
                );
                used.first().copied()
            })?;
            Some(self.take_rx(head, len))
        }

        /// Waits for packets from the device, takes every one used by then
        /// (in order), and recycles their buffers.
        pub fn recv_all(&mut self) -> Vec<(VsockHeader, Vec<u8>)> {
            let used = wait(|| {
                let used = self.rx.take_used();
                (!used.is_empty()).then_some(used)
            })
            .unwrap_or_default();
            used.into_iter()
                .map(|(head, len)| self.take_rx(head, len))
                .collect()
        }

        fn take_rx(&mut self, head: u32, len: u32) -> (VsockHeader, Vec<u8>) {
            let slot = self.rx_slot[head as usize];
            let base = RX_BUF + u64::from(slot) * u64::from(RX_BUF_SIZE);
            let mut raw = vec![0u8; len as usize];
            self.mem
                .read_slice(&mut raw, GuestAddress(base))
                .expect("rx");
            let hdr = VsockHeader::parse(&raw).expect("header");
            self.post_rx(slot);
            self.kick(0);
            (hdr, raw[HDR_SIZE..].to_vec())
        }

        /// Event-queue entries the device used.
        pub fn events(&mut self) -> Vec<u32> {
            wait(|| {
                let used = self.ev.take_used();
                (!used.is_empty()).then_some(used)
            })
            .unwrap_or_default()
            .into_iter()
            .map(|(_, len)| {
                assert_eq!(len, 4);
                self.mem
                    .read_obj::<u32>(GuestAddress(EV_BUF))
                    .expect("event")
            })
            .collect()
        }
    }

    /// Polls `f` for up to 5 s.
    pub fn wait<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(v) = f() {
                return Some(v);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;

    use super::test_driver::{Driver, CID};
    use super::*;
    use crate::devices::virtio::testing;
    use crate::devices::virtio::vsock::{
        HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, VSOCK_OP_REQUEST, VSOCK_OP_RESPONSE, VSOCK_OP_RST,
        VSOCK_OP_RW, VSOCK_OP_SHUTDOWN,
    };

    pub(crate) fn uds_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vsk-dev-{}-{tag}", std::process::id()))
    }

    #[test]
    fn config_space_and_features() {
        let path = uds_path("cfg");
        let dev = Vsock::new(CID, &path).expect("vsock");
        let mut data = [0u8; 8];
        dev.read_config(0, &mut data);
        assert_eq!(u64::from_le_bytes(data), CID);
        assert_eq!(dev.queue_max_sizes().len(), 3);
        assert!(matches!(
            Vsock::new(2, &path),
            Err(VsockError::InvalidCid(2))
        ));
        assert!(matches!(
            Vsock::new(u64::from(u32::MAX), &path),
            Err(VsockError::InvalidCid(_))
        ));
    }

    #[test]
    fn host_connect_and_echo_through_the_queues() {
        let path = uds_path("echo");
        let mut d = Driver::new(Box::new(Vsock::new(CID, &path).expect("vsock")));
        assert!(d.t.device().is_activated());
        for round in 0..3u32 {
            let mut host = UnixStream::connect(&path).expect("connect");
            host.write_all(b"CONNECT 1024\n").expect("write");
            let (req, _) = d.recv().expect("request");
            assert_eq!(
                (req.op, req.dst_port, req.dst_cid),
                (VSOCK_OP_REQUEST, 1024, CID)
            );
            assert_eq!(req.src_cid, HOST_CID);
            d.send(VSOCK_OP_RESPONSE, 1024, req.src_port, 0, &[]);
            let mut reader = BufReader::new(host.try_clone().expect("clone"));
            let mut line = String::new();
            reader.read_line(&mut line).expect("OK");
            assert_eq!(line, format!("OK {}\n", req.src_port));
            let msg = format!("hello {round}");
            host.write_all(msg.as_bytes()).expect("write");
            let (rw, data) = d.recv().expect("data");
            assert_eq!((rw.op, data.as_slice()), (VSOCK_OP_RW, msg.as_bytes()));
            d.send(VSOCK_OP_RW, 1024, req.src_port, data.len() as u32, &data);
            let mut back = vec![0u8; msg.len()];
            reader.read_exact(&mut back).expect("echo");
            assert_eq!(back, msg.as_bytes());
            drop(reader);
            drop(host);
            let (shut, _) = d.recv().expect("shutdown");
            assert_eq!(shut.op, VSOCK_OP_SHUTDOWN);
            assert_eq!(shut.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
            d.send(VSOCK_OP_RST, 1024, req.src_port, 0, &[]);
        }
        // A malformed TX packet (data claimed, none present) on no
        // connection: answered with RST, the device keeps going.
        d.send(VSOCK_OP_RW, 1, 2, 0, &[]);
        let (rst, _) = d.recv().expect("rst");
        assert_eq!(rst.op, VSOCK_OP_RST);
        // Reset brings connections down and the device back to idle.
        testing::write32(&mut d.t, 0x70, 0);
        assert!(!d.t.device().is_activated());
    }
}
