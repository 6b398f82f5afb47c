//! virtio-vsock packets (virtio 1.x section 5.10.6): a 44-byte little-endian
//! header, then (for RW) `len` bytes of data. A TX packet is a chain of
//! device-readable descriptors; an RX buffer a chain of device-writable ones.
//! Neither the header nor the data need sit in one descriptor (Linux puts
//! them in two), so both directions go through virtio-queue's Reader/Writer.
//!
//! Everything here is bounded: a packet's data is at most
//! [`MAX_PKT_DATA`] bytes and never more than the chain holds, and a short,
//! truncated or oversized packet is an error value, never a panic.

use std::io::{Read, Write};

use vm_memory::GuestMemoryMmap;

use super::{TYPE_STREAM, VSOCK_OP_RW};
use crate::devices::virtio::queue::Chain;

/// Size of the packet header.
pub const HDR_SIZE: usize = 44;
/// Most data one packet may carry (Linux's VIRTIO_VSOCK_MAX_PKT_BUF_SIZE).
pub const MAX_PKT_DATA: usize = 64 * 1024;

/// Malformed packets and unusable buffers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    /// Fewer bytes than a header.
    #[error("vsock packet of {0} bytes is shorter than its {HDR_SIZE}-byte header")]
    ShortHeader(usize),
    /// `len` above the protocol's maximum.
    #[error("vsock packet claims {0} bytes of data, more than the {MAX_PKT_DATA}-byte maximum")]
    TooLong(u32),
    /// `len` above what the chain holds.
    #[error("vsock packet claims {len} bytes of data but its buffers hold {available}")]
    Truncated {
        /// Claimed.
        len: u32,
        /// Present.
        available: usize,
    },
    /// A descriptor points outside guest memory (or the chain is invalid).
    #[error("vsock descriptor chain is unusable: {0}")]
    BadChain(String),
    /// An RX buffer too small for the packet.
    #[error("vsock RX buffer of {available} bytes cannot hold {needed}")]
    NoRoom {
        /// Needed.
        needed: usize,
        /// Available.
        available: usize,
    },
}

/// The packet header, in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VsockHeader {
    /// Source context ID.
    pub src_cid: u64,
    /// Destination context ID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Data length.
    pub len: u32,
    /// Socket type (1 = stream).
    pub type_: u16,
    /// Operation (VSOCK_OP_*).
    pub op: u16,
    /// Operation flags (shutdown direction bits).
    pub flags: u32,
    /// Sender's receive buffer size (credit).
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer.
    pub fwd_cnt: u32,
}

impl VsockHeader {
    /// Parses the first [`HDR_SIZE`] bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<Self, PacketError> {
        let b: &[u8; HDR_SIZE] = b
            .get(..HDR_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or(PacketError::ShortHeader(b.len()))?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        Ok(VsockHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// How many data bytes a TX packet with this header carries, given that
    /// its chain holds `available` bytes after the header. Only RW packets
    /// carry data; other ops' `len` is ignored, as Linux ignores it.
    pub fn tx_data_len(&self, available: usize) -> Result<usize, PacketError> {
        if self.op != VSOCK_OP_RW || self.type_ != TYPE_STREAM {
            return Ok(0);
        }
        let len = self.len as usize;
        if len > MAX_PKT_DATA {
            return Err(PacketError::TooLong(self.len));
        }
        if len > available {
            return Err(PacketError::Truncated {
                len: self.len,
                available,
            });
        }
        Ok(len)
    }
}

/// Reads the TX packet in `chain`: returns its header, with its data in
/// `data` (resized to the data length, at most [`MAX_PKT_DATA`]). When the
/// header parsed but the rest did not, the error comes with the header, so
/// the caller can reset that connection.
pub fn read_tx(
    chain: Chain<'_>,
    mem: &GuestMemoryMmap,
    data: &mut Vec<u8>,
) -> Result<VsockHeader, (Option<VsockHeader>, PacketError)> {
    data.clear();
    let mut reader = chain
        .reader(mem)
        .map_err(|e| (None, PacketError::BadChain(e.to_string())))?;
    let total = reader.available_bytes();
    let mut raw = [0u8; HDR_SIZE];
    if total < HDR_SIZE || reader.read_exact(&mut raw).is_err() {
        return Err((None, PacketError::ShortHeader(total)));
    }
    let hdr = VsockHeader::parse(&raw).map_err(|e| (None, e))?;
    let len = hdr
        .tx_data_len(reader.available_bytes())
        .map_err(|e| (Some(hdr), e))?;
    data.resize(len, 0);
    reader
        .read_exact(data)
        .map_err(|e| (Some(hdr), PacketError::BadChain(e.to_string())))?;
    Ok(hdr)
}

/// Room for data in the RX buffer `chain`, after the header; an error when
/// the buffer cannot even hold a header.
pub fn rx_capacity(writer: &virtio_queue::Writer<'_>) -> Result<usize, PacketError> {
    let available = writer.available_bytes();
    available
        .checked_sub(HDR_SIZE)
        .map(|room| room.min(MAX_PKT_DATA))
        .ok_or(PacketError::NoRoom {
            needed: HDR_SIZE,
            available,
        })
}

/// Writes a packet into an RX buffer; returns the bytes written (the used
/// length). `hdr.len` is set from `data`.
pub fn write_rx(
    writer: &mut virtio_queue::Writer<'_>,
    hdr: &VsockHeader,
    data: &[u8],
) -> Result<u32, PacketError> {
    let needed = HDR_SIZE + data.len();
    let available = writer.available_bytes();
    if needed > available || data.len() > MAX_PKT_DATA {
        return Err(PacketError::NoRoom { needed, available });
    }
    let hdr = VsockHeader {
        len: data.len() as u32,
        ..*hdr
    };
    writer
        .write_all(&hdr.to_bytes())
        .and_then(|()| writer.write_all(data))
        .map_err(|e| PacketError::BadChain(e.to_string()))?;
    // needed <= HDR_SIZE + MAX_PKT_DATA, which fits in a u32.
    Ok(needed as u32)
}

#[cfg(test)]
mod tests {
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::devices::virtio::queue::{pop, QUEUE_MAX_SIZE};
    use crate::devices::virtio::testing::{self, Desc, DriverSetup, GuestQueue, BUFFERS, F_WRITE};
    use crate::devices::virtio::vsock::{VSOCK_OP_REQUEST, VSOCK_OP_RST};

    fn header() -> VsockHeader {
        VsockHeader {
            src_cid: 3,
            dst_cid: 2,
            src_port: 1024,
            dst_port: 0x4000_0001,
            len: 5,
            type_: TYPE_STREAM,
            op: VSOCK_OP_RW,
            flags: 0,
            buf_alloc: 4096,
            fwd_cnt: 17,
        }
    }

    #[test]
    fn header_round_trips_and_matches_the_wire_layout() {
        let h = header();
        let b = h.to_bytes();
        assert_eq!(VsockHeader::parse(&b), Ok(h));
        assert_eq!(&b[0..8], &3u64.to_le_bytes());
        assert_eq!(&b[24..28], &5u32.to_le_bytes());
        assert_eq!(&b[30..32], &VSOCK_OP_RW.to_le_bytes());
        assert_eq!(&b[40..44], &17u32.to_le_bytes());
        assert_eq!(
            VsockHeader::parse(&b[..43]),
            Err(PacketError::ShortHeader(43))
        );
        assert_eq!(VsockHeader::parse(&[]), Err(PacketError::ShortHeader(0)));
    }

    #[test]
    fn data_length_is_bounded() {
        let h = header();
        assert_eq!(h.tx_data_len(5), Ok(5));
        assert_eq!(h.tx_data_len(100), Ok(5));
        assert_eq!(
            h.tx_data_len(4),
            Err(PacketError::Truncated {
                len: 5,
                available: 4
            })
        );
        let big = VsockHeader { len: u32::MAX, ..h };
        assert_eq!(
            big.tx_data_len(usize::MAX),
            Err(PacketError::TooLong(u32::MAX))
        );
        // Control packets carry no data whatever `len` says.
        let req = VsockHeader {
            op: VSOCK_OP_REQUEST,
            len: u32::MAX,
            ..h
        };
        assert_eq!(req.tx_data_len(0), Ok(0));
        let rst = VsockHeader {
            op: VSOCK_OP_RST,
            ..h
        };
        assert_eq!(rst.tx_data_len(0), Ok(0));
    }

    fn queue() -> (vm_memory::GuestMemoryMmap, Queue, GuestQueue) {
        let mem = testing::memory();
        let setup = DriverSetup::for_sizes(&[16]).queues[0];
        let mut q = Queue::new(QUEUE_MAX_SIZE).expect("queue");
        q.set_size(16);
        q.set_desc_table_address(Some(setup.desc as u32), Some(0));
        q.set_avail_ring_address(Some(setup.avail as u32), Some(0));
        q.set_used_ring_address(Some(setup.used as u32), Some(0));
        q.set_ready(true);
        let g = GuestQueue::new(&mem, setup);
        (mem, q, g)
    }

    fn d(addr: u64, len: u32, flags: u16) -> Desc {
        Desc {
            addr,
            len,
            flags,
            next: 0,
        }
    }

    #[test]
    fn tx_packets_split_across_descriptors_are_read_whole() {
        let (mem, mut q, mut g) = queue();
        mem.write_slice(&header().to_bytes(), GuestAddress(BUFFERS))
            .expect("hdr");
        mem.write_slice(b"hello", GuestAddress(BUFFERS + 0x100))
            .expect("data");
        g.add_chain(&[
            d(BUFFERS, 20, 0),
            d(BUFFERS + 20, 24, 0),
            d(BUFFERS + 0x100, 2, 0),
            d(BUFFERS + 0x102, 3, 0),
        ]);
        let chain = pop(&mut q, &mem).expect("pop").expect("chain");
        let mut data = Vec::new();
        let hdr = read_tx(chain, &mem, &mut data).expect("packet");
        assert_eq!(hdr, header());
        assert_eq!(data, b"hello");
    }

    #[test]
    fn malformed_tx_packets_are_errors() {
        let (mem, mut q, mut g) = queue();
        let mut data = Vec::new();
        let mut next = |descs: &[Desc], q: &mut Queue| {
            g.add_chain(descs);
            let chain = pop(q, &mem).expect("pop").expect("chain");
            read_tx(chain, &mem, &mut data).map(|_| ())
        };
        mem.write_slice(&header().to_bytes(), GuestAddress(BUFFERS))
            .expect("hdr");
        // Short header.
        assert_eq!(
            next(&[d(BUFFERS, 30, 0)], &mut q),
            Err((None, PacketError::ShortHeader(30)))
        );
        // Data missing.
        assert!(matches!(
            next(&[d(BUFFERS, 44, 0)], &mut q),
            Err((
                Some(_),
                PacketError::Truncated {
                    len: 5,
                    available: 0
                }
            ))
        ));
        // Outside guest memory.
        assert!(matches!(
            next(&[d(0xffff_0000, 44, 0)], &mut q),
            Err((None, PacketError::BadChain(_)))
        ));
        // Only writable descriptors: nothing readable.
        assert_eq!(
            next(&[d(BUFFERS, 44, F_WRITE)], &mut q),
            Err((None, PacketError::ShortHeader(0)))
        );
        // Oversized.
        let mut big = header();
        big.len = (MAX_PKT_DATA + 1) as u32;
        mem.write_slice(&big.to_bytes(), GuestAddress(BUFFERS))
            .expect("hdr");
        assert!(matches!(
            next(
                &[d(BUFFERS, 44, 0), d(BUFFERS + 0x1000, 0x2_0000, 0)],
                &mut q
            ),
            Err((Some(_), PacketError::TooLong(_)))
        ));
    }

    #[test]
    fn rx_buffers_are_filled_and_small_ones_refused() {
        let (mem, mut q, mut g) = queue();
        g.add_chain(&[d(BUFFERS, 44, F_WRITE), d(BUFFERS + 0x100, 8, F_WRITE)]);
        let chain = pop(&mut q, &mem).expect("pop").expect("chain");
        let mut w = chain.writer(&mem).expect("writer");
        assert_eq!(rx_capacity(&w), Ok(8));
        assert_eq!(
            write_rx(&mut w.clone(), &header(), b"too long!"),
            Err(PacketError::NoRoom {
                needed: 53,
                available: 52
            })
        );
        assert_eq!(write_rx(&mut w, &header(), b"hi"), Ok(46));
        let mut raw = [0u8; 44];
        mem.read_slice(&mut raw, GuestAddress(BUFFERS))
            .expect("read");
        let hdr = VsockHeader::parse(&raw).expect("parse");
        assert_eq!(hdr.len, 2);
        let mut two = [0u8; 2];
        mem.read_slice(&mut two, GuestAddress(BUFFERS + 0x100))
            .expect("read");
        assert_eq!(&two, b"hi");

        g.add_chain(&[d(BUFFERS, 43, F_WRITE)]);
        let chain = pop(&mut q, &mem).expect("pop").expect("chain");
        let w = chain.writer(&mem).expect("writer");
        assert!(matches!(rx_capacity(&w), Err(PacketError::NoRoom { .. })));
    }
}
