//! Processes: the table of tracked processes, the Spawn request's life cycle
//! (reserve the id, launch, reply, start output and stdin), each process's
//! supervisor that sends Exit once its output is done, and Signal/ResizePty.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox_proto::{
    AgentError, AgentMessage, ErrorKind, ExitStatus, PtySize, Reply, SpawnRequest, Stream,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

use crate::agent::Agent;
use crate::codefile;
use crate::errors::io_kind;
use crate::guest_groups;
use crate::launch::launch;
use crate::link::ClaimError;
use crate::output;
use crate::pty;
use crate::stdin::{self, StdinJob, StdinQueue};

/// Processes tracked at once (from Spawn until their Exit is sent).
pub const MAX_PROCS: usize = 1024;

/// How long output may keep flowing after the process itself was reaped:
/// a descendant holding the pipe open must not delay Exit forever.
const EXIT_GRACE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("too many processes (limit {MAX_PROCS})")]
    TooMany,
    #[error("process id {0} is already in use")]
    DuplicateId(u64),
    #[error("unknown process {0}")]
    Unknown(u64),
    #[error("process {0} is still starting")]
    Starting(u64),
    #[error("process {0} was started without stdin")]
    NoStdin(u64),
    #[error("process {0} has no terminal")]
    NoPty(u64),
    #[error("invalid spawn request: {0}")]
    Invalid(String),
    #[error("no container root named {0:?} is attached")]
    NoRoot(String),
    #[error(transparent)]
    Descriptors(#[from] ClaimError),
    #[error("writing the code file: {0}")]
    CodeFile(io::Error),
    #[error("opening a terminal: {0}")]
    Pty(io::Error),
    #[error("preparing the process: {0}")]
    Prepare(io::Error),
    #[error("cannot execute {program}: {source}")]
    Exec { program: String, source: io::Error },
    #[error("{step} failed: {source}")]
    Setup { step: String, source: io::Error },
    #[error("making the process's cgroup in the guest: {0}")]
    GuestGroup(io::Error),
    #[error("signal {0} is out of range")]
    BadSignal(i32),
    #[error("signalling process {proc}: {source}")]
    Signal { proc: u64, source: io::Error },
    #[error("resizing the terminal of process {proc}: {source}")]
    Resize { proc: u64, source: io::Error },
    #[error("the host gave up waiting for process {0} to start")]
    Abandoned(u64),
    #[error("spawn failed: {0}")]
    Internal(String),
}

impl From<ProcError> for AgentError {
    fn from(err: ProcError) -> Self {
        let kind = match &err {
            ProcError::Unknown(_) => ErrorKind::UnknownProcess,
            ProcError::NoRoot(_) => ErrorKind::NotFound,
            ProcError::Invalid(_)
            | ProcError::Descriptors(_)
            | ProcError::BadSignal(_)
            | ProcError::DuplicateId(_)
            | ProcError::NoStdin(_)
            | ProcError::NoPty(_) => ErrorKind::InvalidInput,
            ProcError::Exec { source, .. }
            | ProcError::Setup { source, .. }
            | ProcError::Signal { source, .. }
            | ProcError::Resize { source, .. }
            | ProcError::CodeFile(source)
            | ProcError::Pty(source)
            | ProcError::Prepare(source)
            | ProcError::GuestGroup(source) => io_kind(source),
            ProcError::TooMany
            | ProcError::Starting(_)
            | ProcError::Abandoned(_)
            | ProcError::Internal(_) => ErrorKind::Other,
        };
        AgentError::new(kind, err.to_string())
    }
}

struct Entry {
    /// None until the fork has happened.
    pid: Option<i32>,
    /// The main process has been waited for; its pid may belong to someone else now.
    reaped: bool,
    exit: Option<oneshot::Sender<ExitStatus>>,
    stdin: Option<UnboundedSender<StdinJob>>,
    /// Dropped with the entry, which tells the stdin writer the process is gone.
    _gone: Option<watch::Sender<()>>,
    /// A duplicate of the PTY master, for ResizePty.
    pty: Option<OwnedFd>,
    /// The host gave up on it while it was starting: it must not run.
    abandoned: bool,
}

/// Where an abandoned process stood (see [`ProcTable::abandon`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Abandoned {
    /// Not in the table: its spawn has not come yet (and will fail), or it
    /// has already ended (what it left running is the caller's to kill).
    NotInTable,
    /// Being started: it is not launched, or killed as it registers.
    Starting,
    /// It runs: the caller kills its tree.
    Running,
}

#[derive(Default)]
pub struct ProcTable {
    procs: HashMap<u64, Entry>,
    by_pid: HashMap<i32, u64>,
    /// Ids the host abandoned that were not in the table, at most
    /// [`MAX_PROCS`] (the oldest, the smallest ids, go first).
    abandoned: BTreeSet<u64>,
}

impl ProcTable {
    fn reserve(&mut self, proc: u64, with_stdin: bool) -> Result<Option<StdinQueue>, ProcError> {
        if self.abandoned.remove(&proc) {
            return Err(ProcError::Abandoned(proc));
        }
        if self.procs.contains_key(&proc) {
            return Err(ProcError::DuplicateId(proc));
        }
        if self.procs.len() >= MAX_PROCS {
            return Err(ProcError::TooMany);
        }
        let (stdin, gone, queue) = if with_stdin {
            let (jobs, gone, queue) = stdin::queue();
            (Some(jobs), Some(gone), Some(queue))
        } else {
            (None, None, None)
        };
        self.procs.insert(
            proc,
            Entry {
                pid: None,
                reaped: false,
                exit: None,
                stdin,
                _gone: gone,
                pty: None,
                abandoned: false,
            },
        );
        Ok(queue)
    }

    /// Marks `proc` as one the host no longer knows (its spawn was
    /// written but not answered in time). An id not in the table is
    /// remembered, so that its spawn fails if it comes later; one that
    /// already ended stays remembered to no effect (the host never reuses
    /// ids) until [`Self::forget_abandoned`] or the cap drops it.
    pub fn abandon(&mut self, proc: u64) -> Abandoned {
        match self.procs.get_mut(&proc) {
            Some(entry) if entry.pid.is_some() => Abandoned::Running,
            Some(entry) => {
                entry.abandoned = true;
                Abandoned::Starting
            }
            None => {
                self.abandoned.insert(proc);
                while self.abandoned.len() > MAX_PROCS {
                    self.abandoned.pop_first();
                }
                Abandoned::NotInTable
            }
        }
    }

    /// `proc` was found to have run and ended: no spawn of it will come.
    pub fn forget_abandoned(&mut self, proc: u64) {
        self.abandoned.remove(&proc);
    }

    /// Whether the host abandoned `proc` while it was being started.
    fn is_abandoned(&self, proc: u64) -> bool {
        self.procs.get(&proc).is_some_and(|entry| entry.abandoned)
    }

    /// Records a forked process. Called while holding the spawn gate, so the
    /// reaper cannot have collected `pid` yet. Also says whether the host
    /// abandoned it meanwhile: the caller then kills it, and it ends as
    /// any process does (its group, code file and entry cleaned up).
    fn register(
        &mut self,
        proc: u64,
        pid: i32,
        pty: Option<OwnedFd>,
    ) -> Option<(oneshot::Receiver<ExitStatus>, bool)> {
        let entry = self.procs.get_mut(&proc)?;
        let (tx, rx) = oneshot::channel();
        entry.pid = Some(pid);
        entry.exit = Some(tx);
        entry.pty = pty;
        self.by_pid.insert(pid, proc);
        Some((rx, entry.abandoned))
    }

    /// Called by the reaper for every child it collects; orphans are ignored.
    pub fn reaped(&mut self, pid: i32, status: ExitStatus) {
        let Some(proc) = self.by_pid.remove(&pid) else {
            return;
        };
        if let Some(entry) = self.procs.get_mut(&proc) {
            entry.reaped = true;
            if let Some(exit) = entry.exit.take() {
                let _ = exit.send(status);
            }
        }
    }

    fn remove(&mut self, proc: u64) {
        if let Some(entry) = self.procs.remove(&proc) {
            if let (Some(pid), false) = (entry.pid, entry.reaped) {
                self.by_pid.remove(&pid);
            }
        }
    }

    pub fn stdin(&self, proc: u64) -> Result<UnboundedSender<StdinJob>, ProcError> {
        let entry = self.procs.get(&proc).ok_or(ProcError::Unknown(proc))?;
        entry.stdin.clone().ok_or(ProcError::NoStdin(proc))
    }

    /// Kills every tracked process group, for shutdown.
    pub fn kill_all(&mut self) {
        if let Some(groups) = guest_groups::get() {
            for proc in self.procs.keys() {
                let _ = groups.kill(*proc);
            }
        }
        for entry in self.procs.values() {
            if let Some(pid) = entry.pid {
                // SAFETY: kill takes plain integers.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                if !entry.reaped {
                    // SAFETY: as above; the pid is still our unreaped child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        self.procs.clear();
        self.by_pid.clear();
    }
}

/// Removes a reservation that never became a running process.
struct Reservation {
    agent: Arc<Agent>,
    proc: u64,
    armed: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.armed {
            self.agent.procs().remove(self.proc);
        }
    }
}

/// Handles a Spawn request: replies Spawned (or an error), then starts the
/// output readers and the supervisor. Output never precedes the Spawned reply.
pub async fn spawn(
    agent: Arc<Agent>,
    id: u64,
    request: SpawnRequest,
    fds: Result<Vec<OwnedFd>, ClaimError>,
    permit: OwnedSemaphorePermit,
) {
    let proc = request.proc;
    match start(&agent, request, fds).await {
        Ok(started) => {
            let _ = agent
                .outbox
                .reply(id, Reply::Spawned { pid: started.pid })
                .await;
            drop(permit);
            started.run(agent, proc);
        }
        Err(e) => {
            let _ = agent.outbox.error(id, e.into()).await;
        }
    }
}

struct Started {
    pid: i32,
    exit: oneshot::Receiver<ExitStatus>,
    stdout: OwnedFd,
    stderr: Option<OwnedFd>,
    code_path: Option<PathBuf>,
}

async fn start(
    agent: &Arc<Agent>,
    request: SpawnRequest,
    fds: Result<Vec<OwnedFd>, ClaimError>,
) -> Result<Started, ProcError> {
    let mut cgroup_fds = fds?;
    validate(&request)?;
    let proc = request.proc;
    let wants_stdin = request.stdin || request.pty.is_some();
    let queue = agent.procs().reserve(proc, wants_stdin)?;
    let mut reservation = Reservation {
        agent: agent.clone(),
        proc,
        armed: true,
    };
    let gate_agent = agent.clone();
    let blocking = tokio::task::spawn_blocking(move || {
        // Held until the pid is registered: the reaper waits for it, so a child
        // that dies at once (or std reaping a failed exec) cannot race it.
        let _gate = gate_agent.spawn_gate.blocking_read();
        // A late spawn waits here (for a pooled thread, or the gate): the
        // host may have given up on it meanwhile.
        if gate_agent.procs().is_abandoned(proc) {
            return Err(ProcError::Abandoned(proc));
        }
        // A microVM's agent keeps the groups itself; a container's are
        // handed over. Made once the id is reserved, so a refused spawn
        // leaves none.
        let guest_group = guest_groups::get().filter(|_| cgroup_fds.is_empty());
        if let Some(groups) = guest_group {
            let root = request.root.as_deref();
            cgroup_fds.push(groups.create(proc, root).map_err(ProcError::GuestGroup)?);
        }
        let mut launched = launch(request, cgroup_fds).inspect_err(|_| {
            if let Some(groups) = guest_group {
                groups.remove(proc);
            }
        })?;
        let pty = launched.pty_dup.take();
        let registered = gate_agent.procs().register(proc, launched.pid, pty);
        let kill = |launched: &crate::launch::Launched| {
            launched.kill();
            // What it may have started already, in a microVM.
            if let Some(groups) = guest_group {
                let _ = groups.kill(proc);
            }
        };
        match registered {
            Some((exit, abandoned)) => {
                if abandoned {
                    kill(&launched);
                }
                Ok((launched, exit))
            }
            None => {
                kill(&launched);
                Err(ProcError::Internal("the agent is shutting down".into()))
            }
        }
    });
    let outcome = match blocking.await {
        Ok(result) => result,
        Err(e) => Err(ProcError::Internal(e.to_string())),
    };
    let (launched, exit) = match outcome {
        Ok(pair) => pair,
        Err(e) => {
            if let Some(queue) = queue {
                // Refuses any stdin already queued for the process that never ran.
                drop(reservation);
                stdin::start(agent.clone(), proc, None, queue);
            }
            return Err(e);
        }
    };
    reservation.armed = false;
    if let Some(queue) = queue {
        stdin::start(agent.clone(), proc, launched.stdin, queue);
    }
    Ok(Started {
        pid: launched.pid,
        exit,
        stdout: launched.stdout,
        stderr: launched.stderr,
        code_path: launched.code_path,
    })
}

impl Started {
    fn run(self, agent: Arc<Agent>, proc: u64) {
        let (stop, stop_rx) = watch::channel(false);
        let mut readers = vec![output::start(
            &agent,
            proc,
            Stream::Stdout,
            self.stdout,
            stop_rx.clone(),
        )];
        if let Some(stderr) = self.stderr {
            readers.push(output::start(&agent, proc, Stream::Stderr, stderr, stop_rx));
        }
        tokio::spawn(supervise(
            agent,
            proc,
            self.exit,
            readers,
            stop,
            self.code_path,
        ));
    }
}

/// Waits for the process to be reaped and its output to drain (or the grace
/// period to pass), then retires it and sends Exit.
async fn supervise(
    agent: Arc<Agent>,
    proc: u64,
    exit: oneshot::Receiver<ExitStatus>,
    mut readers: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    code_path: Option<PathBuf>,
) {
    // An error means the table was cleared for shutdown.
    let Ok(mut status) = exit.await else { return };
    if tokio::time::timeout(EXIT_GRACE, join_all(&mut readers))
        .await
        .is_err()
    {
        let _ = stop.send(true);
        join_all(&mut readers).await;
    }
    if let Some(groups) = guest_groups::get() {
        status.oom_killed = status.signal == Some(libc::SIGKILL) && groups.oom_kills(proc) > 0;
        groups.remove(proc);
    }
    // Out of the table before Exit is sent, so the host may reuse the id at once.
    agent.procs().remove(proc);
    if let Some(path) = code_path {
        codefile::remove(&path);
    }
    let _ = agent
        .outbox
        .send(&AgentMessage::Exit { proc, status })
        .await;
}

/// Awaits the handles in turn, dropping each once finished, so it can be
/// resumed after a timeout without polling a finished handle again.
async fn join_all(handles: &mut Vec<JoinHandle<()>>) {
    while let Some(first) = handles.first_mut() {
        let _ = first.await;
        handles.remove(0);
    }
}

fn validate(request: &SpawnRequest) -> Result<(), ProcError> {
    let invalid = |what: &str| Err(ProcError::Invalid(what.to_owned()));
    match request.argv.first() {
        None => return invalid("argv is empty"),
        Some(program) if program.is_empty() => return invalid("argv[0] is empty"),
        Some(_) => {}
    }
    if request.argv.iter().any(|arg| arg.contains('\0')) {
        return invalid("argv contains a NUL byte");
    }
    for (key, value) in &request.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(ProcError::Invalid(format!(
                "bad environment variable name {key:?}"
            )));
        }
    }
    if request.cwd.contains('\0') {
        return invalid("cwd contains a NUL byte");
    }
    if !request.cwd.is_empty() && !request.cwd.starts_with('/') {
        return invalid("cwd must be absolute");
    }
    Ok(())
}

/// Handles Abandon: a process the host gave up on while it started never
/// runs (or is killed as it registers), one already running is killed
/// with its tree, and one that already ended has what it left running
/// killed through its group, which outlives it (in a microVM).
pub fn abandon(agent: &Agent, proc: u64) -> Result<Reply, ProcError> {
    let state = agent.procs().abandon(proc);
    if state == Abandoned::Starting {
        return Ok(Reply::Ok);
    }
    // A SIGKILL is the tree kill a caller's kill is: it reaches an ended
    // process's group too, while what it left runs there.
    match signal(agent, proc, libc::SIGKILL) {
        Ok(_) if state == Abandoned::NotInTable => {
            // It ran and ended: no spawn of it will come.
            agent.procs().forget_abandoned(proc);
        }
        Ok(_) => {}
        // Ended with nothing left, or its spawn has not come yet.
        Err(ProcError::Unknown(_)) => {}
        Err(e) => return Err(e),
    }
    Ok(Reply::Ok)
}

/// Sends a signal to the process's group (every process leads its own), or to
/// the process alone if the group is gone. A process that has already gone
/// entirely is not an error. In a microVM, SIGKILL goes to the process's
/// cgroup: the whole tree, sessions of its own included.
pub fn signal(agent: &Agent, proc: u64, signal: i32) -> Result<Reply, ProcError> {
    if !(0..=libc::SIGRTMAX()).contains(&signal) {
        return Err(ProcError::BadSignal(signal));
    }
    let found = {
        let table = agent.procs();
        table
            .procs
            .get(&proc)
            .map(|entry| (entry.pid, entry.reaped))
    };
    let Some((pid, reaped)) = found else {
        // An ended process's group outlives it while what it left in the
        // background runs: a kill still ends that (as cgroups do for a
        // container's processes on the host).
        if let (libc::SIGKILL, Some(groups)) = (signal, guest_groups::get()) {
            if groups
                .kill(proc)
                .map_err(|source| ProcError::Signal { proc, source })?
            {
                return Ok(Reply::Ok);
            }
        }
        return Err(ProcError::Unknown(proc));
    };
    let pid = pid.ok_or(ProcError::Starting(proc))?;
    if let (libc::SIGKILL, Some(groups)) = (signal, guest_groups::get()) {
        match groups.kill(proc) {
            Ok(true) => return Ok(Reply::Ok),
            // Gone already: the group kill below finds what is left.
            Ok(false) => {}
            Err(source) => return Err(ProcError::Signal { proc, source }),
        }
    }
    // SAFETY: kill takes plain integers.
    if unsafe { libc::kill(-pid, signal) } == 0 {
        return Ok(Reply::Ok);
    }
    let mut err = io::Error::last_os_error();
    // Once reaped, the bare pid may have been reused; only the group is safe.
    if err.raw_os_error() == Some(libc::ESRCH) && !reaped {
        // SAFETY: as above; the pid is our unreaped child.
        if unsafe { libc::kill(pid, signal) } == 0 {
            return Ok(Reply::Ok);
        }
        err = io::Error::last_os_error();
    }
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(Reply::Ok);
    }
    Err(ProcError::Signal { proc, source: err })
}

pub fn resize(agent: &Agent, proc: u64, size: PtySize) -> Result<Reply, ProcError> {
    let table = agent.procs();
    let entry = table.procs.get(&proc).ok_or(ProcError::Unknown(proc))?;
    if entry.pid.is_none() {
        return Err(ProcError::Starting(proc));
    }
    let master = entry.pty.as_ref().ok_or(ProcError::NoPty(proc))?;
    pty::resize(master.as_fd(), size).map_err(|source| ProcError::Resize { proc, source })?;
    Ok(Reply::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_the_host_abandoned_does_not_run_or_is_killed_as_it_registers() {
        let mut table = ProcTable::default();
        // Before its spawn came: the spawn fails once it does.
        assert_eq!(table.abandon(1), Abandoned::NotInTable);
        assert!(matches!(
            table.reserve(1, false),
            Err(ProcError::Abandoned(1))
        ));
        assert!(table.abandoned.is_empty(), "a late spawn uses up its mark");
        // Reserved but not launched: the launch is skipped.
        table.reserve(2, false).expect("reserve");
        assert!(!table.is_abandoned(2));
        assert_eq!(table.abandon(2), Abandoned::Starting);
        assert!(table.is_abandoned(2));
        // Launched meanwhile: it registers, told to kill it.
        let (_, kill) = table.register(2, 4242, None).expect("register");
        assert!(kill);
        // Control: one nobody abandoned registers to run, and once it runs
        // an abandon says so (the caller kills it).
        table.reserve(3, false).expect("reserve");
        let (_, kill) = table.register(3, 4343, None).expect("register");
        assert!(!kill);
        assert_eq!(table.abandon(3), Abandoned::Running);
        // An id that ran and ended is forgotten once that is known.
        assert_eq!(table.abandon(9), Abandoned::NotInTable);
        table.forget_abandoned(9);
        assert!(table.abandoned.is_empty());
    }

    #[test]
    fn abandoned_ids_not_in_the_table_are_capped_oldest_first() {
        let mut table = ProcTable::default();
        for proc in 1..=(MAX_PROCS as u64 + 5) {
            table.abandon(proc);
        }
        assert_eq!(table.abandoned.len(), MAX_PROCS);
        assert_eq!(table.abandoned.first(), Some(&6));
    }
}
