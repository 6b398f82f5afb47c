//! The virtio-blk device: configuration space (capacity), feature bits, and
//! request processing. A request is a descriptor chain: a 16-byte header
//! (type, reserved, sector) in device-readable memory, then the data
//! (readable for OUT, writable for IN and GET_ID), then one writable status
//! byte. The chain may split any of these across descriptors; the device
//! reads it through virtio-queue's Reader/Writer, which see it as two byte
//! streams, so the split never matters and never overruns.
//!
//! Bounds: data moves through a fixed 64 KiB bounce buffer in chunks, so no
//! request makes the VMM allocate; OUT/IN lengths must be whole sectors and
//! lie inside the disk; a chain with no writable byte (nowhere to put the
//! status) is returned with length 0.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_queue::Queue;
use vm_memory::{ByteValued, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{DiskConfig, DiskSource};
use crate::devices::virtio::queue::{self, Chain, QueueError, QUEUE_MAX_SIZE};
use crate::devices::virtio::worker::{WorkerError, WorkerHandler, WorkerSlot};
use crate::devices::virtio::{
    lock, read_config_bytes, ActivateError, DeviceContext, VirtioDevice, INTERRUPT_USED_RING,
    VIRTIO_F_VERSION_1, VIRTIO_ID_BLOCK,
};

/// Bytes per sector (virtio-blk's unit, whatever the host's block size).
pub const SECTOR_SIZE: u64 = 512;
/// Bounce buffer size: the most data moved per host read/write call.
const CHUNK: usize = 64 * 1024;
/// Length of a GET_ID answer.
const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// Errors setting up a disk. Each names the disk and says what to change.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The disk file could not be opened.
    #[error("cannot open disk {path}: {source}; check the path and its permissions")]
    Open {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A descriptor handed in could not be used.
    #[error("disk fd {fd} is not usable: {source}; pass an open file descriptor")]
    Fd {
        /// The descriptor.
        fd: i32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A writable disk was handed in on a read-only descriptor.
    #[error(
        "disk {name} is configured writable but its file was opened read-only: \
         open it read-write or mark the disk `ro`"
    )]
    NotWritable {
        /// The disk (path or fd).
        name: String,
    },
    /// The descriptor's open flags could not be read.
    #[error("cannot read the open flags of disk {name}: {source}")]
    Flags {
        /// The disk.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The disk's size could not be read.
    #[error("cannot read the size of disk {name}: {source}")]
    Size {
        /// The disk.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The disk holds no whole sector.
    #[error(
        "disk {name} is {bytes} bytes, less than one {SECTOR_SIZE}-byte sector: use a larger file"
    )]
    TooSmall {
        /// The disk.
        name: String,
        /// Its size.
        bytes: u64,
    },
    /// The worker thread failed.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// A virtio-blk request header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestHeader {
    /// VIRTIO_BLK_T_*.
    pub request_type: u32,
    /// Zero (was ioprio).
    pub reserved: u32,
    /// First sector.
    pub sector: u64,
}

// SAFETY: `RequestHeader` is `repr(C)` with two u32 then a u64: 16 bytes with
// no padding, and every bit pattern is a valid value.
unsafe impl ByteValued for RequestHeader {}

impl RequestHeader {
    /// Parses the little-endian wire form.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&b[8..]);
        RequestHeader {
            request_type: u32_at(0),
            reserved: u32_at(4),
            sector: u64::from_le_bytes(sector),
        }
    }
}

/// Checks that `len` bytes from `sector` are whole sectors inside a disk of
/// `capacity` sectors; returns the byte offset.
pub fn check_range(sector: u64, len: u64, capacity: u64) -> Option<u64> {
    if len % SECTOR_SIZE != 0 {
        return None;
    }
    let start = sector.checked_mul(SECTOR_SIZE)?;
    let end = start.checked_add(len)?;
    (end <= capacity.checked_mul(SECTOR_SIZE)?).then_some(start)
}

/// Why a slot's medium could not be changed. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MediumError {
    /// The disk was not started as an empty slot.
    #[error("disk {0} is not a slot (start it with --disk empty); its medium cannot change")]
    NotASlot(String),
    /// No disk has that number.
    #[error("the VM has no disk number {0}; disks are numbered from 0 in --disk order")]
    NoSuchDisk(usize),
    /// The slot already holds a disk.
    #[error("slot {0} holds a disk: detach it first")]
    Occupied(String),
    /// Slots are read-only to the guest, so the medium must be too.
    #[error("the disk for slot {0} was opened for writing: slots take read-only disks")]
    Writable(String),
    /// The new medium is unusable (its size, its flags).
    #[error(transparent)]
    Disk(#[from] BlockError),
    /// The device's worker could not be paused or restarted around the change.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// An open disk and what the guest is told about it.
#[derive(Debug)]
pub struct Disk {
    /// `None` for an empty slot (0 sectors, so every read or write is out of
    /// range).
    file: Option<File>,
    read_only: bool,
    capacity: u64,
    id: [u8; ID_BYTES],
    buf: Vec<u8>,
}

impl Disk {
    /// Opens `path` (read-only if `read_only`).
    pub fn open(path: &Path, read_only: bool, id: &str) -> Result<Self, BlockError> {
        let file = File::options()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|source| BlockError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Self::from_file(file, read_only, id, &path.display().to_string())
    }

    /// An empty slot answering GET_ID with `id`: read-only, 0 sectors.
    pub fn empty(id: &str) -> Self {
        Disk {
            file: None,
            read_only: true,
            capacity: 0,
            id: id_bytes(id),
            buf: Vec::new(),
        }
    }

    /// Whether this is an empty slot.
    pub fn is_empty(&self) -> bool {
        self.file.is_none()
    }

    /// Opens the disk `config` describes, answering GET_ID with `id`. A
    /// descriptor is duplicated, so the caller's stays open and its own.
    pub fn from_config(config: &DiskConfig, id: &str) -> Result<Self, BlockError> {
        match &config.source {
            DiskSource::Empty => Ok(Self::empty(id)),
            DiskSource::Path(path) => Self::open(path, config.read_only, id),
            DiskSource::Fd(fd) => {
                // SAFETY: F_DUPFD_CLOEXEC only reads `fd` (an invalid one
                // fails with EBADF) and returns a new descriptor or -1.
                let dup = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    return Err(BlockError::Fd {
                        fd: *fd,
                        source: io::Error::last_os_error(),
                    });
                }
                // SAFETY: `dup` is a new descriptor that nothing else owns.
                let file = unsafe { File::from_raw_fd(dup) };
                Self::from_file(file, config.read_only, id, &config.source.to_string())
            }
        }
    }

    /// Uses an open file; `name` is for messages. A writable disk must be
    /// open for writing.
    pub fn from_file(
        file: File,
        read_only: bool,
        id: &str,
        name: &str,
    ) -> Result<Self, BlockError> {
        if !read_only
            && !is_writable(&file).map_err(|source| BlockError::Size {
                name: name.into(),
                source,
            })?
        {
            return Err(BlockError::NotWritable { name: name.into() });
        }
        let bytes = file
            .metadata()
            .map_err(|source| BlockError::Size {
                name: name.into(),
                source,
            })?
            .len();
        let capacity = bytes / SECTOR_SIZE;
        if capacity == 0 {
            return Err(BlockError::TooSmall {
                name: name.into(),
                bytes,
            });
        }
        Ok(Disk {
            file: Some(file),
            read_only,
            capacity,
            id: id_bytes(id),
            buf: vec![0; CHUNK],
        })
    }

    /// Size in sectors (a partial last sector of the file is not used).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether writes are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The GET_ID answer, NUL-padded.
    pub fn id(&self) -> &[u8; ID_BYTES] {
        &self.id
    }

    /// Executes one request chain; returns the bytes written into the
    /// chain's writable part (the used length).
    pub fn execute(&mut self, chain: Chain<'_>, mem: &GuestMemoryMmap) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.writer(mem))
        else {
            // A buffer outside guest RAM: nothing can be answered, not even
            // the status; the chain is returned empty.
            return 0;
        };
        let writable = writer.available_bytes();
        let Some(data_len) = writable.checked_sub(1) else {
            return 0;
        };
        let Ok(mut status_writer) = writer.split_at(data_len) else {
            return 0;
        };
        let (status, written) = match reader.read_obj::<RequestHeader>() {
            Err(_) => (VIRTIO_BLK_S_IOERR, 0),
            Ok(header) => match header.request_type {
                VIRTIO_BLK_T_IN => self.read_into(header.sector, &mut writer),
                VIRTIO_BLK_T_OUT => (self.write_from(header.sector, &mut reader), 0),
                VIRTIO_BLK_T_FLUSH => (self.flush(), 0),
                VIRTIO_BLK_T_GET_ID => {
                    let n = ID_BYTES.min(data_len);
                    match writer.write_all(&self.id[..n]) {
                        Ok(()) => (VIRTIO_BLK_S_OK, n),
                        Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                    }
                }
                _ => (VIRTIO_BLK_S_UNSUPP, 0),
            },
        };
        if status_writer.write_all(&[status as u8]).is_err() {
            return 0;
        }
        // `written` <= data_len < the chain's length, which fits in a u32.
        u32::try_from(written + 1).unwrap_or(u32::MAX)
    }

    /// IN: fills the writable data part from the disk.
    fn read_into(&mut self, sector: u64, writer: &mut virtio_queue::Writer<'_>) -> (u32, usize) {
        let len = writer.available_bytes();
        let (Some(mut offset), Some(file)) =
            (check_range(sector, len as u64, self.capacity), &self.file)
        else {
            return (VIRTIO_BLK_S_IOERR, 0);
        };
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            let buf = &mut self.buf[..n];
            if file.read_exact_at(buf, offset).is_err() || writer.write_all(buf).is_err() {
                return (VIRTIO_BLK_S_IOERR, done);
            }
            done += n;
            offset += n as u64;
        }
        (VIRTIO_BLK_S_OK, done)
    }

    /// OUT: writes the readable data part to the disk.
    fn write_from(&mut self, sector: u64, reader: &mut virtio_queue::Reader<'_>) -> u32 {
        // Refused whatever the driver negotiated: F_RO is advice to the
        // driver, this check is the guarantee.
        if self.read_only {
            return VIRTIO_BLK_S_IOERR;
        }
        let len = reader.available_bytes();
        let (Some(mut offset), Some(file)) =
            (check_range(sector, len as u64, self.capacity), &self.file)
        else {
            return VIRTIO_BLK_S_IOERR;
        };
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            let buf = &mut self.buf[..n];
            if reader.read_exact(buf).is_err() || file.write_all_at(buf, offset).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
            done += n;
            offset += n as u64;
        }
        VIRTIO_BLK_S_OK
    }

    fn flush(&mut self) -> u32 {
        let Some(file) = self.file.as_ref().filter(|_| !self.read_only) else {
            return VIRTIO_BLK_S_OK;
        };
        match file.sync_data() {
            Ok(()) => VIRTIO_BLK_S_OK,
            Err(_) => VIRTIO_BLK_S_IOERR,
        }
    }

    /// Executes every available request on `queue`; returns how many were
    /// returned to the driver, and the error that stopped the pass early if
    /// the rings themselves are unusable (what was answered before still
    /// needs its interrupt).
    pub fn process_queue(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> (usize, Result<(), QueueError>) {
        let mut count = 0;
        loop {
            let chain = match queue::pop(queue, mem) {
                Ok(Some(chain)) => chain,
                Ok(None) => return (count, Ok(())),
                Err(e) => return (count, Err(e)),
            };
            let head = chain.head_index();
            let len = self.execute(chain, mem);
            if let Err(e) = queue::add_used(queue, mem, head, len) {
                return (count, Err(e));
            }
            count += 1;
        }
    }
}

/// `id` as GET_ID answers it: NUL-padded, cut at [`ID_BYTES`].
fn id_bytes(id: &str) -> [u8; ID_BYTES] {
    let mut bytes = [0u8; ID_BYTES];
    let n = id.len().min(ID_BYTES);
    bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
    bytes
}

fn is_writable(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL on a descriptor this `File` owns reads its flags and
    // touches no memory.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_ACCMODE != libc::O_RDONLY)
}

/// The running device: the disk plus its queue.
#[derive(Debug)]
struct BlockWorker {
    disk: Disk,
    ctx: DeviceContext,
}

impl WorkerHandler for BlockWorker {
    fn queue_notified(&mut self, _index: usize) {
        let mut queues = lock(&self.ctx.queues);
        let Some(queue) = queues.get_mut(0) else {
            return;
        };
        // A broken ring gets no more answers until the driver resets the
        // device; what was answered before the breakage is still signalled.
        let (used, _broken) = self.disk.process_queue(queue, &self.ctx.mem);
        drop(queues);
        if used > 0 {
            // A failed irqfd write leaves a polling driver unaffected and an
            // interrupt-driven one to its timeout; nothing better to do.
            let _ = self.ctx.interrupt.trigger(INTERRUPT_USED_RING);
        }
    }
}

/// A virtio-blk device.
#[derive(Debug)]
pub struct Block {
    /// The disk, while no worker runs.
    disk: Option<Disk>,
    worker: WorkerSlot<BlockWorker>,
    evts: [EventFd; 1],
    config: [u8; 8],
    avail_features: u64,
    read_only: bool,
    capacity: u64,
    id: String,
    /// Started empty: its medium may change while the guest runs.
    slot: bool,
}

impl Block {
    /// A device for `disk`; an empty disk makes it a slot.
    pub fn new(disk: Disk, id: &str) -> Result<Self, BlockError> {
        let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| WorkerError::Setup {
            device: "block",
            source,
        })?;
        let mut avail_features = (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_BLK_F_FLUSH);
        if disk.read_only() {
            avail_features |= 1 << VIRTIO_BLK_F_RO;
        }
        Ok(Block {
            config: disk.capacity().to_le_bytes(),
            read_only: disk.read_only(),
            capacity: disk.capacity(),
            id: id.into(),
            slot: disk.is_empty(),
            disk: Some(disk),
            worker: WorkerSlot::new("block"),
            evts: [evt],
            avail_features,
        })
    }

    /// Capacity in sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether the disk is read-only.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The id reported to GET_ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the device was started as a slot.
    pub fn is_slot(&self) -> bool {
        self.slot
    }

    /// Whether the device is a slot holding a disk.
    pub fn slot_holds_disk(&self) -> bool {
        self.slot && self.capacity > 0
    }

    /// Puts the read-only `file` into this slot, or empties it (`None`);
    /// returns the new capacity in sectors. A running worker is stopped
    /// between two batches for the change, so no request sees half of it.
    /// The caller tells the driver (a configuration-change interrupt).
    pub fn change_medium(&mut self, file: Option<File>) -> Result<u64, MediumError> {
        if !self.slot {
            return Err(MediumError::NotASlot(self.id.clone()));
        }
        let incoming = match file {
            None => Disk::empty(&self.id),
            Some(_) if self.capacity > 0 => return Err(MediumError::Occupied(self.id.clone())),
            Some(file) => {
                if is_writable(&file).map_err(|source| BlockError::Flags {
                    name: self.id.clone(),
                    source,
                })? {
                    return Err(MediumError::Writable(self.id.clone()));
                }
                Disk::from_file(file, true, &self.id, &self.id)?
            }
        };
        let capacity = incoming.capacity();
        let mut incoming = Some(incoming);
        self.worker.with_handler(&self.evts, |worker| {
            if let Some(disk) = incoming.take() {
                worker.disk = disk;
            }
        })?;
        if let Some(disk) = incoming {
            // No worker: the driver has not started the device yet.
            self.disk = Some(disk);
        }
        self.capacity = capacity;
        self.config = capacity.to_le_bytes();
        Ok(capacity)
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_MAX_SIZE]
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
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
        let disk = self.disk.take().ok_or(ActivateError::Broken("block"))?;
        // Look at the queue once at start: requests made available before
        // activation (or before a snapshot) are served, not left waiting.
        let _ = self.evts[0].write(1);
        Ok(self.worker.start(BlockWorker { disk, ctx }, &self.evts)?)
    }

    fn is_activated(&self) -> bool {
        self.worker.is_running()
    }

    fn reset(&mut self) {
        // A panicked worker took the disk with it; the device then stays
        // inactive and later activations fail with `Broken`.
        if let Some(handler) = self.worker.stop() {
            self.disk = Some(handler.disk);
        }
        let _ = self.evts[0].read();
    }

    fn device_state(&self) -> crate::devices::virtio::persist::DeviceState {
        crate::devices::virtio::persist::DeviceState::Block(self.save())
    }

    fn pause(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.pause()?)
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(self.worker.resume(&self.evts)?)
    }

    fn as_block(&self) -> Option<&Block> {
        Some(self)
    }

    fn as_block_mut(&mut self) -> Option<&mut Block> {
        Some(self)
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use std::fs::File;
    use std::io::{Seek, Write};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::SECTOR_SIZE;

    /// A disk file of `sectors` sectors, sector i filled with byte i.
    pub fn disk_file(sectors: u64) -> File {
        let mut f = tempfile();
        for i in 0..sectors {
            f.write_all(&[i as u8; SECTOR_SIZE as usize]).expect("fill");
        }
        f.rewind().expect("rewind");
        f
    }

    pub fn tempfile() -> File {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "vmm-blk-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("temp file");
        std::fs::remove_file(&path).expect("unlink");
        f
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vm_memory::{Bytes, GuestAddress};

    use super::tests_support::disk_file;
    use super::*;
    use crate::devices::virtio::mmio::MmioTransport;
    use crate::devices::virtio::testing::{
        self, Desc, DriverSetup, GuestQueue, BUFFERS, F_INDIRECT, F_WRITE,
    };
    use crate::devices::virtio::Interrupt;

    const HDR: u64 = BUFFERS;
    const DATA: u64 = BUFFERS + 0x1000;
    const STATUS: u64 = BUFFERS + 0x100;

    fn reopen_ro(f: &File) -> File {
        use std::os::fd::AsRawFd;
        File::open(format!("/proc/self/fd/{}", f.as_raw_fd())).expect("reopen")
    }

    fn header(mem: &GuestMemoryMmap, request_type: u32, sector: u64) {
        mem.write_obj(
            RequestHeader {
                request_type,
                reserved: 0,
                sector,
            },
            GuestAddress(HDR),
        )
        .expect("header");
    }

    fn status(mem: &GuestMemoryMmap) -> u8 {
        mem.read_obj(GuestAddress(STATUS)).expect("status")
    }

    struct Rig {
        mem: GuestMemoryMmap,
        queue: Queue,
        disk: Disk,
    }

    impl Rig {
        fn new(sectors: u64, read_only: bool) -> (Self, File) {
            let file = disk_file(sectors);
            let handle = file.try_clone().expect("clone");
            let file = if read_only { reopen_ro(&file) } else { file };
            let disk = Disk::from_file(file, read_only, "disk-under-test", "test").expect("disk");
            let mem = testing::memory();
            let setup = DriverSetup::for_sizes(&[16]).queues[0];
            let mut queue = Queue::new(QUEUE_MAX_SIZE).expect("queue");
            use virtio_queue::QueueT;
            queue.set_size(setup.size);
            queue.set_desc_table_address(Some(setup.desc as u32), Some(0));
            queue.set_avail_ring_address(Some(setup.avail as u32), Some(0));
            queue.set_used_ring_address(Some(setup.used as u32), Some(0));
            queue.set_ready(true);
            (Rig { mem, queue, disk }, handle)
        }

        fn guest(&self) -> GuestQueue {
            GuestQueue::new(&self.mem, DriverSetup::for_sizes(&[16]).queues[0])
        }

        fn run(&mut self) -> usize {
            let (n, result) = self.disk.process_queue(&mut self.queue, &self.mem);
            result.expect("process");
            n
        }
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
    fn reads_writes_flushes_and_ids() {
        let (mut rig, file) = Rig::new(8, false);
        let mut g = rig.guest();
        header(&rig.mem, VIRTIO_BLK_T_IN, 3);
        g.add_chain(&[d(HDR, 16, 0), d(DATA, 1024, F_WRITE), d(STATUS, 1, F_WRITE)]);
        assert_eq!(rig.run(), 1);
        assert_eq!(g.take_used(), vec![(0, 1025)]);
        assert_eq!(status(&rig.mem), VIRTIO_BLK_S_OK as u8);
        let mut data = [0u8; 1024];
        rig.mem
            .read_slice(&mut data, GuestAddress(DATA))
            .expect("read");
        assert!(data[..512].iter().all(|&b| b == 3) && data[512..].iter().all(|&b| b == 4));

        // OUT, with the header and the data split oddly across descriptors.
        rig.mem
            .write_slice(&[0xab; 512], GuestAddress(DATA))
            .expect("data");
        header(&rig.mem, VIRTIO_BLK_T_OUT, 7);
        g.add_chain(&[
            d(HDR, 10, 0),
            d(HDR + 10, 6, 0),
            d(DATA, 100, 0),
            d(DATA + 100, 412, 0),
            d(STATUS, 1, F_WRITE),
        ]);
        rig.run();
        assert_eq!(g.take_used(), vec![(3, 1)]);
        assert_eq!(status(&rig.mem), VIRTIO_BLK_S_OK as u8);
        let mut back = [0u8; 512];
        file.read_exact_at(&mut back, 7 * 512).expect("host read");
        assert_eq!(back, [0xab; 512]);

        header(&rig.mem, VIRTIO_BLK_T_FLUSH, 0);
        g.add_chain(&[d(HDR, 16, 0), d(STATUS, 1, F_WRITE)]);
        header(&rig.mem, VIRTIO_BLK_T_GET_ID, 0);
        rig.run();
        assert_eq!(status(&rig.mem), VIRTIO_BLK_S_OK as u8);
        g.add_chain(&[d(HDR, 16, 0), d(DATA, 20, F_WRITE), d(STATUS, 1, F_WRITE)]);
        rig.run();
        let used = g.take_used();
        assert_eq!(used.last(), Some(&(10, 21)));
        let mut id = [0u8; 20];
        rig.mem.read_slice(&mut id, GuestAddress(DATA)).expect("id");
        assert_eq!(&id[..15], b"disk-under-test");
        assert_eq!(id[15..], [0; 5]);
    }

    #[test]
    fn read_only_disk_refuses_writes_whatever_was_negotiated() {
        let (mut rig, file) = Rig::new(4, true);
        let mut g = rig.guest();
        rig.mem
            .write_slice(&[0xee; 512], GuestAddress(DATA))
            .expect("data");
        header(&rig.mem, VIRTIO_BLK_T_OUT, 1);
        g.add_chain(&[d(HDR, 16, 0), d(DATA, 512, 0), d(STATUS, 1, F_WRITE)]);
        rig.run();
        assert_eq!(g.take_used(), vec![(0, 1)]);
        assert_eq!(status(&rig.mem), VIRTIO_BLK_S_IOERR as u8);
        let mut back = [0u8; 512];
        file.read_exact_at(&mut back, 512).expect("host read");
        assert_eq!(back, [1; 512], "host file unchanged");
        // Reads still work, and flush is a no-op success.
        header(&rig.mem, VIRTIO_BLK_T_FLUSH, 0);
        g.add_chain(&[d(HDR, 16, 0), d(STATUS, 1, F_WRITE)]);
        rig.run();
        assert_eq!(status(&rig.mem), VIRTIO_BLK_S_OK as u8);
    }

    #[test]
    fn malformed_requests_get_errors_not_panics() {
        let (mut rig, file) = Rig::new(4, false);
        let mut g = rig.guest();
        let cases: Vec<(u32, u64, Vec<Desc>, Option<u8>)> = vec![
            // Past the end of the disk.
            (
                VIRTIO_BLK_T_IN,
                4,
                vec![d(HDR, 16, 0), d(DATA, 512, F_WRITE), d(STATUS, 1, F_WRITE)],
                Some(1),
            ),
            (
                VIRTIO_BLK_T_IN,
                3,
                vec![d(HDR, 16, 0), d(DATA, 1024, F_WRITE), d(STATUS, 1, F_WRITE)],
                Some(1),
            ),
            (
                VIRTIO_BLK_T_OUT,
                u64::MAX / 2,
                vec![d(HDR, 16, 0), d(DATA, 512, 0), d(STATUS, 1, F_WRITE)],
                Some(1),
            ),
            // Not a whole sector.
            (
                VIRTIO_BLK_T_IN,
                0,
                vec![d(HDR, 16, 0), d(DATA, 100, F_WRITE), d(STATUS, 1, F_WRITE)],
                Some(1),
            ),
            // Short header.
            (
                VIRTIO_BLK_T_IN,
                0,
                vec![d(HDR, 8, 0), d(STATUS, 1, F_WRITE)],
                Some(1),
            ),
            // Unknown type.
            (99, 0, vec![d(HDR, 16, 0), d(STATUS, 1, F_WRITE)], Some(2)),
            // No writable byte at all: returned with length 0.
            (VIRTIO_BLK_T_IN, 0, vec![d(HDR, 16, 0)], None),
            // A buffer outside guest memory.
            (
                VIRTIO_BLK_T_IN,
                0,
                vec![
                    d(HDR, 16, 0),
                    d(0xffff_0000, 512, F_WRITE),
                    d(STATUS, 1, F_WRITE),
                ],
                None,
            ),
            // A length that wraps the address space.
            (
                VIRTIO_BLK_T_IN,
                0,
                vec![
                    d(HDR, 16, 0),
                    d(DATA, u32::MAX, F_WRITE),
                    d(STATUS, 1, F_WRITE),
                ],
                None,
            ),
        ];
        for (i, (t, sector, descs, want)) in cases.into_iter().enumerate() {
            rig.mem
                .write_obj(0xffu8, GuestAddress(STATUS))
                .expect("status");
            header(&rig.mem, t, sector);
            g.add_chain(&descs);
            assert_eq!(rig.run(), 1, "case {i}");
            let used = g.take_used();
            assert_eq!(used.len(), 1, "case {i}");
            match want {
                Some(s) => assert_eq!(status(&rig.mem), s, "case {i}"),
                None => assert_eq!(used[0].1, 0, "case {i}"),
            }
        }
        let mut back = vec![0u8; 4 * 512];
        file.read_exact_at(&mut back, 0).expect("host read");
        assert!(back
            .chunks(512)
            .enumerate()
            .all(|(i, s)| s.iter().all(|&b| b == i as u8)));
    }

    #[test]
    fn hostile_chains_terminate() {
        let (mut rig, _file) = Rig::new(4, false);
        let g = rig.guest();
        header(&rig.mem, VIRTIO_BLK_T_IN, 0);
        // A descriptor loop: 0 -> 1 -> 0 ... ends at the queue size.
        g.write_desc(
            0,
            Desc {
                addr: HDR,
                len: 16,
                flags: 1,
                next: 1,
            },
        );
        g.write_desc(
            1,
            Desc {
                addr: STATUS,
                len: 1,
                flags: 1 | F_WRITE,
                next: 0,
            },
        );
        let mut g = g;
        g.publish(0);
        // An indirect table that points at itself, and one of absurd length.
        g.write_desc(
            2,
            Desc {
                addr: 0x9_0000,
                len: 32,
                flags: F_INDIRECT,
                next: 0,
            },
        );
        rig.mem
            .write_slice(&[0u8; 32], GuestAddress(0x9_0000))
            .expect("table");
        let table = GuestQueue::new(
            &rig.mem,
            testing::QueueSetup {
                size: 2,
                desc: 0x9_0000,
                avail: 0,
                used: 0,
            },
        );
        table.write_desc(
            0,
            Desc {
                addr: 0x9_0000,
                len: 32,
                flags: F_INDIRECT,
                next: 0,
            },
        );
        g.publish(2);
        g.write_desc(
            3,
            Desc {
                addr: 0x9_0000,
                len: 0xffff_fff0,
                flags: F_INDIRECT,
                next: 0,
            },
        );
        g.publish(3);
        // Out-of-range head index: skipped (it cannot be returned).
        g.publish(200);
        let started = Instant::now();
        assert_eq!(rig.run(), 3);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(g.take_used().len(), 3);
        // An available index far ahead of the device: refused, not looped on.
        g.set_avail_idx(1000);
        assert!(rig.disk.process_queue(&mut rig.queue, &rig.mem).1.is_err());
    }

    #[test]
    fn range_checks() {
        assert_eq!(check_range(0, 512, 1), Some(0));
        assert_eq!(check_range(1, 512, 1), None);
        assert_eq!(check_range(0, 1024, 1), None);
        assert_eq!(check_range(0, 511, 1), None);
        assert_eq!(check_range(u64::MAX, 512, u64::MAX), None);
        assert_eq!(check_range(2, 0, 2), Some(1024));
        assert_eq!(
            RequestHeader::from_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]),
            RequestHeader {
                request_type: 1,
                reserved: 0,
                sector: 5
            }
        );
    }

    #[test]
    fn device_through_the_transport_and_worker() {
        let file = disk_file(4);
        let disk = Disk::from_file(file, true, "ro", "test").expect("disk");
        let block = Block::new(disk, "ro").expect("block");
        assert_ne!(block.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
        let mem = testing::memory();
        let irq = Arc::new(Interrupt::new().expect("irq"));
        let mut t = MmioTransport::new(Box::new(block), mem.clone(), irq.clone());
        assert_eq!(
            testing::read32(&mut t, 0x100),
            4,
            "capacity in config space"
        );
        let setup = DriverSetup::for_sizes(&[16]);
        testing::init_driver(&mut t, &setup, 1 << VIRTIO_F_VERSION_1);
        assert!(t.device().is_activated());
        let mut g = GuestQueue::new(&mem, setup.queues[0]);
        header(&mem, VIRTIO_BLK_T_IN, 2);
        g.add_chain(&[d(HDR, 16, 0), d(DATA, 512, F_WRITE), d(STATUS, 1, F_WRITE)]);
        testing::write32(&mut t, 0x50, 0);
        // Wait as a driver does, for the interrupt: the worker publishes the
        // used entry before it raises the line, so a test that polls the
        // ring can see the entry before the status bit on a slow CPU.
        let mut raised = libc::pollfd {
            fd: irq.eventfd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; the eventfd outlives it.
        let ready = unsafe { libc::poll(&mut raised, 1, 5_000) };
        assert_eq!(ready, 1, "no interrupt within 5 s");
        assert_eq!(irq.status() & INTERRUPT_USED_RING, INTERRUPT_USED_RING);
        assert_eq!(g.take_used(), vec![(0, 513)]);
        let mut data = [0u8; 512];
        mem.read_slice(&mut data, GuestAddress(DATA)).expect("read");
        assert_eq!(data, [2; 512]);
        // Reset stops the worker and gives the disk back for a new start.
        testing::write32(&mut t, 0x70, 0);
        assert!(!t.device().is_activated());
        testing::init_driver(&mut t, &setup, 1 << VIRTIO_F_VERSION_1);
        assert!(t.device().is_activated());
    }
}
