//! Fork+exec of one process: stdio (pipes or a PTY), the in-child setup
//! before exec (cgroup, session, controlling terminal, OOM score,
//! credentials, capabilities, cwd, seccomp) and telling which step failed
//! when the spawn does.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandbox_proto::SpawnRequest;

use crate::codefile;
use crate::process::ProcError;
use crate::pty;
use crate::warm;

/// What a successful fork+exec leaves in the agent.
pub struct Launched {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: Option<OwnedFd>,
    /// The PTY master duplicate kept for resizing (stdout/stdin hold their own).
    pub pty_dup: Option<OwnedFd>,
    pub code_path: Option<PathBuf>,
}

impl Launched {
    pub fn kill(&self) {
        // SAFETY: kill takes plain integers; the pid is our unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }
}

/// Writes the run-code file if any, then has the warm interpreter run it
/// (when it can serve the request) or forks and execs. Blocks until the
/// process runs or its start failed.
pub fn launch(request: SpawnRequest, cgroup_fds: Vec<OwnedFd>) -> Result<Launched, ProcError> {
    if request.root.is_some() && request.code.is_some() {
        // The code file lives in the sandbox's /tmp, out of a container root's sight.
        return Err(ProcError::Invalid(
            "run-code cannot name a container root; start the interpreter with a command".into(),
        ));
    }
    let code_path = match &request.code {
        Some(code) => Some(
            codefile::write(request.proc, code, request.uid, request.gid)
                .map_err(ProcError::CodeFile)?,
        ),
        None => None,
    };
    let launched = match code_path
        .as_deref()
        .and_then(|path| warm::launch(&request, path, &cgroup_fds))
    {
        Some(served) => served,
        None => fork_exec(&request, code_path.as_deref(), &cgroup_fds),
    };
    match launched {
        Ok(mut launched) => {
            launched.code_path = code_path;
            Ok(launched)
        }
        Err(e) => {
            if let Some(path) = code_path {
                codefile::remove(&path);
            }
            Err(e)
        }
    }
}

/// Forks and execs `request` with the stdio it asks for: pipes, or a PTY.
fn fork_exec(
    request: &SpawnRequest,
    code_path: Option<&Path>,
    cgroup_fds: &[OwnedFd],
) -> Result<Launched, ProcError> {
    let pty = request
        .pty
        .map(pty::open)
        .transpose()
        .map_err(ProcError::Pty)?;
    let stdio = match &pty {
        Some(pty) => {
            let slave = || {
                pty.slave
                    .try_clone()
                    .map(Stdio::from)
                    .map_err(ProcError::Pty)
            };
            [slave()?, slave()?, slave()?]
        }
        None => [
            if request.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            },
            Stdio::piped(),
            Stdio::piped(),
        ],
    };
    let (pid, mut child) = spawn(request, code_path, cgroup_fds, stdio, pty.is_some())?;
    let launched = match pty {
        Some(pty) => {
            let dup = |fd: &OwnedFd| fd.try_clone();
            let (stdin, resize) = match (dup(&pty.master), dup(&pty.master)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    // SAFETY: kill takes plain integers; the pid is our unreaped child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return Err(ProcError::Pty(e));
                }
            };
            drop(pty.slave);
            Launched {
                pid,
                stdin: Some(stdin),
                stdout: pty.master,
                stderr: None,
                pty_dup: Some(resize),
                code_path: None,
            }
        }
        None => {
            let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(ProcError::Internal("missing output pipes".into()));
            };
            Launched {
                pid,
                stdin: child.stdin.take().map(OwnedFd::from),
                stdout: stdout.into(),
                stderr: Some(stderr.into()),
                pty_dup: None,
                code_path: None,
            }
        }
    };
    Ok(launched)
}

/// Starts the warm interpreter's server: `request`'s program with
/// `control` as its stdin and nothing for output (it writes none, and its
/// forks get their own). Returns its pid.
pub fn spawn_server(request: &SpawnRequest, control: OwnedFd) -> Result<i32, ProcError> {
    let stdio = [Stdio::from(control), Stdio::null(), Stdio::null()];
    spawn(request, None, &[], stdio, false).map(|(pid, _)| pid)
}

/// Forks `request`'s program with `stdio` (stdin, stdout, stderr), runs
/// [`ChildSetup`] in the child and execs; returns once the exec happened.
/// Dropping the returned `Child` neither waits nor kills: the reaper owns that.
fn spawn(
    request: &SpawnRequest,
    code_path: Option<&Path>,
    cgroup_fds: &[OwnedFd],
    stdio: [Stdio; 3],
    controlling_tty: bool,
) -> Result<(i32, std::process::Child), ProcError> {
    let Some((program, args)) = request.argv.split_first() else {
        return Err(ProcError::Invalid("argv is empty".into()));
    };
    let program = program.clone();
    let mut command = Command::new(&program);
    command.args(args);
    if let Some(path) = code_path {
        command.arg(path);
    }
    command.env_clear();
    command.envs(request.env.iter().map(|(k, v)| (k, v)));
    let [stdin, stdout, stderr] = stdio;
    command.stdin(stdin).stdout(stdout).stderr(stderr);

    let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ProcError::Prepare(e.into()))?;
    let cwd = if request.cwd.is_empty() {
        "/"
    } else {
        request.cwd.as_str()
    };
    let root = match &request.root {
        Some(name) => {
            if !sandbox_proto::valid_root_name(name) {
                return Err(ProcError::Invalid(format!(
                    "{name:?} is not a container root name"
                )));
            }
            let path = sandbox_proto::container_root(name);
            if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Err(ProcError::NoRoot(name.clone()));
            }
            Some(CString::new(path).map_err(|_| {
                ProcError::Invalid("container root path contains a NUL byte".into())
            })?)
        }
        None => None,
    };
    // SAFETY: geteuid has no preconditions.
    let set_groups = unsafe { libc::geteuid() } == 0;
    if !set_groups && !request.groups.is_empty() {
        return Err(ProcError::Invalid(
            "supplementary groups need the agent to run as root".into(),
        ));
    }
    let confinement = &request.confinement;
    let filtered = confinement.seccomp_filter.is_some();
    let setup = ChildSetup {
        root,
        oom_score_adj: confinement.oom_score_adj.map(oom_score_text),
        capabilities: confinement.capabilities,
        seccomp: confinement
            .seccomp_filter
            .as_deref()
            .map(seccomp_program)
            .transpose()?,
        cgroup_fds: cgroup_fds.iter().map(AsRawFd::as_raw_fd).collect(),
        controlling_tty,
        set_groups,
        groups: request.groups.iter().map(|&g| g as libc::gid_t).collect(),
        uid: request.uid,
        gid: request.gid,
        cwd: CString::new(cwd).map_err(|_| ProcError::Invalid("cwd contains a NUL byte".into()))?,
        report: report_write.as_raw_fd(),
    };
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on data prepared before the fork (see ChildSetup::run).
    unsafe {
        command.pre_exec(move || setup.run());
    }
    let spawned = command.spawn();
    // The Command holds the PTY slave copies; the child has its own now.
    drop(command);
    drop(report_write);
    let child = match spawned {
        Ok(child) => child,
        Err(source) => {
            return Err(match failed_step(&report_read) {
                Some(step) => ProcError::Setup {
                    step: step.describe(cwd),
                    source,
                },
                // After the process's own filter was loaded: a refusal may
                // be its answer.
                None if filtered
                    && matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
                {
                    ProcError::Setup {
                        step: format!("executing {program} under the process's seccomp profile (which may refuse execve)"),
                        source,
                    }
                }
                None => ProcError::Exec { program, source },
            });
        }
    };
    let pid =
        i32::try_from(child.id()).map_err(|_| ProcError::Internal("pid out of range".into()))?;
    Ok((pid, child))
}

/// The in-child steps, in order; the failing one reports its index through a pipe.
#[derive(Clone, Copy)]
pub enum Step {
    Cgroup,
    Session,
    Terminal,
    OomScore,
    Root,
    Bounding,
    Groups,
    Gid,
    Uid,
    Capabilities,
    Cwd,
    Seccomp,
}

// `failed_step` reads the child's `step as u8` as an index into `ALL`.
const _: () = {
    let mut i = 0;
    while i < Step::ALL.len() {
        assert!(Step::ALL[i] as usize == i);
        i += 1;
    }
};

impl Step {
    const ALL: [Step; 12] = [
        Step::Cgroup,
        Step::Session,
        Step::Terminal,
        Step::OomScore,
        Step::Root,
        Step::Bounding,
        Step::Groups,
        Step::Gid,
        Step::Uid,
        Step::Capabilities,
        Step::Cwd,
        Step::Seccomp,
    ];

    pub fn describe(self, cwd: &str) -> String {
        match self {
            Step::Cgroup => "moving into the process cgroup".into(),
            Step::Session => "starting a new session".into(),
            Step::Terminal => "acquiring the controlling terminal".into(),
            Step::Root => "entering the container root (chroot, dropping CAP_SYS_CHROOT)".into(),
            Step::OomScore => "setting oom_score_adj (it cannot go below the sandbox's)".into(),
            Step::Bounding => "narrowing the capability bounding set".into(),
            Step::Groups => "setting the supplementary groups".into(),
            Step::Gid => "setting the group id".into(),
            Step::Uid => "setting the user id".into(),
            Step::Capabilities => "dropping capabilities".into(),
            Step::Cwd => format!("changing to working directory {cwd}"),
            Step::Seccomp => "loading the process's seccomp filter".into(),
        }
    }
}

fn failed_step(report: &OwnedFd) -> Option<Step> {
    let mut byte = 0u8;
    // SAFETY: reads at most one byte into a local. The write end is closed in
    // both processes by now, so this cannot block.
    let n = unsafe { libc::read(report.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
    if n == 1 {
        Step::ALL.get(usize::from(byte)).copied()
    } else {
        None
    }
}

/// Everything the child needs before exec, prepared before the fork.
struct ChildSetup {
    /// A container root to pivot into, in a mount namespace of the child's own.
    root: Option<CString>,
    /// `oom_score_adj`'s new value as the file takes it.
    oom_score_adj: Option<OomScoreText>,
    /// The capabilities to keep, a bit per number; `None` keeps the agent's.
    capabilities: Option<u64>,
    /// A filter loaded last, right before the exec.
    seccomp: Option<Vec<libc::sock_filter>>,
    cgroup_fds: Vec<RawFd>,
    controlling_tty: bool,
    /// The agent may set groups (it runs as root, as it does in a
    /// sandbox); the child then gets exactly `groups`.
    set_groups: bool,
    groups: Vec<libc::gid_t>,
    uid: u32,
    gid: u32,
    cwd: CString,
    report: RawFd,
}

impl ChildSetup {
    /// Runs in the forked child: only async-signal-safe calls, no allocation.
    /// The cgroup move comes first so everything after it is accounted there;
    /// chdir comes last so it is checked with the target user's rights.
    fn run(&self) -> io::Result<()> {
        for &fd in &self.cgroup_fds {
            // SAFETY: writes one byte from a static string to a descriptor we own.
            if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                return self.fail(Step::Cgroup);
            }
            // SAFETY: the descriptor is ours (a copy of the parent's) and unused after this.
            unsafe { libc::close(fd) };
        }
        // SAFETY: setsid has no memory-safety preconditions.
        if unsafe { libc::setsid() } < 0 {
            return self.fail(Step::Session);
        }
        // SAFETY: TIOCSCTTY takes an integer argument; fd 0 is the PTY slave by now.
        if self.controlling_tty && unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            return self.fail(Step::Terminal);
        }
        // Through the sandbox's /proc, before a container root's.
        if let Some((text, len)) = &self.oom_score_adj {
            if write_oom_score(&text[..*len]).is_err() {
                return self.fail(Step::OomScore);
            }
        }
        if let Some(root) = &self.root {
            if enter_root(root).is_err() {
                return self.fail(Step::Root);
            }
        }
        // The bounding set narrows while the child still holds CAP_SETPCAP;
        // what it holds goes after the id changes, which need CAP_SETUID
        // and CAP_SETGID.
        if let Some(keep) = self.capabilities {
            if narrow_bounding_set(keep).is_err() {
                return self.fail(Step::Bounding);
            }
        }
        // SAFETY: the pointer and length describe `groups`, prepared before
        // the fork and not touched since; an empty list is a valid one.
        if self.set_groups
            && unsafe { libc::setgroups(self.groups.len(), self.groups.as_ptr()) } < 0
        {
            return self.fail(Step::Groups);
        }
        // SAFETY: setgid/setuid take plain integers.
        if unsafe { libc::setgid(self.gid) } < 0 {
            return self.fail(Step::Gid);
        }
        // SAFETY: as above.
        if unsafe { libc::setuid(self.uid) } < 0 {
            return self.fail(Step::Uid);
        }
        if let Some(keep) = self.capabilities {
            if keep_capabilities(keep).is_err() {
                return self.fail(Step::Capabilities);
            }
        }
        // SAFETY: cwd is a valid NUL-terminated string owned by this closure.
        if unsafe { libc::chdir(self.cwd.as_ptr()) } < 0 {
            return self.fail(Step::Cwd);
        }
        if let Some(program) = &self.seccomp {
            if load_seccomp(program).is_err() {
                return self.fail(Step::Seccomp);
            }
        }
        Ok(())
    }

    fn fail(&self, step: Step) -> io::Result<()> {
        let err = io::Error::last_os_error();
        let byte = step as u8;
        // SAFETY: writes one byte from a local to the report pipe, which is ours.
        unsafe { libc::write(self.report, (&byte as *const u8).cast(), 1) };
        Err(err)
    }
}

/// `oom_score_adj`'s value as the file takes it (at most 6 bytes: "-32768"),
/// and its length: formatted before the fork, written after.
type OomScoreText = ([u8; 8], usize);

fn oom_score_text(score: i16) -> OomScoreText {
    let formatted = score.to_string();
    let mut text = [0u8; 8];
    let len = formatted.len().min(text.len());
    text[..len].copy_from_slice(&formatted.as_bytes()[..len]);
    (text, len)
}

/// Writes the calling process's `oom_score_adj`; the kernel refuses a value
/// below the one it inherited (unless CAP_SYS_RESOURCE, which sandboxes do
/// not hold). System calls only.
fn write_oom_score(text: &[u8]) -> Result<(), ()> {
    // SAFETY: a valid NUL-terminated path and integer flags.
    let fd = unsafe {
        libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(());
    }
    // SAFETY: writes `text`, which outlives the call, to the descriptor just opened.
    let written = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
    // SAFETY: the descriptor is ours and unused after this.
    unsafe { libc::close(fd) };
    if usize::try_from(written) == Ok(text.len()) {
        Ok(())
    } else {
        Err(())
    }
}

/// The program of a process's own seccomp filter, from its wire form.
fn seccomp_program(bytes: &[u8]) -> Result<Vec<libc::sock_filter>, ProcError> {
    use sandbox_proto::confinement::{SECCOMP_INSTRUCTION_BYTES, SECCOMP_MAX_INSTRUCTIONS};
    let count = bytes.len() / SECCOMP_INSTRUCTION_BYTES;
    let whole = bytes
        .chunks_exact(SECCOMP_INSTRUCTION_BYTES)
        .remainder()
        .is_empty();
    if !whole || !(1..=SECCOMP_MAX_INSTRUCTIONS).contains(&count) {
        return Err(ProcError::Invalid(format!(
            "a seccomp program of {} bytes is not 1 to {SECCOMP_MAX_INSTRUCTIONS} instructions of {SECCOMP_INSTRUCTION_BYTES} bytes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(SECCOMP_INSTRUCTION_BYTES)
        .map(|i| libc::sock_filter {
            code: u16::from_ne_bytes([i[0], i[1]]),
            jt: i[2],
            jf: i[3],
            k: u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
        })
        .collect())
}

/// Loads `program` on the calling process for good, with `no_new_privs`
/// (which a sandbox's processes have anyway) so the kernel takes it from a
/// process without CAP_SYS_ADMIN. System calls only.
fn load_seccomp(program: &[libc::sock_filter]) -> Result<(), ()> {
    let Ok(len) = u16::try_from(program.len()) else {
        return Err(());
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(());
    }
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the
    // kernel copies the instructions and writes nothing back.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(())
    }
}

/// Drops from the bounding set every capability not in `keep` (a bit per
/// number), up to the last the kernel knows. Needs CAP_SETPCAP, which
/// sandboxes keep. System calls only.
fn narrow_bounding_set(keep: u64) -> Result<(), ()> {
    for capability in 0..64u32 {
        if keep & (1u64 << capability) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_CAPBSET_DROP,
                libc::c_ulong::from(capability),
                0,
                0,
                0,
            )
        };
        if rc < 0 {
            // EINVAL: past the kernel's last capability.
            return match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINVAL) => Ok(()),
                _ => Err(()),
            };
        }
    }
    Ok(())
}

/// Keeps only `keep` of the effective and permitted sets and empties the
/// inheritable and ambient ones, so no exec gives more back than the
/// bounding set (narrowed before). System calls only.
fn keep_capabilities(keep: u64) -> Result<(), ()> {
    let words = [keep as u32, (keep >> 32) as u32];
    change_capabilities(|data| {
        for (set, word) in data.iter_mut().zip(words) {
            set.effective &= word;
            set.permitted &= word;
            set.inheritable = 0;
        }
    })?;
    clear_ambient()
}

/// capget, `change`, capset, on the calling thread.
fn change_capabilities(change: impl FnOnce(&mut [CapData; 2])) -> Result<(), ()> {
    let check = |rc: libc::c_long| if rc < 0 { Err(()) } else { Ok(()) };
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills the two-element array a version 3 header names.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) })?;
    change(&mut data);
    // SAFETY: capset reads the header and the two-element array.
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) })
}

fn clear_ambient() -> Result<(), ()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc < 0 {
        Err(())
    } else {
        Ok(())
    }
}

/// Makes `root` the calling process's root and takes CAP_SYS_CHROOT from
/// it for good (effective, permitted, inheritable, ambient and bounding
/// sets), so it cannot chroot its way back out to the sandbox's root. The
/// sandbox's seccomp filter refuses mount namespaces and pivot_root to
/// everything in it, the agent included; the sandbox (not the container
/// root) is the isolation boundary. Runs in the forked child: system
/// calls only, on a string made before the fork.
fn enter_root(root: &CString) -> Result<(), ()> {
    let check = |rc: libc::c_long| if rc < 0 { Err(()) } else { Ok(()) };
    // SAFETY: root is a valid NUL-terminated string owned by the caller.
    check(unsafe { libc::chroot(root.as_ptr()) }.into())?;
    // SAFETY: a valid NUL-terminated path.
    check(unsafe { libc::chdir(c"/".as_ptr()) }.into())?;
    let chroot_bit = 1u32 << CAP_SYS_CHROOT;
    change_capabilities(|data| {
        data[0].effective &= !chroot_bit;
        data[0].permitted &= !chroot_bit;
        data[0].inheritable &= !chroot_bit;
    })?;
    clear_ambient()?;
    // SAFETY: as above; needs CAP_SETPCAP, which sandboxes keep.
    check(
        unsafe {
            libc::prctl(
                libc::PR_CAPBSET_DROP,
                libc::c_ulong::from(CAP_SYS_CHROOT),
                0,
                0,
                0,
            )
        }
        .into(),
    )
}

/// `CAP_SYS_CHROOT` (linux/capability.h).
const CAP_SYS_CHROOT: u32 = 18;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
