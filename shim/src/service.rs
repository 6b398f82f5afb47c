//! containerd's Task service over sandboxd: a task is a sandbox (made at
//! Create from the bundle's root and spec), its init and execs are
//! sandboxd processes (started at Start), and every answer and event
//! containerd expects is made from what sandboxd says. No isolation here.
//!
//! Under CRI one shim serves a whole pod: the pod's sandbox ("pause")
//! container makes the sandbox (in the pod's network namespace) and runs
//! no process, and each other container of the pod is a root of its own
//! in that sandbox (`POST /v1/sandboxes/{id}/roots`), its processes
//! started in it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use containerd_shim::api;
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageDyn, MessageField};
use containerd_shim::protos::topics::{
    TASK_CREATE_EVENT_TOPIC, TASK_DELETE_EVENT_TOPIC, TASK_EXEC_ADDED_EVENT_TOPIC,
    TASK_EXEC_STARTED_EVENT_TOPIC, TASK_EXIT_EVENT_TOPIC, TASK_START_EVENT_TOPIC,
};
use containerd_shim::protos::ttrpc::{self, Code};
use containerd_shim::protos::types::task::{ProcessInfo, Status};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{ExitSignal, Task, TtrpcContext, TtrpcResult};
use serde_json::Value;

use crate::daemon::{Daemon, DaemonError};
use crate::process::{self, Process, State, Stdio};
use crate::publisher::Publisher;
use crate::spec;

fn status(code: Code, message: impl Into<String>) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message.into()))
}

fn from_daemon(e: DaemonError) -> ttrpc::Error {
    let code = match &e {
        DaemonError::Refused { status: 404, .. } => Code::NOT_FOUND,
        DaemonError::Refused {
            status: 400 | 403, ..
        } => Code::INVALID_ARGUMENT,
        DaemonError::Refused { status: 409, .. } => Code::FAILED_PRECONDITION,
        DaemonError::Refused { status: 503, .. } => Code::RESOURCE_EXHAUSTED,
        DaemonError::Refused { status: 504, .. } => Code::DEADLINE_EXCEEDED,
        _ => Code::UNAVAILABLE,
    };
    status(code, e.to_string())
}

fn from_spec(e: spec::SpecError) -> ttrpc::Error {
    status(Code::INVALID_ARGUMENT, format!("sandboxd: {e}"))
}

/// What a task is in sandboxd.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A sandbox of its own, whose init is a process.
    Task,
    /// A CRI pod's sandbox container: the sandbox itself; its "init" runs
    /// no process and ends when it is killed.
    PodSandbox,
    /// A container of a pod: a root of the pod's sandbox, named `root`.
    PodMember { root: String },
}

/// One task: its sandbox and processes.
struct Container {
    bundle: PathBuf,
    sandbox: String,
    kind: Kind,
    /// Its `linux.seccomp`, which each of its processes loads.
    seccomp: Option<Value>,
    init: Arc<Process>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
}

impl Container {
    fn exec_table(&self) -> MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.execs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The execs now, outside the lock.
    fn execs(&self) -> Vec<Arc<Process>> {
        self.exec_table().values().cloned().collect()
    }

    fn process(&self, exec_id: &str) -> TtrpcResult<Arc<Process>> {
        if exec_id.is_empty() {
            return Ok(Arc::clone(&self.init));
        }
        self.exec_table()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| status(Code::NOT_FOUND, format!("exec {exec_id} not found")))
    }
}

/// How long the shim's exit waits for its queued events.
const EVENTS_FLUSH: Duration = Duration::from_secs(5);

pub struct Service {
    daemon: Daemon,
    events: Events,
    exit: Arc<ExitSignal>,
    containers: Containers,
}

impl Service {
    pub fn new(namespace: &str, publisher: RemotePublisher, exit: Arc<ExitSignal>) -> Service {
        Service {
            daemon: Daemon::from_env(),
            events: Events {
                publisher: Arc::new(Publisher::start(publisher)),
                namespace: namespace.to_string(),
            },
            exit,
            containers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn containers(&self) -> MutexGuard<'_, HashMap<String, Arc<Container>>> {
        lock_containers(&self.containers)
    }

    /// The sandbox of pod sandbox container `pod`, served by this shim,
    /// and that container's bundle.
    fn pod_sandbox(&self, pod: &str) -> TtrpcResult<(String, PathBuf)> {
        match self.containers().get(pod) {
            Some(c) if c.kind == Kind::PodSandbox => Ok((c.sandbox.clone(), c.bundle.clone())),
            _ => Err(status(
                Code::FAILED_PRECONDITION,
                format!("sandboxd: pod sandbox {pod} is not served by this shim (was it made with the sandboxd runtime?)"),
            )),
        }
    }

    fn container(&self, id: &str) -> TtrpcResult<Arc<Container>> {
        self.containers()
            .get(id)
            .cloned()
            .ok_or_else(|| status(Code::NOT_FOUND, format!("container {id} not found")))
    }

    /// Records the end of every process of the pod members in `sandbox`
    /// (the sandbox is gone, and they with it).
    fn record_members_ended(&self, sandbox: &str) {
        record_members_ended(&self.containers, &self.events, sandbox);
    }

    fn pid_of(&self, process: &Process) -> u32 {
        pid_of(process)
    }
}

/// The tasks this shim serves, by container id; shared with the threads
/// that watch pod sandboxes.
type Containers = Arc<Mutex<HashMap<String, Arc<Container>>>>;

fn lock_containers(containers: &Containers) -> MutexGuard<'_, HashMap<String, Arc<Container>>> {
    containers.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records the end of every process of the pod members in `sandbox`.
fn record_members_ended(containers: &Containers, events: &Events, sandbox: &str) {
    let members: Vec<(String, Arc<Container>)> = lock_containers(containers)
        .iter()
        .filter(|(_, c)| c.sandbox == sandbox && matches!(c.kind, Kind::PodMember { .. }))
        .map(|(id, c)| (id.clone(), Arc::clone(c)))
        .collect();
    for (id, member) in members {
        for process in std::iter::once(Arc::clone(&member.init)).chain(member.execs()) {
            events.record_exit(&id, &process, pid_of(&process), 137);
        }
    }
}

/// The pid containerd sees for a process: the shim's own for the init
/// (the sandbox's host processes are sandboxd's), the pid inside the
/// sandbox for an exec.
fn pid_of(process: &Process) -> u32 {
    if process.exec_id.is_empty() {
        return std::process::id();
    }
    match process.state() {
        State::Running { pid, .. } | State::Exited { pid, .. } => pid,
        State::Created | State::Starting => 0,
    }
}

/// How long an exited process's output may still be draining into
/// containerd's FIFOs before its exit is reported anyway (a reader that
/// stopped reading must not hold the exit back).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// What the shim tells containerd, in its namespace: task events, and
/// exits recorded so that every recorded exit is one TaskExit, wherever
/// it was found.
#[derive(Clone)]
struct Events {
    publisher: Arc<Publisher>,
    namespace: String,
}

impl Events {
    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        self.publisher.publish(topic, &self.namespace, event);
    }

    fn record_exit(&self, container_id: &str, process: &Process, pid: u32, code: u32) {
        if !process.set_exited(code) {
            return;
        }
        let (code, at) = process.wait();
        let id = if process.exec_id.is_empty() {
            container_id.to_string()
        } else {
            process.exec_id.clone()
        };
        self.publish(
            TASK_EXIT_EVENT_TOPIC,
            Box::new(TaskExit {
                container_id: container_id.to_string(),
                id,
                pid,
                exit_status: code,
                exited_at: MessageField::some(at),
                ..Default::default()
            }),
        );
    }
}

/// SIGKILLs a container's running execs: its init ended, and under
/// containerd a task's processes end with its init.
fn kill_execs(daemon: &Daemon, container: &Container) {
    for exec in container.execs() {
        if let State::Running { api_id, .. } = exec.settled_state() {
            if let Err(e) = process::signal(daemon, &container.sandbox, api_id, 9) {
                log::debug!("killing exec {}: {e}", exec.exec_id);
            }
        }
    }
}

fn stdio_of(stdin: &str, stdout: &str, stderr: &str) -> Stdio {
    Stdio {
        stdin: stdin.to_string(),
        stdout: stdout.to_string(),
        stderr: stderr.to_string(),
    }
}

impl Task for Service {
    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        if !req.checkpoint.is_empty() {
            return Err(status(
                Code::INVALID_ARGUMENT,
                "sandboxd: restoring a containerd checkpoint is not supported; use sandboxd's snapshots",
            ));
        }
        if self.containers().contains_key(&req.id) {
            return Err(status(
                Code::ALREADY_EXISTS,
                format!("container {} exists", req.id),
            ));
        }
        let bundle = PathBuf::from(&req.bundle);
        let config = spec::read_bundle(&bundle).map_err(from_spec)?;
        let role = spec::role(&config).map_err(from_spec)?;
        let mounts: Vec<spec::RootMount<'_>> = req
            .rootfs
            .iter()
            .map(|m| spec::RootMount {
                kind: &m.type_,
                source: &m.source,
                options: &m.options,
            })
            .collect();
        let host_rootfs = spec::host_rootfs(
            &mounts,
            &bundle,
            config.pointer("/root/path").and_then(Value::as_str),
        )
        .map_err(from_spec)?;
        let mut init = spec::process(&config["process"], "process", role != spec::Role::Task)
            .map_err(from_spec)?;
        let seccomp = spec::seccomp(&config);
        if let Some(profile) = &seccomp {
            init.body["seccomp"] = profile.clone();
        }
        let (sandbox, kind) = match role {
            spec::Role::PodMember { pod } => {
                let (sandbox, pod_bundle) = self.pod_sandbox(&pod)?;
                let pod_config = spec::read_bundle(&pod_bundle).map_err(|e| {
                    status(
                        Code::FAILED_PRECONDITION,
                        format!("sandboxd: reading pod sandbox {pod}'s spec: {e}"),
                    )
                })?;
                let own = spec::member(&config, &pod_config).map_err(from_spec)?;
                let mut body = serde_json::json!({"name": req.id, "host_rootfs": host_rootfs});
                if let Some(limits) = own.limits {
                    body["limits"] = limits;
                }
                if !own.volumes.is_empty() {
                    body["volumes"] = Value::Array(own.volumes);
                }
                self.daemon
                    .call(
                        "POST",
                        &format!("/v1/sandboxes/{sandbox}/roots"),
                        Some(&body),
                    )
                    .map_err(from_daemon)?;
                init.body["root"] = Value::String(req.id.clone());
                (
                    sandbox,
                    Kind::PodMember {
                        root: req.id.clone(),
                    },
                )
            }
            role => {
                let body = spec::sandbox(&config, &host_rootfs, &self.events.namespace, &req.id)
                    .map_err(from_spec)?;
                let created = self
                    .daemon
                    .call("POST", "/v1/sandboxes", Some(&body))
                    .map_err(from_daemon)?;
                let sandbox = created["id"]
                    .as_str()
                    .ok_or_else(|| {
                        status(
                            Code::INTERNAL,
                            format!("sandboxd's create answer has no id: {created}"),
                        )
                    })?
                    .to_string();
                let kind = if role == spec::Role::PodSandbox {
                    Kind::PodSandbox
                } else {
                    Kind::Task
                };
                (sandbox, kind)
            }
        };
        let container = Arc::new(Container {
            bundle,
            sandbox,
            kind,
            seccomp,
            init: Process::new("", init, stdio_of(&req.stdin, &req.stdout, &req.stderr)),
            execs: Mutex::new(HashMap::new()),
        });
        let pid = self.pid_of(&container.init);
        self.containers().insert(req.id.clone(), container);
        self.events.publish(
            TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(containerd_shim::protos::events::task::TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                pid,
                ..Default::default()
            }),
        );
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        if !process.begin_start() {
            return Err(status(
                Code::FAILED_PRECONDITION,
                "the process was already started, or has ended",
            ));
        }
        if container.kind == Kind::PodSandbox && req.exec_id.is_empty() {
            // The sandbox is the pod's; nothing runs for its container,
            // which ends when it is killed, or when the sandbox ends on
            // its own or is deleted outside containerd.
            let pid = self.pid_of(&process);
            process.set_running(0, pid);
            let (daemon, containers, events, process, id) = (
                self.daemon.clone(),
                Arc::clone(&self.containers),
                self.events.clone(),
                Arc::clone(&process),
                req.id.clone(),
            );
            let sandbox = container.sandbox.clone();
            std::thread::spawn(move || {
                if process::watch_sandbox(&daemon, &sandbox, &process) {
                    record_members_ended(&containers, &events, &sandbox);
                    events.record_exit(&id, &process, pid, 137);
                }
            });
            self.events.publish(
                TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: req.id.clone(),
                    pid,
                    ..Default::default()
                }),
            );
            return Ok(api::StartResponse {
                pid,
                ..Default::default()
            });
        }
        let mut body = process.spec.body.clone();
        body["stdin"] = Value::Bool(!process.stdio.stdin.is_empty());
        if let Kind::PodMember { root } = &container.kind {
            body["root"] = Value::String(root.clone());
        }
        let started = self.daemon.call(
            "POST",
            &format!("/v1/sandboxes/{}/processes", container.sandbox),
            Some(&body),
        );
        // A failed start is the process's end: its waiters wake.
        let api_id = match started.as_ref().map(|s| s["id"].as_u64()) {
            Ok(Some(api_id)) => api_id,
            Ok(None) => {
                self.events.record_exit(&req.id, &process, 0, 255);
                return Err(status(
                    Code::INTERNAL,
                    "sandboxd's start answer has no process id",
                ));
            }
            Err(_) => {
                self.events.record_exit(&req.id, &process, 0, 255);
                return Err(started
                    .map_err(from_daemon)
                    .err()
                    .unwrap_or_else(|| status(Code::INTERNAL, "the start failed")));
            }
        };
        let inner_pid = started
            .ok()
            .and_then(|s| s["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0);
        process.set_running(api_id, inner_pid);
        let pid = self.pid_of(&process);

        if !process.stdio.stdin.is_empty() {
            let (daemon, sandbox, path) = (
                self.daemon.clone(),
                container.sandbox.clone(),
                process.stdio.stdin.clone(),
            );
            std::thread::spawn(move || process::copy_stdin(&daemon, &sandbox, api_id, &path));
        }
        // Output and exit on their own threads: the exit is reported once
        // the output drained (or OUTPUT_GRACE passed), so ctr sees all of it.
        let (drained, output_done) = std::sync::mpsc::channel::<()>();
        {
            let (daemon, sandbox, process) = (
                self.daemon.clone(),
                container.sandbox.clone(),
                Arc::clone(&process),
            );
            std::thread::spawn(move || {
                process::copy_output(&daemon, &sandbox, api_id, &process);
                let _ = drained.send(());
            });
        }
        {
            let daemon = self.daemon.clone();
            let container = Arc::clone(&container);
            let process = Arc::clone(&process);
            let events = self.events.clone();
            let container_id = req.id.clone();
            std::thread::spawn(move || {
                let code = process::wait_exit(&daemon, &container.sandbox, api_id, &process);
                let _ = output_done.recv_timeout(OUTPUT_GRACE);
                if process.exec_id.is_empty() {
                    // As a pid namespace's processes die with its init
                    // under runc: the execs, and what the init left
                    // running in the background, before containerd
                    // hears of the exit.
                    kill_execs(&daemon, &container);
                    process::kill_tree(&daemon, &container.sandbox, api_id);
                }
                events.record_exit(&container_id, &process, pid, code);
            });
        }
        if req.exec_id.is_empty() {
            self.events.publish(
                TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: req.id.clone(),
                    pid,
                    ..Default::default()
                }),
            );
        } else {
            self.events.publish(
                TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                    pid,
                    ..Default::default()
                }),
            );
        }
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        let mut response = api::StateResponse {
            id: req.id.clone(),
            bundle: container.bundle.display().to_string(),
            pid: self.pid_of(&process),
            stdin: process.stdio.stdin.clone(),
            stdout: process.stdio.stdout.clone(),
            stderr: process.stdio.stderr.clone(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        };
        match process.state() {
            State::Created | State::Starting => response.set_status(Status::CREATED),
            State::Running { .. } => response.set_status(Status::RUNNING),
            State::Exited { code, at, .. } => {
                response.set_status(Status::STOPPED);
                response.exit_status = code;
                response.exited_at = MessageField::some(at);
            }
        }
        Ok(response)
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        let process = self.container(&req.id)?.process(&req.exec_id)?;
        let (code, at) = process.wait();
        Ok(api::WaitResponse {
            exit_status: code,
            exited_at: MessageField::some(at),
            ..Default::default()
        })
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        let mut targets = vec![process];
        if req.all && req.exec_id.is_empty() {
            targets.extend(container.execs());
        }
        let mut signalled = false;
        for target in targets {
            // A Start under way finishes first, so the kill reaches it.
            let holds_pod = container.kind == Kind::PodSandbox && target.exec_id.is_empty();
            match target.settled_state() {
                // The pod's sandbox container "exits" when killed; the
                // sandbox stays until the task is deleted.
                State::Running { pid, .. } if holds_pod => {
                    self.events.record_exit(
                        &req.id,
                        &target,
                        pid,
                        128u32.saturating_add(req.signal),
                    );
                    signalled = true;
                }
                State::Running { api_id, .. } => {
                    match process::signal(&self.daemon, &container.sandbox, api_id, req.signal) {
                        Ok(()) => signalled = true,
                        // It ended meanwhile; its exit is on its way.
                        Err(DaemonError::Refused { status: 409, .. }) => {}
                        Err(e) => return Err(from_daemon(e)),
                    }
                }
                // Never started: it ends here, as runc's created init would.
                State::Created => {
                    self.events
                        .record_exit(&req.id, &target, 0, 128u32.saturating_add(req.signal));
                    signalled = true;
                }
                State::Starting | State::Exited { .. } => {}
            }
        }
        if !signalled && !req.all {
            return Err(status(Code::NOT_FOUND, "process already finished"));
        }
        Ok(api::Empty::new())
    }

    fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id)?;
        let spec_json: Value = serde_json::from_slice(&req.spec.value).map_err(|e| {
            status(
                Code::INVALID_ARGUMENT,
                format!("the exec's process spec: {e}"),
            )
        })?;
        let under_cri = container.kind != Kind::Task;
        let mut spec = spec::process(&spec_json, "exec.process", under_cri).map_err(from_spec)?;
        if let Some(profile) = &container.seccomp {
            spec.body["seccomp"] = profile.clone();
        }
        let mut execs = container.exec_table();
        if execs.contains_key(&req.exec_id) {
            return Err(status(
                Code::ALREADY_EXISTS,
                format!("exec {} exists", req.exec_id),
            ));
        }
        execs.insert(
            req.exec_id.clone(),
            Process::new(
                &req.exec_id,
                spec,
                stdio_of(&req.stdin, &req.stdout, &req.stderr),
            ),
        );
        drop(execs);
        self.events.publish(
            TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(api::Empty::new())
    }

    fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        let pid = self.pid_of(&process);
        if !req.exec_id.is_empty() {
            if matches!(process.settled_state(), State::Running { .. }) {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    "the exec is still running",
                ));
            }
            // Never started: its waiters wake with its end.
            self.events.record_exit(&req.id, &process, pid, 255);
            container.exec_table().remove(&req.exec_id);
            let (code, at) = process.wait();
            return Ok(api::DeleteResponse {
                pid,
                exit_status: code,
                exited_at: MessageField::some(at),
                ..Default::default()
            });
        }
        // Removing the sandbox (a pod member: its root) ends whatever
        // still runs in it.
        let path = match &container.kind {
            Kind::PodMember { root } => format!("/v1/sandboxes/{}/roots/{root}", container.sandbox),
            Kind::Task | Kind::PodSandbox => format!("/v1/sandboxes/{}", container.sandbox),
        };
        match self.daemon.call("DELETE", &path, None) {
            Ok(_) | Err(DaemonError::Refused { status: 404, .. }) => {}
            // A pod member of a sandbox that is not running (it failed, or
            // is going): its root goes with the sandbox, whose own delete
            // follows; containerd must not be held here.
            Err(DaemonError::Refused { status: 409, .. })
                if matches!(container.kind, Kind::PodMember { .. }) => {}
            Err(e) => return Err(from_daemon(e)),
        }
        if container.kind == Kind::PodSandbox {
            self.record_members_ended(&container.sandbox);
        }
        self.events.record_exit(&req.id, &process, pid, 137);
        for exec in container.execs() {
            let exec_pid = self.pid_of(&exec);
            self.events.record_exit(&req.id, &exec, exec_pid, 137);
        }
        self.containers().remove(&req.id);
        let (code, at) = process.wait();
        self.events.publish(
            TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: req.id.clone(),
                pid,
                exit_status: code,
                exited_at: MessageField::some(at.clone()),
                id: req.id.clone(),
                ..Default::default()
            }),
        );
        Ok(api::DeleteResponse {
            pid,
            exit_status: code,
            exited_at: MessageField::some(at),
            ..Default::default()
        })
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        let container = self.container(&req.id)?;
        let list = self
            .daemon
            .call(
                "GET",
                &format!("/v1/sandboxes/{}/processes", container.sandbox),
                None,
            )
            .map_err(from_daemon)?;
        let processes = list["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["state"] == "running")
            .filter_map(|p| p["pid"].as_u64().and_then(|pid| u32::try_from(pid).ok()))
            .map(|pid| ProcessInfo {
                pid,
                ..Default::default()
            })
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    /// A process on a terminal (`ctr run -t`) gets its console's size.
    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        if process.spec.body.get("pty").is_none() {
            return Err(status(
                Code::FAILED_PRECONDITION,
                "the process has no terminal",
            ));
        }
        let clamp = |v: u32| u16::try_from(v).unwrap_or(u16::MAX).max(1);
        let size = serde_json::json!({"rows": clamp(req.height), "cols": clamp(req.width)});
        match process.settled_state() {
            State::Running { api_id, .. } => {
                let path = format!(
                    "/v1/sandboxes/{}/processes/{api_id}/resize",
                    container.sandbox
                );
                match self.daemon.call("POST", &path, Some(&size)) {
                    // It ended meanwhile: its terminal has no size to change.
                    Ok(_) | Err(DaemonError::Refused { status: 409, .. }) => {}
                    Err(e) => return Err(from_daemon(e)),
                }
            }
            State::Created | State::Starting | State::Exited { .. } => {}
        }
        Ok(api::Empty::new())
    }

    fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        if let State::Running { api_id, .. } = process.state() {
            if req.stdin {
                process::close_stdin(&self.daemon, &container.sandbox, api_id);
            }
        }
        Ok(api::Empty::new())
    }

    fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let container = self.container(&req.id)?;
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: self.pid_of(&container.init),
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, _req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if self.containers().is_empty() {
            // The last task's delete and exit events are queued: let them
            // reach containerd before the shim goes.
            if !self.events.publisher.flush(EVENTS_FLUSH) {
                log::warn!("shutting down with events not yet delivered to containerd");
            }
            self.exit.signal();
        }
        Ok(api::Empty::new())
    }

    /// The sandbox's stats as cgroup v1 metrics, the shape `ctr task
    /// metrics` and CRI's container stats decode, whichever cgroup version
    /// the host runs (sandboxd reads either). A pod's container with limits
    /// of its own has its own root's (its own group's); one without counts
    /// in its pod's.
    fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        let container = self.container(&req.id)?;
        let sandbox_stats = format!("/v1/sandboxes/{}/stats", container.sandbox);
        let stats = match &container.kind {
            Kind::PodMember { root } => match self.daemon.call(
                "GET",
                &format!("/v1/sandboxes/{}/roots/{root}/stats", container.sandbox),
                None,
            ) {
                // No group of its own; or a microVM guest too busy to
                // read it, where the pod's stats (the host's) still answer.
                Err(DaemonError::Refused { code, .. })
                    if code == "root_not_limited" || code == "agent_timeout" =>
                {
                    self.daemon.call("GET", &sandbox_stats, None)
                }
                own => own,
            },
            _ => self.daemon.call("GET", &sandbox_stats, None),
        }
        .map_err(from_daemon)?;
        let metrics = crate::metrics::from_stats(&stats);
        let value = metrics
            .write_to_bytes()
            .map_err(|e| status(Code::INTERNAL, format!("encoding the metrics: {e}")))?;
        Ok(api::StatsResponse {
            stats: MessageField::some(Any {
                type_url: crate::metrics::TYPE_URL.to_string(),
                value,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}
