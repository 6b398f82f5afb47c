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
use crate::devices::virtio::worker::{Worker, WorkerError, WorkerHandler, HANDLER_TOKEN_BASE};
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
fn read_tx_frame(
    chain: queue::Chain<'_>,
    mem: &GuestMemoryMmap,
    buf: &mut [u8],
) -> Option<usize> {
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
    worker: Option<Worker<NetWorker>>,
    /// The running state while paused.
    paused: Option<NetWorker>,
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
            worker: None,
            paused: None,
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
        if self.worker.is_some() {
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
        self.worker = Some(Worker::spawn("net", handler, &self.evts)?);
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.worker.is_some()
    }

    fn reset(&mut self) {
        if let Some(handler) = self.paused.take() {
            self.tap = Some(handler.tap);
        }
        if let Some(worker) = self.worker.take() {
            // A panicked worker took the tap with it; the device then stays
            // inactive.
            if let Ok(handler) = worker.stop() {
                self.tap = Some(handler.tap);
            }
        }
        for evt in &self.evts {
            let _ = evt.read();
        }
    }

    fn device_state(&self) -> crate::devices::virtio::persist::DeviceState {
        crate::devices::virtio::persist::DeviceState::Net(self.save())
    }

    fn pause(&mut self) -> Result<(), ActivateError> {
        if let Some(worker) = self.worker.take() {
            self.paused = Some(worker.stop()?);
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        if let Some(handler) = self.paused.take() {
            self.worker = Some(Worker::spawn("net", handler, &self.evts)?);
        }
        Ok(())
    }
}
