//! Fuzzes virtio-blk request processing in the VMM (vmm/src/devices/
//! virtio/block/device.rs) with hostile guests: the input is the first bytes
//! of a 64 KiB guest memory holding a 16-entry virtqueue (descriptor table
//! at 0, available ring at 0x100, used ring at 0x200) whose requests point
//! anywhere in it, served by an 8-sector disk that is read-only when the
//! input's first byte is odd. Checked: no panics, a bounded number of
//! requests answered, a used index that counts them, and a read-only disk
//! that never changes, whatever the requests say.
#![no_main]

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::devices::virtio::block::Disk;

const MEM: usize = 0x1_0000;
const QUEUE_SIZE: u16 = 16;
const SECTORS: usize = 8;

fn content() -> Vec<u8> {
    (0..SECTORS * 512).map(|i| (i % 251) as u8).collect()
}

fn memfd() -> File {
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is
    // checked and then owned by the File.
    let fd = unsafe { libc::memfd_create(c"fuzz-disk".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(&content()).unwrap();
    f
}

struct Disks {
    ro: Disk,
    ro_file: File,
    rw: Disk,
}

thread_local! {
    static DISKS: RefCell<Disks> = RefCell::new({
        let ro_file = memfd();
        // The descriptor is writable: read-only must come from the device.
        let ro = Disk::from_file(ro_file.try_clone().unwrap(), true, "ro", "fuzz").unwrap();
        let rw = Disk::from_file(memfd(), false, "rw", "fuzz").unwrap();
        Disks { ro, ro_file, rw }
    });
}

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    mem.write_slice(&data[..data.len().min(MEM)], GuestAddress(0))
        .unwrap();
    let mut q = Queue::new(256).unwrap();
    q.set_size(QUEUE_SIZE);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(0x100), Some(0));
    q.set_used_ring_address(Some(0x200), Some(0));
    q.set_ready(true);
    let read_only = data.first().is_some_and(|b| b & 1 == 1);

    let answered = DISKS.with(|d| {
        let mut d = d.borrow_mut();
        let disk = if read_only { &mut d.ro } else { &mut d.rw };
        let (answered, _) = disk.process_queue(&mut q, &mem);
        assert!(answered <= usize::from(QUEUE_SIZE));
        if read_only {
            let mut now = vec![0u8; SECTORS * 512];
            d.ro_file.read_exact_at(&mut now, 0).unwrap();
            assert!(now == content(), "the read-only disk changed");
        }
        answered
    });
    // The device's last write is the used index (request data may have
    // landed on the ring before it): it must count what was answered.
    if answered > 0 {
        let used_idx: u16 = mem.read_obj(GuestAddress(0x202)).unwrap();
        assert_eq!(usize::from(used_idx), answered);
    }
});
