//! The daemon's typed client of a sandbox's supervisor: one method per
//! request, each with its deadline, returning the typed payload. A refusal
//! (`SupervisorReply::Error`), an agent error and a reply that does not fit
//! the request become a [`CallError`] here and nowhere else. The streaming
//! requests (`Attach`, `Watch`) hand back a stream that reads typed items.
//!
//! [`Supervisors`] is what the manager's orchestration needs from the
//! supervisors, by sandbox id; [`SocketSupervisors`] is the real one, and
//! tests put a recording fake (`fake::FakeSupervisors`) in its place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use sandbox_proto::{AgentError, FileStat, GuestRootUsage, PtySize, Reply, RequestBody};

use super::output::OutputItem;
use super::protocol::{
    ClientError, HandOver, SpawnSpec, SupervisorConn, SupervisorError, SupervisorEvent,
    SupervisorHealth, SupervisorReply, SupervisorRequest,
};
use crate::model::Process;
use crate::net::policy::NetworkPolicy;
use crate::net::proxy::EgressLogEntry;
use crate::runtime::mount_ns::HostRoot;
use crate::runtime::paths::SandboxPaths;
use crate::runtime::sandbox::Checkpoint;
use crate::runtime::CheckpointTarget;

/// Control requests (health, environment, policy): the supervisor answers
/// these itself, so a slow answer means it is stuck.
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(5);
/// Requests about processes, which may wait on the agent.
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(35);
/// One file request passed to the agent.
pub const FILE_DEADLINE: Duration = Duration::from_secs(35);
const EGRESS_LOG_DEADLINE: Duration = Duration::from_secs(10);
/// The supervisor kills and removes the container before it answers.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(15);
/// A dial inside the sandbox's namespace: a connect on its loopback, or a
/// microVM's guest's (the supervisor gives either 4.5 s in all).
const DIAL_DEADLINE: Duration = Duration::from_secs(5);
/// A checkpoint writes the sandbox's memory out.
const CHECKPOINT_DEADLINE: Duration = Duration::from_secs(120);

/// Why a supervisor request did not give what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The supervisor's socket could not be reached at all.
    #[error(transparent)]
    Connect(ClientError),
    /// The exchange broke after the connection was made.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The supervisor refused the request.
    #[error("{0}")]
    Refused(SupervisorError),
    /// The agent refused a file request.
    #[error("{0}")]
    Agent(AgentError),
    #[error("unexpected supervisor reply to {request}: {reply}")]
    Unexpected {
        request: &'static str,
        reply: String,
    },
}

/// The checkpoint a supervisor took.
#[derive(Debug)]
pub struct Checkpointed {
    pub checkpoint: Checkpoint,
    pub next_proc: u64,
    /// The processes running at the checkpoint, which forks inherit.
    pub processes: Vec<Process>,
}

/// One item of an attached process's stream: output as the supervisor's
/// log holds it, then the process's end.
#[derive(Debug)]
pub enum Attached {
    Output(OutputItem),
    /// The last item: the process ended.
    Exited(Process),
}

/// The typed decoding of each reply: the one place a reply that does not
/// fit its request becomes an error. Pure, so the fake decodes its
/// scripted replies exactly as the real client does.
mod expect {
    use super::*;

    fn unexpected(request: &'static str, reply: SupervisorReply) -> CallError {
        CallError::Unexpected {
            request,
            reply: format!("{reply:?}"),
        }
    }

    /// A refusal as an error; every other reply as it is.
    pub(super) fn answered(reply: SupervisorReply) -> Result<SupervisorReply, CallError> {
        match reply {
            SupervisorReply::Error(e) => Err(CallError::Refused(e)),
            reply => Ok(reply),
        }
    }

    pub(super) fn ok(request: &'static str, reply: SupervisorReply) -> Result<(), CallError> {
        match answered(reply)? {
            SupervisorReply::Ok => Ok(()),
            other => Err(unexpected(request, other)),
        }
    }

    /// The fake's decoding of a health reply; the real client's is
    /// `SupervisorConn::checked_health`, which reads the version first.
    #[cfg(test)]
    pub(super) fn health(reply: SupervisorReply) -> Result<SupervisorHealth, CallError> {
        match answered(reply)? {
            SupervisorReply::Health(h) => Ok(h),
            other => Err(unexpected("Health", other)),
        }
    }

    pub(super) fn process(
        request: &'static str,
        reply: SupervisorReply,
    ) -> Result<Process, CallError> {
        match answered(reply)? {
            SupervisorReply::Process(p) => Ok(p),
            other => Err(unexpected(request, other)),
        }
    }

    pub(super) fn processes(reply: SupervisorReply) -> Result<Vec<Process>, CallError> {
        match answered(reply)? {
            SupervisorReply::Processes(p) => Ok(p),
            other => Err(unexpected("List", other)),
        }
    }

    pub(super) fn egress_log(reply: SupervisorReply) -> Result<Vec<EgressLogEntry>, CallError> {
        match answered(reply)? {
            SupervisorReply::EgressLog(entries) => Ok(entries),
            other => Err(unexpected("EgressLog", other)),
        }
    }

    fn agent(reply: SupervisorReply) -> Result<Reply, CallError> {
        match answered(reply)? {
            SupervisorReply::Agent(Reply::Error(e)) => Err(CallError::Agent(e)),
            SupervisorReply::Agent(reply) => Ok(reply),
            other => Err(unexpected("File", other)),
        }
    }

    /// An agent's answer to a file request, as `pick` takes it apart.
    pub(super) fn file<T>(
        request: &'static str,
        reply: SupervisorReply,
        pick: impl FnOnce(Reply) -> Result<T, Reply>,
    ) -> Result<T, CallError> {
        pick(agent(reply)?).map_err(|other| unexpected(request, SupervisorReply::Agent(other)))
    }

    /// A microVM's guest task count (`GuestPids`).
    pub(super) fn guest_pids(reply: SupervisorReply) -> Result<u64, CallError> {
        file("GuestPids", reply, |r| match r {
            Reply::Pids { current } => Ok(current),
            other => Err(other),
        })
    }

    /// A microVM container root's use (`GuestRootUsage`).
    pub(super) fn guest_root_usage(reply: SupervisorReply) -> Result<GuestRootUsage, CallError> {
        file("GuestRootUsage", reply, |r| match r {
            Reply::RootUsage(usage) => Ok(usage),
            other => Err(other),
        })
    }

    pub(super) fn checkpointed(reply: SupervisorReply) -> Result<Checkpointed, CallError> {
        match answered(reply)? {
            SupervisorReply::Checkpointed {
                checkpoint,
                next_proc,
                processes,
            } => Ok(Checkpointed {
                checkpoint,
                next_proc,
                processes,
            }),
            other => Err(unexpected("Checkpoint", other)),
        }
    }

    pub(super) fn output(reply: SupervisorReply) -> Result<Attached, CallError> {
        match answered(reply)? {
            SupervisorReply::Output {
                stream,
                offset,
                data,
            } => Ok(Attached::Output(OutputItem::Data {
                stream,
                offset,
                data,
            })),
            SupervisorReply::Dropped { stream, bytes } => {
                Ok(Attached::Output(OutputItem::Dropped { stream, bytes }))
            }
            SupervisorReply::Exited(p) => Ok(Attached::Exited(p)),
            other => Err(unexpected("Attach", other)),
        }
    }

    pub(super) fn event(reply: SupervisorReply) -> Result<(u64, SupervisorEvent), CallError> {
        match answered(reply)? {
            SupervisorReply::Event { seq, event } => Ok((seq, event)),
            other => Err(unexpected("Watch", other)),
        }
    }
}

/// One connection to a sandbox's supervisor, spoken to in typed requests.
pub struct SupervisorClient {
    conn: SupervisorConn,
}

impl SupervisorClient {
    pub async fn connect(socket: &Path) -> Result<Self, CallError> {
        SupervisorConn::connect(socket)
            .await
            .map(|conn| Self { conn })
            .map_err(CallError::Connect)
    }

    /// The pid of the supervisor at the other end.
    pub fn peer_pid(&self) -> Option<i32> {
        self.conn.peer_pid()
    }

    async fn call(
        &mut self,
        request: &SupervisorRequest,
        deadline: Duration,
    ) -> Result<SupervisorReply, CallError> {
        Ok(self.conn.call(request, deadline).await?)
    }

    /// The supervisor's health, once its protocol version is this
    /// daemon's ([`ClientError::Version`] otherwise).
    pub async fn health(&mut self) -> Result<SupervisorHealth, CallError> {
        Ok(self.conn.checked_health(CONTROL_DEADLINE).await?)
    }

    pub async fn spawn(&mut self, spec: SpawnSpec) -> Result<Process, CallError> {
        let reply = self
            .call(&SupervisorRequest::Spawn(spec), PROCESS_DEADLINE)
            .await?;
        expect::process("Spawn", reply)
    }

    pub async fn get(&mut self, proc: u64) -> Result<Process, CallError> {
        let reply = self
            .call(&SupervisorRequest::Get { proc }, PROCESS_DEADLINE)
            .await?;
        expect::process("Get", reply)
    }

    pub async fn list(&mut self) -> Result<Vec<Process>, CallError> {
        expect::processes(
            self.call(&SupervisorRequest::List, PROCESS_DEADLINE)
                .await?,
        )
    }

    /// The process's output from the given offsets, streamed until it exits.
    /// The connection carries nothing else afterwards, so it is used up.
    pub async fn attach(
        mut self,
        proc: u64,
        stdout_offset: u64,
        stderr_offset: u64,
    ) -> Result<OutputStream, CallError> {
        self.conn
            .send(&SupervisorRequest::Attach {
                proc,
                stdout_offset,
                stderr_offset,
            })
            .await?;
        Ok(OutputStream { conn: self.conn })
    }

    pub async fn write_stdin(&mut self, proc: u64, data: Vec<u8>) -> Result<(), CallError> {
        let reply = self
            .call(
                &SupervisorRequest::WriteStdin { proc, data },
                PROCESS_DEADLINE,
            )
            .await?;
        expect::ok("WriteStdin", reply)
    }

    pub async fn close_stdin(&mut self, proc: u64) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::CloseStdin { proc }, PROCESS_DEADLINE)
            .await?;
        expect::ok("CloseStdin", reply)
    }

    pub async fn signal(&mut self, proc: u64, signal: i32) -> Result<(), CallError> {
        let reply = self
            .call(
                &SupervisorRequest::Signal { proc, signal },
                PROCESS_DEADLINE,
            )
            .await?;
        expect::ok("Signal", reply)
    }

    /// Kills the process's whole tree.
    pub async fn kill(&mut self, proc: u64) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::Kill { proc }, PROCESS_DEADLINE)
            .await?;
        expect::ok("Kill", reply)
    }

    pub async fn resize(&mut self, proc: u64, size: PtySize) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::Resize { proc, size }, PROCESS_DEADLINE)
            .await?;
        expect::ok("Resize", reply)
    }

    /// The process once it ended, or as it is after `timeout`.
    pub async fn wait(&mut self, proc: u64, timeout: Duration) -> Result<Process, CallError> {
        let request = SupervisorRequest::Wait {
            proc,
            timeout_ms: timeout.as_millis() as u64,
        };
        let reply = self.call(&request, timeout + PROCESS_DEADLINE).await?;
        expect::process("Wait", reply)
    }

    /// The supervisor's events after sequence number `after`, then live.
    pub async fn watch(mut self, after: u64) -> Result<EventStream, CallError> {
        self.conn.send(&SupervisorRequest::Watch { after }).await?;
        Ok(EventStream { conn: self.conn })
    }

    /// Has a pooled container's supervisor hold its trust bundle at `path`
    /// (relative to the root) for a claim's append.
    pub async fn hold_trust_bundle(&mut self, path: &str) -> Result<(), CallError> {
        let request = SupervisorRequest::HoldTrustBundle { path: path.into() };
        let reply = self.call(&request, CONTROL_DEADLINE).await?;
        expect::ok("HoldTrustBundle", reply)
    }

    /// Puts a pool claim's parts in force in one exchange.
    pub async fn hand_over(&mut self, change: HandOver) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::HandOver(change), CONTROL_DEADLINE)
            .await?;
        expect::ok("HandOver", reply)
    }

    /// The tasks a microVM's guest processes hold.
    pub async fn guest_pids(&mut self) -> Result<u64, CallError> {
        let reply = self
            .call(&SupervisorRequest::GuestPids, CONTROL_DEADLINE)
            .await?;
        expect::guest_pids(reply)
    }

    /// What a microVM's pod container root `name`, one with limits of its
    /// own, uses in the guest.
    pub async fn guest_root_usage(&mut self, name: &str) -> Result<GuestRootUsage, CallError> {
        let request = SupervisorRequest::GuestRootUsage {
            name: name.to_owned(),
        };
        let reply = self.call(&request, CONTROL_DEADLINE).await?;
        expect::guest_root_usage(reply)
    }

    /// Sets a microVM's pids limit inside its guest.
    pub async fn limit_guest_pids(&mut self, max: u64) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::LimitGuestPids { max }, CONTROL_DEADLINE)
            .await?;
        expect::ok("LimitGuestPids", reply)
    }

    /// Puts `policy` (validated, the daemon's default applied) in force.
    pub async fn set_policy(&mut self, policy: &NetworkPolicy) -> Result<(), CallError> {
        let request = SupervisorRequest::SetPolicy(policy.into());
        expect::ok("SetPolicy", self.call(&request, CONTROL_DEADLINE).await?)
    }

    /// Makes pod container root `name` on `layers` (top first), with
    /// `limits` of its own within the sandbox's if given; a microVM's from
    /// `disk`, the layers as one ext4.
    pub async fn attach_root(
        &mut self,
        name: &str,
        layers: Vec<PathBuf>,
        limits: Option<crate::runtime::cgroups::RootLimits>,
        disk: Option<PathBuf>,
        volumes: Vec<crate::model::HostVolume>,
    ) -> Result<(), CallError> {
        let request = SupervisorRequest::AttachRoot {
            name: name.to_string(),
            layers,
            limits,
            disk,
            volumes,
        };
        expect::ok("AttachRoot", self.call(&request, PROCESS_DEADLINE).await?)
    }

    /// Kills what runs in pod container root `name` and removes it.
    pub async fn detach_root(&mut self, name: &str) -> Result<(), CallError> {
        let request = SupervisorRequest::DetachRoot {
            name: name.to_string(),
        };
        expect::ok("DetachRoot", self.call(&request, PROCESS_DEADLINE).await?)
    }

    /// Puts the sandbox's brokered secrets in force.
    pub async fn set_secrets(
        &mut self,
        brokered: crate::net::intercept::Brokered,
    ) -> Result<(), CallError> {
        let request = SupervisorRequest::SetSecrets(brokered);
        expect::ok("SetSecrets", self.call(&request, CONTROL_DEADLINE).await?)
    }

    pub async fn egress_log(&mut self) -> Result<Vec<EgressLogEntry>, CallError> {
        let reply = self
            .call(&SupervisorRequest::EgressLog, EGRESS_LOG_DEADLINE)
            .await?;
        expect::egress_log(reply)
    }

    /// A connection to `port` of the sandbox's app, made inside its
    /// network namespace. Nothing listening is a refusal of kind
    /// `Refused`. Uses up the connection (the descriptor must come with
    /// the first bytes read).
    pub async fn dial(mut self, port: u16) -> Result<std::net::TcpStream, CallError> {
        let (reply, fd) = self
            .conn
            .call_for_fd(&SupervisorRequest::Dial { port }, DIAL_DEADLINE)
            .await?;
        match (expect::answered(reply)?, fd) {
            (SupervisorReply::Dialed, Some(fd)) => Ok(std::net::TcpStream::from(fd)),
            (other, _) => Err(CallError::Unexpected {
                request: "Dial",
                reply: format!("{other:?} (a socket must come with Dialed)"),
            }),
        }
    }

    /// The daemon's end of a pooled sandbox's claim mailbox. Uses up the
    /// connection, as [`Self::dial`].
    pub async fn open_mailbox(mut self) -> Result<super::mailbox::Postbox, CallError> {
        // Before the request: the process that answers it is the one this
        // pidfd holds (a pid is not reused while its process lives).
        let supervisor = self
            .peer_pid()
            .ok_or_else(|| std::io::Error::other("the supervisor's pid is unknown"))
            .and_then(crate::pidfd::open)
            .map_err(|e| CallError::Client(ClientError::Unreachable(e)))?;
        let (reply, fd) = self
            .conn
            .call_for_fd(&SupervisorRequest::OpenMailbox, CONTROL_DEADLINE)
            .await?;
        match (expect::answered(reply)?, fd) {
            (SupervisorReply::Mailbox, Some(fd)) => {
                Ok(super::mailbox::Postbox::new(fd, supervisor))
            }
            (other, _) => Err(CallError::Unexpected {
                request: "OpenMailbox",
                reply: format!("{other:?} (a memfd must come with Mailbox)"),
            }),
        }
    }

    /// The TCP sockets listening in the sandbox.
    pub async fn listening_ports(
        &mut self,
    ) -> Result<Vec<sandbox_proto::ListeningSocket>, CallError> {
        let reply = self
            .call(&SupervisorRequest::ListeningPorts, FILE_DEADLINE)
            .await?;
        expect::file("ListeningPorts", reply, |r| match r {
            Reply::Listening(sockets) => Ok(sockets),
            other => Err(other),
        })
    }

    /// One file request to the agent; its refusal is [`CallError::Agent`].
    async fn file<T>(
        &mut self,
        request: &'static str,
        body: RequestBody,
        pick: impl FnOnce(Reply) -> Result<T, Reply>,
    ) -> Result<T, CallError> {
        let reply = self
            .call(&SupervisorRequest::File(body), FILE_DEADLINE)
            .await?;
        expect::file(request, reply, pick)
    }

    async fn file_ok(&mut self, request: &'static str, body: RequestBody) -> Result<(), CallError> {
        self.file(request, body, |reply| match reply {
            Reply::Ok => Ok(()),
            other => Err(other),
        })
        .await
    }

    /// Opens (creating or truncating) a file for writing; its handle.
    pub async fn open_write(&mut self, path: String, mode: u32) -> Result<u64, CallError> {
        self.file(
            "OpenWrite",
            RequestBody::OpenWrite { path, mode },
            |r| match r {
                Reply::Opened { handle, .. } => Ok(handle),
                other => Err(other),
            },
        )
        .await
    }

    /// Opens a file for reading; its handle and size.
    pub async fn open_read(&mut self, path: String) -> Result<(u64, u64), CallError> {
        self.file("OpenRead", RequestBody::OpenRead { path }, |r| match r {
            Reply::Opened { handle, size } => Ok((handle, size)),
            other => Err(other),
        })
        .await
    }

    pub async fn write(&mut self, handle: u64, data: Vec<u8>) -> Result<(), CallError> {
        self.file_ok("Write", RequestBody::Write { handle, data })
            .await
    }

    /// Up to `max` bytes; empty at the end of the file.
    pub async fn read(&mut self, handle: u64, max: u32) -> Result<Vec<u8>, CallError> {
        self.file("Read", RequestBody::Read { handle, max }, |r| match r {
            Reply::Data(data) => Ok(data),
            other => Err(other),
        })
        .await
    }

    pub async fn close(&mut self, handle: u64) -> Result<(), CallError> {
        self.file_ok("Close", RequestBody::Close { handle }).await
    }

    pub async fn stat(&mut self, path: String) -> Result<FileStat, CallError> {
        self.file("Stat", RequestBody::Stat { path }, |r| match r {
            Reply::Stat(stat) => Ok(stat),
            other => Err(other),
        })
        .await
    }

    pub async fn list_dir(&mut self, path: String) -> Result<Vec<FileStat>, CallError> {
        self.file("ListDir", RequestBody::ListDir { path }, |r| match r {
            Reply::Entries(entries) => Ok(entries),
            other => Err(other),
        })
        .await
    }

    pub async fn mkdir(&mut self, path: String, parents: bool, mode: u32) -> Result<(), CallError> {
        let body = RequestBody::Mkdir {
            path,
            parents,
            mode,
        };
        self.file_ok("Mkdir", body).await
    }

    pub async fn remove(&mut self, path: String, recursive: bool) -> Result<(), CallError> {
        self.file_ok("Remove", RequestBody::Remove { path, recursive })
            .await
    }

    /// Kill everything, remove the container; the supervisor exits after.
    pub async fn shutdown(&mut self) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::Shutdown, SHUTDOWN_DEADLINE)
            .await?;
        expect::ok("Shutdown", reply)
    }

    /// A microVM only: clone its scratch disk to `to` while paused.
    pub async fn clone_disk(&mut self, to: PathBuf) -> Result<(), CallError> {
        let reply = self
            .call(&SupervisorRequest::CloneDisk { to }, CHECKPOINT_DEADLINE)
            .await?;
        expect::ok("CloneDisk", reply)
    }

    pub async fn checkpoint(
        &mut self,
        target: CheckpointTarget,
    ) -> Result<Checkpointed, CallError> {
        let request = SupervisorRequest::Checkpoint(target);
        expect::checkpointed(self.call(&request, CHECKPOINT_DEADLINE).await?)
    }
}

/// A process's output, as `Attach` streams it.
pub struct OutputStream {
    conn: SupervisorConn,
}

impl OutputStream {
    /// The next item; `None` once the supervisor closed the stream.
    pub async fn next(&mut self) -> Result<Option<Attached>, CallError> {
        match self.conn.next().await? {
            Some(reply) => expect::output(reply).map(Some),
            None => Ok(None),
        }
    }
}

/// A supervisor's events, as `Watch` streams them.
pub struct EventStream {
    conn: SupervisorConn,
}

impl EventStream {
    /// The next event and its sequence number; `None` once the connection closed.
    pub async fn next(&mut self) -> Result<Option<(u64, SupervisorEvent)>, CallError> {
        match self.conn.next().await? {
            Some(reply) => expect::event(reply).map(Some),
            None => Ok(None),
        }
    }
}

/// A future of one supervisor call, boxed so that [`Supervisors`] can be a
/// trait object (the crate has no async-trait).
pub type CallFuture<'a, T> = BoxFuture<'a, Result<T, CallError>>;

/// What the daemon's orchestration asks of the sandboxes' supervisors, by
/// sandbox id: each call is one request on a fresh connection.
pub trait Supervisors: Send + Sync {
    fn health<'a>(&'a self, id: &'a str) -> CallFuture<'a, SupervisorHealth>;
    fn hand_over<'a>(&'a self, id: &'a str, change: HandOver) -> CallFuture<'a, ()>;
    fn set_policy<'a>(&'a self, id: &'a str, policy: &'a NetworkPolicy) -> CallFuture<'a, ()>;
    fn set_secrets<'a>(
        &'a self,
        id: &'a str,
        brokered: crate::net::intercept::Brokered,
    ) -> CallFuture<'a, ()>;
    fn limit_guest_pids<'a>(&'a self, id: &'a str, max: u64) -> CallFuture<'a, ()>;
    fn guest_pids<'a>(&'a self, id: &'a str) -> CallFuture<'a, u64>;
    fn open_mailbox<'a>(&'a self, id: &'a str) -> CallFuture<'a, super::mailbox::Postbox>;
    fn hold_trust_bundle<'a>(&'a self, id: &'a str, path: &'a str) -> CallFuture<'a, ()>;
    /// The root of the container at `paths`, whose init is `init_pid` in
    /// group `cgroups_path`, as the daemon reaches it.
    fn root(&self, paths: &SandboxPaths, init_pid: i32, cgroups_path: &str) -> HostRoot;
}

/// The real supervisors, at `<run dir>/<id>/shim.sock`.
pub struct SocketSupervisors {
    run_dir: PathBuf,
}

impl SocketSupervisors {
    pub fn new(run_dir: PathBuf) -> Self {
        Self { run_dir }
    }

    /// A connection to sandbox `id`'s supervisor.
    pub async fn client(&self, id: &str) -> Result<SupervisorClient, CallError> {
        SupervisorClient::connect(&SandboxPaths::new(&self.run_dir, id).socket()).await
    }
}

impl Supervisors for SocketSupervisors {
    fn health<'a>(&'a self, id: &'a str) -> CallFuture<'a, SupervisorHealth> {
        Box::pin(async move { self.client(id).await?.health().await })
    }

    fn hand_over<'a>(&'a self, id: &'a str, change: HandOver) -> CallFuture<'a, ()> {
        Box::pin(async move { self.client(id).await?.hand_over(change).await })
    }

    fn set_policy<'a>(&'a self, id: &'a str, policy: &'a NetworkPolicy) -> CallFuture<'a, ()> {
        Box::pin(async move { self.client(id).await?.set_policy(policy).await })
    }

    fn set_secrets<'a>(
        &'a self,
        id: &'a str,
        brokered: crate::net::intercept::Brokered,
    ) -> CallFuture<'a, ()> {
        Box::pin(async move { self.client(id).await?.set_secrets(brokered).await })
    }

    fn limit_guest_pids<'a>(&'a self, id: &'a str, max: u64) -> CallFuture<'a, ()> {
        Box::pin(async move { self.client(id).await?.limit_guest_pids(max).await })
    }

    fn guest_pids<'a>(&'a self, id: &'a str) -> CallFuture<'a, u64> {
        Box::pin(async move { self.client(id).await?.guest_pids().await })
    }

    fn open_mailbox<'a>(&'a self, id: &'a str) -> CallFuture<'a, super::mailbox::Postbox> {
        Box::pin(async move { self.client(id).await?.open_mailbox().await })
    }

    fn hold_trust_bundle<'a>(&'a self, id: &'a str, path: &'a str) -> CallFuture<'a, ()> {
        Box::pin(async move { self.client(id).await?.hold_trust_bundle(path).await })
    }

    /// Through its init: no mount namespace of the host's holds it.
    fn root(&self, _paths: &SandboxPaths, init_pid: i32, cgroups_path: &str) -> HostRoot {
        HostRoot::through_init(init_pid, cgroups_path)
    }
}

/// A recording fake of [`Supervisors`] for unit tests of the orchestration:
/// every call is recorded, and each answers with the reply scripted for its
/// sandbox (decoded as the real client decodes it), or as an unreachable
/// supervisor when none is scripted.
#[cfg(test)]
pub mod fake {
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::supervisor::protocol::Ceilings;

    #[derive(Debug, Clone, PartialEq)]
    pub enum Call {
        Health(String),
        /// A claim's parts, the secrets by name (never their values).
        HandOver {
            id: String,
            policy: Option<NetworkPolicy>,
            secrets: Option<Vec<String>>,
            env: Option<Vec<(String, String)>>,
            guest_pids: Option<u64>,
            ceilings: Option<Ceilings>,
            disk_quota_bytes: Option<u64>,
            /// The image bundle's length the append expects.
            trust_bundle_append: Option<u64>,
        },
        SetPolicy(String, NetworkPolicy),
        /// The names of the secrets (never their values).
        SetSecrets(String, Vec<String>),
        LimitGuestPids(String, u64),
        GuestPids(String),
        OpenMailbox(String),
        HoldTrustBundle(String),
    }

    #[derive(Default)]
    pub struct FakeSupervisors {
        calls: Mutex<Vec<Call>>,
        replies: Mutex<HashMap<String, VecDeque<SupervisorReply>>>,
        /// Health calls wait here before they answer, when set.
        health_gate: Mutex<Option<Arc<tokio::sync::Barrier>>>,
    }

    impl FakeSupervisors {
        /// Makes every health call wait until `calls` of them are in
        /// flight at once: callers that ask one at a time never finish.
        pub fn gate_health(&self, calls: usize) {
            *self.health_gate.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Arc::new(tokio::sync::Barrier::new(calls)));
        }

        /// Queues `reply` as the answer to the next call for sandbox `id`.
        pub fn script(&self, id: &str, reply: SupervisorReply) {
            self.replies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id.to_string())
                .or_default()
                .push_back(reply);
        }

        /// Every call so far, in order.
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        fn answer(&self, id: &str, call: Call) -> Result<SupervisorReply, CallError> {
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(call);
            self.replies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(id)
                .and_then(VecDeque::pop_front)
                .ok_or_else(|| {
                    CallError::Connect(ClientError::Unreachable(std::io::Error::from(
                        std::io::ErrorKind::NotFound,
                    )))
                })
        }
    }

    impl Supervisors for FakeSupervisors {
        fn health<'a>(&'a self, id: &'a str) -> CallFuture<'a, SupervisorHealth> {
            let reply = self.answer(id, Call::Health(id.into()));
            let gate = self
                .health_gate
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.wait().await;
                }
                expect::health(reply?)
            })
        }

        fn hand_over<'a>(&'a self, id: &'a str, change: HandOver) -> CallFuture<'a, ()> {
            let call = Call::HandOver {
                id: id.into(),
                policy: change.policy.map(Into::into),
                secrets: change
                    .secrets
                    .map(|b| b.secrets.iter().map(|s| s.name.clone()).collect()),
                env: change.env,
                guest_pids: change.guest_pids,
                ceilings: change.ceilings,
                disk_quota_bytes: change.disk_quota_bytes,
                trust_bundle_append: change.trust_bundle_append.map(|a| a.image_length),
            };
            let reply = self.answer(id, call);
            Box::pin(async move { expect::ok("HandOver", reply?) })
        }

        fn set_policy<'a>(&'a self, id: &'a str, policy: &'a NetworkPolicy) -> CallFuture<'a, ()> {
            let reply = self.answer(id, Call::SetPolicy(id.into(), policy.clone()));
            Box::pin(async move { expect::ok("SetPolicy", reply?) })
        }

        fn set_secrets<'a>(
            &'a self,
            id: &'a str,
            brokered: crate::net::intercept::Brokered,
        ) -> CallFuture<'a, ()> {
            let names = brokered.secrets.iter().map(|s| s.name.clone()).collect();
            let reply = self.answer(id, Call::SetSecrets(id.into(), names));
            Box::pin(async move { expect::ok("SetSecrets", reply?) })
        }

        fn limit_guest_pids<'a>(&'a self, id: &'a str, max: u64) -> CallFuture<'a, ()> {
            let reply = self.answer(id, Call::LimitGuestPids(id.into(), max));
            Box::pin(async move { expect::ok("LimitGuestPids", reply?) })
        }

        fn guest_pids<'a>(&'a self, id: &'a str) -> CallFuture<'a, u64> {
            let reply = self.answer(id, Call::GuestPids(id.into()));
            Box::pin(async move { expect::guest_pids(reply?) })
        }

        /// Fake supervisors mount nothing: the root is whatever the test
        /// put at the run directory's `rootfs`.
        fn root(&self, paths: &SandboxPaths, _init_pid: i32, _cgroups: &str) -> HostRoot {
            HostRoot::in_directory(&paths.rootfs())
        }

        fn hold_trust_bundle<'a>(&'a self, id: &'a str, _path: &'a str) -> CallFuture<'a, ()> {
            let reply = self.answer(id, Call::HoldTrustBundle(id.into()));
            Box::pin(async move { expect::ok("HoldTrustBundle", reply?) })
        }

        /// A fake has no memfd to hand out: a scripted reply is refused as
        /// one without its descriptor, as the real client would.
        fn open_mailbox<'a>(
            &'a self,
            id: &'a str,
        ) -> CallFuture<'a, crate::supervisor::mailbox::Postbox> {
            let reply = self.answer(id, Call::OpenMailbox(id.into()));
            Box::pin(async move {
                Err(match reply {
                    Err(e) => e,
                    Ok(other) => CallError::Unexpected {
                        request: "OpenMailbox",
                        reply: format!("{other:?} (a memfd must come with Mailbox)"),
                    },
                })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::protocol::SupervisorErrorKind;

    #[test]
    fn a_refusal_and_a_misfit_reply_become_errors_in_one_place() {
        let refused = expect::process(
            "Get",
            SupervisorReply::Error(SupervisorError::new(
                SupervisorErrorKind::UnknownProcess,
                "no process 7",
            )),
        );
        assert!(
            matches!(refused, Err(CallError::Refused(e)) if e.kind == SupervisorErrorKind::UnknownProcess)
        );
        let misfit = expect::process("Get", SupervisorReply::Ok);
        let text = misfit.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(text, "unexpected supervisor reply to Get: Ok");
    }

    #[test]
    fn an_agent_refusal_keeps_its_kind() {
        let reply = SupervisorReply::Agent(Reply::Error(AgentError {
            kind: sandbox_proto::ErrorKind::NotFound,
            message: "no /x".into(),
        }));
        let err = expect::file("Stat", reply, |r| match r {
            Reply::Stat(s) => Ok(s),
            other => Err(other),
        })
        .expect_err("an error");
        assert!(
            matches!(&err, CallError::Agent(e) if e.kind == sandbox_proto::ErrorKind::NotFound),
            "{err:?}"
        );
        let misfit = expect::file("Stat", SupervisorReply::Agent(Reply::Ok), |r| match r {
            Reply::Stat(s) => Ok(s),
            other => Err(other),
        });
        assert_eq!(
            misfit.map_err(|e| e.to_string()).err().as_deref(),
            Some("unexpected supervisor reply to Stat: Agent(Ok)")
        );
    }
}
