//! The vmm's seccomp filter: an allow-list of the system calls the VMM makes
//! once the VM is built (vCPU threads in KVM_RUN, device worker threads
//! started at DRIVER_OK, the vsock Unix sockets, disk I/O, the allocator,
//! teardown). It is installed on every thread (TSYNC) by
//! [`crate::Machine::run_with`]'s hook in the binary, after the VM is built
//! and before any guest instruction runs, so a guest that takes over the VMM
//! through a device bug cannot open files, exec, or issue KVM ioctls that
//! reconfigure the VM.
//!
//! Anything outside the list kills the whole process
//! (SECCOMP_RET_KILL_PROCESS: the parent sees SIGSYS, and the kernel's audit
//! log has a `type=1326` line naming the syscall number). To find a missing
//! syscall, run with `--seccomp log`: the same list, but a syscall outside it
//! is allowed and logged (SECCOMP_RET_LOG, e.g. `dmesg | grep type=1326`).
//!
//! Arguments are checked where the allowed set is small: ioctl request
//! numbers, fcntl commands, prctl options, the socket family and clone
//! flags. `clone3` (whose flags live in memory a filter cannot read) is
//! answered ENOSYS by a second filter, which makes glibc fall back to
//! `clone`, where CLONE_THREAD is required: threads may be made, processes
//! not.

use std::collections::BTreeMap;
use std::str::FromStr;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What happens to a syscall outside the allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// The process is killed (the default).
    Kill,
    /// The syscall runs and the kernel logs it: for finding what the list
    /// lacks, never for production.
    Log,
    /// No filter (debugging only).
    Off,
}

impl FromStr for SeccompMode {
    type Err = SeccompError;

    fn from_str(s: &str) -> Result<Self, SeccompError> {
        match s {
            "kill" => Ok(SeccompMode::Kill),
            "log" => Ok(SeccompMode::Log),
            "off" => Ok(SeccompMode::Off),
            _ => Err(SeccompError::Mode(s.to_owned())),
        }
    }
}

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// An unknown `--seccomp` value.
    #[error("unknown seccomp mode {0:?}: use kill, log or off")]
    Mode(String),
    /// The filter did not compile (a bug in the rules below).
    #[error("the seccomp filter does not compile ({0}); this is a vmm bug")]
    Compile(#[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error(
        "cannot install the seccomp filter: {0}; the host kernel needs seccomp filter \
         support (CONFIG_SECCOMP_FILTER), or run with --no-seccomp to debug"
    )]
    Install(#[source] seccompiler::Error),
}

// ioctl request numbers (Linux's _IOC encoding): direction << 30 | size << 16
// | type << 8 | nr.
const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (ty << 8) | nr
}
const KVMIO: u64 = 0xae;
/// KVM_RUN = _IO(KVMIO, 0x80): the vCPU loop.
const KVM_RUN: u64 = ioc(0, KVMIO, 0x80, 0);
/// KVM_GET_REGS = _IOR(KVMIO, 0x81, struct kvm_regs): the guest RIP in an
/// emulation-failure report.
const KVM_GET_REGS: u64 = ioc(
    2,
    KVMIO,
    0x81,
    std::mem::size_of::<kvm_bindings::kvm_regs>() as u64,
);

/// `_IOR`/`_IOWR` of KVMIO with `T`'s size: the state ioctls a snapshot
/// makes (`snapshot DIR` on the control socket, after the filter is in).
const fn kvm_ior<T>(nr: u64) -> u64 {
    ioc(2, KVMIO, nr, std::mem::size_of::<T>() as u64)
}
const fn kvm_iowr<T>(nr: u64) -> u64 {
    ioc(3, KVMIO, nr, std::mem::size_of::<T>() as u64)
}
/// Everything `VcpuState::save` and `VmState::save` read.
const SNAPSHOT_IOCTLS: [u64; 12] = [
    kvm_ior::<kvm_bindings::kvm_sregs>(0x83),
    kvm_iowr::<kvm_bindings::kvm_msrs>(0x88),
    kvm_ior::<kvm_bindings::kvm_lapic_state>(0x8e),
    kvm_iowr::<kvm_bindings::kvm_cpuid2>(0x91),
    kvm_ior::<kvm_bindings::kvm_mp_state>(0x98),
    kvm_ior::<kvm_bindings::kvm_vcpu_events>(0x9f),
    kvm_ior::<kvm_bindings::kvm_debugregs>(0xa1),
    kvm_ior::<kvm_bindings::kvm_xsave>(0xa4),
    kvm_ior::<kvm_bindings::kvm_xcrs>(0xa6),
    kvm_iowr::<kvm_bindings::kvm_irqchip>(0x62),
    kvm_ior::<kvm_bindings::kvm_pit_state2>(0x9f),
    kvm_ior::<kvm_bindings::kvm_clock_data>(0x7c),
];

/// glibc's internal real-time signals (below SIGRTMIN as glibc reports it).
const GLIBC_SIGCANCEL: u64 = 32;
const GLIBC_SIGSETXID: u64 = 33;

/// Syscalls allowed with any arguments.
const ALLOWED: &[libc::c_long] = &[
    // Serial output, eventfds, sockets, disks.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_fdatasync,
    libc::SYS_fsync,
    libc::SYS_close,
    // Device workers.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    // vsock: host connections in, guest connections out (socket is below).
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    // The vsock socket is removed when the VM stops.
    libc::SYS_unlink,
    // Snapshots: the memory and state files in the snapshot directory
    // (checked empty), /proc/self/pagemap for the touched pages, SEEK_DATA.
    // The file system the VMM can reach is bounded by its jail, not here.
    libc::SYS_openat,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_getdents64,
    libc::SYS_lseek,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlinkat,
    // Threads: locks, the kick signal, thread start and exit.
    libc::SYS_futex,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Allowed here only so that this filter's verdict (ALLOW) yields to the
    // other filter's ENOSYS: the kernel applies the strictest verdict of
    // all filters, and KILL would beat ERRNO.
    libc::SYS_clone3,
    // The allocator and thread stacks.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_brk,
    // Time (normally the vDSO's), timeouts, HashMap seeds of new threads.
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_getrandom,
];

fn arg_is(index: u8, value: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}

/// The allow-list as seccompiler rules: syscall number -> rules, any of
/// which allows it (no rules: always allowed).
fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    rules.insert(
        libc::SYS_ioctl,
        vec![
            arg_is(1, KVM_RUN),
            arg_is(1, KVM_GET_REGS),
            // std's set_nonblocking (vsock connections).
            arg_is(1, libc::FIONBIO),
        ]
        .into_iter()
        .chain(SNAPSHOT_IOCTLS.iter().map(|&nr| arg_is(1, nr)))
        .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_fcntl,
        [
            libc::F_GETFD,
            libc::F_SETFD,
            libc::F_GETFL,
            libc::F_SETFL,
            libc::F_DUPFD_CLOEXEC,
        ]
        .into_iter()
        .map(|cmd| arg_is(1, cmd as u64))
        .collect::<Result<_, _>>()?,
    );
    // glibc installs the handler of its internal signal SIGSETXID (33;
    // SIGCANCEL is 32) at the process's first pthread_create, which in the
    // vmm is the first vCPU thread, started under the filter.
    rules.insert(
        libc::SYS_rt_sigaction,
        vec![arg_is(0, GLIBC_SIGCANCEL)?, arg_is(0, GLIBC_SIGSETXID)?],
    );
    // Thread names.
    rules.insert(libc::SYS_prctl, vec![arg_is(0, libc::PR_SET_NAME as u64)?]);
    // Guest connections to `<uds>_<port>` are Unix sockets.
    rules.insert(libc::SYS_socket, vec![arg_is(0, libc::AF_UNIX as u64)?]);
    // Threads (CLONE_THREAD set), never new processes.
    let thread = libc::CLONE_THREAD as u64;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(thread),
            thread,
        )?])?],
    );
    Ok(rules)
}

/// The BPF programs for `mode`, in the order they must be installed: first
/// the one that answers clone3 with ENOSYS, then the allow-list (which does
/// not allow `seccomp` itself, so nothing can be installed after it). Empty
/// for [`SeccompMode::Off`].
pub fn filters(mode: SeccompMode) -> Result<Vec<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Off => return Ok(Vec::new()),
    };
    let arch = TargetArch::x86_64;
    let compile = |filter: Result<SeccompFilter, _>| {
        filter
            .and_then(BpfProgram::try_from)
            .map_err(SeccompError::Compile)
    };
    let allow =
        compile(rules().and_then(|r| SeccompFilter::new(r, mismatch, SeccompAction::Allow, arch)))?;
    let no_clone3 = compile(SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    ))?;
    Ok(vec![no_clone3, allow])
}

/// Installs `programs` (from [`filters`]) on every thread of the process.
/// Does not allocate, so a forked child may call it.
pub fn apply(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for program in programs {
        seccompiler::apply_filter_all_threads(program).map_err(SeccompError::Install)?;
    }
    Ok(())
}

/// Builds and installs the filter for `mode` on every thread.
pub fn install(mode: SeccompMode) -> Result<(), SeccompError> {
    apply(&filters(mode)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_ones_say_what_to_use() {
        assert_eq!("kill".parse::<SeccompMode>().ok(), Some(SeccompMode::Kill));
        assert_eq!("log".parse::<SeccompMode>().ok(), Some(SeccompMode::Log));
        assert_eq!("off".parse::<SeccompMode>().ok(), Some(SeccompMode::Off));
        let err = "strict".parse::<SeccompMode>().unwrap_err();
        assert!(err.to_string().contains("kill, log or off"), "{err}");
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // From <linux/kvm.h> as compiled: KVM_RUN 0xae80, KVM_GET_REGS
        // 0x8090ae81 (struct kvm_regs is 144 bytes).
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_GET_REGS, 0x8090_ae81);
    }

    #[test]
    fn filters_compile_for_each_mode() {
        assert_eq!(filters(SeccompMode::Kill).expect("kill").len(), 2);
        assert_eq!(filters(SeccompMode::Log).expect("log").len(), 2);
        assert!(filters(SeccompMode::Off).expect("off").is_empty());
    }

    /// Runs `body` in a forked child under the `mode` filter; returns the
    /// child's wait status. The programs are built before the fork, so the
    /// child only makes system calls (no allocation in a copy of a
    /// multi-threaded process).
    fn in_filtered_child(mode: SeccompMode, body: fn() -> i32) -> libc::c_int {
        let programs = filters(mode).expect("filters");
        // SAFETY: the child calls only `apply` (prctl + seccomp, no
        // allocation), `body` (raw syscalls) and `_exit`, all safe after a
        // fork of a multi-threaded process.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = if apply(&programs).is_ok() {
                body()
            } else {
                100
            };
            // SAFETY: ends the child without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
        status
    }

    fn forbidden_syscall() -> i32 {
        // SAFETY: getppid has no arguments and no side effects; it is simply
        // not on the allow-list.
        unsafe { libc::syscall(libc::SYS_getppid) };
        0
    }

    fn allowed_syscalls() -> i32 {
        // SAFETY: raw syscalls with valid arguments: a one-byte write to fd
        // -1 (fails with EBADF, but the filter allows it), an eventfd that is
        // closed again, gettid.
        unsafe {
            libc::syscall(libc::SYS_write, -1, b"x".as_ptr(), 1usize);
            let fd = libc::syscall(libc::SYS_eventfd2, 0, 0);
            if fd < 0 {
                return 3;
            }
            libc::syscall(libc::SYS_close, fd);
            libc::syscall(libc::SYS_gettid);
        }
        0
    }

    fn clone3_is_refused() -> i32 {
        // SAFETY: clone3 with a null argument would fail with EFAULT if it
        // ran; the filter answers ENOSYS before the kernel looks at it.
        let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if rc == -1 && errno == Some(libc::ENOSYS) {
            0
        } else {
            4
        }
    }

    #[test]
    fn a_forbidden_syscall_kills_the_process() {
        let status = in_filtered_child(SeccompMode::Kill, forbidden_syscall);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "expected death by SIGSYS, got wait status {status:#x}"
        );
    }

    #[test]
    fn allowed_syscalls_run_under_the_filter() {
        let status = in_filtered_child(SeccompMode::Kill, allowed_syscalls);
        assert!(libc::WIFEXITED(status), "wait status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }

    #[test]
    fn clone3_gets_enosys_so_glibc_falls_back_to_clone() {
        let status = in_filtered_child(SeccompMode::Kill, clone3_is_refused);
        assert!(libc::WIFEXITED(status), "wait status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }

    #[test]
    fn log_mode_lets_a_forbidden_syscall_through() {
        let status = in_filtered_child(SeccompMode::Log, forbidden_syscall);
        assert!(libc::WIFEXITED(status), "wait status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
