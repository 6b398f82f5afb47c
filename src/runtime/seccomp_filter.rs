//! The sandbox's seccomp profile ([`super::seccomp`]) compiled to BPF once per
//! supervisor process, and installed by the container's init right before it
//! execs the agent ([`SandboxExecutor`]).
//!
//! libcontainer would compile the profile with libseccomp inside every
//! create's init process: 1.9 ms of a 9 ms `runtime` phase on the dev host.
//! A standby supervisor compiles it while it waits for a sandbox, so the
//! init (forked from it) only hands the kernel a ready program. The
//! translation is libcontainer 0.7's, for the subset the profile uses
//! (errno actions; conditions that compare one argument each), so the
//! kernel sees the same filter: the kernel probe in `seccomp.rs` loads it
//! through [`CompiledFilter::install`]. As with libcontainer, the init has
//! set `no_new_privs` long before, and nothing but libcontainer's own
//! start handshake runs between where it would have installed the filter
//! and here.

use std::collections::HashSet;
use std::io::{Read, Seek};
use std::sync::{Arc, OnceLock};

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use libseccomp::ScmpSyscall;
use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext};
use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompOperator, Spec,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompFilterError {
    #[error("the sandbox seccomp profile uses {0}, which sandboxd does not compile; this is a bug in sandboxd, please report it")]
    Unsupported(String),
    #[error("the process's seccomp profile uses {0}, which sandboxd does not load")]
    Refused(String),
    #[error("the process's seccomp profile: {0}")]
    Invalid(String),
    #[error("compiling the seccomp profile with libseccomp: {0}")]
    Compile(String),
    #[error("exporting the compiled seccomp filter: {0}")]
    Export(std::io::Error),
}

/// A BPF program for `seccomp(SECCOMP_SET_MODE_FILTER)`.
#[derive(Debug)]
pub struct CompiledFilter {
    program: Vec<libc::sock_filter>,
}

fn compile_err(e: impl std::fmt::Display) -> SeccompFilterError {
    SeccompFilterError::Compile(e.to_string())
}

/// Whose profile is compiled: sandboxd's own (errno actions on x86 only,
/// anything else is a bug here), or one a process asks for on top of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Sandbox,
    Process,
}

impl Profile {
    fn not_compiled(self, what: String) -> SeccompFilterError {
        match self {
            Profile::Sandbox => SeccompFilterError::Unsupported(what),
            Profile::Process => SeccompFilterError::Refused(what),
        }
    }
}

fn action(
    profile: Profile,
    action: LinuxSeccompAction,
    errno: Option<u32>,
) -> Result<ScmpAction, SeccompFilterError> {
    let errno = || errno.unwrap_or(libc::EPERM as u32) as i32;
    match (action, profile) {
        (LinuxSeccompAction::ScmpActAllow, _) => Ok(ScmpAction::Allow),
        (LinuxSeccompAction::ScmpActErrno, _) => Ok(ScmpAction::Errno(errno())),
        // Another program in the sandbox could be the tracer, or hold the
        // notification's listener: neither has a place here.
        (
            LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread,
            Profile::Process,
        ) => Ok(ScmpAction::KillThread),
        (LinuxSeccompAction::ScmpActKillProcess, Profile::Process) => Ok(ScmpAction::KillProcess),
        (LinuxSeccompAction::ScmpActTrap, Profile::Process) => Ok(ScmpAction::Trap),
        (LinuxSeccompAction::ScmpActLog, Profile::Process) => Ok(ScmpAction::Log),
        (other, _) => Err(profile.not_compiled(format!(
            "the action {other:?} (the actions loaded are allow, errno, kill, trap and log)"
        ))),
    }
}

fn arch(profile: Profile, arch: Arch) -> Result<ScmpArch, SeccompFilterError> {
    match (arch, profile) {
        (Arch::ScmpArchX86_64, _) => Ok(ScmpArch::X8664),
        (Arch::ScmpArchX86, _) => Ok(ScmpArch::X86),
        (Arch::ScmpArchX32, _) => Ok(ScmpArch::X32),
        // A profile written for several machines: libseccomp adds the
        // others' checks, which an x86 process never meets.
        (other, Profile::Process) => serde_json::to_value(other)
            .ok()
            .and_then(|name| name.as_str().and_then(|n| n.parse::<ScmpArch>().ok()))
            .ok_or_else(|| profile.not_compiled(format!("architecture {other:?}"))),
        (other, Profile::Sandbox) => Err(profile.not_compiled(format!("{other:?}"))),
    }
}

/// Whether `profile` refuses clone3 only because it names it nowhere (a
/// profile written before the call existed).
fn unaware_of_clone3(profile: &LinuxSeccomp, default: ScmpAction) -> bool {
    // An ENOSYS default already says it (and libseccomp refuses a rule
    // that repeats the default).
    !matches!(
        default,
        ScmpAction::Allow | ScmpAction::Log | ScmpAction::Errno(libc::ENOSYS)
    ) && !profile
        .syscalls()
        .iter()
        .flatten()
        .any(|rule| rule.names().iter().any(|name| name == "clone3"))
}

/// One argument comparison of a rule. A masked one is read two ways:
/// sandboxd's own profile was written for libcontainer 0.7, which takes
/// the mask from `valueTwo` and compares with `value`; a process's
/// profile is written for runc (containerd's and Docker's defaults mask
/// `clone`'s flags so), which masks with `value` and compares with
/// `valueTwo`, as libseccomp's `datum_a` and `datum_b`.
fn comparison(kind: Profile, arg: &LinuxSeccompArg) -> ScmpArgCompare {
    let index = arg.index() as u32;
    let op = match arg.op() {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        LinuxSeccompOperator::ScmpCmpMaskedEq => {
            let (mask, datum) = match kind {
                Profile::Sandbox => (arg.value_two().unwrap_or(0), arg.value()),
                Profile::Process => (arg.value(), arg.value_two().unwrap_or(0)),
            };
            return ScmpArgCompare::new(index, ScmpCompareOp::MaskedEqual(mask), datum);
        }
    };
    ScmpArgCompare::new(index, op, arg.value())
}

/// `profile` (sandboxd's own, or a process's) compiled as libcontainer
/// would load it: the program as libseccomp exports it, `struct
/// sock_filter`s in the host's byte order, which is also the form the agent
/// takes (`sandbox_proto::confinement::ProcessConfinement::seccomp_filter`).
fn export_as(kind: Profile, profile: &LinuxSeccomp) -> Result<Vec<u8>, SeccompFilterError> {
    if profile.flags().as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(kind.not_compiled("filter flags".into()));
    }
    if profile.listener_path().is_some() {
        return Err(kind.not_compiled("a notification listener".into()));
    }
    let default = action(kind, profile.default_action(), profile.default_errno_ret())?;
    let mut ctx = ScmpFilterContext::new(default).map_err(compile_err)?;
    // The init sets no_new_privs itself, as the spec says.
    ctx.set_ctl_nnp(false).map_err(compile_err)?;
    for &a in profile.architectures().iter().flatten() {
        ctx.add_arch(arch(kind, a)?).map_err(compile_err)?;
    }
    for rule in profile.syscalls().iter().flatten() {
        let act = action(kind, rule.action(), rule.errno_ret())?;
        if act == default {
            continue;
        }
        let comparisons: Vec<ScmpArgCompare> = rule
            .args()
            .iter()
            .flatten()
            .map(|a| comparison(kind, a))
            .collect();
        let mut indexes = HashSet::new();
        let one_argument_each = rule
            .args()
            .iter()
            .flatten()
            .all(|a| indexes.insert(a.index()));
        for name in rule.names() {
            // libcontainer skips a name libseccomp cannot resolve, and
            // so does this: the profile lists none (seccomp.rs).
            let Ok(call) = ScmpSyscall::from_name(name) else {
                tracing::warn!("seccomp: libseccomp does not know {name}; not filtered");
                continue;
            };
            if comparisons.is_empty() {
                ctx.add_rule(act, call).map_err(compile_err)?;
            } else if one_argument_each {
                ctx.add_rule_conditional(act, call, &comparisons)
                    .map_err(compile_err)?;
            } else {
                for c in &comparisons {
                    ctx.add_rule_conditional(act, call, std::slice::from_ref(c))
                        .map_err(compile_err)?;
                }
            }
        }
    }
    if kind == Profile::Process && unaware_of_clone3(profile, default) {
        // As runc does for a profile older than clone3: glibc creates
        // threads with clone3 and falls back to clone only on ENOSYS.
        // The kernel takes the newest filter's errno where two refuse,
        // so the profile's EPERM would override the sandbox's ENOSYS
        // and no thread could start.
        let clone3 = ScmpSyscall::from_name("clone3").map_err(compile_err)?;
        ctx.add_rule(ScmpAction::Errno(libc::ENOSYS), clone3)
            .map_err(compile_err)?;
    }
    let exported = nix::sys::memfd::memfd_create(
        c"sandboxd-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| SeccompFilterError::Export(e.into()))?;
    let mut file = std::fs::File::from(exported);
    ctx.export_bpf(&file).map_err(compile_err)?;
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(SeccompFilterError::Export)?;
    let size = std::mem::size_of::<libc::sock_filter>();
    if bytes.is_empty() || bytes.len() % size != 0 {
        return Err(SeccompFilterError::Compile(format!(
            "libseccomp exported {} bytes, not whole BPF instructions",
            bytes.len()
        )));
    }
    Ok(bytes)
}

impl CompiledFilter {
    /// Compiles sandboxd's own `profile` as libcontainer would load it.
    pub fn compile(profile: &LinuxSeccomp) -> Result<CompiledFilter, SeccompFilterError> {
        Self::compile_as(Profile::Sandbox, profile)
    }

    /// Compiles `profile` (sandboxd's own, or a process's) as libcontainer
    /// would load it.
    pub fn compile_as(
        kind: Profile,
        profile: &LinuxSeccomp,
    ) -> Result<CompiledFilter, SeccompFilterError> {
        Ok(Self::from_exported(&export_as(kind, profile)?))
    }

    /// The program in `bytes`, whole instructions in the kernel's layout as
    /// libseccomp exports them; a trailing partial instruction is dropped
    /// (the callers check the length first).
    pub fn from_exported(bytes: &[u8]) -> CompiledFilter {
        let program = bytes
            .chunks_exact(std::mem::size_of::<libc::sock_filter>())
            .map(|i| libc::sock_filter {
                code: u16::from_ne_bytes([i[0], i[1]]),
                jt: i[2],
                jf: i[3],
                k: u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
            })
            .collect();
        CompiledFilter { program }
    }

    /// The program as [`Self::from_exported`] reads it.
    pub fn exported(&self) -> Vec<u8> {
        self.program
            .iter()
            .flat_map(|i| {
                let mut bytes = [0u8; 8];
                bytes[..2].copy_from_slice(&i.code.to_ne_bytes());
                bytes[2] = i.jt;
                bytes[3] = i.jf;
                bytes[4..].copy_from_slice(&i.k.to_ne_bytes());
                bytes
            })
            .collect()
    }
    /// Puts the filter on the calling thread, for good. The caller has set
    /// `no_new_privs` (or holds CAP_SYS_ADMIN in its user namespace).
    pub fn install(&self) -> std::io::Result<()> {
        let program = libc::sock_fprog {
            len: u16::try_from(self.program.len()).map_err(|_| {
                std::io::Error::other("seccomp filter longer than 65535 instructions")
            })?,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: `program` points at `self.program`, which outlives the call;
        // the kernel copies the instructions and writes nothing back.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &program as *const libc::sock_fprog,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Most syscall names a process's profile may list over all its rules
/// (containerd's default lists about 350), checked before libseccomp
/// compiles it.
const MAX_PROCESS_PROFILE_NAMES: usize = 4096;

/// Most rules libseccomp is asked to add for a process's profile: a name
/// with comparisons that repeat an argument becomes one rule per
/// comparison.
const MAX_PROCESS_PROFILE_RULES: usize = 8192;

/// Process profiles compiled lately, kept by their JSON text: a pod's
/// containers, and every exec into them, bring the same profile, which
/// would otherwise be compiled again each time.
const KEPT_PROCESS_PROGRAMS: usize = 16;

/// Profiles longer than this are compiled each time, not kept (so the kept
/// texts stay small; containerd's default is about 20 KB).
const MAX_KEPT_PROFILE_BYTES: usize = 256 * 1024;

/// A compiled process profile and its JSON text.
type KeptProgram = (String, Arc<[u8]>);

/// The program a process's own `profile` (an OCI `linux.seccomp` as JSON)
/// compiles to, in the form the agent takes
/// (`sandbox_proto::confinement::ProcessConfinement::seccomp_filter`).
pub fn process_program(profile: &serde_json::Value) -> Result<Arc<[u8]>, SeccompFilterError> {
    static KEPT: OnceLock<std::sync::Mutex<Vec<KeptProgram>>> = OnceLock::new();
    let text = profile.to_string();
    let kept = KEPT.get_or_init(Default::default);
    let lock = || kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, program)) = lock().iter().find(|(t, _)| *t == text) {
        return Ok(Arc::clone(program));
    }
    let parsed: LinuxSeccomp = serde_json::from_value(profile.clone())
        .map_err(|e| SeccompFilterError::Invalid(e.to_string()))?;
    let rules = parsed.syscalls().iter().flatten();
    let names: usize = rules.clone().map(|r| r.names().len()).sum();
    let added: usize = rules
        .map(|r| r.names().len() * r.args().as_ref().map_or(1, |a| a.len().max(1)))
        .sum();
    if names > MAX_PROCESS_PROFILE_NAMES || added > MAX_PROCESS_PROFILE_RULES {
        return Err(SeccompFilterError::Invalid(format!(
            "{names} syscall names, {added} with their comparisons, over its rules; at most {MAX_PROCESS_PROFILE_NAMES} and {MAX_PROCESS_PROFILE_RULES}"
        )));
    }
    let program = export_as(Profile::Process, &parsed)?;
    let instructions = program.len() / std::mem::size_of::<libc::sock_filter>();
    let max = sandbox_proto::confinement::SECCOMP_MAX_INSTRUCTIONS;
    if instructions > max {
        return Err(SeccompFilterError::Invalid(format!(
            "it compiles to {instructions} instructions; the kernel takes at most {max}"
        )));
    }
    let program: Arc<[u8]> = program.into();
    if text.len() > MAX_KEPT_PROFILE_BYTES {
        return Ok(program);
    }
    let mut kept = lock();
    if kept.len() >= KEPT_PROCESS_PROGRAMS {
        kept.remove(0);
    }
    kept.push((text, Arc::clone(&program)));
    Ok(program)
}

/// The sandbox profile's program, made once per process: a standby
/// supervisor makes it while it waits ([`prepare`]), a supervisor spawned
/// for its sandbox in the create. Read from the daemon's shared copy when
/// the supervisor was told where it is ([`super::seccomp_shared`]),
/// compiled otherwise.
pub fn sandbox_filter() -> Result<Arc<CompiledFilter>, String> {
    static MADE: OnceLock<Result<Arc<CompiledFilter>, String>> = OnceLock::new();
    MADE.get_or_init(|| {
        let profile = super::seccomp::sandbox_seccomp().map_err(|e| e.to_string())?;
        if let Some(shared) = super::seccomp_shared::read(&profile) {
            return Ok(Arc::new(shared));
        }
        CompiledFilter::compile(&profile)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
}

/// Makes the filter ahead of a create; an error shows again, and fails
/// the create, when it is used.
pub fn prepare() {
    let _ = sandbox_filter();
}

/// libcontainer's default executor (`execvp` of the spec's args), with the
/// sandbox's seccomp filter installed first.
#[derive(Clone)]
pub struct SandboxExecutor {
    pub filter: Arc<CompiledFilter>,
}

impl Executor for SandboxExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        self.filter
            .install()
            .map_err(|e| ExecutorError::Other(format!("installing the seccomp filter: {e}")))?;
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_compiles_to_a_program_that_checks_the_architecture_first() {
        let filter = match sandbox_filter() {
            Ok(f) => f,
            Err(e) => panic!("{e}"),
        };
        // BPF_LD|BPF_W|BPF_ABS of seccomp_data.arch (offset 4): a filter
        // that allows by default must refuse other ABIs before anything else.
        let first = filter.program[0];
        assert_eq!(
            (first.code, first.k),
            (0x20, 4),
            "{:?}",
            &filter.program[..4]
        );
        assert!(
            filter.program.len() > 50,
            "{} instructions",
            filter.program.len()
        );
    }

    #[test]
    fn a_process_profile_takes_kills_traps_logs_and_other_machines_but_no_notify() {
        let profile = |value: serde_json::Value| -> LinuxSeccomp {
            serde_json::from_value(value).expect("profile")
        };
        let taken = profile(serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
            "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["getppid"], "action": "SCMP_ACT_KILL_PROCESS"},
                {"names": ["getpid"], "action": "SCMP_ACT_TRAP"},
                {"names": ["getuid"], "action": "SCMP_ACT_LOG"},
                {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 2114060288u64, "op": "SCMP_CMP_MASKED_EQ"}]}
            ]
        }));
        let compiled = CompiledFilter::compile_as(Profile::Process, &taken);
        let exported = export_as(Profile::Process, &taken);
        assert!(matches!(
            (compiled, exported),
            (Ok(c), Ok(e)) if e.len() == c.program.len() * 8
        ));
        // An ENOSYS default needs no clone3 rule (libseccomp would refuse
        // one that repeats the default).
        let enosys = profile(serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
            "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]
        }));
        if let Err(e) = CompiledFilter::compile_as(Profile::Process, &enosys) {
            panic!("{e}");
        }
        // sandboxd's own profile takes none of those: a bug, said so.
        assert!(matches!(
            CompiledFilter::compile(&taken),
            Err(SeccompFilterError::Unsupported(_))
        ));
        for refused in [
            serde_json::json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
            serde_json::json!({"defaultAction": "SCMP_ACT_TRACE"}),
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/l"}),
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"]}),
        ] {
            assert!(
                matches!(
                    CompiledFilter::compile_as(Profile::Process, &profile(refused.clone())),
                    Err(SeccompFilterError::Refused(_))
                ),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_action_the_profile_does_not_use_is_refused_not_compiled() {
        let profile = oci_spec::runtime::LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActKill)
            .build()
            .expect("profile");
        assert!(matches!(
            CompiledFilter::compile(&profile),
            Err(SeccompFilterError::Unsupported(_))
        ));
    }
}
