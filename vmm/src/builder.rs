//! Building a VM from a [`VmConfig`]: checks first (config, kernel file, KVM),
//! then guest memory, the KVM VM, the kernel and boot structures, the devices
//! and the vCPUs, ready for [`Machine::run`]. Cheap checks come before
//! expensive work so bad input fails fast.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use crate::arch::{self, layout::BOOT_INFO_START, ConfigureSystemError, SystemInfo};
use crate::config::{ConfigError, VmConfig, MAX_VCPUS};
use crate::devices::bus::{Bus, BusError};
use crate::devices::exit::{ExitDevice, EXIT_PORT, EXIT_PORT_LEN};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::serial::{
    IrqTrigger, SerialDevice, SerialError, SerialSink, COM1_GSI, COM1_LEN, COM1_PORT,
};
use crate::loader::{KernelImage, LoaderError};
use crate::machine::Machine;
use crate::stop::StopLatch;
use crate::vstate::kvm::{KvmContext, KvmError};
use crate::vstate::memory::{self, MemoryError, MIB};
use crate::vstate::vcpu::{Vcpu, VcpuError, VcpuIo};
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
}

/// Builds the VM described by `config`, with the guest's serial output going
/// to `serial_out`. The serial sink's clock (first-line time) starts here.
pub fn build(config: &VmConfig, serial_out: Box<dyn Write + Send>) -> Result<Machine, BuildError> {
    let started = Instant::now();
    config.validate()?;
    let mut kernel = KernelImage::open(&config.kernel)?;
    let kvm = KvmContext::open(&config.kvm_device)?;
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
    let kernel = kernel.load(&mem, arch::low_ram_end(mem_bytes))?;
    arch::configure_system(
        &mem,
        &SystemInfo {
            mem_bytes,
            vcpus: config.vcpus,
            cmdline: config.cmdline.as_bytes(),
        },
    )?;

    let latch = Arc::new(StopLatch::new());
    let sink = SerialSink::new(serial_out, config.serial_cap_bytes, started);
    let serial = Arc::new(Mutex::new(SerialDevice::new(IrqTrigger::new()?, sink)));
    {
        // Not contended yet: no vCPU runs.
        let serial = serial
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        vm.register_irqfd(serial.irq().eventfd(), COM1_GSI)?;
    }
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
    // Nothing on the MMIO bus yet: virtio-mmio devices will go here.
    let mmio = Bus::new();

    let vcpus = (0..config.vcpus)
        .map(|id| {
            let vcpu = Vcpu::new(&vm, id)?;
            vcpu.configure(&kvm, config.vcpus)?;
            if id == 0 {
                vcpu.setup_boot_regs(kernel.entry.0, BOOT_INFO_START)?;
            }
            Ok(vcpu)
        })
        .collect::<Result<Vec<_>, VcpuError>>()?;

    Ok(Machine::new(
        kvm,
        vm,
        mem,
        vcpus,
        VcpuIo {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            latch,
        },
        serial,
        config.timeout,
    ))
}
