//! The supervisor's model of one sandbox: its processes, their output logs,
//! timeouts and exits. In a container, kills act through the per-process
//! cgroup, never by asking the agent, so a hostile or wedged agent cannot
//! keep a process alive; in a microVM the guest's agent kills them (the
//! runtime's [`ProcessControl`] says which). What a pool claim changes
//! (`claim`), a pod's container roots (`pod_roots`) and copies of the
//! sandbox (`checkpoint`) are the same `Supervisor`'s, in files of their
//! own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sandbox_proto::{ErrorKind, ExitStatus, Reply, RequestBody, SpawnRequest, Stream};
use tokio::sync::{mpsc, watch};

use super::config::SupervisorConfig;
use super::link::{AgentLink, LinkError, LinkEvent};
use super::output::{OutputItem, OutputLog};
use super::protocol::{
    SpawnSpec, SupervisorError, SupervisorErrorKind, SupervisorEvent, SupervisorHealth,
};
use crate::model::{Process, ProcessState};
use crate::runtime::cgroups::SandboxCgroups;
use crate::runtime::paths::SandboxPaths;
use crate::runtime::sandbox::ProcessControl;

mod checkpoint;
mod claim;
mod pod_roots;

/// Bound on agent calls; file chunks and spawns answer in well under this.
pub const AGENT_DEADLINE: Duration = Duration::from_secs(30);
/// Bound on a microVM agent's count of its guest's tasks. A stats read
/// waits no longer for it, so neither does this side: a count the agent of
/// a stalled guest (a fork bomb) never gives would otherwise hold the link
/// for [`AGENT_DEADLINE`], and a snapshot, which waits for no request to be
/// in flight, would be refused all that time.
pub const GUEST_COUNT_DEADLINE: Duration = Duration::from_secs(2);
/// A forwarder's set-up in the guest: its agent's connects to the app on
/// the loopback answer at once, or are bounded there by 1.5 s each.
const FORWARD_DEADLINE: Duration = Duration::from_millis(3500);
/// How long a teardown waits, once the sandbox's groups are gone, for the
/// reaper to take its killed init: it has exited by then, so this bounds
/// only a reaper held up.
const INIT_REAP_PATIENCE: Duration = Duration::from_secs(2);
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
    /// The pod container root it was started in, if any.
    root: Option<String>,
    /// Whether that root has limits of its own, so the process's group is
    /// under the root's.
    limited: bool,
}

impl Entry {
    /// The limited root whose group holds this process's, if any.
    fn group_root(&self) -> Option<String> {
        self.root.clone().filter(|_| self.limited)
    }
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
    /// Where a process starts when its request names no cwd: the image
    /// config's `WorkingDir`, else `/root`.
    default_cwd: String,
    pub init_pid: i32,
    paths: SandboxPaths,
    pub(super) link: Arc<AgentLink>,
    cgroups: SandboxCgroups,
    procs: Mutex<BTreeMap<u64, Entry>>,
    next_proc: AtomicU64,
    failure: watch::Sender<Option<String>>,
    /// True once the reaper took the sandbox's init (a microVM's VMM, a
    /// container's init): what a teardown waits for before it answers.
    init_reaped: watch::Sender<bool>,
    events: Mutex<std::collections::VecDeque<(u64, SupervisorEvent)>>,
    event_seq: watch::Sender<u64>,
    /// The sandbox's egress proxy and DNS server, once started.
    pub egress: std::sync::OnceLock<Arc<crate::net::proxy::Egress>>,
    /// Makes the ingress's connections inside the sandbox's namespace
    /// (containers; a microVM's guest is not reached yet).
    pub dialer: std::sync::OnceLock<super::dial::Dialer>,
    /// Held while a pod container root is made or removed, and taken by
    /// teardown: a teardown never sweeps the run directory while an
    /// attach has layers mounted there.
    roots: tokio::sync::Mutex<()>,
    /// Pod container roots with limits of their own (a group under the
    /// sandbox's holding their processes').
    limited_roots: Mutex<std::collections::HashSet<String>>,
    /// Pod container roots with host volumes bound in.
    roots_with_volumes: Mutex<std::collections::HashSet<String>>,
    /// A microVM's pod container roots with limits of their own (a group
    /// its agent keeps): only these have a use of their own to read.
    limited_guest_roots: Mutex<std::collections::HashSet<String>>,
    /// A microVM's empty disk slots, each holding the name of the root
    /// whose disk is in it.
    guest_root_slots: Mutex<Vec<Option<String>>>,
    /// The host volumes a microVM's agent holds copies of, by source, and
    /// each copy's key there: roots naming the same source share one.
    pub(super) guest_volume_keys: Mutex<std::collections::HashMap<std::path::PathBuf, String>>,
    /// What keeps read-only copies following the host.
    pub(super) volume_following: super::volume_copies::Following,
    /// False while a microVM fork's fresh RNG seed and clock are sent but
    /// not yet confirmed: ingress (which reaches the guest's servers
    /// without the link) and snapshots wait for it.
    pub fresh_seed: watch::Sender<bool>,
    /// A pooled sandbox's claim mailbox, once the daemon asked for it.
    mailbox: std::sync::OnceLock<super::mailbox::Mailbox>,
    /// Set as a `HandOver` request arrives: with a claim taken from the
    /// mailbox, what health reports as `claimed`.
    handed_over: std::sync::atomic::AtomicBool,
    /// A pooled container's trust bundle, copied up and held open for a
    /// claim's append, once the daemon asked for it; closed at the claim
    /// ([`Self::release_trust_bundle`]).
    trust_bundle: Mutex<HeldBundle>,
}

/// The trust bundle a pooled container's supervisor holds for a claim.
#[derive(Debug)]
pub(crate) enum HeldBundle {
    None,
    Held(std::fs::File),
    /// The sandbox is the caller's: no bundle is held after.
    Claimed,
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

pub(super) fn err(kind: SupervisorErrorKind, message: impl Into<String>) -> SupervisorError {
    SupervisorError::new(kind, message)
}

pub(super) fn unexpected_guest_reply(what: &str, reply: Reply) -> SupervisorError {
    err(
        SupervisorErrorKind::Internal,
        format!("the guest agent answered {what} with {reply:?}"),
    )
}

/// A call the link could not complete: a slow agent (a sandbox starved by
/// its own limits, a big file) is not a gone one.
pub(super) fn link_failure(e: LinkError) -> SupervisorError {
    let kind = match e {
        LinkError::Timeout(_) | LinkError::NotSent(_) => SupervisorErrorKind::AgentTimeout,
        LinkError::Closed(_) | LinkError::Protocol(_) => SupervisorErrorKind::AgentGone,
    };
    err(kind, e.to_string())
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
        let (init_reaped, _) = watch::channel(false);
        let first_proc = config.spec.kind.next_proc().unwrap_or(1);
        let root_slots = match &config.spec.kind {
            crate::runtime::sandbox::RuntimeSpec::Vm(vm) => vm.root_slots,
            _ => 0,
        };
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
                    root: None,
                    limited: false,
                };
                (p.id, entry)
            })
            .collect();
        Arc::new(Self {
            env: Mutex::new(config.spec.env.clone()),
            default_cwd: config
                .spec
                .default_cwd
                .clone()
                .unwrap_or_else(|| "/root".to_string()),
            config,
            paths,
            init_pid,
            link,
            cgroups,
            procs: Mutex::new(inherited),
            next_proc: AtomicU64::new(first_proc),
            failure,
            init_reaped,
            events: Mutex::new(std::collections::VecDeque::new()),
            event_seq: watch::channel(0).0,
            egress: std::sync::OnceLock::new(),
            dialer: std::sync::OnceLock::new(),
            roots: tokio::sync::Mutex::new(()),
            limited_roots: Mutex::default(),
            limited_guest_roots: Mutex::default(),
            roots_with_volumes: Mutex::default(),
            guest_root_slots: Mutex::new(vec![None; usize::from(root_slots)]),
            guest_volume_keys: Mutex::default(),
            volume_following: Default::default(),
            fresh_seed: watch::channel(true).0,
            mailbox: std::sync::OnceLock::new(),
            handed_over: std::sync::atomic::AtomicBool::new(false),
            trust_bundle: Mutex::new(HeldBundle::None),
        })
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

    pub fn health(&self) -> SupervisorHealth {
        SupervisorHealth {
            protocol: super::protocol::SUPERVISOR_PROTOCOL_VERSION,
            init_pid: self.init_pid,
            oom_kills: self.cgroups.oom_kills(),
            failure: self.failure.borrow().clone(),
            egress: self.egress.get().map(|e| e.counters()).unwrap_or_default(),
            substitutions: self
                .egress
                .get()
                .map(|e| e.substitution_counts())
                .unwrap_or_default(),
            claimed: self.claimed(),
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

    /// Waits (within `budget`) until a microVM fork's guest has taken its
    /// fresh RNG seed and clock; at once for any other sandbox.
    pub async fn await_fresh_seed(&self, budget: Duration) -> Result<(), SupervisorError> {
        if *self.fresh_seed.borrow() {
            return Ok(());
        }
        let (mut seeded, mut failed) = (self.fresh_seed.subscribe(), self.failure.subscribe());
        let fresh = tokio::time::timeout(budget, async {
            tokio::select! {
                seeded = seeded.wait_for(|fresh| *fresh) => seeded.is_ok(),
                _ = failed.wait_for(|failure| failure.is_some()) => false,
            }
        })
        .await;
        match fresh {
            Ok(true) => Ok(()),
            _ => {
                self.ensure_live()?;
                Err(err(
                    SupervisorErrorKind::AgentTimeout,
                    "the microVM fork's guest has not yet confirmed its fresh RNG seed and clock",
                ))
            }
        }
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

    /// The reaper took the sandbox's init (`status` says how it ended), or
    /// ended without it (`None`: nothing of the sandbox is left to reap).
    pub fn init_ended(&self, status: Option<String>) {
        self.init_reaped.send_replace(true);
        if let Some(status) = status {
            self.fail(format!("the sandbox's init ended: {status}"));
        }
    }

    /// Kills everything and removes the container; returns what went wrong.
    pub async fn teardown(&self) -> Vec<String> {
        self.fail("the sandbox is being deleted".into());
        // An attach under way finishes (or fails on the failure set above)
        // before the run directory goes.
        let _roots = self.roots.lock().await;
        let id = self.config.spec.id.clone();
        let cgroups_path = self.config.spec.cgroups_path.clone();
        let paths = self.paths.clone();
        let mut problems = tokio::task::spawn_blocking(move || {
            crate::runtime::destroy_sandbox(&id, &cgroups_path, &paths)
        })
        .await
        .unwrap_or_else(|e| vec![format!("teardown panicked: {e}")]);
        // A killed init leaves its groups as it exits, so they could be
        // removed, but stays a zombie, this process's child, until the
        // reaper takes it (a supervisor exiting first hands it to PID 1).
        // Answered only after: whoever sees the delete done finds none of
        // the sandbox's processes left.
        // Where the teardown failed (a kill refused, a group still busy)
        // the init may still run: that is reported already.
        let mut reaped = self.init_reaped.subscribe();
        if problems.is_empty()
            && tokio::time::timeout(INIT_REAP_PATIENCE, reaped.wait_for(|reaped| *reaped))
                .await
                .is_err()
        {
            problems.push(format!(
                "the sandbox's init (pid {}) was not reaped within {INIT_REAP_PATIENCE:?} of its kill",
                self.init_pid
            ));
        }
        problems
    }

    /// Refuses work on a sandbox that failed (its agent gone, a claim it
    /// could not put in force), naming why.
    pub fn ensure_live(&self) -> Result<(), SupervisorError> {
        match self.failure() {
            Some(reason) => Err(err(SupervisorErrorKind::AgentGone, reason)),
            None => Ok(()),
        }
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
            // A microVM's agent reads its guest's group; a container's OOM
            // kill shows in the sandbox's host group.
            entry.info.oom_killed = status.signal == Some(libc::SIGKILL)
                && !entry.killed_by_supervisor
                && (status.oom_killed || oom_now > entry.oom_at_start);
            entry.changed.send_modify(|v| *v += 1);
            let ended = entry.info.clone();
            let group_root = entry.group_root();
            self.forget_old(&mut procs);
            drop(procs);
            self.publish(SupervisorEvent::ProcessExited(ended));
            // Descendants the process left running keep its group busy;
            // then the group stays until the sandbox (or its root) goes.
            self.cgroups
                .remove_process_group(proc, group_root.as_deref());
        }
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
        self.ensure_live()?;
        let confined = !spec.groups.is_empty() || spec.confinement != Default::default();
        let agent_version = self.link.agent_version();
        if confined && agent_version < sandbox_proto::CONFINEMENT_PROTOCOL_VERSION {
            // It would read past them and run the process without them.
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                format!("this sandbox's agent speaks protocol {agent_version} (restored from a snapshot an older sandboxd made), which cannot apply supplementary groups, capabilities, a seccomp profile or an OOM score; start the process without them, or use a sandbox made by this build"),
            ));
        }
        let proc = self.next_proc.fetch_add(1, Ordering::Relaxed);
        // A process in a pod container root is placed under the roots lock:
        // a detach running at once either sees its entry (and kills it) or
        // has removed the root's group first (and this spawn fails), never
        // a group remade without the root's limits.
        let roots_held = match &spec.root {
            Some(_) => Some(self.roots.lock().await),
            None => None,
        };
        let group_root = spec
            .root
            .clone()
            .filter(|root| self.limited_roots().contains(root));
        let cgroup_files = match self.process_control() {
            ProcessControl::GuestAgent => Vec::new(),
            ProcessControl::HostCgroups => {
                let (cgroups, group_root) = (self.cgroups.clone(), group_root.clone());
                tokio::task::spawn_blocking(move || {
                    cgroups.create_process_group(proc, group_root.as_deref())
                })
                .await
                .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
                .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
            }
        };
        let base = self.env.lock().map(|e| e.clone()).unwrap_or_default();
        let env = process_env(&base, &spec.env);
        let request = SpawnRequest {
            proc,
            argv: spec.argv.clone(),
            code: spec.code,
            env,
            cwd: spec.cwd.unwrap_or_else(|| self.default_cwd.clone()),
            uid: spec.uid,
            gid: spec.gid,
            stdin: spec.stdin,
            pty: spec.pty,
            cgroup_fds: cgroup_files.len() as u8,
            root: spec.root.clone(),
            groups: spec.groups,
            confinement: spec.confinement,
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
                    root: spec.root,
                    limited: group_root.is_some(),
                },
            );
        }
        drop(roots_held);
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
                self.cgroups
                    .remove_process_group(proc, group_root.as_deref());
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
                // Only a spawn the agent received can start late.
                let sent = matches!(e, LinkError::Timeout(_));
                self.abandon_spawn(proc, group_root, sent).await;
                return Err(link_failure(e));
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
        let group_root = {
            let mut procs = self.procs();
            let entry = procs.get_mut(&proc).ok_or_else(|| unknown(proc))?;
            entry.killed_by_supervisor = true;
            entry.group_root()
        };
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
        tokio::task::spawn_blocking(move || cgroups.kill_process_group(proc, group_root.as_deref()))
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
        self.agent_within(body, AGENT_DEADLINE).await
    }

    async fn agent_within(
        &self,
        body: RequestBody,
        deadline: Duration,
    ) -> Result<Reply, SupervisorError> {
        self.ensure_live()?;
        self.link
            .call(body, &[], deadline)
            .await
            .map_err(link_failure)
    }

    /// A request only a microVM's agent serves, about its guest: refused
    /// for a container, whose cgroups and loopback the host handles. The
    /// agent's `NotFound` becomes an error of kind `not_found` with the
    /// agent's message, where given; any other refusal is an internal error
    /// about `what`.
    async fn guest_call(
        &self,
        what: &str,
        body: RequestBody,
        deadline: Duration,
        not_found: Option<SupervisorErrorKind>,
    ) -> Result<Reply, SupervisorError> {
        if self.process_control() == ProcessControl::HostCgroups {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                format!("{what} is a microVM guest's, which its agent serves; a container's is the host's, which the daemon handles"),
            ));
        }
        match self.agent_within(body, deadline).await? {
            Reply::Error(e) => match not_found {
                Some(kind) if e.kind == ErrorKind::NotFound => Err(err(kind, e.message)),
                _ => Err(err(
                    SupervisorErrorKind::Internal,
                    format!("the guest agent refused {what}: {}", e.message),
                )),
            },
            reply => Ok(reply),
        }
    }

    /// A forwarder in a microVM's guest to `port` of its loopback, for one
    /// connection from the ingress (`RequestBody::ForwardLoopback`): the
    /// guest's port to dial.
    /// `Refused` when nothing listens on the loopback either.
    pub async fn forward_guest_loopback(
        &self,
        port: u16,
        from_port: u16,
    ) -> Result<u16, SupervisorError> {
        let what = format!("a forwarder to port {port} of the guest's loopback");
        let request = RequestBody::ForwardLoopback { port, from_port };
        let refused = Some(SupervisorErrorKind::Refused);
        match self
            .guest_call(&what, request, FORWARD_DEADLINE, refused)
            .await?
        {
            Reply::Forwarding { port } => Ok(port),
            other => Err(unexpected_guest_reply(&what, other)),
        }
    }

    /// A microVM's pids limit, kept by its agent on the guest's cgroup
    /// over every process it starts.
    pub async fn limit_guest_pids(&self, max: u64) -> Result<(), SupervisorError> {
        let what = format!("the pids limit {max}");
        match self
            .guest_call(&what, RequestBody::LimitPids { max }, AGENT_DEADLINE, None)
            .await?
        {
            Reply::Ok => Ok(()),
            other => Err(unexpected_guest_reply(&what, other)),
        }
    }

    /// The tasks a microVM's guest processes hold, counted by its agent.
    pub async fn guest_pids(&self) -> Result<u64, SupervisorError> {
        let what = "the task count";
        match self
            .guest_call(what, RequestBody::GuestPids, GUEST_COUNT_DEADLINE, None)
            .await?
        {
            Reply::Pids { current } => Ok(current),
            other => Err(unexpected_guest_reply(what, other)),
        }
    }

    /// After a spawn the agent did not answer: it may still start the
    /// process, which nothing here would list or end. Whatever is in its
    /// group is killed and the group removed, so a late child's move into it
    /// fails and it never execs. A microVM's groups are its guest's: its
    /// agent is told to abandon the process (kill it, or fail its spawn
    /// when that comes), without holding up the caller's error. (A memory
    /// snapshot taken before the agent hears of it would keep the late
    /// process in every fork: the abandon waits behind the checkpoint's
    /// hold on the link, like any request.) A spawn never `sent` only has
    /// its host group removed: no agent can start it.
    async fn abandon_spawn(&self, proc: u64, group_root: Option<String>, sent: bool) {
        if self.process_control() != ProcessControl::HostCgroups {
            if !sent {
                return;
            }
            let link = Arc::clone(&self.link);
            tokio::spawn(async move {
                let abandoned = link
                    .call(RequestBody::Abandon { proc }, &[], AGENT_DEADLINE)
                    .await;
                if !matches!(abandoned, Ok(Reply::Ok)) {
                    tracing::warn!(
                        "process {proc}, whose spawn went unanswered, could not be abandoned in the guest ({abandoned:?}); it may run unlisted until the sandbox ends"
                    );
                }
            });
            return;
        }
        let cgroups = self.cgroups.clone();
        let abandoned = tokio::task::spawn_blocking(move || {
            let killed = cgroups.kill_process_group(proc, group_root.as_deref());
            cgroups.remove_process_group(proc, group_root.as_deref());
            killed
        })
        .await;
        match abandoned {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("process {proc}'s group after its spawn failed: {e}"),
            Err(e) => tracing::warn!("process {proc}'s group after its spawn failed: {e}"),
        }
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

/// A process's whole environment: the sandbox's, overridden by the
/// process's own; a name given twice counts once, as its last value.
pub fn process_env(
    sandbox: &[(String, String)],
    own: &[(String, String)],
) -> Vec<(String, String)> {
    let env: BTreeMap<&String, &String> = sandbox.iter().chain(own).map(|(k, v)| (k, v)).collect();
    env.into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn unknown(proc: u64) -> SupervisorError {
    err(
        SupervisorErrorKind::UnknownProcess,
        format!("no process {proc} in this sandbox"),
    )
}

/// The process model against a fake agent that speaks the real protocol on
/// a socketpair (the same codec and link as a sandbox's), with the
/// sandbox's cgroups in a temp directory standing in for cgroupfs. No root,
/// no sandbox, no host cgroup touched.
#[cfg(test)]
pub(super) mod tests {
    use std::os::fd::OwnedFd;
    use std::path::PathBuf;

    use sandbox_proto::{
        AgentError, AgentMessage, FrameDecoder, GuestRootUsage, Request, PROTOCOL_VERSION,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::*;
    use crate::runtime::cgroups::Layout;
    use crate::runtime::sandbox::{
        AgentStart, Checkpoint, RestoreSpec, RuntimeSpec, SandboxSpec, VmSpec,
    };

    const ID: &str = "sb-test";
    /// Bound on every wait below, so a regression fails instead of hanging.
    const BOUND: Duration = Duration::from_secs(10);

    /// The agent's end of the link: reads requests, sends what a real agent
    /// would send (see agent/), when the test says so.
    pub(crate) struct FakeAgent {
        stream: UnixStream,
        decoder: FrameDecoder,
    }

    /// The host's end of a link and a fake agent at the other.
    fn fake_agent_pair() -> (OwnedFd, FakeAgent) {
        let (host, agent_end) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        agent_end.set_nonblocking(true).expect("nonblocking");
        let agent = FakeAgent {
            stream: UnixStream::from_std(agent_end).expect("agent stream"),
            decoder: FrameDecoder::new(),
        };
        (OwnedFd::from(host), agent)
    }

    /// A link to a fake agent that said its hello long ago (as a restored
    /// one), and the link's event receiver, kept so that events can flow.
    pub(crate) async fn linked_fake_agent() -> (
        Arc<AgentLink>,
        tokio::sync::mpsc::Receiver<super::super::link::LinkEvent>,
        FakeAgent,
    ) {
        let (host, agent) = fake_agent_pair();
        let (link, events) = AgentLink::establish(host, None).await.expect("link");
        (link, events, agent)
    }

    impl FakeAgent {
        async fn send(&mut self, message: AgentMessage) {
            let frame = sandbox_proto::encode(&message).expect("encode");
            self.stream.write_all(&frame).await.expect("agent write");
        }

        /// The next request the supervisor sent. Descriptors passed with a
        /// spawn are discarded by the plain read (the kernel closes them).
        pub(crate) async fn request(&mut self) -> Request {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                if let Some(frame) = self.decoder.next_frame().expect("frame") {
                    return sandbox_proto::decode(&frame).expect("request");
                }
                let n = tokio::time::timeout(BOUND, self.stream.read(&mut buf))
                    .await
                    .expect("a request within the bound")
                    .expect("agent read");
                assert_ne!(n, 0, "the supervisor closed the link");
                self.decoder.push(&buf[..n]);
            }
        }

        pub(crate) async fn reply(&mut self, id: u64, reply: Reply) {
            self.send(AgentMessage::Reply { id, reply }).await;
        }

        async fn output(&mut self, proc: u64, stream: Stream, data: &[u8]) {
            let data = data.to_vec();
            self.send(AgentMessage::Output { proc, stream, data }).await;
        }

        async fn exit(&mut self, proc: u64, code: Option<i32>, signal: Option<i32>) {
            let status = ExitStatus {
                code,
                signal,
                oom_killed: false,
            };
            self.send(AgentMessage::Exit { proc, status }).await;
        }
    }

    fn config(kind: RuntimeSpec) -> SupervisorConfig {
        SupervisorConfig {
            spec: SandboxSpec {
                id: ID.into(),
                hostname: "sandbox".into(),
                image_rootfs: PathBuf::from("/nonexistent/rootfs"),
                image_layers: Vec::new(),
                layer_dir: PathBuf::from("/nonexistent/layer"),
                agent_path: PathBuf::from("/nonexistent/agent"),
                cgroups_path: format!("/sandboxd/{ID}"),
                cpu: 1.0,
                cpu_shares: None,
                memory_bytes: 256 << 20,
                pids: 256,
                id_map_base: 100_000,
                id_map_size: 65_536,
                shm_bytes: 64 << 20,
                nofile: 1024,
                default_cwd: None,
                env: vec![
                    ("PATH".into(), "/usr/bin:/bin".into()),
                    ("LANG".into(), "C".into()),
                ],
                ready_timeout_ms: 5_000,
                devices: Default::default(),
                kind,
                netns_ready: false,
                host_owned_image: false,
                joined_netns: None,
                volumes: Vec::new(),
            },
            output_buffer_bytes: 1 << 20,
            network: Default::default(),
            upstream: Default::default(),
            egress_limits: Default::default(),
            warm_interpreter: None,
        }
    }

    fn vm() -> RuntimeSpec {
        RuntimeSpec::Vm(VmSpec {
            vmm_path: PathBuf::from("/nonexistent/vmm"),
            kernel: PathBuf::from("/nonexistent/vmlinux"),
            cmdline: String::new(),
            vcpus: 1,
            mem_mib: 256,
            overhead_bytes: 0,
            base_disk: PathBuf::from("/nonexistent/base.ext4"),
            agent_disk: PathBuf::from("/nonexistent/agent.ext4"),
            scratch_bytes: 0,
            restore: None,
            scratch_from: None,
            uid: 0,
            root_slots: 0,
        })
    }

    fn process(id: u64, sandbox_id: &str, pid: i32) -> Process {
        Process {
            id,
            sandbox_id: sandbox_id.into(),
            argv: vec!["sleep".into(), "1000".into()],
            state: ProcessState::Running,
            pid,
            exit_code: None,
            signal: None,
            timed_out: false,
            oom_killed: false,
            dropped_bytes: 0,
            started_at: "2026-01-01T00:00:00.000Z".into(),
            ended_at: None,
        }
    }

    fn spawn_spec(argv: &[&str]) -> SpawnSpec {
        SpawnSpec {
            groups: Vec::new(),
            confinement: Default::default(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            code: None,
            env: Vec::new(),
            cwd: None,
            uid: 0,
            gid: 0,
            stdin: false,
            pty: None,
            timeout_ms: None,
            root: None,
        }
    }

    struct Harness {
        sup: Arc<Supervisor>,
        agent: FakeAgent,
        /// The sandbox's (v2) cgroup, a plain directory.
        group: PathBuf,
        _dir: tempfile::TempDir,
    }

    async fn harness(kind: RuntimeSpec) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = config(kind);
        let (host, mut agent) = fake_agent_pair();
        // As the supervisor's start does: a restored agent said hello to
        // the source's supervisor long ago.
        let hello = match config.spec.kind.agent_start() {
            AgentStart::Restored => None,
            AgentStart::Fresh | AgentStart::RestoredVm => {
                let version = PROTOCOL_VERSION;
                agent.send(AgentMessage::Hello { version }).await;
                Some(BOUND)
            }
        };
        let (link, events) = AgentLink::establish(host, hello).await.expect("link");
        let cgroups = SandboxCgroups::under(dir.path(), Layout::V2, &config.spec.cgroups_path);
        let group = dir.path().join("sandboxd").join(ID);
        std::fs::create_dir_all(&group).expect("sandbox group");
        let paths = SandboxPaths::new(&dir.path().join("run"), ID);
        let sup = Supervisor::new(config, paths, 4242, link, cgroups);
        tokio::spawn(Arc::clone(&sup).consume_events(events));
        Harness {
            sup,
            agent,
            group,
            _dir: dir,
        }
    }

    impl Harness {
        /// Sets the OOM kills the sandbox's memory controller reports.
        fn set_oom_kills(&self, n: u64) {
            let events = format!("low 0\nhigh 0\nmax 0\noom {n}\noom_kill {n}\n");
            std::fs::write(self.group.join("memory.events"), events).expect("memory.events");
        }

        /// Starts a process, the agent answering its spawn with `reply`;
        /// returns the supervisor's answer and the request the agent got.
        async fn spawn_answered(
            &mut self,
            spec: SpawnSpec,
            reply: Reply,
        ) -> (Result<Process, SupervisorError>, SpawnRequest) {
            // What the kernel does on mkdir in cgroupfs: the next process's
            // group comes with its `cgroup.procs`.
            let next = self.sup.next_proc.load(Ordering::Relaxed);
            let proc_group = self.group.join(format!("p{next}"));
            std::fs::create_dir_all(&proc_group).expect("process group");
            std::fs::write(proc_group.join("cgroup.procs"), "").expect("cgroup.procs");
            let Harness { sup, agent, .. } = self;
            let answer = async {
                let request = agent.request().await;
                let RequestBody::Spawn(spawn) = request.body else {
                    panic!("expected a spawn, got {:?}", request.body);
                };
                agent.reply(request.id, reply).await;
                spawn
            };
            tokio::join!(sup.spawn(spec), answer)
        }

        async fn spawn(&mut self, spec: SpawnSpec, pid: i32) -> (Process, SpawnRequest) {
            let (result, request) = self.spawn_answered(spec, Reply::Spawned { pid }).await;
            (result.expect("spawn"), request)
        }

        /// Waits for the process to end (the agent's exit has been applied).
        async fn ended(&self, proc: u64) -> Process {
            let p = self.sup.wait(proc, BOUND).await.expect("wait");
            assert_eq!(
                p.state,
                ProcessState::Exited,
                "process {proc} ended in time"
            );
            p
        }
    }

    /// Every event once `n` have been published.
    async fn events(sup: &Supervisor, n: u64) -> Vec<(u64, SupervisorEvent)> {
        let mut changes = sup.event_changes();
        tokio::time::timeout(BOUND, async {
            while *changes.borrow_and_update() < n {
                changes.changed().await.expect("event sender lives");
            }
        })
        .await
        .expect("events within the bound");
        sup.events_after(0)
    }

    fn kind_of<T>(r: Result<T, SupervisorError>) -> SupervisorErrorKind {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.kind,
        }
    }

    #[tokio::test]
    async fn a_spawn_records_a_running_process_with_the_next_id() {
        let mut h = harness(RuntimeSpec::Container).await;
        let mut spec = spawn_spec(&["python3", "-c", "pass"]);
        spec.env = vec![("LANG".into(), "C.UTF-8".into()), ("A".into(), "1".into())];
        let (first, request) = h.spawn(spec, 100).await;
        assert_eq!(first.id, 1);
        assert_eq!(first.sandbox_id, ID);
        assert_eq!(first.argv, ["python3", "-c", "pass"]);
        assert_eq!(first.state, ProcessState::Running);
        assert_eq!(first.pid, 100);
        assert_eq!(
            (first.exit_code, first.signal, &first.ended_at),
            (None, None, &None)
        );
        // The agent is told the id, the sandbox's environment overridden by
        // the spawn's (sorted), the default cwd, and one cgroup.procs
        // descriptor per hierarchy (one on v2).
        assert_eq!(request.proc, 1);
        assert_eq!(
            request.env,
            [
                ("A".to_string(), "1".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ]
        );
        assert_eq!(request.cwd, "/root");
        assert_eq!(request.cgroup_fds, 1);

        // A pooled sandbox handed over with its own variables.
        h.sup.set_env(vec![("X".into(), "y".into())]);
        let (second, request) = h.spawn(spawn_spec(&["true"]), 101).await;
        assert_eq!(second.id, 2);
        assert_eq!(request.env, [("X".to_string(), "y".to_string())]);

        // A refused spawn leaves no process behind; its id is not reused.
        let refusal = Reply::Error(AgentError::new(ErrorKind::NotFound, "no such program"));
        let (refused, request) = h.spawn_answered(spawn_spec(&["nope"]), refusal).await;
        assert_eq!(request.proc, 3);
        assert_eq!(kind_of(refused), SupervisorErrorKind::InvalidInput);
        assert_eq!(kind_of(h.sup.get(3)), SupervisorErrorKind::UnknownProcess);
        let (fourth, _) = h.spawn(spawn_spec(&["true"]), 102).await;
        assert_eq!(fourth.id, 4);

        let listed: Vec<(u64, i32)> = h.sup.list().iter().map(|p| (p.id, p.pid)).collect();
        assert_eq!(listed, [(1, 100), (2, 101), (4, 102)]);
        assert!(h.sup.events_after(0).is_empty());
    }

    /// A spawn (process `next`) whose request the agent reads and never
    /// answers: paused time runs out the deadline at once, and the process
    /// is not listed.
    async fn spawn_unanswered(h: &mut Harness, next: u64) {
        let Harness { sup, agent, .. } = h;
        let (late, request) = tokio::join!(sup.spawn(spawn_spec(&["sleep", "9"])), agent.request());
        assert!(matches!(request.body, RequestBody::Spawn(_)));
        assert_eq!(kind_of(late), SupervisorErrorKind::AgentTimeout);
        assert_eq!(
            kind_of(h.sup.get(next)),
            SupervisorErrorKind::UnknownProcess
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_spawn_the_agent_never_answers_is_late_and_its_group_is_killed() {
        let mut h = harness(RuntimeSpec::Container).await;
        let next = h.sup.next_proc.load(Ordering::Relaxed);
        let proc_group = h.group.join(format!("p{next}"));
        std::fs::create_dir_all(&proc_group).expect("process group");
        std::fs::write(proc_group.join("cgroup.procs"), "").expect("cgroup.procs");
        spawn_unanswered(&mut h, next).await;
        assert_eq!(
            std::fs::read_to_string(proc_group.join("cgroup.kill"))
                .ok()
                .as_deref(),
            Some("1"),
            "the group of a process the agent may still start is killed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_microvm_spawn_the_agent_never_answers_is_abandoned_in_the_guest() {
        let mut h = harness(vm()).await;
        let next = h.sup.next_proc.load(Ordering::Relaxed);
        spawn_unanswered(&mut h, next).await;
        // No host cgroup reaches into the guest: its agent is told.
        let abandon = h.agent.request().await;
        assert_eq!(abandon.body, RequestBody::Abandon { proc: next });
        h.agent.reply(abandon.id, Reply::Ok).await;
    }

    #[tokio::test]
    async fn a_vm_roots_use_is_its_agents_answer_and_a_root_without_a_group_is_unknown() {
        let mut h = harness(vm()).await;
        let Harness { sup, agent, .. } = &mut h;
        let usage = GuestRootUsage {
            cpu_usec: 1500,
            memory_bytes: 4096,
            memory_max: Some(32 << 20),
            pids: 2,
            pids_max: None,
            oom_kills: 1,
        };
        let answer = async {
            let request = agent.request().await;
            assert_eq!(request.body, RequestBody::RootUsage { name: "web".into() });
            agent.reply(request.id, Reply::RootUsage(usage)).await;
        };
        // As a mount of a root with limits leaves it.
        sup.limited_guest_roots().insert("web".into());
        let (read, ()) = tokio::join!(sup.guest_root_usage("web"), answer);
        assert_eq!(read.expect("the agent's answer"), usage);
        // A root without limits is answered without the agent (a request
        // to it would wait here for an answer that never comes).
        let plain = sup.guest_root_usage("plain").await;
        assert_eq!(kind_of(plain), SupervisorErrorKind::UnknownRoot);
        // The agent knowing no group for it says the same.
        let refuse = async {
            let request = agent.request().await;
            let missing = AgentError::new(ErrorKind::NotFound, "no group of its own");
            agent.reply(request.id, Reply::Error(missing)).await;
        };
        let (read, ()) = tokio::join!(sup.guest_root_usage("web"), refuse);
        assert_eq!(kind_of(read), SupervisorErrorKind::UnknownRoot);
    }

    #[tokio::test(start_paused = true)]
    async fn a_guest_count_the_agent_never_gives_frees_the_link_for_a_snapshot_soon() {
        let mut h = harness(vm()).await;
        let begun = tokio::time::Instant::now();
        let Harness { sup, agent, .. } = &mut h;
        let (count, request) = tokio::join!(sup.guest_pids(), agent.request());
        assert_eq!(request.body, RequestBody::GuestPids);
        assert_eq!(kind_of(count), SupervisorErrorKind::AgentTimeout);
        let waited = begun.elapsed();
        assert!(
            (GUEST_COUNT_DEADLINE..AGENT_DEADLINE).contains(&waited),
            "gave up after {waited:?}"
        );
        assert!(
            h.sup.link.try_pause().is_some(),
            "a checkpoint can pause the link once the count gave up"
        );
    }

    #[tokio::test]
    async fn output_lands_in_arrival_order_and_an_exit_ends_the_process_once() {
        let mut h = harness(RuntimeSpec::Container).await;
        let (p, _) = h.spawn(spawn_spec(&["sh", "-c", "..."]), 7).await;
        let (other, _) = h.spawn(spawn_spec(&["true"]), 8).await;
        h.agent.output(p.id, Stream::Stdout, b"ab").await;
        h.agent.output(p.id, Stream::Stderr, b"E").await;
        h.agent.output(other.id, Stream::Stdout, b"not mine").await;
        h.agent.output(p.id, Stream::Stdout, b"cd").await;
        h.agent.exit(p.id, Some(3), None).await;

        let ended = h.ended(p.id).await;
        assert_eq!((ended.exit_code, ended.signal), (Some(3), None));
        assert!(ended.ended_at.is_some());
        assert!(!ended.oom_killed && !ended.timed_out);
        assert_eq!(ended.dropped_bytes, 0);

        let read = h.sup.read_output(p.id, [0, 0]).expect("read");
        let data = |stream, offset, d: &[u8]| OutputItem::Data {
            stream,
            offset,
            data: d.to_vec(),
        };
        assert_eq!(
            read.items,
            [
                data(Stream::Stdout, 0, b"ab"),
                data(Stream::Stderr, 0, b"E"),
                data(Stream::Stdout, 2, b"cd"),
            ]
        );
        assert_eq!(read.resume_at, [4, 1]);
        assert_eq!(read.ended.as_ref(), Some(&ended));
        // A reader resuming where it left off gets only what is new.
        let resumed = h.sup.read_output(p.id, [2, 1]).expect("read");
        assert_eq!(resumed.items, [data(Stream::Stdout, 2, b"cd")]);

        // A second exit for the same process changes nothing and publishes
        // nothing: the next event is the other process's.
        h.agent.exit(p.id, None, Some(libc::SIGKILL)).await;
        h.agent.exit(other.id, Some(0), None).await;
        let events = events(&h.sup, 2).await;
        let other_ended = h.ended(other.id).await;
        assert_eq!(
            events,
            [
                (1, SupervisorEvent::ProcessExited(ended.clone())),
                (2, SupervisorEvent::ProcessExited(other_ended)),
            ]
        );
        assert_eq!(h.sup.get(p.id).expect("get"), ended);
    }

    #[tokio::test]
    async fn a_sigkill_is_an_oom_kill_only_when_the_counter_rose_and_the_supervisor_did_not_kill() {
        let mut h = harness(RuntimeSpec::Container).await;
        h.set_oom_kills(0);
        let (by_oom, _) = h.spawn(spawn_spec(&["hog"]), 10).await;
        let (by_kill, _) = h.spawn(spawn_spec(&["sleep", "9"]), 11).await;
        h.set_oom_kills(1);
        let (after_oom, _) = h.spawn(spawn_spec(&["sleep", "9"]), 12).await;
        assert_eq!(h.sup.health().oom_kills, 1);

        // A container's kill goes through the process's cgroup, not the
        // agent: the next request the agent sees is the spawn below.
        h.sup.kill(by_kill.id).await.expect("kill");
        let kill_file = h.group.join(format!("p{}", by_kill.id)).join("cgroup.kill");
        assert_eq!(
            std::fs::read_to_string(kill_file).expect("cgroup.kill"),
            "1"
        );
        let (last, _) = h.spawn(spawn_spec(&["true"]), 13).await;

        for p in [&by_oom, &by_kill, &after_oom] {
            h.agent.exit(p.id, None, Some(libc::SIGKILL)).await;
        }
        h.agent.exit(last.id, Some(137), None).await;
        let mut oom = Vec::new();
        for p in [&by_oom, &by_kill, &after_oom, &last] {
            oom.push(h.ended(p.id).await.oom_killed);
        }
        assert_eq!(oom, [true, false, false, false]);
    }

    #[tokio::test]
    async fn a_microvm_timeout_kills_through_the_agent_and_marks_the_process() {
        let mut h = harness(vm()).await;
        h.set_oom_kills(0);
        let mut spec = spawn_spec(&["sleep", "1000"]);
        spec.timeout_ms = Some(20);
        let (p, request) = h.spawn(spec, 55).await;
        // No host cgroup holds a guest's process.
        assert_eq!(request.cgroup_fds, 0);
        h.set_oom_kills(1);

        // The timeout's kill: a SIGKILL asked of the guest's agent.
        let kill = h.agent.request().await;
        assert_eq!(
            kill.body,
            RequestBody::Signal {
                proc: p.id,
                signal: libc::SIGKILL
            }
        );
        h.agent.reply(kill.id, Reply::Ok).await;
        h.agent.exit(p.id, None, Some(libc::SIGKILL)).await;
        let ended = h.ended(p.id).await;
        assert!(ended.timed_out);
        assert_eq!((ended.exit_code, ended.signal), (None, Some(libc::SIGKILL)));
        // The supervisor killed it, so the risen counter is not its doing.
        assert!(!ended.oom_killed);

        // A process the guest already reaped is killed all the same.
        let (q, _) = h.spawn(spawn_spec(&["true"]), 56).await;
        let Harness { sup, agent, .. } = &mut h;
        let answer = async {
            let request = agent.request().await;
            let gone = AgentError::new(ErrorKind::UnknownProcess, "no such process");
            agent.reply(request.id, Reply::Error(gone)).await;
        };
        let (killed, ()) = tokio::join!(sup.kill(q.id), answer);
        killed.expect("a kill of a process the agent no longer knows");
    }

    #[tokio::test]
    async fn unknown_process_ids_are_refused_and_ignored() {
        let mut h = harness(RuntimeSpec::Container).await;
        let sup = &h.sup;
        assert_eq!(kind_of(sup.get(99)), SupervisorErrorKind::UnknownProcess);
        assert_eq!(
            kind_of(sup.kill(99).await),
            SupervisorErrorKind::UnknownProcess
        );
        assert_eq!(
            kind_of(sup.wait(99, BOUND).await),
            SupervisorErrorKind::UnknownProcess
        );
        let read = sup.read_output(99, [0, 0]).map(|_| ());
        assert_eq!(kind_of(read), SupervisorErrorKind::UnknownProcess);
        assert_eq!(
            kind_of(sup.output_changes(99)),
            SupervisorErrorKind::UnknownProcess
        );
        let close = RequestBody::CloseStdin { proc: 99 };
        assert_eq!(
            kind_of(sup.process_call(99, close).await),
            SupervisorErrorKind::UnknownProcess
        );

        // The agent's messages about processes the supervisor does not know
        // are dropped: neither a process nor an event comes of them.
        h.agent.output(99, Stream::Stdout, b"who?").await;
        h.agent.exit(99, Some(0), None).await;
        let (p, _) = h.spawn(spawn_spec(&["true"]), 20).await;
        h.agent.exit(p.id, Some(0), None).await;
        let events = events(&h.sup, 1).await;
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0].1, SupervisorEvent::ProcessExited(e) if e.id == p.id));
        assert_eq!(kind_of(h.sup.get(99)), SupervisorErrorKind::UnknownProcess);
        assert_eq!(h.sup.list().len(), 1);

        // An ended process takes no more requests.
        let close = RequestBody::CloseStdin { proc: p.id };
        assert_eq!(
            kind_of(h.sup.process_call(p.id, close).await),
            SupervisorErrorKind::Conflict
        );
    }

    #[test]
    fn a_slow_agent_is_told_apart_from_a_gone_one() {
        let slow = link_failure(LinkError::Timeout(AGENT_DEADLINE));
        assert_eq!(slow.kind, SupervisorErrorKind::AgentTimeout);
        assert!(slow.message.contains("did not answer within 30s"), "{slow}");
        for gone in [
            LinkError::Closed("eof".into()),
            LinkError::Protocol("bad frame".into()),
        ] {
            assert_eq!(link_failure(gone).kind, SupervisorErrorKind::AgentGone);
        }
    }

    #[tokio::test]
    async fn a_closed_link_fails_the_sandbox_and_ends_its_processes() {
        let mut h = harness(RuntimeSpec::Container).await;
        let (p, _) = h.spawn(spawn_spec(&["sleep", "1000"]), 30).await;
        assert_eq!(h.sup.health().failure, None);
        let Harness { sup, agent, .. } = h;
        drop(agent);

        let ended = sup.wait(p.id, BOUND).await.expect("wait");
        assert_eq!(ended.state, ProcessState::Exited);
        assert_eq!(ended.signal, Some(libc::SIGKILL));
        assert!(ended.ended_at.is_some());
        let reason = sup.health().failure.expect("the health shows the failure");
        assert!(reason.starts_with("sandbox agent ended"), "{reason}");
        assert_eq!(sup.failure().as_ref(), Some(&reason));

        // Only the first failure is kept and published.
        sup.fail("a second reason".into());
        assert_eq!(sup.failure().as_ref(), Some(&reason));
        assert_eq!(
            events(&sup, 1).await,
            [(1, SupervisorEvent::Failed(reason.clone()))]
        );

        let refused = sup.spawn(spawn_spec(&["true"])).await;
        assert_eq!(kind_of(refused), SupervisorErrorKind::AgentGone);
        assert_eq!(
            kind_of(sup.agent(RequestBody::Health).await),
            SupervisorErrorKind::AgentGone
        );
        assert_eq!(sup.list(), [ended]);
    }

    #[tokio::test]
    async fn groups_and_confinement_reach_only_an_agent_that_applies_them() {
        let restore = RestoreSpec {
            criu: PathBuf::from("/nonexistent/criu"),
            images_dir: PathBuf::from("/nonexistent/images"),
            checkpoint: Checkpoint::default(),
            next_proc: 7,
            processes: Vec::new(),
        };
        // A restored agent, before its Health answer says otherwise, is
        // taken for the oldest protocol, which reads past both.
        let mut h = harness(RuntimeSpec::ContainerRestore(restore)).await;
        let mut confined = spawn_spec(&["id"]);
        confined.confinement.capabilities = Some(0);
        let mut grouped = spawn_spec(&["id"]);
        grouped.groups = vec![10];
        for refused in [confined.clone(), grouped] {
            let answer = h.sup.spawn(refused).await;
            assert_eq!(kind_of(answer), SupervisorErrorKind::InvalidInput);
        }
        // Nothing of them reached the agent: the next request it gets is
        // a plain spawn's, with the next id.
        let (plain, request) = h.spawn(spawn_spec(&["true"]), 70).await;
        assert_eq!((plain.id, request.argv), (7, vec!["true".to_string()]));
        h.sup
            .link
            .set_agent_version(PROTOCOL_VERSION)
            .expect("this build's protocol");
        let (_, request) = h.spawn(confined, 71).await;
        assert_eq!(request.confinement.capabilities, Some(0));
    }

    #[tokio::test]
    async fn a_fork_inherits_the_checkpoints_processes_and_continues_its_ids() {
        let inherited = process(5, "sb-source", 42);
        let restore = RestoreSpec {
            criu: PathBuf::from("/nonexistent/criu"),
            images_dir: PathBuf::from("/nonexistent/images"),
            checkpoint: Checkpoint::default(),
            next_proc: 7,
            processes: vec![inherited.clone()],
        };
        let mut h = harness(RuntimeSpec::ContainerRestore(restore)).await;

        // Listed as the fork's own, running on.
        let expected = Process {
            sandbox_id: ID.into(),
            ..inherited
        };
        assert_eq!(h.sup.list(), [expected]);

        // Its output from the restore on, from offset 0; its exit as any.
        h.agent.output(5, Stream::Stdout, b"after restore").await;
        h.agent.exit(5, Some(0), None).await;
        let ended = h.ended(5).await;
        assert_eq!(ended.exit_code, Some(0));
        assert_eq!(ended.pid, 42);
        let read = h.sup.read_output(5, [0, 0]).expect("read");
        assert_eq!(
            read.items,
            [OutputItem::Data {
                stream: Stream::Stdout,
                offset: 0,
                data: b"after restore".to_vec()
            }]
        );
        assert_eq!(
            events(&h.sup, 1).await,
            [(1, SupervisorEvent::ProcessExited(ended))]
        );

        // New processes continue above the source's ids, which the agent
        // still knows its processes by.
        let (p, request) = h.spawn(spawn_spec(&["true"]), 43).await;
        assert_eq!((p.id, request.proc), (7, 7));
    }

    #[tokio::test]
    async fn running_and_ended_processes_are_bounded() {
        // A microVM's, so no process needs a cgroup.
        let mut h = harness(vm()).await;
        for i in 1..=MAX_RUNNING_PROCESSES as u64 {
            let (p, _) = h.spawn(spawn_spec(&["sleep", "1000"]), i as i32).await;
            assert_eq!(p.id, i);
        }
        let over = h.sup.spawn(spawn_spec(&["one", "too", "many"])).await;
        assert_eq!(kind_of(over), SupervisorErrorKind::Conflict);
        assert_eq!(h.sup.list().len(), MAX_RUNNING_PROCESSES);

        for p in h.sup.list() {
            h.agent.exit(p.id, Some(0), None).await;
        }
        let (last, _) = h.spawn(spawn_spec(&["true"]), 0).await;
        h.agent.exit(last.id, Some(0), None).await;
        let events = events(&h.sup, MAX_RUNNING_PROCESSES as u64 + 1).await;
        assert_eq!(events.len(), MAX_RUNNING_PROCESSES + 1);

        // One ended process more than the bound: the oldest is forgotten.
        assert_eq!(MAX_ENDED_PROCESSES, MAX_RUNNING_PROCESSES);
        let kept = h.sup.list();
        assert_eq!(kept.len(), MAX_ENDED_PROCESSES);
        assert!(kept.iter().all(|p| p.state == ProcessState::Exited));
        assert_eq!(kind_of(h.sup.get(1)), SupervisorErrorKind::UnknownProcess);
        assert_eq!(h.sup.get(2).expect("the second oldest stays").id, 2);
        assert_eq!(h.sup.get(last.id).expect("the newest stays").id, last.id);
    }

    #[tokio::test]
    async fn the_event_ring_keeps_the_newest_and_numbers_on() {
        let h = harness(RuntimeSpec::Container).await;
        let published = MAX_EVENTS as u64 + 10;
        for i in 1..=published {
            h.sup.publish(SupervisorEvent::Failed(format!("event {i}")));
        }
        assert_eq!(*h.sup.event_changes().borrow(), published);
        let kept = h.sup.events_after(0);
        assert_eq!(kept.len(), MAX_EVENTS);
        assert_eq!(kept[0], (11, SupervisorEvent::Failed("event 11".into())));
        assert_eq!(kept.last().map(|(seq, _)| *seq), Some(published));
        // A reader that fell behind the ring resumes at its oldest event;
        // one that kept up gets only what is new.
        assert_eq!(h.sup.events_after(5).len(), MAX_EVENTS);
        let recent: Vec<u64> = h
            .sup
            .events_after(published - 2)
            .iter()
            .map(|(seq, _)| *seq)
            .collect();
        assert_eq!(recent, [published - 1, published]);
    }

    /// A microVM fork's ingress and snapshots wait for its guest to confirm
    /// the fresh seed; a fork whose seed was refused fails at once rather
    /// than at the end of the wait.
    #[tokio::test]
    async fn ingress_waits_for_a_forks_fresh_seed_and_a_refused_one_fails_it() {
        let h = harness(vm()).await;
        h.sup
            .await_fresh_seed(Duration::from_millis(1))
            .await
            .expect("a sandbox that is no fork waits for nothing");
        h.sup.fresh_seed.send_replace(false);
        let waiting = tokio::spawn({
            let sup = Arc::clone(&h.sup);
            async move { sup.await_fresh_seed(Duration::from_secs(30)).await }
        });
        h.sup.fresh_seed.send_replace(true);
        waiting.await.expect("joined").expect("confirmed");

        h.sup.fresh_seed.send_replace(false);
        let late = h.sup.await_fresh_seed(Duration::from_millis(10)).await;
        assert_eq!(
            late.map_err(|e| e.kind),
            Err(SupervisorErrorKind::AgentTimeout)
        );
        let waiting = tokio::spawn({
            let sup = Arc::clone(&h.sup);
            async move { sup.await_fresh_seed(Duration::from_secs(30)).await }
        });
        h.sup
            .fail("the fork's agent did not take a fresh RNG seed".into());
        let failed = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the failure ends the wait")
            .expect("joined");
        assert_eq!(
            failed.map_err(|e| e.kind),
            Err(SupervisorErrorKind::AgentGone)
        );
    }

    /// A claim's lower ceilings, as the tests below post them.
    const LOWER: crate::supervisor::protocol::Ceilings =
        crate::supervisor::protocol::Ceilings::Container(crate::runtime::cgroups::CgroupLimits {
            cpu_quota_us: 50_000,
            memory_bytes: 256 << 20,
            pids_max: 64,
        });

    /// Posts `claim` to the supervisor's mailbox and settles it, as the
    /// next request would.
    async fn post_and_settle(h: &Harness, claim: &crate::supervisor::protocol::HandOver) {
        let mailbox = h.sup.open_mailbox().expect("mailbox");
        let me = crate::pidfd::open(std::process::id() as i32).expect("pidfd");
        crate::supervisor::mailbox::Postbox::new(mailbox, me)
            .post(claim)
            .expect("posted");
        h.sup.settle_claim().await;
    }

    /// A claim's lower ceilings are written by the supervisor as it takes
    /// the claim from its mailbox, before any request acts.
    #[tokio::test]
    async fn a_posted_claim_lowers_the_sandboxs_cgroup_ceilings() {
        use crate::supervisor::protocol::HandOver;
        let h = harness(RuntimeSpec::Container).await;
        let claim = HandOver {
            env: Some(vec![("A".into(), "1".into())]),
            ceilings: Some(LOWER),
            ..HandOver::default()
        };
        post_and_settle(&h, &claim).await;
        assert_eq!(h.sup.failure(), None);
        let read = |file: &str| std::fs::read_to_string(h.group.join(file)).expect(file);
        assert_eq!(read("memory.max"), (256u64 << 20).to_string());
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("pids.max"), "64");
    }

    /// Health says a claim reached the supervisor once one is posted to its
    /// mailbox (taken and put in force, taken and failed, or cut off) or
    /// arrives as a `HandOver` request, and not while its mailbox is open
    /// and empty.
    #[tokio::test]
    async fn health_says_when_a_claim_reached_the_supervisor() {
        use crate::supervisor::protocol::HandOver;
        let posted = harness(RuntimeSpec::Container).await;
        let _mailbox = posted.sup.open_mailbox().expect("mailbox");
        posted.sup.settle_claim().await;
        assert!(!posted.sup.health().claimed, "nothing posted yet");
        let claim = HandOver {
            env: Some(vec![("A".into(), "1".into())]),
            ..HandOver::default()
        };
        post_and_settle(&posted, &claim).await;
        assert!(posted.sup.health().claimed, "taken from the mailbox");

        let failed = harness(RuntimeSpec::Container).await;
        std::fs::create_dir(failed.group.join("memory.max")).expect("in the way");
        post_and_settle(
            &failed,
            &HandOver {
                ceilings: Some(LOWER),
                ..HandOver::default()
            },
        )
        .await;
        assert!(failed.sup.failure().is_some());
        assert!(failed.sup.health().claimed, "taken, though not in force");

        let requested = harness(RuntimeSpec::Container).await;
        assert!(!requested.sup.health().claimed);
        requested.sup.hand_over(claim).await.expect("handed over");
        assert!(requested.sup.health().claimed, "a HandOver request");

        // A daemon killed while posting: the length written, no mark.
        let cut = harness(RuntimeSpec::Container).await;
        let shared = std::fs::File::from(cut.sup.open_mailbox().expect("mailbox"));
        std::os::unix::fs::FileExt::write_all_at(&shared, &5u64.to_le_bytes(), 8)
            .expect("the length");
        cut.sup.settle_claim().await;
        assert!(cut.sup.failure().is_none(), "nothing to take");
        assert!(cut.sup.health().claimed, "a post cut off");
    }

    /// Ceilings the kernel refuses fail the sandbox, and nothing after
    /// them in the claim is put in force.
    #[tokio::test]
    async fn ceilings_that_cannot_be_written_fail_the_sandbox() {
        use crate::supervisor::protocol::{HandOver, PolicyFields};
        let h = harness(RuntimeSpec::Container).await;
        // Where cgroupfs would answer EBUSY: a file that cannot be written.
        std::fs::create_dir(h.group.join("memory.max")).expect("in the way");
        let claim = HandOver {
            policy: Some(PolicyFields {
                block_network: Some(true),
                allow_list: None,
            }),
            env: Some(vec![("A".into(), "1".into())]),
            ceilings: Some(LOWER),
            ..HandOver::default()
        };
        post_and_settle(&h, &claim).await;
        let failure = h.sup.failure().expect("the sandbox failed");
        assert!(
            failure.contains("lowering the sandbox's limits"),
            "{failure}"
        );
        assert_eq!(kind_of(h.sup.ensure_live()), SupervisorErrorKind::AgentGone);
        assert!(!h.group.join("pids.max").exists(), "nothing written after");
        // No caller's code runs in it.
        let refused = h.sup.spawn(spawn_spec(&["true"])).await;
        assert_eq!(kind_of(refused), SupervisorErrorKind::AgentGone);
    }

    /// A disk limit the layer cannot take (here no btrfs subvolume at all)
    /// fails the sandbox too; the cgroup ceilings before it are written.
    #[tokio::test]
    async fn a_disk_limit_that_cannot_be_set_fails_the_sandbox() {
        use crate::supervisor::protocol::HandOver;
        let h = harness(RuntimeSpec::Container).await;
        let claim = HandOver {
            ceilings: Some(LOWER),
            disk_quota_bytes: Some(64 << 20),
            ..HandOver::default()
        };
        post_and_settle(&h, &claim).await;
        let failure = h.sup.failure().expect("the sandbox failed");
        assert!(failure.contains("disk limit"), "{failure}");
        assert!(h.group.join("pids.max").exists(), "the ceilings came first");
    }

    /// A claim's CA is appended to the trust bundle the supervisor holds
    /// while the file still has the image's bundle's length; a file that
    /// changed fails the sandbox, as does a CA for a bundle not held.
    #[tokio::test]
    async fn a_claims_ca_is_appended_to_the_held_trust_bundle_of_the_images_length() {
        use crate::supervisor::protocol::{HandOver, TrustBundleAppend};
        let claim = |image_length| HandOver {
            trust_bundle_append: Some(TrustBundleAppend {
                image_length,
                tail: b"CA\n".to_vec(),
            }),
            ..HandOver::default()
        };
        let dir = tempfile::tempdir().expect("dir");
        let hold = |h: &Harness, name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"roots\n").expect("bundle");
            let file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .expect("held");
            *h.sup.trust_bundle.lock().unwrap() = HeldBundle::Held(file);
            path
        };

        let h = harness(RuntimeSpec::Container).await;
        let bundle = hold(&h, "same");
        post_and_settle(&h, &claim(6)).await;
        assert_eq!(h.sup.failure(), None);
        assert_eq!(std::fs::read(&bundle).expect("bundle"), b"roots\nCA\n");
        assert!(
            matches!(*h.sup.trust_bundle.lock().unwrap(), HeldBundle::Claimed),
            "closed at the claim"
        );

        let h = harness(RuntimeSpec::Container).await;
        let bundle = hold(&h, "other");
        post_and_settle(&h, &claim(5)).await;
        let failure = h.sup.failure().expect("the sandbox failed");
        assert!(failure.contains("trust bundle changed"), "{failure}");
        assert_eq!(std::fs::read(&bundle).expect("bundle"), b"roots\n");

        let h = harness(RuntimeSpec::Container).await;
        post_and_settle(&h, &claim(6)).await;
        let failure = h.sup.failure().expect("the sandbox failed");
        assert!(failure.contains("does not hold"), "{failure}");
    }

    /// A claim that changed nothing the supervisor holds ends the bundle's
    /// hold when the daemon starts watching the sandbox, and no bundle is
    /// held for it after.
    #[tokio::test]
    async fn the_watch_of_a_claimed_sandbox_ends_its_held_bundle() {
        let h = harness(RuntimeSpec::Container).await;
        let file = tempfile::tempfile().expect("a file");
        *h.sup.trust_bundle.lock().unwrap() = HeldBundle::Held(file);
        // What the server does on a Watch request.
        assert!(h.sup.release_trust_bundle().is_some(), "it was held");
        assert!(matches!(
            *h.sup.trust_bundle.lock().unwrap(),
            HeldBundle::Claimed
        ));
        let refused = h
            .sup
            .hold_trust_bundle("etc/ssl/certs/ca-certificates.crt".into())
            .await;
        assert_eq!(kind_of(refused), SupervisorErrorKind::InvalidInput);
    }
}
