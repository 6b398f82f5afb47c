//! The virtio-mmio transport, version 2 ("modern", virtio 1.x section 4.2):
//! the 4 KiB register window of one device. It runs on vCPU threads (MMIO
//! exits) and owns everything the driver configures: feature negotiation,
//! queue sizes and addresses, the device status state machine, interrupt
//! acknowledgement and config-space access. When the driver sets DRIVER_OK
//! with valid queues it activates the device; a write of 0 to Status resets
//! it. Anything out of order (queue setup before FEATURES_OK, features the
//! device never offered, status bits skipped) is ignored or refused the way
//! the spec lets a device refuse it, never a panic.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_mmio as reg;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::persist::{check_version, PersistError, SavedQueue, VirtioMmioState};
use super::queue::is_usable;
use super::{lock, status, DeviceContext, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;

/// Size of one device's register window.
pub const MMIO_DEVICE_SIZE: u64 = 0x1000;
/// "virt", little endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
pub const MMIO_VERSION: u32 = 2;
/// Vendor ID reported to the driver: "SBXD", little endian (drivers do not
/// care; it only shows in Linux's sysfs).
pub const MMIO_VENDOR_ID: u32 = 0x4458_4253;
/// Version of [`MmioTransportState`].
pub const MMIO_STATE_VERSION: u32 = 1;

/// The transport's saved registers plus the queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioTransportState {
    /// [`MMIO_STATE_VERSION`].
    pub version: u32,
    /// The device's virtio ID, to refuse restoring into another kind.
    pub device_type: u32,
    /// Status register.
    pub device_status: u32,
    /// DeviceFeaturesSel.
    pub features_select: u32,
    /// DriverFeaturesSel.
    pub acked_features_select: u32,
    /// QueueSel.
    pub queue_select: u32,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// The queues.
    pub queues: Vec<SavedQueue>,
}

/// One virtio device's MMIO window.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    queues: Arc<Mutex<Vec<Queue>>>,
    device_status: u32,
    features_select: u32,
    acked_features_select: u32,
    queue_select: u32,
    acked_features: u64,
    config_generation: u32,
    /// QueueNotify writes that reached the VMM (0 while KVM's ioeventfds
    /// catch them all).
    notify_exits: u64,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device.device_type())
            .field("device_status", &self.device_status)
            .field("acked_features", &self.acked_features)
            .finish_non_exhaustive()
    }
}

fn new_queues(max_sizes: &[u16]) -> Vec<Queue> {
    max_sizes
        .iter()
        // Devices declare power-of-two sizes <= 32768, which Queue accepts;
        // a size it refuses would be a bug in the device, caught by the
        // devices' own tests, and falls back to the smallest queue.
        .map(|&max| Queue::new(max).unwrap_or_else(|_| Queue::default()))
        .collect()
}

impl MmioTransport {
    /// A transport for `device`, raising `interrupt` (whose eventfd the
    /// caller registers as an irqfd).
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<Interrupt>,
    ) -> Self {
        let queues = Arc::new(Mutex::new(new_queues(device.queue_max_sizes())));
        MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            device_status: 0,
            features_select: 0,
            acked_features_select: 0,
            queue_select: 0,
            acked_features: 0,
            config_generation: 0,
            notify_exits: 0,
        }
    }

    /// QueueNotify writes that exited to the VMM instead of being caught
    /// by an ioeventfd in KVM.
    pub fn notify_exits(&self) -> u64 {
        self.notify_exits
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    /// The interrupt line.
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// The Status register.
    pub fn device_status(&self) -> u32 {
        self.device_status
    }

    fn has(&self, bits: u32) -> bool {
        self.device_status & bits == bits
    }

    /// Queue registers may change only between FEATURES_OK and DRIVER_OK
    /// (virtio 1.x 3.1.1).
    fn queue_setup_allowed(&self) -> bool {
        self.has(status::FEATURES_OK) && !self.has(status::DRIVER_OK)
    }

    fn with_selected_queue<T>(&self, f: impl FnOnce(&mut Queue) -> T) -> Option<T> {
        let mut queues = lock(&self.queues);
        queues.get_mut(self.queue_select as usize).map(f)
    }

    fn read_register(&self, offset: u32) -> u32 {
        match offset {
            reg::VIRTIO_MMIO_MAGIC_VALUE => MMIO_MAGIC,
            reg::VIRTIO_MMIO_VERSION => MMIO_VERSION,
            reg::VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            reg::VIRTIO_MMIO_VENDOR_ID => MMIO_VENDOR_ID,
            reg::VIRTIO_MMIO_DEVICE_FEATURES => match self.features_select {
                0 => self.device.avail_features() as u32,
                1 => (self.device.avail_features() >> 32) as u32,
                _ => 0,
            },
            reg::VIRTIO_MMIO_QUEUE_NUM_MAX => self
                .with_selected_queue(|q| u32::from(q.max_size()))
                .unwrap_or(0),
            reg::VIRTIO_MMIO_QUEUE_READY => self
                .with_selected_queue(|q| u32::from(q.ready()))
                .unwrap_or(0),
            reg::VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt.status(),
            reg::VIRTIO_MMIO_STATUS => self.device_status,
            reg::VIRTIO_MMIO_CONFIG_GENERATION => self.config_generation,
            // Write-only registers, legacy registers and holes read as 0.
            _ => 0,
        }
    }

    fn write_register(&mut self, offset: u32, value: u32) {
        match offset {
            reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.features_select = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.acked_features_select = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            reg::VIRTIO_MMIO_QUEUE_SEL => self.queue_select = value,
            reg::VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value),
            reg::VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt.ack(value),
            reg::VIRTIO_MMIO_STATUS => self.set_status(value),
            reg::VIRTIO_MMIO_QUEUE_NUM
            | reg::VIRTIO_MMIO_QUEUE_READY
            | reg::VIRTIO_MMIO_QUEUE_DESC_LOW
            | reg::VIRTIO_MMIO_QUEUE_DESC_HIGH
            | reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | reg::VIRTIO_MMIO_QUEUE_USED_LOW
            | reg::VIRTIO_MMIO_QUEUE_USED_HIGH
                if self.queue_setup_allowed() =>
            {
                self.write_queue_register(offset, value);
            }
            // Read-only, legacy and unknown registers: writes are dropped.
            _ => {}
        }
    }

    fn write_queue_register(&mut self, offset: u32, value: u32) {
        self.with_selected_queue(|q| match offset {
            // virtio-queue refuses (and logs) sizes that are not a power of
            // two or exceed the maximum, keeping the previous size.
            reg::VIRTIO_MMIO_QUEUE_NUM => q.set_size(value as u16),
            reg::VIRTIO_MMIO_QUEUE_READY => q.set_ready(value == 1),
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(value), None),
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(value)),
            reg::VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(value), None),
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH => q.set_used_ring_address(None, Some(value)),
            _ => {}
        });
    }

    fn write_driver_features(&mut self, value: u32) {
        // Features are negotiated between DRIVER and FEATURES_OK only.
        if !self.has(status::DRIVER) || self.has(status::FEATURES_OK) {
            return;
        }
        let shift = match self.acked_features_select {
            0 => 0,
            1 => 32,
            _ => return,
        };
        let mask = 0xffff_ffffu64 << shift;
        self.acked_features = (self.acked_features & !mask) | (u64::from(value) << shift);
    }

    fn notify(&mut self, value: u32) {
        // Only reached when no ioeventfd caught the write first.
        self.notify_exits += 1;
        if let Some(evt) = self.device.queue_events().get(value as usize) {
            // The counter saturates only after 2^64 - 2 unread notifies.
            let _ = evt.write(1);
        }
    }

    fn set_status(&mut self, value: u32) {
        use status::{ACKNOWLEDGE, DRIVER, DRIVER_OK, FAILED, FEATURES_OK};
        if value == 0 {
            self.reset();
            return;
        }
        if value & FAILED != 0 {
            // The driver gave up on the device; keep it inert until reset.
            self.device_status |= FAILED;
            return;
        }
        let old = self.device_status;
        // Each step adds exactly one bit, in the order of virtio 1.x 3.1.1.
        let next = match old {
            0 => ACKNOWLEDGE,
            s if s == ACKNOWLEDGE => ACKNOWLEDGE | DRIVER,
            s if s == ACKNOWLEDGE | DRIVER => ACKNOWLEDGE | DRIVER | FEATURES_OK,
            s if s == ACKNOWLEDGE | DRIVER | FEATURES_OK => {
                ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
            }
            _ => return,
        };
        if value != next {
            return;
        }
        if next & FEATURES_OK != 0 && old & FEATURES_OK == 0 && !self.features_acceptable() {
            // Leave FEATURES_OK clear: the driver reads it back and fails.
            return;
        }
        if next & DRIVER_OK != 0 {
            self.device_status = next;
            self.activate();
            return;
        }
        self.device_status = next;
    }

    /// The driver may accept only offered features, and must accept
    /// VERSION_1: this transport has no legacy interface.
    fn features_acceptable(&self) -> bool {
        let avail = self.device.avail_features();
        self.acked_features & !avail == 0 && self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        let all_usable = lock(&self.queues).iter().all(|q| is_usable(q, &self.mem));
        let result = if all_usable {
            self.device.activate(DeviceContext {
                mem: self.mem.clone(),
                queues: self.queues.clone(),
                interrupt: self.interrupt.clone(),
                acked_features: self.acked_features,
            })
        } else {
            let queues = lock(&self.queues);
            Err(super::ActivateError::QueuesNotReady {
                needed: queues.len(),
                found: queues.iter().filter(|q| is_usable(q, &self.mem)).count(),
            })
        };
        if result.is_err() {
            // The spec's way to say "this will not work": the driver sees
            // DEVICE_NEEDS_RESET after a configuration-change interrupt.
            self.device_status |= status::DEVICE_NEEDS_RESET;
            let _ = self.interrupt.trigger(super::INTERRUPT_CONFIG);
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        let mut queues = lock(&self.queues);
        for q in queues.iter_mut() {
            q.reset();
        }
        drop(queues);
        self.interrupt.set_status(0);
        self.device_status = 0;
        self.features_select = 0;
        self.acked_features_select = 0;
        self.queue_select = 0;
        self.acked_features = 0;
    }

    /// Saves the registers and queues. Safe while the device runs: the queue
    /// lock is taken between batches, so the saved indices match what the
    /// guest's rings show once vCPUs are paused.
    pub fn save(&self) -> MmioTransportState {
        MmioTransportState {
            version: MMIO_STATE_VERSION,
            device_type: self.device.device_type(),
            device_status: self.device_status,
            features_select: self.features_select,
            acked_features_select: self.acked_features_select,
            queue_select: self.queue_select,
            acked_features: self.acked_features,
            interrupt_status: self.interrupt.status(),
            config_generation: self.config_generation,
            queues: lock(&self.queues).iter().map(SavedQueue::save).collect(),
        }
    }

    /// Changes the medium of the block slot behind this transport (see
    /// [`Block::change_medium`](super::block::Block::change_medium)) and
    /// tells a running driver with a configuration-change interrupt, after
    /// bumping ConfigGeneration so a driver reading the capacity across the
    /// change reads it again.
    pub fn change_medium(
        &mut self,
        disk_number: usize,
        file: Option<std::fs::File>,
    ) -> Result<u64, super::block::MediumError> {
        let block = self
            .device
            .as_block_mut()
            .ok_or(super::block::MediumError::NoSuchDisk(disk_number))?;
        let sectors = block.change_medium(file)?;
        self.config_generation = self.config_generation.wrapping_add(1);
        if self.has(status::DRIVER_OK) {
            // A failed irqfd write leaves the driver with the old size until
            // it next looks; nothing better to do.
            let _ = self.interrupt.trigger(super::INTERRUPT_CONFIG);
        }
        Ok(sectors)
    }

    /// Stops the device's worker for a pause (see `VirtioDevice::pause`).
    pub fn pause_device(&mut self) -> Result<(), super::ActivateError> {
        self.device.pause()
    }

    /// Restarts the device's worker after a pause.
    pub fn resume_device(&mut self) -> Result<(), super::ActivateError> {
        self.device.resume()
    }

    /// Saves the transport and the device behind it.
    pub fn snapshot(&self) -> VirtioMmioState {
        VirtioMmioState {
            transport: self.save(),
            device: self.device.device_state(),
        }
    }

    /// Rebuilds a transport for `device` (restored from its own state) from
    /// `state`, and restarts the device if the driver had set DRIVER_OK.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<Interrupt>,
        state: &MmioTransportState,
    ) -> Result<Self, PersistError> {
        check_version("virtio-mmio transport", state.version, MMIO_STATE_VERSION)?;
        if state.device_type != device.device_type() {
            return Err(PersistError::Mismatch(format!(
                "the state is for virtio device type {}, the device is type {}",
                state.device_type,
                device.device_type()
            )));
        }
        let max_sizes = device.queue_max_sizes();
        if state.queues.len() != max_sizes.len()
            || state
                .queues
                .iter()
                .zip(max_sizes)
                .any(|(q, &max)| q.max_size != max)
        {
            return Err(PersistError::Mismatch(format!(
                "the state has queues of max sizes {:?}, the device has {:?}",
                state.queues.iter().map(|q| q.max_size).collect::<Vec<_>>(),
                max_sizes
            )));
        }
        let queues = state
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| q.restore(i))
            .collect::<Result<Vec<_>, _>>()?;
        interrupt.set_status(state.interrupt_status);
        let mut transport = MmioTransport {
            device,
            mem,
            interrupt,
            queues: Arc::new(Mutex::new(queues)),
            device_status: state.device_status,
            features_select: state.features_select,
            acked_features_select: state.acked_features_select,
            queue_select: state.queue_select,
            acked_features: state.acked_features,
            config_generation: state.config_generation,
            notify_exits: 0,
        };
        if transport.has(status::DRIVER_OK) && !transport.has(status::DEVICE_NEEDS_RESET) {
            if let Some(index) = lock(&transport.queues)
                .iter()
                .position(|q| !is_usable(q, &transport.mem))
            {
                return Err(PersistError::Mismatch(format!(
                    "virtqueue {index} of the running device lies outside this VM's memory"
                )));
            }
            transport.device.activate(DeviceContext {
                mem: transport.mem.clone(),
                queues: transport.queues.clone(),
                interrupt: transport.interrupt.clone(),
                acked_features: transport.acked_features,
            })?;
        }
        Ok(transport)
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let config_base = u64::from(reg::VIRTIO_MMIO_CONFIG);
        if offset >= config_base {
            self.device.read_config(offset - config_base, data);
            return;
        }
        // Registers are 32 bits wide and 32-bit aligned (virtio 1.x 4.2.2.2);
        // anything else reads as 0.
        if data.len() == 4 && offset % 4 == 0 {
            let value = self.read_register(offset as u32);
            data.copy_from_slice(&value.to_le_bytes());
        } else {
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let config_base = u64::from(reg::VIRTIO_MMIO_CONFIG);
        if offset >= config_base {
            self.device.write_config(offset - config_base, data);
            return;
        }
        if let (Ok(bytes), true) = (<[u8; 4]>::try_from(data), offset % 4 == 0) {
            self.write_register(offset as u32, u32::from_le_bytes(bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use vmm_sys_util::eventfd::EventFd;

    use super::*;
    use crate::devices::virtio::testing::{self, DriverSetup};
    use crate::devices::virtio::ActivateError;

    /// A device with two queues that records activation and reset.
    struct Dummy {
        evts: Vec<EventFd>,
        active: Arc<AtomicBool>,
        config: [u8; 8],
    }

    impl Dummy {
        fn new() -> (Self, Arc<AtomicBool>) {
            let active = Arc::new(AtomicBool::new(false));
            let evts = (0..2)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"))
                .collect();
            (
                Dummy {
                    evts,
                    active: active.clone(),
                    config: *b"12345678",
                },
                active,
            )
        }
    }

    impl VirtioDevice for Dummy {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 8]
        }
        fn avail_features(&self) -> u64 {
            (1 << VIRTIO_F_VERSION_1) | 0b101
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            crate::devices::virtio::read_config_bytes(&self.config, offset, data);
        }
        fn queue_events(&self) -> &[EventFd] {
            &self.evts
        }
        fn activate(&mut self, _ctx: DeviceContext) -> Result<(), ActivateError> {
            if self.active.swap(true, Ordering::SeqCst) {
                return Err(ActivateError::AlreadyActive);
            }
            Ok(())
        }
        fn is_activated(&self) -> bool {
            self.active.load(Ordering::SeqCst)
        }
        fn reset(&mut self) {
            self.active.store(false, Ordering::SeqCst);
        }
        fn device_state(&self) -> crate::devices::virtio::persist::DeviceState {
            crate::devices::virtio::persist::DeviceState::Vsock(
                crate::devices::virtio::vsock::VsockState { version: 0, cid: 0 },
            )
        }
    }

    fn transport() -> (MmioTransport, Arc<AtomicBool>, GuestMemoryMmap) {
        let mem = testing::memory();
        let (dev, active) = Dummy::new();
        let irq = Arc::new(Interrupt::new().expect("irq"));
        (
            MmioTransport::new(Box::new(dev), mem.clone(), irq),
            active,
            mem,
        )
    }

    #[test]
    fn identification_registers() {
        let (mut t, _, _) = transport();
        assert_eq!(testing::read32(&mut t, 0x0), MMIO_MAGIC);
        assert_eq!(testing::read32(&mut t, 0x4), 2);
        assert_eq!(testing::read32(&mut t, 0x8), 42);
        assert_eq!(testing::read32(&mut t, 0xc), MMIO_VENDOR_ID);
        testing::write32(&mut t, 0x14, 1);
        assert_eq!(
            testing::read32(&mut t, 0x10),
            1,
            "VERSION_1 in the high page"
        );
        testing::write32(&mut t, 0x14, 0);
        assert_eq!(testing::read32(&mut t, 0x10), 0b101);
        testing::write32(&mut t, 0x30, 1);
        assert_eq!(testing::read32(&mut t, 0x34), 8);
        testing::write32(&mut t, 0x30, 9);
        assert_eq!(testing::read32(&mut t, 0x34), 0, "no such queue");
        // Narrow or unaligned register reads answer 0; config reads any width.
        let mut b = [0xffu8; 2];
        t.read(0, &mut b);
        assert_eq!(b, [0, 0]);
        t.read(0x102, &mut b);
        assert_eq!(&b, b"34");
        t.read(0x107, &mut b);
        assert_eq!(b, [b'8', 0], "past the end of config reads 0");
    }

    #[test]
    fn full_negotiation_activates_and_zero_resets() {
        let (mut t, active, _) = transport();
        testing::init_driver(
            &mut t,
            &DriverSetup::for_sizes(&[16, 8]),
            1 << VIRTIO_F_VERSION_1,
        );
        assert!(active.load(Ordering::SeqCst));
        assert_eq!(t.device_status(), 0xf);
        assert_eq!(testing::read32(&mut t, 0x44), 1);
        testing::write32(&mut t, 0x70, 0);
        assert!(!active.load(Ordering::SeqCst));
        assert_eq!(t.device_status(), 0);
        testing::write32(&mut t, 0x30, 0);
        assert_eq!(testing::read32(&mut t, 0x44), 0, "queues reset too");
        // And it can be brought up again.
        testing::init_driver(
            &mut t,
            &DriverSetup::for_sizes(&[16, 8]),
            1 << VIRTIO_F_VERSION_1,
        );
        assert!(active.load(Ordering::SeqCst));
    }

    #[test]
    fn out_of_order_and_bad_negotiation_is_refused() {
        let (mut t, active, _) = transport();
        // DRIVER before ACKNOWLEDGE: ignored.
        testing::write32(&mut t, 0x70, status::DRIVER);
        assert_eq!(t.device_status(), 0);
        testing::write32(&mut t, 0x70, status::ACKNOWLEDGE);
        testing::write32(&mut t, 0x70, status::ACKNOWLEDGE | status::DRIVER);
        // Queue setup before FEATURES_OK is ignored.
        testing::write32(&mut t, 0x30, 0);
        testing::write32(&mut t, 0x38, 4);
        testing::write32(&mut t, 0x44, 1);
        assert_eq!(testing::read32(&mut t, 0x44), 0);
        // Without VERSION_1, FEATURES_OK does not stick.
        testing::write32(&mut t, 0x24, 0);
        testing::write32(&mut t, 0x20, 0b1);
        testing::write32(&mut t, 0x70, 0b1011);
        assert_eq!(t.device_status() & status::FEATURES_OK, 0);
        // A feature the device never offered: refused too.
        testing::write32(&mut t, 0x24, 1);
        testing::write32(&mut t, 0x20, 1);
        testing::write32(&mut t, 0x24, 0);
        testing::write32(&mut t, 0x20, 0b10);
        testing::write32(&mut t, 0x70, 0b1011);
        assert_eq!(t.device_status() & status::FEATURES_OK, 0);
        testing::write32(&mut t, 0x20, 0b100);
        testing::write32(&mut t, 0x70, 0b1011);
        assert_eq!(t.device_status(), 0b1011);
        // DRIVER_OK with no queue set up: the device does not start, and
        // says it needs a reset.
        testing::write32(&mut t, 0x70, 0b1111);
        assert!(!active.load(Ordering::SeqCst));
        assert_ne!(t.device_status() & status::DEVICE_NEEDS_RESET, 0);
        assert_ne!(t.interrupt().status() & super::super::INTERRUPT_CONFIG, 0);
    }

    #[test]
    fn queue_addresses_outside_ram_do_not_activate() {
        let (mut t, active, _) = transport();
        let mut setup = DriverSetup::for_sizes(&[16, 8]);
        setup.queues[1].used = 0xffff_f000;
        testing::init_driver(&mut t, &setup, 1 << VIRTIO_F_VERSION_1);
        assert!(!active.load(Ordering::SeqCst));
        assert_ne!(t.device_status() & status::DEVICE_NEEDS_RESET, 0);
    }

    #[test]
    fn notify_signals_the_queue_eventfd_and_ack_clears() {
        let (mut t, _, _) = transport();
        testing::write32(&mut t, 0x50, 1);
        assert_eq!(t.device().queue_events()[1].read().expect("signalled"), 1);
        testing::write32(&mut t, 0x50, 7); // no such queue: ignored
        t.interrupt().trigger(1).expect("trigger");
        assert_eq!(testing::read32(&mut t, 0x60), 1);
        testing::write32(&mut t, 0x64, 1);
        assert_eq!(testing::read32(&mut t, 0x60), 0);
    }

    #[test]
    fn state_round_trips_and_restarts_the_device() {
        let (mut t, _, mem) = transport();
        testing::init_driver(
            &mut t,
            &DriverSetup::for_sizes(&[16, 8]),
            1 << VIRTIO_F_VERSION_1,
        );
        t.interrupt().trigger(1).expect("trigger");
        let state = t.save();
        let json = serde_json::to_string(&state).expect("serialise");
        let back: MmioTransportState = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, state);

        let (dev, active) = Dummy::new();
        let irq = Arc::new(Interrupt::new().expect("irq"));
        let mut restored =
            MmioTransport::restore(Box::new(dev), mem.clone(), irq, &back).expect("restore");
        assert!(
            active.load(Ordering::SeqCst),
            "DRIVER_OK state restarts the device"
        );
        assert_eq!(restored.save(), state);
        assert_eq!(testing::read32(&mut restored, 0x60), 1);

        let wrong = MmioTransportState {
            device_type: 7,
            ..state.clone()
        };
        let (dev, _) = Dummy::new();
        let irq = Arc::new(Interrupt::new().expect("irq"));
        assert!(matches!(
            MmioTransport::restore(Box::new(dev), mem.clone(), irq, &wrong),
            Err(PersistError::Mismatch(_))
        ));
        let old = MmioTransportState {
            version: 0,
            ..state
        };
        let (dev, _) = Dummy::new();
        let irq = Arc::new(Interrupt::new().expect("irq"));
        assert!(matches!(
            MmioTransport::restore(Box::new(dev), mem, irq, &old),
            Err(PersistError::Version { .. })
        ));
    }
}
