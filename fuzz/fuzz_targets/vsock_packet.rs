//! Fuzzes the virtio-vsock packet code of the VMM (vmm/src/devices/virtio/
//! vsock/packet.rs) with hostile guests: the input is both a raw header and
//! the first bytes of a 64 KiB guest memory holding a 16-entry virtqueue
//! (descriptor table at 0, available ring at 0x100, used ring at 0x200) whose
//! chains point anywhere in it. Every chain is read as a TX packet and
//! written as an RX buffer. Checked: no panics, a bounded number of chains,
//! packet data never above 64 KiB and always the claimed length, headers
//! that round-trip, and RX writes that succeed whenever the buffer's
//! reported room says they fit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::devices::virtio::queue::pop;
use vmm::devices::virtio::vsock::packet::{
    read_tx, rx_capacity, write_rx, VsockHeader, HDR_SIZE, MAX_PKT_DATA,
};
use vmm::devices::virtio::vsock::{TYPE_STREAM, VSOCK_OP_RW};

const MEM: usize = 0x1_0000;
const QUEUE_SIZE: u16 = 16;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = VsockHeader::parse(data) {
        assert_eq!(VsockHeader::parse(&h.to_bytes()), Ok(h));
        let available = data.len() - HDR_SIZE;
        if let Ok(n) = h.tx_data_len(available) {
            assert!(n <= available && n <= MAX_PKT_DATA);
        }
    }

    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    mem.write_slice(&data[..data.len().min(MEM)], GuestAddress(0))
        .unwrap();
    let mut q = Queue::new(256).unwrap();
    q.set_size(QUEUE_SIZE);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(0x100), Some(0));
    q.set_used_ring_address(Some(0x200), Some(0));
    q.set_ready(true);

    let mut buf = Vec::new();
    let mut chains = 0;
    while let Ok(Some(chain)) = pop(&mut q, &mem) {
        chains += 1;
        assert!(chains <= QUEUE_SIZE, "more chains than the ring holds");
        let head = chain.head_index();
        if let Ok(h) = read_tx(chain.clone(), &mem, &mut buf) {
            assert!(buf.len() <= MAX_PKT_DATA);
            if h.op == VSOCK_OP_RW && h.type_ == TYPE_STREAM {
                assert_eq!(buf.len(), h.len as usize);
            } else {
                assert!(buf.is_empty());
            }
        }
        if let Ok(mut w) = chain.writer(&mem) {
            if let Ok(room) = rx_capacity(&w) {
                assert!(room <= MAX_PKT_DATA);
                let payload = &data[..room.min(data.len())];
                let len = write_rx(&mut w, &VsockHeader::default(), payload)
                    .expect("a packet that fits the reported room is written");
                assert_eq!(len as usize, HDR_SIZE + payload.len());
            }
        }
        let _ = q.add_used(&mem, head, 0);
    }
});
