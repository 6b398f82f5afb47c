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
use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator, Spec};

#[derive(Debug, thiserror::Error)]
pub enum SeccompFilterError {
    #[error("the sandbox seccomp profile uses {0}, which sandboxd does not compile; this is a bug in sandboxd, please report it")]
    Unsupported(String),
    #[error("compiling the sandbox seccomp profile with libseccomp: {0}")]
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

fn action(
    action: LinuxSeccompAction,
    errno: Option<u32>,
) -> Result<ScmpAction, SeccompFilterError> {
    match action {
        LinuxSeccompAction::ScmpActAllow => Ok(ScmpAction::Allow),
        LinuxSeccompAction::ScmpActErrno => {
            Ok(ScmpAction::Errno(errno.unwrap_or(libc::EPERM as u32) as i32))
        }
        other => Err(SeccompFilterError::Unsupported(format!("{other:?}"))),
    }
}

fn arch(arch: Arch) -> Result<ScmpArch, SeccompFilterError> {
    match arch {
        Arch::ScmpArchX86_64 => Ok(ScmpArch::X8664),
        Arch::ScmpArchX86 => Ok(ScmpArch::X86),
        Arch::ScmpArchX32 => Ok(ScmpArch::X32),
        other => Err(SeccompFilterError::Unsupported(format!("{other:?}"))),
    }
}

/// libcontainer 0.7's reading: a masked comparison takes its mask from
/// `valueTwo`.
fn compare_op(op: LinuxSeccompOperator, value_two: Option<u64>) -> ScmpCompareOp {
    match op {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        LinuxSeccompOperator::ScmpCmpMaskedEq => ScmpCompareOp::MaskedEqual(value_two.unwrap_or(0)),
    }
}

impl CompiledFilter {
    /// Compiles `profile` as libcontainer would load it.
    pub fn compile(profile: &LinuxSeccomp) -> Result<CompiledFilter, SeccompFilterError> {
        if profile.flags().as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(SeccompFilterError::Unsupported("filter flags".into()));
        }
        let default = action(profile.default_action(), profile.default_errno_ret())?;
        let mut ctx = ScmpFilterContext::new(default).map_err(compile_err)?;
        // The init sets no_new_privs itself, as the spec says.
        ctx.set_ctl_nnp(false).map_err(compile_err)?;
        for &a in profile.architectures().iter().flatten() {
            ctx.add_arch(arch(a)?).map_err(compile_err)?;
        }
        for rule in profile.syscalls().iter().flatten() {
            let act = action(rule.action(), rule.errno_ret())?;
            if act == default {
                continue;
            }
            let comparisons: Vec<ScmpArgCompare> = rule
                .args()
                .iter()
                .flatten()
                .map(|a| {
                    ScmpArgCompare::new(
                        a.index() as u32,
                        compare_op(a.op(), a.value_two()),
                        a.value(),
                    )
                })
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
        let program = bytes
            .chunks_exact(size)
            .map(|i| libc::sock_filter {
                code: u16::from_ne_bytes([i[0], i[1]]),
                jt: i[2],
                jf: i[3],
                k: u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
            })
            .collect();
        Ok(CompiledFilter { program })
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

/// The sandbox profile, compiled once per process: a standby supervisor
/// calls this while it waits ([`prepare`]), a supervisor spawned for its
/// sandbox in the create.
pub fn sandbox_filter() -> Result<Arc<CompiledFilter>, String> {
    static COMPILED: OnceLock<Result<Arc<CompiledFilter>, String>> = OnceLock::new();
    COMPILED
        .get_or_init(|| {
            let profile = super::seccomp::sandbox_seccomp().map_err(|e| e.to_string())?;
            CompiledFilter::compile(&profile)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// Compiles the filter ahead of a create; an error shows again, and fails
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
