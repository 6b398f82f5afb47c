//! The virtio-net device: two queues (RX 0, TX 1), the MAC in config space,
//! and a worker thread that moves frames between the queues and the tap.
//!
//! TX: each chain is a 12-byte `virtio_net_hdr_v1` and the frame; the
//! frame (14 to [`MAX_FRAME_LEN`] bytes) goes to the tap with one `writev`
//! behind a zeroed header (no offloads were offered, so whatever the guest
//! put in its header is not passed on). Anything else is dropped and the
//! chain returned with length 0.
//!
//! RX: while the tap is readable and the guest has RX buffers, one frame
//! per chain (header + frame, `num_buffers` = 1). With no RX buffer left the
//! tap is taken out of the worker's epoll set until the guest adds buffers
//! (an RX queue notify), so a busy tap does not make the worker spin; frames
//! wait in the tap's queue meanwhile (the kernel drops them when it fills).
//! A chain too small for the frame gets length 0 and the frame is dropped.
//!
//! The backend is any descriptor that carries one header-prefixed frame per
//! read/write: the tap (see [`super::tap`]), or a datagram socket in tests.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::tap::{open_tap, TapError};
use super::{Mac, MAX_FRAME_LEN, RXQ, TXQ, VIRTIO_NET_F_MAC, VNET_HDR_LEN};
use crate::devices::virtio::queue::{self, QUEUE_MAX_SIZE};
use crate::devices::virtio::worker::{WorkerError, WorkerHandler, WorkerSlot, HANDLER_TOKEN_BASE};
use crate::devices::virtio::{
    lock, read_config_bytes, ActivateError, DeviceContext, VirtioDevice, INTERRUPT_USED_RING,
    VIRTIO_F_VERSION_1,
};

/// virtio device ID of a network card.
pub const VIRTIO_ID_NET: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_NET;

/// Smallest frame passed on: an Ethernet header.
const MIN_FRAME_LEN: usize = 14;
/// Frames moved per RX pass before the worker looks at its other events.
const RX_BATCH: usize = 64;
/// Token of the tap's epoll set in the worker's.
const TAP_TOKEN: u64 = HANDLER_TOKEN_BASE;

/// Errors setting up the net device; each names the tap.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The tap could not be attached.
    #[error(transparent)]
    Tap(#[from] TapError),
    /// An eventfd or epoll set could not be created.
    #[error("cannot set up the virtio-net device for tap {name}: {source}")]
    Setup {
        /// The tap.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Frames and wake-ups, for tests and `-v`.
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Frames written to the tap.
    pub tx_frames: AtomicU64,
    /// Guest TX chains dropped as malformed or refused by the tap.
    pub tx_dropped: AtomicU64,
    /// Frames written into RX buffers.
    pub rx_frames: AtomicU64,
    /// Frames read from the tap and dropped (buffer too small, outside RAM).
    pub rx_dropped: AtomicU64,
    /// Times the worker woke for the tap.
    pub tap_wakeups: AtomicU64,
}

/// The running device.
#[derive(Debug)]
struct NetWorker {
    tap: File,
    /// The tap alone, so that it can be left out while there is no RX
    /// buffer; the worker watches this set's descriptor.
    tap_epoll: Epoll,
    tap_polled: bool,
    ctx: DeviceContext,
    /// One header + frame, for either direction.
    buf: Vec<u8>,
    counters: Arc<NetCounters>,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl NetWorker {
    fn poll_tap(&mut self, on: bool) {
        if self.tap_polled == on {
            return;
        }
        let events = if on { EventSet::IN } else { EventSet::empty() };
        // Cannot fail for a descriptor already in the set; if it did, the
        // tap stays as it was (a spurious wake-up or a later RX notify
        // retries).
        if self
            .tap_epoll
            .ctl(
                ControlOperation::Modify,
                self.tap.as_raw_fd(),
                EpollEvent::new(events, 0),
            )
            .is_ok()
        {
            self.tap_polled = on;
        }
    }

    /// Sends every TX chain; returns whether any chain was used.
    fn process_tx(&mut self) -> bool {
        let NetWorker {
            tap,
            ctx,
            buf,
            counters,
            ..
        } = self;
        let mem: &GuestMemoryMmap = &ctx.mem;
        let mut queues = lock(&ctx.queues);
        let Some(q) = queues.get_mut(TXQ) else {
            return false;
        };
        let mut used = false;
        while let Ok(Some(chain)) = queue::pop(q, mem) {
            let head = chain.head_index();
            match read_tx_frame(chain, mem, buf) {
                Some(len) => {
                    let zero = [0u8; VNET_HDR_LEN];
                    let iov = [IoSlice::new(&zero), IoSlice::new(&buf[..len])];
                    match tap.write_vectored(&iov) {
                        Ok(n) if n == VNET_HDR_LEN + len => bump(&counters.tx_frames),
                        // Full, down, or refused by the kernel: a NIC drops.
                        _ => bump(&counters.tx_dropped),
                    }
                }
                None => bump(&counters.tx_dropped),
            }
            if queue::add_used(q, mem, head, 0).is_err() {
                break;
            }
            used = true;
        }
        used
    }

    /// Moves frames from the tap into RX chains; returns whether any chain
    /// was used. Leaves the tap out of the epoll set when the guest has no
    /// RX buffer.
    fn process_rx(&mut self) -> bool {
        let mut used = false;
        let mut out_of_buffers = false;
        {
            let NetWorker {
                tap,
                ctx,
                buf,
                counters,
                ..
            } = self;
            let mem: &GuestMemoryMmap = &ctx.mem;
            let mut queues = lock(&ctx.queues);
            let Some(q) = queues.get_mut(RXQ) else {
                return false;
            };
            for _ in 0..RX_BATCH {
                let chain = match queue::pop(q, mem) {
                    Ok(Some(chain)) => chain,
                    _ => {
                        out_of_buffers = true;
                        break;
                    }
                };
                let head = chain.head_index();
                let Ok(mut writer) = chain.writer(mem) else {
                    // Outside guest memory: returned unused.
                    if queue::add_used(q, mem, head, 0).is_err() {
                        break;
                    }
                    used = true;
                    continue;
                };
                let n = match tap.read(buf) {
                    Ok(n) if n >= VNET_HDR_LEN => n,
                    // A runt: nothing to deliver; keep the buffer.
                    Ok(_) => {
                        queue::undo_pop(q);
                        bump(&counters.rx_dropped);
                        continue;
                    }
                    // Nothing more (WouldBlock) or a tap error: keep the
                    // buffer for later.
                    Err(_) => {
                        queue::undo_pop(q);
                        break;
                    }
                };
                // No mergeable buffers: one buffer per frame.
                buf[10..12].copy_from_slice(&1u16.to_le_bytes());
                let len = if writer.available_bytes() >= n && writer.write_all(&buf[..n]).is_ok() {
                    bump(&counters.rx_frames);
                    n as u32
                } else {
                    bump(&counters.rx_dropped);
                    0
                };
                if queue::add_used(q, mem, head, len).is_err() {
                    break;
                }
                used = true;
            }
        }
        if out_of_buffers {
            self.poll_tap(false);
        }
        used
    }

    fn signal(&self, used: bool) {
        if used {
            // Nothing better to do on failure: the guest polls or kicks again.
            let _ = self.ctx.interrupt.trigger(INTERRUPT_USED_RING);
        }
    }
}

/// Reads a TX chain's frame (after its 12-byte header) into `buf`; `None`
/// for a chain outside RAM, without a header, or with a frame shorter than
/// an Ethernet header or longer than [`MAX_FRAME_LEN`].
fn read_tx_frame(chain: queue::Chain<'_>, mem: &GuestMemoryMmap, buf: &mut [u8]) -> Option<usize> {
    let mut reader = chain.reader(mem).ok()?;
    let total = reader.available_bytes();
    let len = total.checked_sub(VNET_HDR_LEN)?;
    if !(MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&len) || buf.len() < len {
        return None;
    }
    let mut hdr = [0u8; VNET_HDR_LEN];
    reader.read_exact(&mut hdr).ok()?;
    reader.read_exact(&mut buf[..len]).ok()?;
    Some(len)
}

impl WorkerHandler for NetWorker {
    fn extra_fds(&self) -> Vec<(RawFd, u64)> {
        vec![(self.tap_epoll.as_raw_fd(), TAP_TOKEN)]
    }

    fn queue_notified(&mut self, index: usize) {
        let used = match index {
            RXQ => {
                // New buffers: take frames again.
                self.poll_tap(true);
                self.process_rx()
            }
            TXQ => self.process_tx(),
            _ => false,
        };
        self.signal(used);
    }

    fn fd_ready(&mut self, _token: u64) {
        bump(&self.counters.tap_wakeups);
        // Harvest the inner set's readiness; the reads below do the work.
        let mut events = [EpollEvent::default(); 1];
        let _ = self.tap_epoll.wait(0, &mut events);
        let used = self.process_rx();
        self.signal(used);
    }
}

/// A virtio-net device on a tap.
#[derive(Debug)]
pub struct Net {
    name: String,
    mac: Mac,
    tap: Option<File>,
    worker: WorkerSlot<NetWorker>,
    evts: [EventFd; 2],
    counters: Arc<NetCounters>,
}

impl Net {
    /// A device on the persistent tap `tap_name`, with `mac` for the guest.
    pub fn new(tap_name: &str, mac: Mac) -> Result<Self, NetError> {
        let tap = open_tap(tap_name)?;
        Self::with_backend(tap, tap_name, mac)
    }

    /// A device on `backend`, a non-blocking descriptor carrying one
    /// header-prefixed frame per read and write; `name` is for messages.
    pub fn with_backend(backend: File, name: &str, mac: Mac) -> Result<Self, NetError> {
        let evt = || {
            EventFd::new(libc::EFD_NONBLOCK).map_err(|source| NetError::Setup {
                name: name.to_owned(),
                source,
            })
        };
        Ok(Net {
            name: name.to_owned(),
            mac,
            tap: Some(backend),
            worker: WorkerSlot::new("net"),
            evts: [evt()?, evt()?],
            counters: Arc::new(NetCounters::default()),
        })
    }

    /// The guest's MAC.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// The tap's name.
    pub fn tap_name(&self) -> &str {
        &self.name
    }

    /// Frame and wake-up counters.
    pub fn counters(&self) -> Arc<NetCounters> {
        self.counters.clone()
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_MAX_SIZE; 2]
    }

    fn avail_features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.mac.0, offset, data);
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.evts
    }

    fn activate(&mut self, ctx: DeviceContext) -> Result<(), ActivateError> {
        if self.worker.is_running() {
            return Err(ActivateError::AlreadyActive);
        }
        let tap = self.tap.take().ok_or(ActivateError::Broken("net"))?;
        let setup = |source| WorkerError::Setup {
            device: "net",
            source,
        };
        let tap_epoll = match Epoll::new().and_then(|e| {
            e.ctl(
                ControlOperation::Add,
                tap.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .map(|()| e)
        }) {
            Ok(e) => e,
            Err(e) => {
                self.tap = Some(tap);
                return Err(setup(e).into());
            }
        };
        // One pass over both queues at start: frames queued before the
        // activation (or a snapshot) are not left waiting.
        for evt in &self.evts {
            let _ = evt.write(1);
        }
        let handler = NetWorker {
            tap,
            tap_epoll,
            tap_polled: true,
            ctx,
            buf: vec![0; VNET_HDR_LEN + MAX_FRAME_LEN],
            counters: self.counters.clone(),
        };
        Ok(self.worker.start(handler, &self.evts)?)
    }

    fn is_activated(&self) -> bool {
        self.worker.is_running()
    }

    fn reset(&mut self) {
        // A panicked worker took the tap with it; the device then stays
        // inactive.
        if let Some(handler) = self.worker.stop() {
            self.tap = Some(handler.tap);
        }
        for evt in &self.evts {
            let _ = evt.read();
        }
    }

    fn device_state(&self) -> crate::devices::virtio::persist::DeviceState {
        crate::devices::virtio::persist::DeviceState::Net(self.save())
    }

    fn pause(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.pause()?)
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.resume(&self.evts)?)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::devices::virtio::mmio::MmioTransport;
    use crate::devices::virtio::net::DEFAULT_GUEST_MAC;
    use crate::devices::virtio::testing::{
        self, Desc, DriverSetup, GuestQueue, BUFFERS, F_INDIRECT, F_NEXT, F_WRITE, MEM_SIZE,
    };
    use crate::devices::virtio::Interrupt;

    const RX_BUF: u64 = BUFFERS;
    const RX_BUF_SIZE: u32 = 2048;
    const TX_BUF: u64 = BUFFERS + 0x4_0000;

    pub struct Driver {
        pub t: MmioTransport,
        pub mem: GuestMemoryMmap,
        pub rx: GuestQueue,
        pub tx: GuestQueue,
        /// The tap's other end.
        pub peer: UnixDatagram,
        counters: Arc<NetCounters>,
    }

    impl Driver {
        pub fn new() -> Self {
            let (ours, peer) = UnixDatagram::pair().expect("socketpair");
            ours.set_nonblocking(true).expect("nonblocking");
            peer.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let backend = File::from(OwnedFd::from(ours));
            let dev = Net::with_backend(backend, "test0", DEFAULT_GUEST_MAC).expect("net");
            let counters = dev.counters();
            let mem = testing::memory();
            let mut t = MmioTransport::new(
                Box::new(dev),
                mem.clone(),
                Arc::new(Interrupt::new().expect("irq")),
            );
            let setup = DriverSetup::for_sizes(&[16, 16]);
            testing::init_driver(
                &mut t,
                &setup,
                (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC),
            );
            Driver {
                rx: GuestQueue::new(&mem, setup.queues[0]),
                tx: GuestQueue::new(&mem, setup.queues[1]),
                t,
                mem,
                peer,
                counters,
            }
        }

        fn kick(&mut self, q: u32) {
            testing::write32(&mut self.t, 0x50, q);
        }

        pub fn post_rx(&mut self, slot: u16) -> u16 {
            let head = self.rx.add_chain(&[Desc {
                addr: RX_BUF + u64::from(slot) * u64::from(RX_BUF_SIZE),
                len: RX_BUF_SIZE,
                flags: F_WRITE,
                next: 0,
            }]);
            self.kick(0);
            head
        }

        pub fn wait_used(q: &mut GuestQueue, n: usize) -> Vec<(u32, u32)> {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut got = Vec::new();
            while got.len() < n {
                got.extend(q.take_used());
                assert!(Instant::now() < deadline, "only {got:?} used");
                std::thread::yield_now();
            }
            got
        }

        /// The guest sends `frame` behind a header of junk, split over two
        /// descriptors.
        pub fn send(&mut self, frame: &[u8]) {
            let hdr = [0xaau8; VNET_HDR_LEN];
            self.mem
                .write_slice(&hdr, GuestAddress(TX_BUF))
                .expect("hdr");
            self.mem
                .write_slice(frame, GuestAddress(TX_BUF + 0x100))
                .expect("frame");
            self.tx.add_chain(&[
                Desc {
                    addr: TX_BUF,
                    len: VNET_HDR_LEN as u32,
                    flags: 0,
                    next: 0,
                },
                Desc {
                    addr: TX_BUF + 0x100,
                    len: frame.len() as u32,
                    flags: 0,
                    next: 0,
                },
            ]);
            self.kick(1);
        }
    }

    pub fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    #[test]
    fn config_space_is_the_mac_and_features_are_version_1_and_mac() {
        let d = Driver::new();
        let mut mac = [0u8; 8];
        let mut t = d.t;
        crate::devices::bus::BusDevice::read(&mut t, 0x100, &mut mac);
        assert_eq!(&mac[..6], &DEFAULT_GUEST_MAC.0);
        assert_eq!(mac[6..], [0, 0]);
        assert_eq!(testing::read32(&mut t, 0x08), 1);
    }

    #[test]
    fn tx_frames_reach_the_tap_with_a_zeroed_header() {
        let mut d = Driver::new();
        let f = frame(60, 1);
        d.send(&f);
        let mut got = vec![0u8; 4096];
        let n = d.peer.recv(&mut got).expect("frame at the tap");
        assert_eq!(n, VNET_HDR_LEN + 60);
        assert_eq!(got[..VNET_HDR_LEN], [0u8; VNET_HDR_LEN]);
        assert_eq!(&got[VNET_HDR_LEN..n], &f[..]);
        assert_eq!(Driver::wait_used(&mut d.tx, 1)[0].1, 0);
    }

    #[test]
    fn rx_frames_fill_one_buffer_each_with_num_buffers_1() {
        let mut d = Driver::new();
        let heads = [d.post_rx(0), d.post_rx(1)];
        for seed in [1u8, 2] {
            let mut pkt = vec![0u8; VNET_HDR_LEN];
            pkt.extend(frame(100 + usize::from(seed), seed));
            d.peer.send(&pkt).expect("send");
        }
        let used = Driver::wait_used(&mut d.rx, 2);
        for (i, (head, len)) in used.into_iter().enumerate() {
            assert_eq!(head, u32::from(heads[i]));
            assert_eq!(len as usize, VNET_HDR_LEN + 101 + i);
            let mut got = vec![0u8; len as usize];
            d.mem
                .read_slice(
                    &mut got,
                    GuestAddress(RX_BUF + i as u64 * u64::from(RX_BUF_SIZE)),
                )
                .expect("read");
            assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
            assert_eq!(&got[VNET_HDR_LEN..], &frame(101 + i, i as u8 + 1)[..]);
        }
    }

    #[test]
    fn without_rx_buffers_the_tap_is_not_polled_until_the_guest_adds_some() {
        let mut d = Driver::new();
        let mut pkt = vec![0u8; VNET_HDR_LEN];
        pkt.extend(frame(64, 9));
        d.peer.send(&pkt).expect("send");
        d.peer.send(&pkt).expect("send");
        // Asserting that nothing happens needs a wait: a spinning worker
        // would wake thousands of times in it.
        std::thread::sleep(Duration::from_millis(100));
        let wakeups = d.counters.tap_wakeups.load(Ordering::Relaxed);
        assert!(
            wakeups <= 2,
            "the worker woke {wakeups} times with no RX buffer"
        );
        d.post_rx(0);
        let used = Driver::wait_used(&mut d.rx, 1);
        assert_eq!(used[0].1 as usize, VNET_HDR_LEN + 64);
        // The second frame waited in the tap and comes with the next buffer.
        d.post_rx(1);
        assert_eq!(
            Driver::wait_used(&mut d.rx, 1)[0].1 as usize,
            VNET_HDR_LEN + 64
        );
        assert_eq!(d.counters.rx_frames.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn hostile_tx_chains_are_returned_empty_and_the_queue_keeps_working() {
        let mut d = Driver::new();
        let bad: Vec<Vec<Desc>> = vec![
            // Shorter than the header.
            vec![Desc {
                addr: TX_BUF,
                len: 5,
                flags: 0,
                next: 0,
            }],
            // A header and a runt frame.
            vec![Desc {
                addr: TX_BUF,
                len: VNET_HDR_LEN as u32 + 10,
                flags: 0,
                next: 0,
            }],
            // Larger than any frame.
            vec![Desc {
                addr: TX_BUF,
                len: (VNET_HDR_LEN + MAX_FRAME_LEN + 1) as u32,
                flags: 0,
                next: 0,
            }],
            // Outside guest memory.
            vec![Desc {
                addr: MEM_SIZE - 16,
                len: 64,
                flags: 0,
                next: 0,
            }],
            // Lengths that wrap.
            vec![
                Desc {
                    addr: TX_BUF,
                    len: u32::MAX,
                    flags: 0,
                    next: 0,
                },
                Desc {
                    addr: TX_BUF,
                    len: 64,
                    flags: 0,
                    next: 0,
                },
            ],
            // Only device-writable buffers.
            vec![Desc {
                addr: TX_BUF,
                len: 128,
                flags: F_WRITE,
                next: 0,
            }],
            // An indirect table past the end of RAM.
            vec![Desc {
                addr: MEM_SIZE - 8,
                len: 64,
                flags: F_INDIRECT,
                next: 0,
            }],
        ];
        let n = bad.len();
        for chain in &bad {
            d.tx.add_chain(chain);
        }
        d.kick(1);
        let used = Driver::wait_used(&mut d.tx, n);
        assert!(used.iter().all(|&(_, len)| len == 0), "{used:?}");
        assert_eq!(d.counters.tx_frames.load(Ordering::Relaxed), 0);
        assert_eq!(d.counters.tx_dropped.load(Ordering::Relaxed), n as u64);
        d.peer.set_nonblocking(true).expect("nonblocking");
        let mut buf = vec![0u8; 4096];
        assert!(d.peer.recv(&mut buf).is_err(), "nothing reached the tap");
        d.peer.set_nonblocking(false).expect("blocking");
        // A descriptor that points at itself: virtio-queue stops the chain
        // after a queue's worth (16) of descriptors, so at most 16 x 64
        // bytes go out, and the queue goes on.
        d.tx.write_desc(
            15,
            Desc {
                addr: TX_BUF,
                len: 64,
                flags: F_NEXT,
                next: 15,
            },
        );
        d.tx.publish(15);
        d.kick(1);
        assert_eq!(Driver::wait_used(&mut d.tx, 1), vec![(15, 0)]);
        if d.counters.tx_frames.load(Ordering::Relaxed) == 1 {
            let got = d.peer.recv(&mut buf).expect("the looped frame");
            assert!(got <= 16 * 64, "{got} bytes from a looping chain");
        }
        // A good frame still goes through.
        let f = frame(60, 3);
        d.send(&f);
        let mut got = vec![0u8; 4096];
        assert_eq!(d.peer.recv(&mut got).expect("frame"), VNET_HDR_LEN + 60);
    }

    #[test]
    fn hostile_rx_chains_get_length_0_and_good_ones_still_fill() {
        let mut d = Driver::new();
        // Too small for the frame, read-only, outside RAM, then a good one.
        d.rx.add_chain(&[Desc {
            addr: RX_BUF,
            len: 20,
            flags: F_WRITE,
            next: 0,
        }]);
        d.rx.add_chain(&[Desc {
            addr: RX_BUF,
            len: 2048,
            flags: 0,
            next: 0,
        }]);
        d.rx.add_chain(&[Desc {
            addr: MEM_SIZE - 16,
            len: 2048,
            flags: F_WRITE,
            next: 0,
        }]);
        d.rx.add_chain(&[Desc {
            addr: RX_BUF,
            len: 2048,
            flags: F_WRITE,
            next: 0,
        }]);
        d.kick(0);
        let mut pkt = vec![0u8; VNET_HDR_LEN];
        pkt.extend(frame(200, 4));
        for _ in 0..3 {
            d.peer.send(&pkt).expect("send");
        }
        let used = Driver::wait_used(&mut d.rx, 4);
        let lens: Vec<u32> = used.iter().map(|&(_, l)| l).collect();
        assert_eq!(lens, vec![0, 0, 0, (VNET_HDR_LEN + 200) as u32]);
        assert_eq!(d.counters.rx_frames.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn pause_keeps_the_tap_and_resume_continues() {
        let mut d = Driver::new();
        d.t.pause_device().expect("pause");
        d.send(&frame(60, 5));
        d.t.resume_device().expect("resume");
        let mut got = vec![0u8; 4096];
        assert_eq!(
            d.peer.recv(&mut got).expect("frame after resume"),
            VNET_HDR_LEN + 60
        );
    }
}
