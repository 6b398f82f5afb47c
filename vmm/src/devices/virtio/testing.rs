//! Test helpers: a small guest memory, register access on a transport, a
//! driver that negotiates and sets up queues, and a driver-side view of a
//! split virtqueue for adding descriptor chains (well-formed or not) and
//! reading the used ring.

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::status;
use crate::devices::bus::BusDevice;

/// Size of the test guest memory.
pub const MEM_SIZE: u64 = 1 << 20;
/// Where test buffers start (above the queues).
pub const BUFFERS: u64 = 0x8_0000;

/// 1 MiB of guest memory at 0.
pub fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).expect("memory")
}

/// A 32-bit register read.
pub fn read32(dev: &mut dyn BusDevice, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    dev.read(offset, &mut b);
    u32::from_le_bytes(b)
}

/// A 32-bit register write.
pub fn write32(dev: &mut dyn BusDevice, offset: u64, value: u32) {
    dev.write(offset, &value.to_le_bytes());
}

/// Where one queue lives.
#[derive(Clone, Copy, Debug)]
pub struct QueueSetup {
    /// Size the driver picks.
    pub size: u16,
    /// Descriptor table.
    pub desc: u64,
    /// Available ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
}

/// The queues a test driver sets up.
#[derive(Clone, Debug)]
pub struct DriverSetup {
    /// One per device queue.
    pub queues: Vec<QueueSetup>,
}

impl DriverSetup {
    /// Queue `i` at `0x10000 * (i + 1)`, with rings a page apart.
    pub fn for_sizes(sizes: &[u16]) -> Self {
        DriverSetup {
            queues: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| {
                    let base = 0x1_0000 * (i as u64 + 1);
                    QueueSetup {
                        size,
                        desc: base,
                        avail: base + 0x1000,
                        used: base + 0x2000,
                    }
                })
                .collect(),
        }
    }
}

/// The driver's side of device initialisation (virtio 1.x 3.1.1).
pub fn init_driver(t: &mut dyn BusDevice, setup: &DriverSetup, features: u64) {
    write32(t, 0x70, 0);
    write32(t, 0x70, status::ACKNOWLEDGE);
    write32(t, 0x70, status::ACKNOWLEDGE | status::DRIVER);
    write32(t, 0x24, 0);
    write32(t, 0x20, features as u32);
    write32(t, 0x24, 1);
    write32(t, 0x20, (features >> 32) as u32);
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    write32(t, 0x70, s);
    for (i, q) in setup.queues.iter().enumerate() {
        write32(t, 0x30, i as u32);
        write32(t, 0x38, u32::from(q.size));
        write32(t, 0x80, q.desc as u32);
        write32(t, 0x84, (q.desc >> 32) as u32);
        write32(t, 0x90, q.avail as u32);
        write32(t, 0x94, (q.avail >> 32) as u32);
        write32(t, 0xa0, q.used as u32);
        write32(t, 0xa4, (q.used >> 32) as u32);
        write32(t, 0x44, 1);
    }
    write32(t, 0x70, s | status::DRIVER_OK);
}

/// VRING_DESC_F_NEXT.
pub const F_NEXT: u16 = 1;
/// VRING_DESC_F_WRITE.
pub const F_WRITE: u16 = 2;
/// VRING_DESC_F_INDIRECT.
pub const F_INDIRECT: u16 = 4;

/// A raw descriptor as the driver writes it.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    /// Buffer address.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// Flags; `F_NEXT` is added by [`GuestQueue::add_chain`] as needed.
    pub flags: u16,
    /// Next index, for hand-made (malformed) chains.
    pub next: u16,
}

/// The driver's view of one split queue.
pub struct GuestQueue {
    mem: GuestMemoryMmap,
    q: QueueSetup,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl GuestQueue {
    /// The queue `q` in `mem`.
    pub fn new(mem: &GuestMemoryMmap, q: QueueSetup) -> Self {
        GuestQueue {
            mem: mem.clone(),
            q,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Writes descriptor `index`.
    pub fn write_desc(&self, index: u16, d: Desc) {
        let at = GuestAddress(self.q.desc + 16 * u64::from(index));
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&d.addr.to_le_bytes());
        raw[8..12].copy_from_slice(&d.len.to_le_bytes());
        raw[12..14].copy_from_slice(&d.flags.to_le_bytes());
        raw[14..].copy_from_slice(&d.next.to_le_bytes());
        self.mem.write_slice(&raw, at).expect("desc");
    }

    /// Makes `head` available.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.q.size);
        self.mem
            .write_obj(head, GuestAddress(self.q.avail + 4 + 2 * slot))
            .expect("avail ring");
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx);
    }

    /// Writes the available index outright (malformed-ring tests).
    pub fn set_avail_idx(&self, idx: u16) {
        self.mem
            .write_obj(idx, GuestAddress(self.q.avail + 2))
            .expect("avail idx");
    }

    /// Adds a chain of `descs`, linked in order, and makes it available.
    pub fn add_chain(&mut self, descs: &[Desc]) -> u16 {
        let head = self.next_desc;
        for (i, d) in descs.iter().enumerate() {
            let index = (head + i as u16) % self.q.size;
            let mut d = *d;
            if i + 1 < descs.len() {
                d.flags |= F_NEXT;
                d.next = (index + 1) % self.q.size;
            }
            self.write_desc(index, d);
        }
        self.next_desc = (head + descs.len() as u16) % self.q.size;
        self.publish(head);
        head
    }

    /// Used entries not seen yet: (head, len).
    pub fn take_used(&mut self) -> Vec<(u32, u32)> {
        let idx: u16 = self
            .mem
            .read_obj(GuestAddress(self.q.used + 2))
            .expect("used idx");
        let mut out = Vec::new();
        while self.used_seen != idx {
            let slot = u64::from(self.used_seen % self.q.size);
            let at = GuestAddress(self.q.used + 4 + 8 * slot);
            let id: u32 = self.mem.read_obj(at).expect("used id");
            let len: u32 = self.mem.read_obj(at.unchecked_add(4)).expect("used len");
            out.push((id, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}
