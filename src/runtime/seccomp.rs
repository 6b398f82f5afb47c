//! The seccomp profile of a container sandbox: which system calls untrusted code may
//! not make, on which architectures, and with which error it is told so.
//!
//! The profile allows by default and denies an explicit list, rather than Docker's
//! allow-list, so that new but harmless system calls keep working in arbitrary
//! images. What it refuses is what a root user inside a user namespace could use to
//! widen the kernel attack surface or to reach beyond the sandbox: new namespaces
//! (above all new user namespaces, which would hand back every capability), the
//! mount API, keyrings, bpf, io_uring, module loading, clocks, kexec, vsock, and
//! the other usual suspects.
//!
//! Encoding notes that the rules below depend on (libcontainer 0.7's, which
//! [`super::seccomp_filter`] compiles alike; checked in its source and by the kernel
//! test at the bottom of this file, which loads the filter the sandboxes get):
//! - Several argument conditions on one rule that name the same argument are split
//!   by libcontainer into separate rules (OR). Every rule here therefore carries a
//!   single condition, so its meaning does not depend on that split.
//! - For `SCMP_CMP_MASKED_EQ` libcontainer takes the mask from `valueTwo` and the
//!   expected value from `value` (runc reads them the other way round). Flag rules
//!   use mask == value, which reads the same either way; only the personality rules
//!   need the order, and the kernel test fails if it ever flips.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

/// Failure to assemble the profile. The profile is a constant, so this only
/// happens if oci-spec's builders change behaviour.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error(
        "internal error while assembling the sandbox seccomp profile: {0}; \
         this is a bug in sandboxd, please report it"
    )]
    Build(#[from] oci_spec::OciSpecError),
}

/// System calls refused outright with EPERM, on every architecture of the filter.
/// Names unknown to an architecture are skipped by libseccomp for that
/// architecture (e.g. `vm86` only exists on x86).
pub const DENIED_SYSCALLS: &[&str] = &[
    // Namespaces: joining one is never needed inside a sandbox. Creating them is
    // handled by the flag rules on clone/unshare below.
    "setns",
    // Kernel keyrings are not namespaced.
    "keyctl",
    "add_key",
    "request_key",
    // Kernel code paths that a sandbox has no business reaching.
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    // Modules and kexec.
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "kexec_load",
    "kexec_file_load",
    // Mounts, old and new API. The sandbox has no CAP_SYS_ADMIN, so these only
    // fail later and deeper without this list.
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    // open_tree_attr (6.15) is left out: libseccomp 2.5 cannot resolve the name,
    // so libcontainer would log a warning into every sandbox's stderr; without
    // CAP_SYS_ADMIN it cannot clone mounts anyway.
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    // Host-wide state.
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "_sysctl",
    "sysfs",
    "ustat",
    // Clocks are not namespaced (time namespaces only offset monotonic/boottime).
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    // Raw hardware access and legacy x86 modes.
    "ioperm",
    "iopl",
    "vm86",
    "vm86old",
    "uselib",
];

/// `CLONE_NEW*` flags refused in `clone`'s flags (argument 0 on x86, x86_64, x32).
/// `CLONE_NEWTIME` is absent on purpose: in `clone` its bit is part of the exit
/// signal, and the kernel only accepts it from `unshare` and `clone3`.
const CLONE_NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Personalities a process may switch to, as Docker allows: PER_LINUX,
/// PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the 0xffffffff query.
pub const ALLOWED_PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Address family refused to `socket`: vsock is not network-namespaced, so it
/// would reach the hypervisor or host services of a VM host.
const AF_VSOCK: u64 = libc::AF_VSOCK as u64;

/// The seccomp profile every container sandbox runs under.
pub fn sandbox_seccomp() -> Result<LinuxSeccomp, SeccompError> {
    let eperm = libc::EPERM as u32;
    let mut syscalls: Vec<LinuxSyscall> = Vec::new();

    syscalls.push(deny(DENIED_SYSCALLS, eperm, None)?);

    // ENOSYS, not EPERM: glibc and others fall back to clone(2) only on ENOSYS,
    // and clone's flags, unlike clone3's (behind a pointer), can be filtered.
    syscalls.push(deny(&["clone3"], libc::ENOSYS as u32, None)?);

    for &flag in CLONE_NAMESPACE_FLAGS {
        syscalls.push(deny(&["clone"], eperm, Some(all_bits_set(0, flag)?))?);
        syscalls.push(deny(&["unshare"], eperm, Some(all_bits_set(0, flag)?))?);
    }
    syscalls.push(deny(
        &["unshare"],
        eperm,
        Some(all_bits_set(0, libc::CLONE_NEWTIME as u64)?),
    )?);

    for cond in personality_deny_conditions()? {
        syscalls.push(deny(&["personality"], eperm, Some(cond))?);
    }

    syscalls.push(deny(
        &["socket"],
        eperm,
        Some(
            LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(AF_VSOCK)
                .op(LinuxSeccompOperator::ScmpCmpEq)
                .build()?,
        ),
    )?);

    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
        ])
        .syscalls(syscalls)
        .build()?)
}

fn deny(
    names: &[&str],
    errno: u32,
    cond: Option<LinuxSeccompArg>,
) -> Result<LinuxSyscall, SeccompError> {
    let builder = LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno);
    let builder = match cond {
        Some(c) => builder.args(vec![c]),
        None => builder,
    };
    Ok(builder.build()?)
}

/// `(arg & bits) == bits`. Written with value == valueTwo so that it means the
/// same whichever of the two a runtime takes as the mask.
fn all_bits_set(index: usize, bits: u64) -> Result<LinuxSeccompArg, SeccompError> {
    Ok(LinuxSeccompArgBuilder::default()
        .index(index)
        .value(bits)
        .value_two(bits)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .build()?)
}

/// `(arg & mask) == expected`, in libcontainer 0.7's encoding (mask in valueTwo).
fn masked_equal(index: usize, mask: u64, expected: u64) -> Result<LinuxSeccompArg, SeccompError> {
    Ok(LinuxSeccompArgBuilder::default()
        .index(index)
        .value(expected)
        .value_two(mask)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .build()?)
}

/// Conditions on personality's argument, any one of which denies the call; together
/// they match exactly the values outside [`ALLOWED_PERSONALITIES`].
///
/// Docker allows a fixed set with a default-deny profile. Under default-allow the
/// complement has to be spelled out, and a rule can only OR single comparisons
/// (see the module notes). So:
/// - anything above 32 bits (the kernel truncates to `unsigned int`, so such a
///   value would otherwise smuggle in a persona);
/// - within 32 bits, a value is allowed iff it is 0xffffffff or has no bit set
///   outside bits 3 and 17. Take the 30 other bits in a cycle; a value with some
///   but not all of them set has, somewhere on the cycle, a set bit followed by a
///   clear bit, and one "bit k set, bit k+1 clear" test per position catches it.
///   A value with all 30 set is allowed only if bits 3 and 17 are set too, which
///   two more tests check. A value with none of them set is one of the four
///   allowed personas.
fn personality_deny_conditions() -> Result<Vec<LinuxSeccompArg>, SeccompError> {
    const FREE_BITS: u64 = (1 << 3) | (1 << 17);
    let others: Vec<u64> = (0..32u32)
        .map(|b| 1u64 << b)
        .filter(|bit| bit & FREE_BITS == 0)
        .collect();

    let mut conds = vec![LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(u64::from(u32::MAX))
        .op(LinuxSeccompOperator::ScmpCmpGt)
        .build()?];
    for (i, &bit) in others.iter().enumerate() {
        let next = others[(i + 1) % others.len()];
        conds.push(masked_equal(0, bit | next, bit)?);
    }
    let first = others[0];
    conds.push(masked_equal(0, first | (1 << 3), first)?);
    conds.push(masked_equal(0, first | (1 << 17), first)?);
    Ok(conds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What libcontainer 0.7 makes of one condition (mask from valueTwo).
    fn cond_matches(c: &LinuxSeccompArg, args: &[u64; 6]) -> bool {
        let a = args[c.index()];
        match c.op() {
            LinuxSeccompOperator::ScmpCmpNe => a != c.value(),
            LinuxSeccompOperator::ScmpCmpLt => a < c.value(),
            LinuxSeccompOperator::ScmpCmpLe => a <= c.value(),
            LinuxSeccompOperator::ScmpCmpEq => a == c.value(),
            LinuxSeccompOperator::ScmpCmpGe => a >= c.value(),
            LinuxSeccompOperator::ScmpCmpGt => a > c.value(),
            LinuxSeccompOperator::ScmpCmpMaskedEq => a & c.value_two().unwrap_or(0) == c.value(),
        }
    }

    /// The errno the profile returns for `name(args)`, or None if it is allowed.
    fn verdict(p: &LinuxSeccomp, name: &str, args: [u64; 6]) -> Option<u32> {
        p.syscalls().iter().flatten().find_map(|s| {
            let named = s.names().iter().any(|n| n == name);
            let hit = match s.args() {
                None => true,
                Some(conds) => conds.iter().any(|c| cond_matches(c, &args)),
            };
            (named && hit && s.action() == LinuxSeccompAction::ScmpActErrno)
                .then(|| s.errno_ret().unwrap_or(libc::EPERM as u32))
        })
    }

    fn profile() -> LinuxSeccomp {
        match sandbox_seccomp() {
            Ok(p) => p,
            Err(e) => panic!("profile: {e}"),
        }
    }

    const EPERM: Option<u32> = Some(libc::EPERM as u32);

    #[test]
    fn default_allows_and_covers_x86_abis() {
        let p = profile();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        let arches: Vec<Arch> = p.architectures().iter().flatten().copied().collect();
        assert!(arches.contains(&Arch::ScmpArchX86_64));
        assert!(arches.contains(&Arch::ScmpArchX86));
        assert!(arches.contains(&Arch::ScmpArchX32));
        assert_eq!(verdict(&p, "read", [0; 6]), None);
        assert_eq!(verdict(&p, "ptrace", [0; 6]), None);
    }

    #[test]
    fn new_namespaces_are_refused() {
        let p = profile();
        let newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(verdict(&p, "unshare", [newuser, 0, 0, 0, 0, 0]), EPERM);
        let fork_like = libc::SIGCHLD as u64 | libc::CLONE_NEWUSER as u64;
        assert_eq!(verdict(&p, "clone", [fork_like, 0, 0, 0, 0, 0]), EPERM);
        let combo = (libc::CLONE_NEWNS | libc::CLONE_NEWPID) as u64;
        assert_eq!(verdict(&p, "unshare", [combo, 0, 0, 0, 0, 0]), EPERM);
        let newtime = libc::CLONE_NEWTIME as u64;
        assert_eq!(verdict(&p, "unshare", [newtime, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(verdict(&p, "setns", [0; 6]), EPERM);
        assert_eq!(
            verdict(&p, "clone3", [0; 6]),
            Some(libc::ENOSYS as u32),
            "clone3 must say ENOSYS so libc falls back to clone"
        );
        // Ordinary process and thread creation stays allowed.
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(verdict(&p, "clone", [thread, 0, 0, 0, 0, 0]), None);
        assert_eq!(
            verdict(&p, "clone", [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            None
        );
        // 0x80 is CSIGNAL territory in clone: exit signal 128 must not be refused.
        assert_eq!(verdict(&p, "clone", [0x80, 0, 0, 0, 0, 0]), None);
        assert_eq!(
            verdict(&p, "unshare", [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            None
        );
    }

    #[test]
    fn listed_syscalls_are_refused() {
        let p = profile();
        for name in [
            "mount",
            "umount2",
            "pivot_root",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "swapon",
            "swapoff",
            "reboot",
            "syslog",
            "acct",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "perf_event_open",
            "userfaultfd",
            "open_by_handle_at",
            "name_to_handle_at",
            "lookup_dcookie",
            "quotactl",
            "nfsservctl",
            "ioperm",
            "iopl",
            "create_module",
            "get_kernel_syms",
            "query_module",
            "uselib",
            "vm86",
            "vm86old",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "fanotify_init",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsmount",
            "fsconfig",
            "fspick",
        ] {
            assert_eq!(verdict(&p, name, [0; 6]), EPERM, "{name} must be refused");
        }
        let vsock = libc::AF_VSOCK as u64;
        assert_eq!(verdict(&p, "socket", [vsock, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            verdict(&p, "socket", [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            None
        );
    }

    #[test]
    fn personality_allows_exactly_dockers_set() {
        let p = profile();
        let allowed = |v: u64| verdict(&p, "personality", [v, 0, 0, 0, 0, 0]).is_none();
        for v in ALLOWED_PERSONALITIES {
            assert!(allowed(v), "{v:#x} must be allowed");
        }
        let mut probes: Vec<u64> = vec![
            1,
            0x7,
            0x9,
            0x0040_0000, // READ_IMPLIES_EXEC
            0x0004_0000, // ADDR_NO_RANDOMIZE
            0x0010_0000, // MMAP_PAGE_ZERO
            0x0002_0001,
            0x0002_0009,
            0xffff_fffe,
            0xffff_fff7,
            0xfffd_ffff,
            0xfffd_fff7,
            0x7fff_ffff,
            0x8000_0000,
            0x1_0000_0000,
            0x1_0000_0008,
            u64::MAX,
        ];
        for b in 0..64 {
            probes.push(1 << b);
            probes.push((1 << b) | 0x20008);
            probes.push(0xffff_ffff ^ (1 << (b % 32)));
        }
        // A cheap deterministic spread over the 32-bit space.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            probes.push(x & 0xffff_ffff);
            probes.push(x & 0x0002_0008 | (x >> 40));
        }
        for v in probes {
            assert_eq!(
                allowed(v),
                ALLOWED_PERSONALITIES.contains(&v),
                "personality({v:#x}) verdict is wrong"
            );
        }
    }

    #[test]
    fn every_rule_has_at_most_one_condition() {
        for s in profile().syscalls().iter().flatten() {
            assert!(s.args().as_ref().map_or(0, Vec::len) <= 1, "{s:?}");
        }
    }

    const PROBE_ENV: &str = "SANDBOXD_SECCOMP_KERNEL_PROBE";

    /// Loads the real profile through libcontainer into a fresh process (this test
    /// binary, re-run for `kernel_probe_child` only) and checks what the kernel
    /// answers. Needs no root: no_new_privs is enough to load a filter.
    #[test]
    fn kernel_enforces_profile() {
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => panic!("current_exe: {e}"),
        };
        let out = std::process::Command::new(exe)
            .args([
                "runtime::seccomp::tests::kernel_probe_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PROBE_ENV, "1")
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) => panic!("spawning probe: {e}"),
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "probe failed:\n{stdout}\n{stderr}");
        let results: std::collections::HashMap<&str, &str> = stdout
            .lines()
            // The harness may print "test ... " on the same line before the output.
            .filter_map(|l| l.split_once("PROBE ").map(|(_, rest)| rest))
            .filter_map(|l| l.split_once('='))
            .collect();
        let eperm = libc::EPERM.to_string();
        let expect = |k: &str, v: &str| {
            assert_eq!(
                results.get(k).copied(),
                Some(v),
                "{k}; full output:\n{stdout}\n{stderr}"
            )
        };
        expect("loaded", "ok");
        expect("unshare_newuser", &eperm);
        expect("unshare_newns", &eperm);
        expect("unshare_files", "0");
        expect("clone_newuser", &eperm);
        expect("clone3", &libc::ENOSYS.to_string());
        expect("setns", &eperm);
        expect("keyctl", &eperm);
        expect("bpf", &eperm);
        expect("io_uring_setup", &eperm);
        expect("mount", &eperm);
        expect("socket_vsock", &eperm);
        expect("personality_query", "0");
        expect("personality_linux32", "0");
        expect("personality_read_implies_exec", &eperm);
        expect("personality_high_bits", &eperm);
        expect("personality_all_but_one", &eperm);
        expect("i386_unshare_newuser", &eperm);
        expect("i386_vm86old", &eperm);
        expect("x32_unshare_newuser", &eperm);
    }

    /// -errno of a raw syscall result, or the value itself when it succeeded.
    fn errno_of(ret: libc::c_long) -> String {
        if ret == -1 {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(-1)
                .to_string()
        } else {
            "0".to_owned()
        }
    }

    /// Issues a system call through the i386 entry point (`int 0x80`), which
    /// seccomp sees as AUDIT_ARCH_I386. Returns the kernel's raw result.
    #[cfg(target_arch = "x86_64")]
    fn int80(nr: u32, a0: u32) -> i64 {
        let ret: i64;
        // SAFETY: int 0x80 takes eax = nr and ebx = first argument and returns in
        // eax. rbx is reserved by LLVM, so the argument is swapped in and out of it
        // around the call, leaving rbx as it was. The kernel zeroes r8-r11 on this
        // path, declared as clobbered. The calls made here (unshare, vm86old) take
        // no pointers, so no memory is touched.
        unsafe {
            std::arch::asm!(
                "xchg {a0}, rbx",
                "int 0x80",
                "xchg {a0}, rbx",
                a0 = inout(reg) u64::from(a0) => _,
                inlateout("rax") u64::from(nr) => ret,
                lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
                options(nostack)
            );
        }
        // The i386 entry returns a 32-bit result in eax.
        i64::from(ret as i32)
    }

    #[test]
    fn kernel_probe_child() {
        if std::env::var_os(PROBE_ENV).is_none() {
            return;
        }
        let p = profile();
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) only sets a flag on this
        // process (a throwaway probe process).
        let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        assert_eq!(rc, 0, "PR_SET_NO_NEW_PRIVS");
        let loaded = crate::runtime::seccomp_filter::CompiledFilter::compile(&p)
            .map_err(|e| e.to_string())
            .and_then(|f| f.install().map_err(|e| e.to_string()));
        match loaded {
            Ok(()) => println!("PROBE loaded=ok"),
            Err(e) => {
                println!("PROBE loaded={e:?}");
                return;
            }
        }
        let sys = |name: &str, ret: libc::c_long| println!("PROBE {name}={}", errno_of(ret));
        // SAFETY (all raw syscalls below): none of them is handed a pointer to
        // memory it could write; the ones that would change this process's state
        // if the filter failed (unshare, personality) only affect this throwaway
        // probe process, and a clone that succeeds is handled right away.
        unsafe {
            sys(
                "unshare_newuser",
                libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER),
            );
            sys(
                "unshare_newns",
                libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS),
            );
            sys(
                "unshare_files",
                libc::syscall(libc::SYS_unshare, libc::CLONE_FILES),
            );
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long;
            let r = libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0);
            if r == 0 {
                libc::_exit(0);
            }
            if r > 0 {
                libc::waitpid(r as libc::pid_t, std::ptr::null_mut(), 0);
            }
            sys("clone_newuser", r);
            sys("clone3", libc::syscall(libc::SYS_clone3, 0usize, 0usize));
            sys("setns", libc::syscall(libc::SYS_setns, -1, 0));
            sys("keyctl", libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0));
            sys("bpf", libc::syscall(libc::SYS_bpf, 0, 0usize, 0));
            sys(
                "io_uring_setup",
                libc::syscall(libc::SYS_io_uring_setup, 0, 0usize),
            );
            sys(
                "mount",
                libc::syscall(libc::SYS_mount, 0usize, 0usize, 0usize, 0, 0usize),
            );
            let s = libc::syscall(libc::SYS_socket, libc::AF_VSOCK, libc::SOCK_STREAM, 0);
            if s >= 0 {
                libc::close(s as libc::c_int);
            }
            sys("socket_vsock", s);
            let q = libc::syscall(libc::SYS_personality, 0xffff_ffffu64);
            sys("personality_query", q);
            sys(
                "personality_linux32",
                libc::syscall(libc::SYS_personality, 0x8u64),
            );
            libc::syscall(libc::SYS_personality, 0u64);
            sys(
                "personality_read_implies_exec",
                libc::syscall(libc::SYS_personality, 0x0040_0000u64),
            );
            sys(
                "personality_high_bits",
                libc::syscall(libc::SYS_personality, 0x1_0000_0000u64),
            );
            sys(
                "personality_all_but_one",
                libc::syscall(libc::SYS_personality, 0xffff_fffeu64),
            );
            libc::syscall(libc::SYS_personality, 0u64);
            // x32 ABI: the x86_64 entry with bit 30 set on the number.
            let x32_unshare = 0x4000_0000 | libc::SYS_unshare;
            sys(
                "x32_unshare_newuser",
                libc::syscall(x32_unshare, libc::CLONE_NEWUSER),
            );
        }
        #[cfg(target_arch = "x86_64")]
        {
            // i386 numbers: unshare = 310, vm86old = 113.
            let show = |name: &str, r: i64| {
                let v = if r < 0 {
                    (-r).to_string()
                } else {
                    "0".to_owned()
                };
                println!("PROBE {name}={v}");
            };
            show(
                "i386_unshare_newuser",
                int80(310, libc::CLONE_NEWUSER as u32),
            );
            show("i386_vm86old", int80(113, 0));
        }
    }
}
