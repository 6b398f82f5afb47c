//! Building a VM from a [`VmConfig`]: checks first (config, kernel and
//! initramfs files, the composed command line, disks, vsock socket, KVM),
//! then guest memory, the KVM VM, the kernel and initramfs, the devices, the
//! boot structures (which list the virtio devices) and the vCPUs, ready for
//! [`Machine::run`]. Cheap checks come before expensive work so bad input
//! fails fast.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use crate::arch::boot_info::BootVirtio;
use crate::arch::layout::{virtio_slot, CMDLINE_MAX_LEN, VIRTIO_MMIO_SIZE};
use crate::arch::{self, BootProtocol, ConfigureSystemError, SystemInfo};
use crate::cmdline::{self, CmdlineError};
use crate::config::{ConfigError, VmConfig, MAX_VCPUS};
use crate::devices::bus::{Bus, BusError};
use crate::devices::exit::{ExitDevice, EXIT_PORT, EXIT_PORT_LEN};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::serial::{
    IrqTrigger, SerialDevice, SerialError, SerialSink, COM1_GSI, COM1_LEN, COM1_PORT,
};
use crate::devices::virtio::block::{Block, BlockError, Disk};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{Net, NetError};
use crate::devices::virtio::vsock::{Vsock, VsockError};
use crate::devices::virtio::{Interrupt, VirtioDevice};
use crate::loader::initrd::{self, Initrd, InitrdError};
use crate::loader::{KernelImage, LoaderError};
use crate::machine::{Machine, MachineDevices, MachineShape};
use crate::stop::StopLatch;
use crate::vstate::kvm::{KvmContext, KvmError};
use crate::vstate::memory::{self, MemoryError, MIB};
use crate::vstate::vcpu::{Vcpu, VcpuError};
use crate::vstate::vm::{Vm, VmError};

/// Why a VM could not be built. Each variant's message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The kernel could not be opened or loaded.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// The initramfs could not be opened or loaded.
    #[error(transparent)]
    Initrd(#[from] InitrdError),
    /// The Linux command line does not fit.
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    /// KVM is missing or unusable.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// Guest memory could not be created.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The KVM VM could not be set up.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// A vCPU could not be set up.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// The boot structures could not be written.
    #[error(transparent)]
    System(#[from] ConfigureSystemError),
    /// The serial device could not be created.
    #[error(transparent)]
    Serial(#[from] SerialError),
    /// Devices overlap (a bug in the fixed device layout).
    #[error("device layout: {0}")]
    Bus(#[from] BusError),
    /// A disk could not be opened or used.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// The vsock device could not be set up.
    #[error(transparent)]
    Vsock(#[from] VsockError),
    /// The net device (its tap) could not be set up.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A device's saved state could not be restored.
    #[error("cannot restore the device: {0}")]
    Restore(String),
    /// A virtio device's interrupt eventfd could not be created.
    #[error("cannot create a virtio interrupt eventfd: {0}")]
    VirtioInterrupt(#[source] std::io::Error),
}

/// Offset of QueueNotify in a virtio-mmio window.
const QUEUE_NOTIFY: u64 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_QUEUE_NOTIFY as u64;

/// Where virtio device number `index` goes and what it is, as the guest is
/// told (boot-info block or command line).
fn virtio_entry(index: usize, device: &dyn VirtioDevice) -> BootVirtio {
    // `index` < MAX_VIRTIO_DEVICES (config validation), so nothing overflows.
    let (base, gsi) = virtio_slot(index);
    BootVirtio {
        base,
        gsi,
        device_type: device.device_type(),
    }
}

/// Places virtio device number `index` on the MMIO bus with its interrupt
/// line and queue-notify ioeventfds; `transport` puts the device behind a
/// transport (new, or restored from a snapshot).
pub(crate) fn attach_virtio(
    vm: &Vm,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
    index: usize,
    device: Box<dyn VirtioDevice>,
    transport: impl FnOnce(
        Box<dyn VirtioDevice>,
        GuestMemoryMmap,
        Arc<Interrupt>,
    ) -> Result<MmioTransport, BuildError>,
) -> Result<(BootVirtio, Arc<Mutex<MmioTransport>>), BuildError> {
    let entry = virtio_entry(index, device.as_ref());
    let BootVirtio { base, gsi, .. } = entry;
    let interrupt = Arc::new(Interrupt::new().map_err(BuildError::VirtioInterrupt)?);
    vm.register_irqfd(interrupt.eventfd(), gsi)?;
    for (queue, evt) in device.queue_events().iter().enumerate() {
        // Notifies then never leave KVM. Without the ioeventfd (a KVM that
        // refuses it) the write exits to the VMM and the transport signals
        // the same eventfd, so a failure here only costs speed.
        let _ = vm.register_ioevent(evt, base + QUEUE_NOTIFY, queue as u32);
    }
    let transport = Arc::new(Mutex::new(transport(device, mem.clone(), interrupt)?));
    mmio.insert(transport.clone(), base, VIRTIO_MMIO_SIZE)?;
    Ok((entry, transport))
}

/// The command line the guest gets: the caller's for the test guest, with
/// the Linux additions (see [`cmdline`]) for a Linux kernel.
fn guest_cmdline(
    config: &VmConfig,
    kernel: &KernelImage,
    virtio: &[BootVirtio],
) -> Result<String, CmdlineError> {
    if !kernel.protocol().is_linux() {
        return Ok(config.cmdline.clone());
    }
    let max = kernel.cmdline_limit().unwrap_or(CMDLINE_MAX_LEN);
    cmdline::linux_cmdline(&config.cmdline, virtio, max)
}

/// The serial port, i8042 and exit port on a new port bus, the serial's
/// interrupt wired to COM1's GSI.
pub(crate) fn legacy_devices(
    vm: &Vm,
    serial: SerialDevice,
    latch: &Arc<StopLatch>,
) -> Result<(Bus, Arc<Mutex<SerialDevice>>), BuildError> {
    vm.register_irqfd(serial.irq().eventfd(), COM1_GSI)?;
    let serial = Arc::new(Mutex::new(serial));
    let mut pio = Bus::new();
    pio.insert(serial.clone(), COM1_PORT, COM1_LEN)?;
    pio.insert(
        Arc::new(Mutex::new(I8042::new(latch.clone()))),
        I8042_BASE,
        I8042_LEN,
    )?;
    pio.insert(
        Arc::new(Mutex::new(ExitDevice::new(latch.clone()))),
        EXIT_PORT,
        EXIT_PORT_LEN,
    )?;
    Ok((pio, serial))
}

/// Builds the VM described by `config`, with the guest's serial output going
/// to `serial_out`. The serial sink's clock (first-line time) starts here.
pub fn build(config: &VmConfig, serial_out: Box<dyn Write + Send>) -> Result<Machine, BuildError> {
    let started = Instant::now();
    config.validate()?;
    let mut kernel = match config.kernel_fd {
        Some(fd) => KernelImage::from_fd(fd)?,
        None => KernelImage::open(&config.kernel)?,
    };
    let protocol = kernel.protocol();
    let mut initrd = match &config.initrd {
        Some(_) if !protocol.is_linux() => return Err(InitrdError::Unsupported.into()),
        Some(path) => Some(Initrd::open(path)?),
        None => None,
    };
    // Disks, the tap and the vsock socket before KVM: a wrong path is the likelier
    // mistake and the cheaper check.
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    for (i, disk) in config.disks.iter().enumerate() {
        let id = format!("disk{i}");
        devices.push(Box::new(Block::new(Disk::from_config(disk, &id)?, &id)?));
    }
    if let Some(n) = &config.net {
        devices.push(Box::new(Net::new(&n.tap, n.mac)?));
    }
    if let Some(v) = &config.vsock {
        devices.push(Box::new(Vsock::new(v.cid, &v.uds_path)?));
    }
    let boot_virtio: Vec<BootVirtio> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| virtio_entry(i, d.as_ref()))
        .collect();
    let guest_cmdline = guest_cmdline(config, &kernel, &boot_virtio)?;
    let kvm = match config.kvm_fd {
        Some(fd) => KvmContext::from_fd(fd)?,
        None => KvmContext::open(&config.kvm_device)?,
    };
    let max_vcpus = kvm.max_vcpus().min(usize::from(MAX_VCPUS));
    if usize::from(config.vcpus) > max_vcpus {
        return Err(ConfigError::TooManyVcpus {
            vcpus: config.vcpus,
            max: max_vcpus,
        }
        .into());
    }

    let mem: GuestMemoryMmap = memory::create_guest_memory(config.mem_mib)?;
    let vm = Vm::new(&kvm, &mem)?;

    let mem_bytes = config.mem_mib * MIB;
    let ram_end = arch::low_ram_end(mem_bytes);
    let kernel = kernel.load(&mem, ram_end)?;
    let initrd = match initrd.as_mut() {
        Some(initrd) => {
            let header = match &kernel.protocol {
                BootProtocol::Linux64 { setup_header } => setup_header.as_ref(),
                BootProtocol::BootInfo | BootProtocol::Pvh => None,
            };
            Some(initrd.load(&mem, kernel.end, ram_end, initrd::addr_max(header))?)
        }
        None => None,
    };

    let mut mmio = Bus::new();
    let mut virtio = Vec::with_capacity(devices.len());
    for (index, device) in devices.into_iter().enumerate() {
        let (_, transport) = attach_virtio(&vm, &mem, &mut mmio, index, device, |d, m, i| {
            Ok(MmioTransport::new(d, m, i))
        })?;
        virtio.push(transport);
    }

    arch::configure_system(
        &mem,
        &SystemInfo {
            mem_bytes,
            vcpus: config.vcpus,
            cmdline: guest_cmdline.as_bytes(),
            virtio: &boot_virtio,
            protocol: kernel.protocol,
            initrd,
        },
    )?;

    let latch = Arc::new(StopLatch::new());
    let sink = SerialSink::new(serial_out, config.serial_cap_bytes, started);
    let (pio, serial) = legacy_devices(&vm, SerialDevice::new(IrqTrigger::new()?, sink), &latch)?;

    let vcpus = (0..config.vcpus)
        .map(|id| {
            let vcpu = Vcpu::new(&vm, id)?;
            vcpu.configure(&kvm, config.vcpus)?;
            if id == 0 {
                vcpu.setup_boot_regs(kernel.protocol.boot_entry(kernel.entry.0))?;
            }
            Ok(vcpu)
        })
        .collect::<Result<Vec<_>, VcpuError>>()?;

    Ok(Machine::new(
        kvm,
        vm,
        mem,
        vcpus,
        MachineDevices {
            pio,
            mmio,
            latch,
            serial,
            virtio,
        },
        config.timeout,
        MachineShape {
            mem_mib: config.mem_mib,
            vcpus: config.vcpus,
        },
    ))
}
