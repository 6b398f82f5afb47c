//! The supervisor's model of one sandbox: its processes, their output logs,
//! timeouts and exits. In a container, kills act through the per-process
//! cgroup, never by asking the agent, so a hostile or wedged agent cannot
//! keep a process alive; in a microVM the guest's agent kills them (the
//! runtime's [`ProcessControl`] says which).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sandbox_proto::{ErrorKind, ExitStatus, Reply, RequestBody, SpawnRequest, Stream};
use tokio::sync::{mpsc, watch};

use super::config::SupervisorConfig;
use super::link::{AgentLink, LinkEvent};
use super::output::{OutputItem, OutputLog};
use super::protocol::{
    SpawnSpec, SupervisorError, SupervisorErrorKind, SupervisorEvent, SupervisorHealth,
};
use crate::model::{Process, ProcessState};
use crate::runtime::cgroups::SandboxCgroups;
use crate::runtime::paths::SandboxPaths;
use crate::runtime::sandbox::ProcessControl;

/// Bound on agent calls; file chunks and spawns answer in well under this.
pub const AGENT_DEADLINE: Duration = Duration::from_secs(30);
/// Ended processes kept for inspection; older ones are forgotten first.
const MAX_ENDED_PROCESSES: usize = 1024;
/// Processes running at once (the agent enforces the same bound).
const MAX_RUNNING_PROCESSES: usize = 1024;
/// Events kept for a daemon that reconnects after a restart.
const MAX_EVENTS: usize = 4096;

struct Entry {
    info: Process,
    log: OutputLog,
    changed: watch::Sender<u64>,
    oom_at_start: u64,
    killed_by_supervisor: bool,
}

/// One read of a process's output log.
pub struct OutputRead {
    pub items: Vec<OutputItem>,
    /// The final state, once the process has exited (all its output is in `items`).
    pub ended: Option<Process>,
    pub resume_at: [u64; 2],
}

pub struct Supervisor {
    pub config: SupervisorConfig,
    /// The environment every process starts with; replaced when a pooled
    /// sandbox is handed to a caller with its own variables.
    env: Mutex<Vec<(String, String)>>,
    pub init_pid: i32,
    paths: SandboxPaths,
    link: Arc<AgentLink>,
    cgroups: SandboxCgroups,
    procs: Mutex<BTreeMap<u64, Entry>>,
    next_proc: AtomicU64,
    failure: watch::Sender<Option<String>>,
    events: Mutex<std::collections::VecDeque<(u64, SupervisorEvent)>>,
    event_seq: watch::Sender<u64>,
    /// The sandbox's egress proxy and DNS server, once started.
    pub egress: std::sync::OnceLock<Arc<crate::net::proxy::Egress>>,
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn err(kind: SupervisorErrorKind, message: impl Into<String>) -> SupervisorError {
    SupervisorError::new(kind, message)
}

impl Supervisor {
    pub fn new(
        config: SupervisorConfig,
        paths: SandboxPaths,
        init_pid: i32,
        link: Arc<AgentLink>,
        cgroups: SandboxCgroups,
    ) -> Arc<Self> {
        let (failure, _) = watch::channel(None);
        let first_proc = config.spec.kind.next_proc().unwrap_or(1);
        let oom_now = cgroups.oom_kills();
        // A fork's inherited processes: running on, output from here.
        let inherited: BTreeMap<u64, Entry> = config
            .spec
            .kind
            .inherited_processes()
            .iter()
            .map(|p| {
                let mut info = p.clone();
                info.sandbox_id = config.spec.id.clone();
                let entry = Entry {
                    info,
                    log: OutputLog::new(config.output_buffer_bytes),
                    changed: watch::channel(0).0,
                    oom_at_start: oom_now,
                    killed_by_supervisor: false,
                };
                (p.id, entry)
            })
            .collect();
        Arc::new(Self {
            env: Mutex::new(config.spec.env.clone()),
            config,
            paths,
            init_pid,
            link,
            cgroups,
            procs: Mutex::new(inherited),
            next_proc: AtomicU64::new(first_proc),
            failure,
            events: Mutex::new(std::collections::VecDeque::new()),
            event_seq: watch::channel(0).0,
            egress: std::sync::OnceLock::new(),
        })
    }

    /// Puts a new egress policy in force.
    pub fn set_policy(
        &self,
        request: &crate::net::policy::NetworkPolicy,
    ) -> Result<super::protocol::SupervisorReply, SupervisorError> {
        let policy = crate::net::policy::EgressPolicy::from_request(
            request,
            crate::net::policy::DefaultEgress::Block,
        )
        .map_err(|e| err(SupervisorErrorKind::InvalidInput, e.to_string()))?;
        let egress = self.egress.get().ok_or_else(|| {
            err(
                SupervisorErrorKind::Internal,
                "the egress proxy is not running",
            )
        })?;
        egress.set_policy(policy);
        Ok(super::protocol::SupervisorReply::Ok)
    }

    /// Whether the host's cgroups or the guest's agent hold and kill the
    /// sandbox's processes.
    fn process_control(&self) -> ProcessControl {
        self.config.spec.kind.process_control()
    }

    fn procs(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // in a way that matters more than losing the supervisor, so recover.
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checkpoints the sandbox's tree into `images_dir` with CRIU. The
    /// daemon has frozen the sandbox; the tree keeps running afterwards.
    /// A crash-consistent copy of a microVM's scratch disk: the guest is
    /// paused while it is cloned (reflink), so no write is half in it.
    pub async fn clone_disk(
        &self,
        to: std::path::PathBuf,
    ) -> Result<super::protocol::SupervisorReply, SupervisorError> {
        let paths = self.paths.clone();
        let spec = self.config.spec.clone();
        tokio::task::spawn_blocking(move || crate::runtime::clone_disk(&spec, &paths, &to))
            .await
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
            .map_err(|e| match e {
                crate::runtime::RuntimeError::Unsupported(_) => {
                    err(SupervisorErrorKind::InvalidInput, e.to_string())
                }
                e => err(SupervisorErrorKind::Internal, e.to_string()),
            })?;
        Ok(super::protocol::SupervisorReply::Ok)
    }

    pub async fn checkpoint(
        &self,
        criu: std::path::PathBuf,
        freezer: std::path::PathBuf,
        images_dir: std::path::PathBuf,
        work_dir: std::path::PathBuf,
    ) -> Result<super::protocol::SupervisorReply, SupervisorError> {
        let Some(_paused) = self.link.try_pause() else {
            return Err(err(
                SupervisorErrorKind::Conflict,
                "requests to the sandbox are in flight (a file transfer or a process start); snapshot again once they finish",
            ));
        };
        let init_pid = self.init_pid;
        let paths = self.paths.clone();
        let spec = self.config.spec.clone();
        let target = crate::runtime::CheckpointTarget {
            criu,
            freezer,
            images_dir,
            work_dir,
        };
        let checkpoint = tokio::task::spawn_blocking(move || {
            crate::runtime::checkpoint(&spec, &paths, init_pid, &target)
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        let processes = self
            .procs()
            .values()
            .filter(|e| e.info.state == ProcessState::Running)
            .map(|e| e.info.clone())
            .collect();
        Ok(super::protocol::SupervisorReply::Checkpointed {
            checkpoint,
            next_proc: self.next_proc.load(Ordering::Relaxed),
            processes,
        })
    }

    pub fn health(&self) -> SupervisorHealth {
        SupervisorHealth {
            protocol: super::protocol::SUPERVISOR_PROTOCOL_VERSION,
            init_pid: self.init_pid,
            oom_kills: self.cgroups.oom_kills(),
            failure: self.failure.borrow().clone(),
            egress: self.egress.get().map(|e| e.counters()).unwrap_or_default(),
        }
    }

    fn publish(&self, event: SupervisorEvent) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let seq = events.back().map(|(s, _)| s + 1).unwrap_or(1);
        events.push_back((seq, event));
        while events.len() > MAX_EVENTS {
            events.pop_front();
        }
        drop(events);
        self.event_seq.send_replace(seq);
    }

    /// Events after `after`, and a receiver that changes when more arrive.
    pub fn events_after(&self, after: u64) -> Vec<(u64, SupervisorEvent)> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().filter(|(s, _)| *s > after).cloned().collect()
    }

    pub fn event_changes(&self) -> watch::Receiver<u64> {
        self.event_seq.subscribe()
    }

    /// Marks the sandbox dead (agent link closed or init exited).
    pub fn fail(&self, reason: String) {
        let first = self.failure.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(reason.clone());
                true
            } else {
                false
            }
        });
        if first {
            self.publish(SupervisorEvent::Failed(reason));
        }
        let mut procs = self.procs();
        for entry in procs.values_mut() {
            if entry.info.state == ProcessState::Running {
                entry.info.state = ProcessState::Exited;
                entry.info.signal = Some(libc::SIGKILL);
                entry.info.ended_at = Some(now_rfc3339());
                entry.changed.send_modify(|v| *v += 1);
            }
        }
    }

    pub fn set_env(&self, env: Vec<(String, String)>) {
        if let Ok(mut current) = self.env.lock() {
            *current = env;
        }
    }

    /// Kills everything and removes the container; returns what went wrong.
    pub async fn teardown(&self) -> Vec<String> {
        self.fail("the sandbox is being deleted".into());
        let id = self.config.spec.id.clone();
        let cgroups_path = self.config.spec.cgroups_path.clone();
        let paths = self.paths.clone();
        tokio::task::spawn_blocking(move || {
            crate::runtime::destroy_sandbox(&id, &cgroups_path, &paths)
        })
        .await
        .unwrap_or_else(|e| vec![format!("teardown panicked: {e}")])
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Applies the agent's unsolicited messages until the link closes.
    pub async fn consume_events(self: Arc<Self>, mut events: mpsc::Receiver<LinkEvent>) {
        while let Some(event) = events.recv().await {
            match event {
                LinkEvent::Output { proc, stream, data } => {
                    let mut procs = self.procs();
                    if let Some(entry) = procs.get_mut(&proc) {
                        entry.log.append(stream, data);
                        entry.changed.send_modify(|v| *v += 1);
                    }
                }
                LinkEvent::Exit { proc, status } => self.record_exit(proc, status),
                LinkEvent::Closed(reason) => {
                    self.fail(format!("sandbox agent ended: {reason}"));
                    return;
                }
            }
        }
    }

    fn record_exit(&self, proc: u64, status: ExitStatus) {
        let oom_now = self.cgroups.oom_kills();
        {
            let mut procs = self.procs();
            let Some(entry) = procs.get_mut(&proc) else {
                return;
            };
            if entry.info.state == ProcessState::Exited {
                return;
            }
            entry.info.state = ProcessState::Exited;
            entry.info.exit_code = status.code;
            entry.info.signal = status.signal;
            entry.info.ended_at = Some(now_rfc3339());
            entry.info.dropped_bytes = entry.log.dropped_bytes();
            entry.info.oom_killed = status.signal == Some(libc::SIGKILL)
                && !entry.killed_by_supervisor
                && oom_now > entry.oom_at_start;
            entry.changed.send_modify(|v| *v += 1);
            let ended = entry.info.clone();
            self.forget_old(&mut procs);
            drop(procs);
            self.publish(SupervisorEvent::ProcessExited(ended));
        }
        // Descendants the process left running keep its group busy; then the
        // group stays until the sandbox goes.
        self.cgroups.remove_process_group(proc);
    }

    fn forget_old(&self, procs: &mut BTreeMap<u64, Entry>) {
        let ended: Vec<u64> = procs
            .iter()
            .filter(|(_, e)| e.info.state == ProcessState::Exited)
            .map(|(id, _)| *id)
            .collect();
        if ended.len() > MAX_ENDED_PROCESSES {
            for id in &ended[..ended.len() - MAX_ENDED_PROCESSES] {
                procs.remove(id);
            }
        }
    }

    pub async fn spawn(self: &Arc<Self>, spec: SpawnSpec) -> Result<Process, SupervisorError> {
        if let Some(reason) = self.failure() {
            return Err(err(SupervisorErrorKind::AgentGone, reason));
        }
        let proc = self.next_proc.fetch_add(1, Ordering::Relaxed);
        let cgroup_files = match self.process_control() {
            ProcessControl::GuestAgent => Vec::new(),
            ProcessControl::HostCgroups => {
                let cgroups = self.cgroups.clone();
                tokio::task::spawn_blocking(move || cgroups.create_process_group(proc))
                    .await
                    .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
                    .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
            }
        };
        let base = self.env.lock().map(|e| e.clone()).unwrap_or_default();
        let mut env: HashMap<String, String> = base.into_iter().collect();
        env.extend(spec.env.iter().cloned());
        let mut env: Vec<(String, String)> = env.into_iter().collect();
        env.sort();
        let request = SpawnRequest {
            proc,
            argv: spec.argv.clone(),
            code: spec.code,
            env,
            cwd: spec.cwd.unwrap_or_else(|| "/root".to_string()),
            uid: spec.uid,
            gid: spec.gid,
            stdin: spec.stdin,
            pty: spec.pty,
            cgroup_fds: cgroup_files.len() as u8,
        };
        {
            let mut procs = self.procs();
            let running = procs
                .values()
                .filter(|e| e.info.state == ProcessState::Running)
                .count();
            if running >= MAX_RUNNING_PROCESSES {
                return Err(err(
                    SupervisorErrorKind::Conflict,
                    format!("the sandbox already runs {running} processes; wait for some to end"),
                ));
            }
            // Registered before the agent starts it: output may arrive before
            // the reply does.
            procs.insert(
                proc,
                Entry {
                    info: Process {
                        id: proc,
                        sandbox_id: self.config.spec.id.clone(),
                        argv: spec.argv,
                        state: ProcessState::Running,
                        pid: 0,
                        exit_code: None,
                        signal: None,
                        timed_out: false,
                        oom_killed: false,
                        dropped_bytes: 0,
                        started_at: now_rfc3339(),
                        ended_at: None,
                    },
                    log: OutputLog::new(self.config.output_buffer_bytes),
                    changed: watch::channel(0).0,
                    oom_at_start: self.cgroups.oom_kills(),
                    killed_by_supervisor: false,
                },
            );
        }
        let fds: Vec<i32> = cgroup_files
            .iter()
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .collect();
        let reply = self
            .link
            .call(RequestBody::Spawn(request), &fds, AGENT_DEADLINE)
            .await;
        drop(cgroup_files);
        let pid = match reply {
            Ok(Reply::Spawned { pid }) => pid,
            Ok(Reply::Error(e)) => {
                self.procs().remove(&proc);
                self.cgroups.remove_process_group(proc);
                let kind = match e.kind {
                    ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::InvalidInput => {
                        SupervisorErrorKind::InvalidInput
                    }
                    _ => SupervisorErrorKind::Internal,
                };
                return Err(err(kind, e.message));
            }
            Ok(other) => {
                self.procs().remove(&proc);
                return Err(err(
                    SupervisorErrorKind::Internal,
                    format!("agent answered a spawn with {other:?}"),
                ));
            }
            Err(e) => {
                self.procs().remove(&proc);
                return Err(err(SupervisorErrorKind::AgentGone, e.to_string()));
            }
        };
        let info = {
            let mut procs = self.procs();
            let entry = procs
                .get_mut(&proc)
                .ok_or_else(|| err(SupervisorErrorKind::Internal, "process vanished"))?;
            entry.info.pid = pid;
            entry.info.clone()
        };
        if let Some(ms) = spec.timeout_ms {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let mut rx = match this.subscribe(proc) {
                    Some(rx) => rx,
                    None => return,
                };
                let ended = async {
                    while !this.has_exited(proc) {
                        if rx.changed().await.is_err() {
                            break;
                        }
                    }
                };
                if tokio::time::timeout(Duration::from_millis(ms), ended)
                    .await
                    .is_err()
                {
                    if let Some(entry) = this.procs().get_mut(&proc) {
                        entry.info.timed_out = true;
                    }
                    let _ = this.kill(proc).await;
                }
            });
        }
        Ok(info)
    }

    fn subscribe(&self, proc: u64) -> Option<watch::Receiver<u64>> {
        self.procs().get(&proc).map(|e| e.changed.subscribe())
    }

    fn has_exited(&self, proc: u64) -> bool {
        self.procs()
            .get(&proc)
            .is_none_or(|e| e.info.state == ProcessState::Exited)
    }

    pub fn get(&self, proc: u64) -> Result<Process, SupervisorError> {
        self.procs()
            .get(&proc)
            .map(|e| e.info.clone())
            .ok_or_else(|| unknown(proc))
    }

    pub fn list(&self) -> Vec<Process> {
        self.procs().values().map(|e| e.info.clone()).collect()
    }

    /// Kills the process and everything it started, through its cgroup. In
    /// a microVM the guest's agent does it (its process group); an agent
    /// that does not answer fails the sandbox, which ends the VM.
    pub async fn kill(&self, proc: u64) -> Result<(), SupervisorError> {
        {
            let mut procs = self.procs();
            let entry = procs.get_mut(&proc).ok_or_else(|| unknown(proc))?;
            entry.killed_by_supervisor = true;
        }
        if self.process_control() == ProcessControl::GuestAgent {
            let signal = RequestBody::Signal {
                proc,
                signal: libc::SIGKILL,
            };
            return match self.agent(signal).await {
                Ok(Reply::Ok) => Ok(()),
                Ok(Reply::Error(e)) if e.kind == ErrorKind::UnknownProcess => Ok(()),
                Ok(other) => Err(err(
                    SupervisorErrorKind::Internal,
                    format!("the agent answered a kill with {other:?}"),
                )),
                Err(e) => Err(e),
            };
        }
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || cgroups.kill_process_group(proc))
            .await
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))
    }

    /// Waits until the process exits or `timeout` passes; returns its state.
    pub async fn wait(&self, proc: u64, timeout: Duration) -> Result<Process, SupervisorError> {
        let mut rx = self.subscribe(proc).ok_or_else(|| unknown(proc))?;
        let _ = tokio::time::timeout(timeout, async {
            while !self.has_exited(proc) {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        })
        .await;
        self.get(proc)
    }

    /// Output after `offsets`, whether the process has ended, and where to resume.
    pub fn read_output(&self, proc: u64, offsets: [u64; 2]) -> Result<OutputRead, SupervisorError> {
        let procs = self.procs();
        let entry = procs.get(&proc).ok_or_else(|| unknown(proc))?;
        let (items, resume_at) = entry.log.read_from(offsets);
        let ended = (entry.info.state == ProcessState::Exited).then(|| entry.info.clone());
        Ok(OutputRead {
            items,
            ended,
            resume_at,
        })
    }

    pub fn output_changes(&self, proc: u64) -> Result<watch::Receiver<u64>, SupervisorError> {
        self.subscribe(proc).ok_or_else(|| unknown(proc))
    }

    /// Forwards a request to the agent and maps its errors.
    pub async fn agent(&self, body: RequestBody) -> Result<Reply, SupervisorError> {
        if let Some(reason) = self.failure() {
            return Err(err(SupervisorErrorKind::AgentGone, reason));
        }
        self.link
            .call(body, &[], AGENT_DEADLINE)
            .await
            .map_err(|e| err(SupervisorErrorKind::AgentGone, e.to_string()))
    }

    /// A process request to the agent that expects a plain `Ok`.
    pub async fn process_call(&self, proc: u64, body: RequestBody) -> Result<(), SupervisorError> {
        let state = self.get(proc)?.state;
        if state != ProcessState::Running {
            return Err(err(
                SupervisorErrorKind::Conflict,
                format!("process {proc} has already exited"),
            ));
        }
        match self.agent(body).await? {
            Reply::Ok => Ok(()),
            Reply::Error(e) if e.kind == ErrorKind::UnknownProcess => Err(err(
                SupervisorErrorKind::Conflict,
                format!("process {proc} has already exited"),
            )),
            Reply::Error(e) => Err(err(SupervisorErrorKind::InvalidInput, e.message)),
            other => Err(err(
                SupervisorErrorKind::Internal,
                format!("unexpected agent reply {other:?}"),
            )),
        }
    }

    pub fn stream_name(stream: Stream) -> &'static str {
        match stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

fn unknown(proc: u64) -> SupervisorError {
    err(
        SupervisorErrorKind::UnknownProcess,
        format!("no process {proc} in this sandbox"),
    )
}
