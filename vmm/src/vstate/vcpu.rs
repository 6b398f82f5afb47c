//! vCPUs: creation and boot configuration, saved state (serialisable, for
//! snapshots), and the run loop each vCPU thread executes. Port and MMIO exits
//! go to the buses; HLT, shutdown and errors stop the VM through the latch.
//!
//! Stopping a vCPU that sits in KVM_RUN (a halted AP, a guest in a loop) takes
//! a signal: the VMM sends [`kick_signal`] to the vCPU thread, whose handler
//! sets `immediate_exit` in that thread's `kvm_run`, so KVM_RUN returns EINTR
//! now or, if the signal lands just before the ioctl, at once on entry. The
//! loop then sees the latch and returns. No stop can be lost between the
//! latch check and the ioctl.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_run, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use serde::{Deserialize, Serialize};
use vmm_sys_util::signal::{register_signal_handler, unblock_signal, SIGRTMIN};

use super::kvm::KvmContext;
use super::pause::RunControl;
use super::vm::Vm;
use crate::arch::{cpuid, interrupts, msr, regs};
use crate::devices::bus::Bus;
use crate::stop::{StopLatch, StopReason};

/// Version of [`VcpuState`]'s layout; bumped on any incompatible change.
pub const VCPU_STATE_VERSION: u32 = 1;

/// KVM_INTERNAL_ERROR_EMULATION: the instruction emulator gave up.
const INTERNAL_ERROR_EMULATION: u32 = 1;

/// vCPU failures. Boot-time ones name the KVM ioctl; run-time ones say where
/// the guest was.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// KVM_CREATE_VCPU failed.
    #[error("KVM_CREATE_VCPU failed for vCPU {id}: {source}")]
    Create {
        /// The vCPU.
        id: u8,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_SET_CPUID2 failed.
    #[error("KVM_SET_CPUID2 failed: {0}")]
    SetCpuid(#[source] kvm_ioctls::Error),
    /// MSRs could not be set or read.
    #[error(transparent)]
    Msr(#[from] msr::MsrError),
    /// The LAPIC could not be set up.
    #[error(transparent)]
    Interrupts(#[from] interrupts::InterruptsError),
    /// The boot registers could not be loaded.
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    /// Reading a part of the vCPU state failed.
    #[error("cannot save vCPU state: {what} failed: {source}")]
    SaveState {
        /// The ioctl.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Writing a part of the vCPU state failed.
    #[error("cannot restore vCPU state: {what} failed: {source}")]
    RestoreState {
        /// The ioctl.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The saved state comes from an incompatible VMM.
    #[error("saved vCPU state has version {found}, this vmm reads version {expected}")]
    StateVersion {
        /// Version in the state.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// The saved CPUID does not fit KVM's limit.
    #[error("saved vCPU state holds {0} CPUID entries, more than KVM accepts")]
    StateCpuid(usize),
    /// The kick signal handler could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    KickSignal(#[source] vmm_sys_util::errno::Error),
    /// KVM_RUN failed.
    #[error("KVM_RUN failed: {0}")]
    Run(#[source] kvm_ioctls::Error),
    /// KVM could not run the guest's code (most often: its instruction
    /// emulator met an instruction it does not handle).
    #[error(
        "KVM could not run the guest at rip {rip:#x} (internal error, suberror {suberror}{hint})"
    )]
    Internal {
        /// KVM's suberror code.
        suberror: u32,
        /// Guest instruction pointer, if it could be read.
        rip: u64,
        /// Advice that depends on the suberror.
        hint: &'static str,
    },
    /// VM entry failed: the register state is invalid for this CPU.
    #[error("VM entry failed (hardware reason {reason:#x}) at rip {rip:#x}")]
    FailEntry {
        /// The hardware's reason code.
        reason: u64,
        /// Guest instruction pointer, if it could be read.
        rip: u64,
    },
    /// KVM_RUN returned an exit the VMM does not handle.
    #[error("unexpected KVM exit {exit} at rip {rip:#x}")]
    UnexpectedExit {
        /// The exit, as text.
        exit: String,
        /// Guest instruction pointer, if it could be read.
        rip: u64,
    },
}

/// A vCPU's architectural state, enough to resume it on another VM with the
/// same memory: the unit of a snapshot's CPU part.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// [`VCPU_STATE_VERSION`] when saved.
    pub version: u32,
    /// The vCPU's id (and APIC ID).
    pub id: u8,
    /// CPUID as set on the vCPU (restored first: KVM checks the rest against it).
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Runnable, halted, waiting for SIPI...
    pub mp_state: kvm_mp_state,
    /// General-purpose registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers.
    pub sregs: kvm_sregs,
    /// FPU/SSE/AVX state (legacy 4 KiB XSAVE area).
    pub xsave: kvm_xsave,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// Debug registers.
    pub debug_regs: kvm_debugregs,
    /// Local APIC registers.
    pub lapic: kvm_lapic_state,
    /// MSRs in `arch::msr::SAVED_MSRS`.
    pub msrs: Vec<kvm_msr_entry>,
    /// Pending exceptions, interrupts, NMIs (restored last: it may inject).
    pub vcpu_events: kvm_vcpu_events,
}

thread_local! {
    // The `kvm_run` of the vCPU this thread runs, for the kick handler. Const
    // initialised and without destructor, so reading it from a signal handler
    // does no lazy initialisation or allocation.
    static KICK_TARGET: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KICK_TARGET.with(Cell::get);
    if !run.is_null() {
        // SAFETY: a non-null KICK_TARGET points at this thread's mapped
        // `kvm_run`: it is set after the vCPU fd (which owns the mapping) is
        // in this thread, and cleared before the fd can be dropped. A
        // volatile byte store is async-signal-safe.
        unsafe { std::ptr::write_volatile(&raw mut (*run).immediate_exit, 1) };
    }
}

/// The real-time signal that kicks vCPU threads out of KVM_RUN.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

/// Installs the kick handler, once per process.
pub fn register_kick_handler() -> Result<(), VcpuError> {
    static INSTALLED: OnceLock<Result<(), vmm_sys_util::errno::Error>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| register_signal_handler(kick_signal(), handle_kick))
        .map_err(VcpuError::KickSignal)
}

/// What a vCPU thread needs besides its vCPU.
#[derive(Clone, Debug)]
pub struct VcpuIo {
    /// Port I/O devices.
    pub pio: Arc<Bus>,
    /// MMIO devices.
    pub mmio: Arc<Bus>,
    /// Where the VM's stop is recorded.
    pub latch: Arc<StopLatch>,
    /// Pause requests (snapshots).
    pub control: Arc<RunControl>,
}

/// What one KVM exit means for the loop.
enum Step {
    Continue,
    Stop(StopReason),
    /// KVM_EXIT_INTERNAL_ERROR: details are read once the exit's borrow of
    /// the vCPU ends.
    Internal,
    FailEntry(u64),
    Unexpected(String),
}

/// One KVM vCPU.
#[derive(Debug)]
pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
}

impl Vcpu {
    /// Creates vCPU `id` on `vm` (after its irqchip).
    pub fn new(vm: &Vm, id: u8) -> Result<Self, VcpuError> {
        let fd = vm
            .fd()
            .create_vcpu(u64::from(id))
            .map_err(|source| VcpuError::Create { id, source })?;
        Ok(Vcpu { id, fd })
    }

    /// The vCPU's id.
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The KVM vCPU fd.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Sets what every vCPU needs before it runs: CPUID, boot MSRs, LAPIC
    /// wiring. Application processors are left waiting for INIT/SIPI.
    pub fn configure(&self, kvm: &KvmContext, vcpu_count: u8) -> Result<(), VcpuError> {
        let cpuid = cpuid::vcpu_cpuid(kvm.supported_cpuid(), self.id, vcpu_count);
        self.fd.set_cpuid2(&cpuid).map_err(VcpuError::SetCpuid)?;
        msr::setup_boot_msrs(&self.fd)?;
        interrupts::set_lint(&self.fd)?;
        Ok(())
    }

    /// Loads the boot state for `boot` into this (the boot) vCPU.
    pub fn setup_boot_regs(&self, boot: regs::BootEntry) -> Result<(), VcpuError> {
        regs::setup_boot_vcpu(&self.fd, boot)?;
        Ok(())
    }

    /// Reads the vCPU's state. The vCPU must not be running.
    pub fn save_state(&self) -> Result<VcpuState, VcpuError> {
        let save = |what| move |source| VcpuError::SaveState { what, source };
        Ok(VcpuState {
            version: VCPU_STATE_VERSION,
            id: self.id,
            cpuid: self
                .fd
                .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                .map_err(save("KVM_GET_CPUID2"))?
                .as_slice()
                .to_vec(),
            mp_state: self.fd.get_mp_state().map_err(save("KVM_GET_MP_STATE"))?,
            regs: self.fd.get_regs().map_err(save("KVM_GET_REGS"))?,
            sregs: self.fd.get_sregs().map_err(save("KVM_GET_SREGS"))?,
            xsave: self.fd.get_xsave().map_err(save("KVM_GET_XSAVE"))?,
            xcrs: self.fd.get_xcrs().map_err(save("KVM_GET_XCRS"))?,
            debug_regs: self
                .fd
                .get_debug_regs()
                .map_err(save("KVM_GET_DEBUGREGS"))?,
            lapic: self.fd.get_lapic().map_err(save("KVM_GET_LAPIC"))?,
            msrs: msr::get_saved_msrs(&self.fd)?,
            vcpu_events: self
                .fd
                .get_vcpu_events()
                .map_err(save("KVM_GET_VCPU_EVENTS"))?,
        })
    }

    /// Loads `state` into this vCPU, in the order KVM needs: CPUID first
    /// (later checks depend on it), events last (they may inject).
    pub fn restore_state(&self, state: &VcpuState) -> Result<(), VcpuError> {
        if state.version != VCPU_STATE_VERSION {
            return Err(VcpuError::StateVersion {
                found: state.version,
                expected: VCPU_STATE_VERSION,
            });
        }
        let restore = |what| move |source| VcpuError::RestoreState { what, source };
        let cpuid = CpuId::from_entries(&state.cpuid)
            .map_err(|_| VcpuError::StateCpuid(state.cpuid.len()))?;
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(restore("KVM_SET_CPUID2"))?;
        self.fd
            .set_mp_state(state.mp_state)
            .map_err(restore("KVM_SET_MP_STATE"))?;
        self.fd
            .set_regs(&state.regs)
            .map_err(restore("KVM_SET_REGS"))?;
        self.fd
            .set_sregs(&state.sregs)
            .map_err(restore("KVM_SET_SREGS"))?;
        // SAFETY: KVM_SET_XSAVE reads more than the 4 KiB `kvm_xsave` only
        // when the process enabled dynamic XSTATE features (AMX) for guests
        // with arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM); this VMM never does, so
        // the kernel reads exactly the struct passed.
        unsafe { self.fd.set_xsave(&state.xsave) }.map_err(restore("KVM_SET_XSAVE"))?;
        // A host CPU without XSAVE saves no XCRs (nr_xcrs 0) and refuses to
        // set any (EINVAL): QEMU's qemu64 model, the nested test host's, is one.
        if state.xcrs.nr_xcrs > 0 {
            self.fd
                .set_xcrs(&state.xcrs)
                .map_err(restore("KVM_SET_XCRS"))?;
        }
        self.fd
            .set_debug_regs(&state.debug_regs)
            .map_err(restore("KVM_SET_DEBUGREGS"))?;
        self.fd
            .set_lapic(&state.lapic)
            .map_err(restore("KVM_SET_LAPIC"))?;
        msr::set_msrs(&self.fd, &state.msrs)?;
        self.fd
            .set_vcpu_events(&state.vcpu_events)
            .map_err(restore("KVM_SET_VCPU_EVENTS"))?;
        Ok(())
    }

    fn rip(&self) -> u64 {
        // Diagnostics only: 0 when the registers cannot be read.
        self.fd.get_regs().map_or(0, |r| r.rip)
    }

    /// Runs the vCPU until the VM stops, recording in `io.latch` why it did if
    /// this vCPU is the cause. Returns the vCPU so its state can be saved.
    /// The caller must have called [`register_kick_handler`].
    pub fn run(mut self, io: &VcpuIo) -> Self {
        // Threads inherit their spawner's signal mask; the kick must get
        // through. Failure only means it already was unblocked.
        let _ = unblock_signal(kick_signal());
        let run: *mut kvm_run = self.fd.get_kvm_run();
        KICK_TARGET.with(|t| t.set(run));
        io.control.register_current(self.id);

        while !io.latch.is_stopped() {
            if io.control.pause_requested() {
                self.complete_pending_io();
                io.control.park(&self);
                continue;
            }
            let step = match self.fd.run() {
                Ok(exit) => handle_exit(self.id, exit, io),
                Err(e) if e.errno() == libc::EINTR => {
                    // A kick (or another signal): clear the request and look
                    // at the latch again.
                    self.fd.set_kvm_immediate_exit(0);
                    Step::Continue
                }
                Err(e) if e.errno() == libc::EAGAIN => Step::Continue,
                Err(e) => Step::Stop(StopReason::VcpuFailed {
                    vcpu: self.id,
                    error: VcpuError::Run(e),
                }),
            };
            let stop = match step {
                Step::Continue => continue,
                Step::Stop(reason) => reason,
                Step::Internal => self.internal_error(),
                Step::FailEntry(reason) => StopReason::VcpuFailed {
                    vcpu: self.id,
                    error: VcpuError::FailEntry {
                        reason,
                        rip: self.rip(),
                    },
                },
                Step::Unexpected(exit) => StopReason::VcpuFailed {
                    vcpu: self.id,
                    error: VcpuError::UnexpectedExit {
                        exit,
                        rip: self.rip(),
                    },
                },
            };
            io.latch.stop(stop);
        }

        io.control.unregister(self.id);
        // The fd, and with it the mapping, may be dropped once this returns.
        KICK_TARGET.with(|t| t.set(std::ptr::null_mut()));
        self
    }

    /// Finishes an exit the VMM has handled but KVM has not yet applied
    /// (the data of a port or MMIO read goes into the guest's registers only
    /// on the next KVM_RUN): KVM_RUN with `immediate_exit` set completes it
    /// and returns without running guest code, so saved state is consistent
    /// (KVM API docs, "immediate_exit").
    fn complete_pending_io(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        // EINTR is the expected answer; anything else shows on the next run.
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    fn internal_error(&mut self) -> StopReason {
        let run = self.fd.get_kvm_run();
        // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, for which KVM
        // fills the `internal` member of the exit union.
        let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
        let hint = if suberror == INTERNAL_ERROR_EMULATION {
            ": emulation failure. On hosts without VMX/SVM (kvm_pvm) every guest \
             instruction is emulated and only PVM-aware or small freestanding guests run"
        } else {
            ""
        };
        StopReason::VcpuFailed {
            vcpu: self.id,
            error: VcpuError::Internal {
                suberror,
                rip: self.rip(),
                hint,
            },
        }
    }
}

fn handle_exit(id: u8, exit: VcpuExit<'_>, io: &VcpuIo) -> Step {
    match exit {
        VcpuExit::IoIn(port, data) => {
            io.pio.read(u64::from(port), data);
            Step::Continue
        }
        VcpuExit::IoOut(port, data) => {
            io.pio.write(u64::from(port), data);
            Step::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            io.mmio.read(addr, data);
            Step::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            io.mmio.write(addr, data);
            Step::Continue
        }
        // With the in-kernel LAPIC KVM handles HLT itself; this exit means a
        // vCPU halted for good.
        VcpuExit::Hlt => Step::Stop(StopReason::Halted { vcpu: id }),
        VcpuExit::Shutdown => Step::Stop(StopReason::TripleFault { vcpu: id }),
        VcpuExit::Intr => Step::Continue,
        VcpuExit::InternalError => Step::Internal,
        VcpuExit::FailEntry(reason, _cpu) => Step::FailEntry(reason),
        other => Step::Unexpected(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use vm_memory::GuestMemoryMmap;

    use super::*;
    use crate::arch::layout::{BOOT_INFO_START, HIMEM_START};
    use crate::arch::msr;
    use crate::vstate::memory::create_guest_memory;

    /// The host's KVM, or `None` (with the reason printed) where there is none.
    fn host_kvm() -> Option<KvmContext> {
        match KvmContext::open(Path::new("/dev/kvm")) {
            Ok(kvm) => Some(kvm),
            Err(e) => {
                sandboxd_test_support::note_skip!(
                    sandboxd_test_support::Reason::NoKvm,
                    "no usable KVM: {e}"
                );
                None
            }
        }
    }

    /// A VM with 4 MiB and one configured vCPU.
    fn vm_with_vcpu(kvm: &KvmContext) -> (Vcpu, Vm, GuestMemoryMmap) {
        let mem = create_guest_memory(4).expect("guest memory");
        let vm = Vm::new(kvm, &mem).expect("VM");
        let vcpu = Vcpu::new(&vm, 0).expect("vCPU");
        vcpu.configure(kvm, 1).expect("configure");
        (vcpu, vm, mem)
    }

    /// The parts of `state` that differ from `other`, by field name, with the
    /// TSC (which moves on its own) left out.
    fn differing_fields(state: &VcpuState, other: &VcpuState) -> Vec<String> {
        let value = |s: &VcpuState| {
            let mut v = serde_json::to_value(s).expect("serialise");
            let msrs: Vec<kvm_msr_entry> = s
                .msrs
                .iter()
                .filter(|e| e.index != msr::TSC)
                .copied()
                .collect();
            v["msrs"] = serde_json::to_value(msrs).expect("serialise");
            v
        };
        let (a, b) = (value(state), value(other));
        let fields = a.as_object().expect("a struct serialises to an object");
        fields
            .keys()
            .filter(|k| a[k.as_str()] != b[k.as_str()])
            .cloned()
            .collect()
    }

    #[test]
    fn state_round_trips_through_serde_on_kvm() {
        let Some(kvm) = host_kvm() else { return };
        let (vcpu, _vm, _mem) = vm_with_vcpu(&kvm);
        vcpu.setup_boot_regs(regs::BootEntry::LongMode {
            entry: HIMEM_START,
            params: BOOT_INFO_START,
        })
        .expect("boot regs");
        let mut regs = vcpu.fd().get_regs().expect("regs");
        regs.rax = 0x1234_5678_9abc_def0;
        regs.r15 = 42;
        vcpu.fd().set_regs(&regs).expect("set regs");

        let saved = vcpu.save_state().expect("save");
        let json = serde_json::to_string(&saved).expect("serialise");
        let loaded: VcpuState = serde_json::from_str(&json).expect("deserialise");

        let (fresh, _vm2, _mem2) = vm_with_vcpu(&kvm);
        fresh.restore_state(&loaded).expect("restore");
        let again = fresh.save_state().expect("save again");
        assert_eq!(again.regs.rax, 0x1234_5678_9abc_def0);
        assert_eq!(again.regs.rip, HIMEM_START);
        assert_eq!(again.sregs.efer & (1 << 10), 1 << 10, "still in long mode");
        assert_eq!(differing_fields(&again, &saved), Vec::<String>::new());
    }

    #[test]
    fn state_of_another_version_is_refused() {
        let Some(kvm) = host_kvm() else { return };
        let (vcpu, _vm, _mem) = vm_with_vcpu(&kvm);
        let mut state = vcpu.save_state().expect("save");
        state.version = VCPU_STATE_VERSION + 1;
        assert!(matches!(
            vcpu.restore_state(&state),
            Err(VcpuError::StateVersion { .. })
        ));
    }
}
