//! A built VM and how it runs: one thread per vCPU, the calling thread waiting
//! for the first stop reason (or the timeout), then kicking every vCPU out of
//! KVM_RUN and joining them, so no thread or KVM fd outlives [`Machine::run`].

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::signal::Killable;

use crate::devices::serial::{SerialDevice, SerialReport};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::persist::VirtioMmioState;
use crate::handle::MachineHandle;
use crate::stop::{StopLatch, StopReason};
use crate::vstate::kvm::KvmContext;
use crate::vstate::vcpu::{self, Vcpu, VcpuError, VcpuIo};
use crate::vstate::vm::Vm;

/// How the guest ended, when it ended on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestExit {
    /// It wrote this code to the exit port.
    Code(u8),
    /// It asked for a reset (i8042), which for a microVM means it is done.
    Reset,
    /// A vCPU triple-faulted.
    TripleFault {
        /// The vCPU.
        vcpu: u8,
    },
    /// A vCPU halted for good.
    Halted {
        /// The vCPU.
        vcpu: u8,
    },
}

/// Why a run did not end with the guest's own exit.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The kick handler could not be installed.
    #[error(transparent)]
    KickHandler(VcpuError),
    /// The hook given to [`Machine::run_with`] failed; no vCPU ran.
    #[error("{0}")]
    BeforeVcpus(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A vCPU thread could not be started.
    #[error("cannot start the thread for vCPU {vcpu}: {source}")]
    Spawn {
        /// The vCPU.
        vcpu: u8,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A vCPU failed.
    #[error("vCPU {vcpu} failed: {source}")]
    VcpuFailed {
        /// The vCPU.
        vcpu: u8,
        /// What went wrong.
        #[source]
        source: VcpuError,
    },
    /// A vCPU thread panicked (a VMM bug).
    #[error("the thread of vCPU {vcpu} panicked; this is a vmm bug")]
    VcpuPanicked {
        /// The vCPU.
        vcpu: u8,
    },
    /// The guest did not finish in time.
    #[error(
        "the guest did not finish within {0:?} (the boot vCPU was at rip {1:#x}); it may be \
         stuck (on kvm_pvm hosts every instruction of a guest that is not PVM-aware is \
         emulated, so it also runs slowly)"
    )]
    TimedOut(Duration, u64),
    /// Its owner ended the run ([`crate::MachineHandle::stop`]) before the
    /// guest finished.
    #[error("the VM was stopped by its owner before the guest finished")]
    Stopped,
}

/// What a finished run reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// How the guest ended.
    pub exit: GuestExit,
    /// What became of its serial output.
    pub serial: SerialReport,
    /// Port accesses no device claimed.
    pub unhandled_pio: u64,
    /// MMIO accesses no device claimed (e.g. beyond guest RAM).
    pub unhandled_mmio: u64,
    /// virtio QueueNotify writes that exited to the VMM (0 when KVM's
    /// ioeventfds caught them all).
    pub virtio_notify_exits: u64,
    /// Each virtio device's state when the VM stopped (vCPUs joined, so
    /// the guest no longer changes it), in boot-info order.
    pub virtio: Vec<VirtioMmioState>,
}

/// Stops the VM if the vCPU thread holding it unwinds, so the run does not
/// wait for a vCPU that is gone.
struct StopOnPanic<'a> {
    latch: &'a StopLatch,
    vcpu: u8,
}

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.latch.stop(StopReason::Panicked { vcpu: self.vcpu });
        }
    }
}

/// The devices a [`Machine`] keeps handles to (they also sit on its buses).
pub(crate) struct MachineDevices {
    /// Port I/O devices.
    pub pio: crate::devices::bus::Bus,
    /// MMIO devices.
    pub mmio: crate::devices::bus::Bus,
    /// Where the VM's stop is recorded (the exit port and i8042 hold it too).
    pub latch: Arc<StopLatch>,
    /// The serial console, for its report.
    pub serial: Arc<Mutex<SerialDevice>>,
    /// The virtio-mmio transports, for their state.
    pub virtio: Vec<Arc<Mutex<MmioTransport>>>,
}

/// What a [`Machine`] was configured as (recorded in snapshots).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MachineShape {
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// vCPU count.
    pub vcpus: u8,
}

/// A VM ready to run.
#[derive(Debug)]
pub struct Machine {
    // Field order is drop order: vCPUs, then the VM, then the memory its
    // slots point into, then the KVM handle.
    vcpus: Vec<Vcpu>,
    // Shared with handles, which save its irqchip state; a handle that
    // outlives the run keeps the VM (and its memory) until it is dropped.
    vm: Arc<Vm>,
    mem: GuestMemoryMmap,
    kvm: KvmContext,
    io: VcpuIo,
    serial: Arc<Mutex<SerialDevice>>,
    virtio: Vec<Arc<Mutex<MmioTransport>>>,
    timeout: Option<Duration>,
    shape: MachineShape,
    devices_paused: Arc<Mutex<bool>>,
}

impl Machine {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kvm: KvmContext,
        vm: Vm,
        mem: GuestMemoryMmap,
        vcpus: Vec<Vcpu>,
        devices: MachineDevices,
        timeout: Option<Duration>,
        shape: MachineShape,
    ) -> Self {
        let MachineDevices {
            pio,
            mmio,
            latch,
            serial,
            virtio,
        } = devices;
        let io = VcpuIo {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            latch,
            control: Arc::new(crate::vstate::pause::RunControl::new(usize::from(
                shape.vcpus,
            ))),
        };
        Machine {
            vcpus,
            vm: Arc::new(vm),
            mem,
            kvm,
            io,
            serial,
            virtio,
            timeout,
            shape,
            devices_paused: Arc::new(Mutex::new(false)),
        }
    }

    /// A handle to pause, resume or snapshot this machine while it runs
    /// (take it before [`run`](Self::run), which consumes the machine).
    pub fn handle(&self) -> MachineHandle {
        MachineHandle {
            control: self.io.control.clone(),
            vm: self.vm.clone(),
            mem: self.mem.clone(),
            serial: self.serial.clone(),
            virtio: self.virtio.clone(),
            mem_mib: self.shape.mem_mib,
            vcpus: self.shape.vcpus,
            op: self.devices_paused.clone(),
            latch: self.io.latch.clone(),
        }
    }

    /// The vCPUs, before they run.
    pub fn vcpus(&self) -> &[Vcpu] {
        &self.vcpus
    }

    /// Guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The KVM VM.
    pub fn vm(&self) -> &Vm {
        &self.vm
    }

    /// The KVM handle the VM was made with.
    pub fn kvm(&self) -> &KvmContext {
        &self.kvm
    }

    /// Runs the VM until the guest exits, a vCPU fails, or the timeout.
    pub fn run(self) -> Result<RunReport, RunError> {
        self.run_with(|| Ok::<(), std::convert::Infallible>(()), || {})
    }

    /// [`Machine::run`] with two hooks on this thread: `before_vcpus` once
    /// the VM is complete and the kick handler installed, just before the
    /// vCPU threads start (the binary installs its seccomp filter there,
    /// after the last setup-only system call and before any guest
    /// instruction; if it fails, no vCPU runs and the error is returned),
    /// and `started` once every vCPU thread runs (readiness, restore timing).
    pub fn run_with<E>(
        mut self,
        before_vcpus: impl FnOnce() -> Result<(), E>,
        started: impl FnOnce(),
    ) -> Result<RunReport, RunError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        vcpu::register_kick_handler().map_err(RunError::KickHandler)?;
        before_vcpus().map_err(|e| RunError::BeforeVcpus(Box::new(e)))?;

        let mut handles: Vec<(u8, JoinHandle<Vcpu>)> = Vec::with_capacity(self.vcpus.len());
        let mut spawn_error = None;
        for vcpu in self.vcpus.drain(..) {
            let id = vcpu.id();
            let io = self.io.clone();
            match thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || {
                    let _guard = StopOnPanic {
                        latch: &io.latch,
                        vcpu: id,
                    };
                    vcpu.run(&io)
                }) {
                Ok(handle) => handles.push((id, handle)),
                Err(source) => {
                    spawn_error = Some(RunError::Spawn { vcpu: id, source });
                    self.io.latch.stop(StopReason::Aborted);
                    break;
                }
            }
        }

        if spawn_error.is_none() {
            started();
        }
        if !self.io.latch.wait(self.timeout) {
            self.io.latch.stop(StopReason::TimedOut);
        }
        // Parked vCPUs (a paused VM) leave their park; pauses now fail.
        self.io.control.finish();
        for (_, handle) in &handles {
            // Fails only if the thread has already ended, which is fine.
            let _ = handle.kill(vcpu::kick_signal());
        }
        let mut panicked = None;
        // Where the boot vCPU stopped: for the timeout message, since a
        // guest that hangs before its first serial line says nothing else.
        let mut boot_rip = 0;
        for (id, handle) in handles {
            match handle.join() {
                Ok(vcpu) if id == 0 => boot_rip = vcpu.fd().get_regs().map_or(0, |r| r.rip),
                Ok(_) => {}
                Err(_) => {
                    panicked.get_or_insert(id);
                }
            }
        }

        if let Some(err) = spawn_error {
            return Err(err);
        }
        let reason = self.io.latch.take_reason();
        let exit = match reason {
            Some(StopReason::GuestExit(code)) => GuestExit::Code(code),
            Some(StopReason::Reset) => GuestExit::Reset,
            Some(StopReason::TripleFault { vcpu }) => GuestExit::TripleFault { vcpu },
            Some(StopReason::Halted { vcpu }) => GuestExit::Halted { vcpu },
            Some(StopReason::VcpuFailed { vcpu, error }) => {
                return Err(RunError::VcpuFailed {
                    vcpu,
                    source: error,
                })
            }
            Some(StopReason::Panicked { vcpu }) => return Err(RunError::VcpuPanicked { vcpu }),
            Some(StopReason::Requested) => return Err(RunError::Stopped),
            Some(StopReason::TimedOut) => {
                return Err(RunError::TimedOut(
                    self.timeout.unwrap_or_default(),
                    boot_rip,
                ))
            }
            // `Aborted` comes only with `spawn_error`, returned above; a
            // latch that was waited on always holds a reason.
            Some(StopReason::Aborted) | None => {
                return Err(RunError::VcpuPanicked {
                    vcpu: panicked.unwrap_or(0),
                })
            }
        };
        if let Some(vcpu) = panicked {
            return Err(RunError::VcpuPanicked { vcpu });
        }
        let serial = self
            .serial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .report();
        Ok(RunReport {
            exit,
            serial,
            unhandled_pio: self.io.pio.unhandled_accesses(),
            unhandled_mmio: self.io.mmio.unhandled_accesses(),
            virtio_notify_exits: self
                .virtio
                .iter()
                .map(|t| {
                    t.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .notify_exits()
                })
                .sum(),
            virtio: self
                .virtio
                .iter()
                .map(|t| t.lock().unwrap_or_else(PoisonError::into_inner).snapshot())
                .collect(),
        })
    }
}
