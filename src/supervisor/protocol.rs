//! The daemon <-> supervisor protocol on each sandbox's `shim.sock`.
//!
//! Same framing as the agent link (`sandbox_proto::encode`). A connection
//! carries requests one after another; each gets one reply, except `Attach`,
//! which streams output until the process exits and then ends the connection.
//! Only root (the daemon) can reach the socket, so the supervisor trusts it.
//!
//! A supervisor outlives the daemon that started it, so after an upgrade a
//! daemon meets supervisors of an earlier build. The frames are positional
//! postcard with no schema, so the two must agree on every encoding:
//! [`SUPERVISOR_PROTOCOL_VERSION`] names the encoding, the health reply
//! carries it, and the daemon reads it (with [`check_supervisor_version`])
//! before anything else a supervisor says. `tests/supervisor_frames.rs` pins
//! the bytes of every frame.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::model::Process;
use sandbox_proto::{FrameDecoder, PtySize, Reply, RequestBody, Stream};

/// The encoding of every frame on this socket. Bump it with any change of
/// what a frame may hold or how it is encoded: a variant added (even at the
/// end: a supervisor of the previous build cannot decode a request it does
/// not know), removed or moved; a field added, removed or reordered in a
/// variant or in any type a frame carries (`Process`, `EgressCounters`, the
/// agent's `RequestBody` and `Reply`...); a field's type changed. Then
/// update the reference frames in `tests/supervisor_frames.rs`. A daemon
/// adopts only supervisors of its own version: the others are left running,
/// marked failed (see `Manager::recover`).
///
/// What never changes, so that any two builds can read each other's
/// version: `SupervisorRequest::Health` is tag 0, the health reply is tag
/// [`HEALTH_REPLY_TAG`] and its first field is the version.
///
/// 0 is the supervisors of builds before the version existed; their health
/// reply was tag 0.
///
/// 2 added `SetSecrets`, the health reply's `substitutions` and the egress
/// log's `request`.
///
/// 3 added `Dial` (with `Dialed`, whose frame carries a descriptor),
/// `ListeningPorts` and the error kind `Refused`.
///
/// 4 added `SpawnSpec::root`, `AttachRoot` and `DetachRoot`.
///
/// 5 added the error kind `AgentTimeout` and `Checkpoint::empty_mounts`.
///
/// 6 added `LimitGuestPids`, `GuestPids`, the agent's
/// `RequestBody::LimitPids`, `RequestBody::Abandon` and
/// `RequestBody::GuestPids`, and its `Reply::Pids`.
///
/// 7 added `Checkpoint::fresh_tmpfs`.
///
/// 8 added `AttachRoot::limits`.
///
/// 9 counts the agent's `RequestBody::WarmInterpreter`, added with warm
/// Python while the version stayed 8 (`File` frames carry a `RequestBody`).
///
/// 10 added `HandOver`.
///
/// 11 added `AttachRoot::disk` (a microVM's root) and the agent's
/// `RequestBody::MountRoot` and `UnmountRoot`.
///
/// 12 added `OpenMailbox` (with `Mailbox`, whose frame carries a
/// descriptor) and the claims posted through it.
///
/// 13 added `AttachRoot::volumes`.
///
/// 14 added `GuestRootUsage` and counts the agent's
/// `RequestBody::ForwardLoopback` and `RootUsage`, and `Reply::Forwarding`
/// and `RootUsage` (`Agent` frames carry them).
///
/// 15 counts the agent's `RequestBody::WriteVolume`, `BindVolumes` and
/// `MountRoot::volumes`.
///
/// 16 counts the agent's `RequestBody::ReplaceVolume` and
/// `GuestVolume::within`.
///
/// 17 added `HandOver::ceilings`, `disk_quota_bytes` and
/// `trust_bundle_append`, and `HoldTrustBundle`.
///
/// 18 added `SupervisorHealth::claimed`.
///
/// 19 added `SpawnSpec::groups` and counts the agent's
/// `SpawnRequest::groups`.
///
/// 20 added `SpawnSpec::confinement` and counts the agent's
/// `SpawnRequest::confinement`.
///
/// 21 added `AttachRoot::limits`' `cpu_shares` and `oom_group`, and
/// counts the agent's `GuestRootLimits::cpu_weight` and `oom_group`.
pub const SUPERVISOR_PROTOCOL_VERSION: u32 = supervisor_protocol_version!();

/// The tag (variant index) of [`SupervisorReply::Health`].
pub const HEALTH_REPLY_TAG: u32 = 12;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SupervisorRequest {
    /// Stays tag 0 in every version (see [`SUPERVISOR_PROTOCOL_VERSION`]).
    Health,
    Spawn(SpawnSpec),
    Get {
        proc: u64,
    },
    List,
    Attach {
        proc: u64,
        stdout_offset: u64,
        stderr_offset: u64,
    },
    WriteStdin {
        proc: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    CloseStdin {
        proc: u64,
    },
    Signal {
        proc: u64,
        signal: i32,
    },
    /// Kills the process's whole tree through its cgroup.
    Kill {
        proc: u64,
    },
    Resize {
        proc: u64,
        size: PtySize,
    },
    Wait {
        proc: u64,
        timeout_ms: u64,
    },
    /// Streams the supervisor's events after sequence number `after`, then
    /// live, until the connection closes.
    Watch {
        after: u64,
    },
    /// Replaces the environment new processes start with.
    SetEnv {
        env: Vec<(String, String)>,
    },
    /// Puts a new egress policy in force (the daemon validated it and
    /// applied its default); open connections it forbids are closed.
    /// A newtype over [`PolicyFields`]: its fields in order, the same
    /// bytes the struct variant of earlier builds had.
    SetPolicy(PolicyFields),
    /// The sandbox's recent egress log.
    EgressLog,
    /// A file request passed to the agent as is (file variants only).
    File(RequestBody),
    /// Kill everything, remove the container, exit.
    Shutdown,
    /// A microVM only: pause the guest, clone its scratch disk to `to`,
    /// resume it. Reply: [`SupervisorReply::Ok`].
    CloneDisk {
        to: std::path::PathBuf,
    },
    /// Checkpoint the sandbox's process tree (frozen by the daemon, left
    /// running) with CRIU. Reply: [`SupervisorReply::Checkpointed`].
    /// A newtype over the runtime's own struct: its fields in order, the
    /// same bytes the struct variant of earlier builds had.
    Checkpoint(crate::runtime::CheckpointTarget),
    /// The sandbox's brokered secrets, values and leaves included
    /// (replacing what it had). Only ever sent over this socket.
    SetSecrets(crate::net::intercept::Brokered),
    /// Connect to `port` of the sandbox's app from inside its network
    /// namespace (the ingress). Reply: [`SupervisorReply::Dialed`], whose
    /// frame carries the connected socket (SCM_RIGHTS); nothing listening
    /// is an error of kind [`SupervisorErrorKind::Refused`].
    Dial {
        port: u16,
    },
    /// The TCP ports something in the sandbox listens on (the agent reads
    /// them). Reply: [`SupervisorReply::Agent`] with `Reply::Listening`.
    ListeningPorts,
    /// Make a pod container's root `name`. A container sandbox's is made
    /// on `layers` (host directories, top first) and attached inside it
    /// (see `runtime::pod_roots`), in a group of its own under the
    /// sandbox's when it has `limits`. A microVM's comes as `disk` (those
    /// layers as one read-only ext4), which goes into a free disk slot of
    /// the VM for its agent to mount. A container's `volumes` (host files
    /// and directories) are bound into its root (`runtime::volumes`).
    /// Reply: [`SupervisorReply::Ok`].
    AttachRoot {
        name: String,
        layers: Vec<std::path::PathBuf>,
        limits: Option<crate::runtime::cgroups::RootLimits>,
        disk: Option<std::path::PathBuf>,
        volumes: Vec<crate::model::HostVolume>,
    },
    /// Kill the processes started in root `name`, have the agent unmount
    /// it and remove its writable layer. Reply: [`SupervisorReply::Ok`].
    DetachRoot {
        name: String,
    },
    /// A microVM only: lower the pids limit over every process its agent
    /// starts (a pool claim that asks for fewer than the VM booted with).
    /// A container's is its host cgroup's, which a claim's `Ceilings`
    /// lower. Reply: [`SupervisorReply::Ok`].
    LimitGuestPids {
        max: u64,
    },
    /// A microVM only: the tasks its guest's processes hold (the agent
    /// counts them). Reply: [`SupervisorReply::Agent`] with `Reply::Pids`.
    GuestPids,
    /// What a pool claim changes in a pooled sandbox, in one exchange
    /// instead of one connection per part: all of it is in force when the
    /// reply comes. Reply: [`SupervisorReply::Ok`]; on an error some parts
    /// may be in force, and the daemon removes the sandbox.
    HandOver(HandOver),
    /// A pooled sandbox's claim mailbox (`mailbox.rs`), made at the first
    /// ask: a claim posted there is in force before the next request is
    /// answered, without a request of its own. Reply:
    /// [`SupervisorReply::Mailbox`], whose frame carries the memfd.
    OpenMailbox,
    /// A microVM only: what pod container root `name`, one with limits of
    /// its own, uses in its guest (the agent reads its group). Reply:
    /// [`SupervisorReply::Agent`] with `Reply::RootUsage`; an error of kind
    /// [`SupervisorErrorKind::UnknownRoot`] for a root without its own
    /// group.
    GuestRootUsage {
        name: String,
    },
    /// A pooled container only: open its trust bundle at `path` (relative
    /// to its root, reached through its init) for appending, copied up
    /// into the root's own layer if it is not there yet, and hold it for a
    /// claim's [`HandOver::trust_bundle_append`]. Reply:
    /// [`SupervisorReply::Ok`]; an error where it is no regular file
    /// reached through no symlink.
    HoldTrustBundle {
        path: String,
    },
}

/// The parts of a pool claim that live in the supervisor (see
/// [`SupervisorRequest::HandOver`]); a part left `None` stays as the pool
/// made it. Applied the host's files first (`ceilings`, `disk_quota_bytes`:
/// what the kernel may refuse, before anything else changed; then
/// `trust_bundle_append`), then in field order, a microVM's guest pids
/// limit last (it needs the agent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HandOver {
    /// The egress policy (as `SetPolicy`).
    pub policy: Option<PolicyFields>,
    /// The brokered secrets, values and leaves included (as `SetSecrets`).
    pub secrets: Option<crate::net::intercept::Brokered>,
    /// The environment new processes start with (as `SetEnv`).
    pub env: Option<Vec<(String, String)>>,
    /// A microVM only: the pids limit its agent keeps (as `LimitGuestPids`).
    pub guest_pids: Option<u64>,
    /// Lower ceilings for the sandbox's cgroups (the daemon has checked
    /// that its memory use is under the new limit). A supervisor of
    /// protocol 16 would drop this field and the next unread (postcard
    /// ignores trailing bytes): only recovery's removal of every pooled
    /// sandbox of another protocol keeps a claim from reaching one.
    pub ceilings: Option<Ceilings>,
    /// A container only: its writable layer's new qgroup limit (bytes).
    pub disk_quota_bytes: Option<u64>,
    /// The brokered CA, appended to the trust bundle the supervisor holds
    /// ([`SupervisorRequest::HoldTrustBundle`]).
    pub trust_bundle_append: Option<TrustBundleAppend>,
}

/// What a claim with secrets appends to a held trust bundle that is still
/// the image's: `tail` where the file has `image_length` bytes (else the
/// sandbox fails: the bundle changed under the pool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrustBundleAppend {
    pub image_length: u64,
    pub tail: Vec<u8>,
}

/// The cgroup ceilings a claim lowers: a container's CPU quota, memory and
/// pids; a microVM's CPU quota alone (its memory is its guest's RAM, its
/// pids limit its agent's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Ceilings {
    Container(crate::runtime::cgroups::CgroupLimits),
    VmCpuQuota { quota_us: i64 },
}

impl HandOver {
    /// Whether the claim changes nothing the supervisor holds.
    pub fn is_empty(&self) -> bool {
        self.policy.is_none()
            && self.secrets.is_none()
            && self.env.is_none()
            && self.guest_pids.is_none()
            && self.ceilings.is_none()
            && self.disk_quota_bytes.is_none()
            && self.trust_bundle_append.is_none()
    }
}

/// The fields of [`crate::net::policy::NetworkPolicy`], spelled out: its
/// serde skips absent fields, which this binary framing cannot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyFields {
    pub block_network: Option<bool>,
    pub allow_list: Option<Vec<String>>,
}

impl From<&crate::net::policy::NetworkPolicy> for PolicyFields {
    fn from(policy: &crate::net::policy::NetworkPolicy) -> Self {
        // Spelled out: a field added to the policy must be added here.
        let crate::net::policy::NetworkPolicy {
            block_network,
            allow_list,
        } = policy;
        Self {
            block_network: *block_network,
            allow_list: allow_list.clone(),
        }
    }
}

impl From<PolicyFields> for crate::net::policy::NetworkPolicy {
    fn from(fields: PolicyFields) -> Self {
        Self {
            block_network: fields.block_network,
            allow_list: fields.allow_list,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    #[serde(with = "serde_bytes")]
    pub code: Option<Vec<u8>>,
    /// Added to (and overriding) the sandbox's environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub stdin: bool,
    pub pty: Option<PtySize>,
    pub timeout_ms: Option<u64>,
    /// A pod container's root (from `AttachRoot`) to run in.
    pub root: Option<String>,
    /// Supplementary groups (the primary is `gid`).
    pub groups: Vec<u32>,
    /// Capabilities, seccomp filter and OOM score of its own.
    pub confinement: sandbox_proto::confinement::ProcessConfinement,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SupervisorReply {
    /// Tag 0 was the health reply of the unversioned protocol (v0). Nothing
    /// sends it now; it holds the tag so the tags after it stay where v0
    /// had them, and a v0 supervisor's health reply decodes as this (postcard
    /// leaves the rest of a frame unread) instead of failing.
    UnversionedHealth,
    Ok,
    Process(Process),
    Processes(Vec<Process>),
    Output {
        stream: Stream,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Dropped {
        stream: Stream,
        bytes: u64,
    },
    Exited(Process),
    EgressLog(Vec<crate::net::proxy::EgressLogEntry>),
    Agent(Reply),
    Event {
        seq: u64,
        event: SupervisorEvent,
    },
    Error(SupervisorError),
    Checkpointed {
        checkpoint: crate::runtime::sandbox::Checkpoint,
        next_proc: u64,
        /// The processes running at the checkpoint, which forks inherit.
        processes: Vec<crate::model::Process>,
    },
    /// The answer to [`SupervisorRequest::Health`]. Tag [`HEALTH_REPLY_TAG`]
    /// in every version, with the protocol version as its first field. A new
    /// tag rather than a field added to v0's tag-0 reply: v0's first field
    /// is the init pid, so a version in front of it could not be told from
    /// a pid, and a version behind fields that may change could not be found
    /// by a daemon that reads those fields differently.
    Health(SupervisorHealth),
    /// A connected socket to the port asked for travels with this frame.
    Dialed,
    /// The claim mailbox's memfd travels with this frame.
    Mailbox,
}

/// What a supervisor reports without being asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SupervisorEvent {
    ProcessExited(Process),
    /// The sandbox died on its own (agent gone, init exited).
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisorHealth {
    /// [`SUPERVISOR_PROTOCOL_VERSION`] of the supervisor's build; first, so
    /// it is read before any field whose encoding may differ.
    pub protocol: u32,
    pub init_pid: i32,
    pub oom_kills: u64,
    /// Set once the sandbox died on its own (agent gone).
    pub failure: Option<String>,
    pub egress: crate::net::proxy::EgressCounters,
    /// Requests each brokered secret was put into, by name.
    pub substitutions: Vec<(String, u64)>,
    /// A pool claim reached the supervisor (taken from its mailbox, or a
    /// `HandOver` request), whether or not it was put in force: a pooled
    /// sandbox that says so is nobody's to pool again.
    pub claimed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorErrorKind {
    UnknownProcess,
    InvalidInput,
    /// The process exists but the request does not fit its state.
    Conflict,
    /// The agent is gone.
    AgentGone,
    Internal,
    /// Nothing accepted the connection (the app does not listen yet).
    Refused,
    /// No pod container root of that name is attached.
    UnknownRoot,
    /// The agent did not answer in time; the sandbox still runs.
    AgentTimeout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct SupervisorError {
    pub kind: SupervisorErrorKind,
    pub message: String,
}

impl SupervisorError {
    pub fn new(kind: SupervisorErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the sandbox's supervisor is not reachable: {0}")]
    Unreachable(std::io::Error),
    #[error("the sandbox's supervisor did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the sandbox's supervisor broke the protocol: {0}")]
    Protocol(String),
    #[error(transparent)]
    Version(#[from] VersionMismatch),
}

/// A supervisor this daemon must not talk to beyond the health check: it
/// speaks another encoding, so any other request could be misread.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionMismatch {
    #[error(
        "its supervisor is from an earlier sandboxd build that speaks the unversioned \
         supervisor protocol (v0), this daemon v{SUPERVISOR_PROTOCOL_VERSION}: {WHAT_TO_DO}"
    )]
    Unversioned,
    #[error(
        "its supervisor speaks supervisor protocol v{0}, this daemon \
         v{SUPERVISOR_PROTOCOL_VERSION}: {WHAT_TO_DO}"
    )]
    Other(u32),
    #[error(
        "its supervisor answered the health check with a frame this daemon (supervisor \
         protocol v{SUPERVISOR_PROTOCOL_VERSION}) cannot read ({0}), so it is from another \
         sandboxd build: {WHAT_TO_DO}"
    )]
    Unreadable(String),
}

const WHAT_TO_DO: &str = "delete the sandbox, or run the matching sandboxd build to drain it";

/// Reads the protocol version from the payload of a supervisor's answer to
/// [`SupervisorRequest::Health`] without decoding the rest, which is only
/// safe to decode once the versions match. Relies on what every version
/// keeps (see [`SUPERVISOR_PROTOCOL_VERSION`]): a postcard enum is its tag
/// as a varint, then its fields in order, and the versioned health reply is
/// tag [`HEALTH_REPLY_TAG`] with the version first.
pub fn check_supervisor_version(payload: &[u8]) -> Result<(), VersionMismatch> {
    let unreadable = |e: postcard::Error| VersionMismatch::Unreadable(e.to_string());
    let (tag, rest) = postcard::take_from_bytes::<u32>(payload).map_err(unreadable)?;
    match tag {
        0 => Err(VersionMismatch::Unversioned),
        HEALTH_REPLY_TAG => match postcard::take_from_bytes::<u32>(rest).map_err(unreadable)? {
            (SUPERVISOR_PROTOCOL_VERSION, _) => Ok(()),
            (other, _) => Err(VersionMismatch::Other(other)),
        },
        other => Err(VersionMismatch::Unreadable(format!(
            "reply tag {other} where the health reply is tag {HEALTH_REPLY_TAG}"
        ))),
    }
}

/// One connection to a supervisor.
pub struct SupervisorConn {
    stream: UnixStream,
    decoder: FrameDecoder,
    buf: Vec<u8>,
}

impl SupervisorConn {
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(ClientError::Unreachable)?;
        Ok(Self {
            stream,
            decoder: FrameDecoder::new(),
            buf: vec![0u8; 64 * 1024],
        })
    }

    pub async fn send(&mut self, request: &SupervisorRequest) -> Result<(), ClientError> {
        let frame =
            sandbox_proto::encode(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.stream
            .write_all(&frame)
            .await
            .map_err(ClientError::Unreachable)
    }

    /// The pid of the supervisor at the other end.
    pub fn peer_pid(&self) -> Option<i32> {
        self.stream.peer_cred().ok().and_then(|c| c.pid())
    }

    /// The next reply, or `None` when the supervisor closed the connection.
    pub async fn next(&mut self) -> Result<Option<SupervisorReply>, ClientError> {
        match self.next_payload().await? {
            Some(frame) => sandbox_proto::decode(&frame)
                .map(Some)
                .map_err(|e| ClientError::Protocol(e.to_string())),
            None => Ok(None),
        }
    }

    /// The next frame's payload, undecoded.
    async fn next_payload(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        loop {
            if let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                return Ok(Some(frame));
            }
            let n = self
                .stream
                .read(&mut self.buf)
                .await
                .map_err(ClientError::Unreachable)?;
            if n == 0 {
                return Ok(None);
            }
            self.decoder.push(&self.buf[..n]);
        }
    }

    /// Sends one request and waits for its reply, bounded by `deadline`.
    pub async fn call(
        &mut self,
        request: &SupervisorRequest,
        deadline: Duration,
    ) -> Result<SupervisorReply, ClientError> {
        let exchange = async {
            self.send(request).await?;
            self.next()
                .await?
                .ok_or_else(|| ClientError::Protocol("connection closed before the reply".into()))
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| ClientError::Timeout(deadline))?
    }

    /// Sends one request and waits for its reply and the descriptor that
    /// came with it (SCM_RIGHTS), if any: the exchange of `Dial`. Run on
    /// a fresh connection: bytes already buffered would carry no
    /// descriptor.
    pub async fn call_for_fd(
        &mut self,
        request: &SupervisorRequest,
        deadline: Duration,
    ) -> Result<(SupervisorReply, Option<std::os::fd::OwnedFd>), ClientError> {
        let exchange = async {
            self.send(request).await?;
            let mut passed = None;
            loop {
                if let Some(frame) = self
                    .decoder
                    .next_frame()
                    .map_err(|e| ClientError::Protocol(e.to_string()))?
                {
                    let reply = sandbox_proto::decode(&frame)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                    return Ok((reply, passed));
                }
                let (n, fd) = self.receive_with_fd().await?;
                if n == 0 {
                    return Err(ClientError::Protocol(
                        "connection closed before the reply".into(),
                    ));
                }
                if let Some(fd) = fd {
                    passed = Some(fd);
                }
            }
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| ClientError::Timeout(deadline))?
    }

    /// One recvmsg into the decoder; the descriptor it carried, if any.
    async fn receive_with_fd(
        &mut self,
    ) -> Result<(usize, Option<std::os::fd::OwnedFd>), ClientError> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let raw = self.stream.as_raw_fd();
        let buf = &mut self.buf;
        let (n, fds) = self
            .stream
            .async_io(tokio::io::Interest::READABLE, || {
                let mut iov = [std::io::IoSliceMut::new(buf)];
                let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
                let msg =
                    recvmsg::<()>(raw, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
                        .map_err(std::io::Error::from)?;
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        fds.extend(received);
                    }
                }
                Ok((msg.bytes, fds))
            })
            .await
            .map_err(ClientError::Unreachable)?;
        // SAFETY: each descriptor was just received with this message and
        // is owned by nobody else; OwnedFd closes every one not kept.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        self.decoder.push(&self.buf[..n]);
        Ok((n, owned.pop()))
    }

    /// Asks for the supervisor's health, checking its protocol version
    /// before decoding anything else: the call to make first on a
    /// supervisor this daemon did not start. [`ClientError::Version`] when
    /// it speaks another version; then send it nothing more.
    pub async fn checked_health(
        &mut self,
        deadline: Duration,
    ) -> Result<SupervisorHealth, ClientError> {
        let exchange = async {
            self.send(&SupervisorRequest::Health).await?;
            self.next_payload()
                .await?
                .ok_or_else(|| ClientError::Protocol("connection closed before the reply".into()))
        };
        let payload = tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| ClientError::Timeout(deadline))??;
        check_supervisor_version(&payload)?;
        match sandbox_proto::decode(&payload) {
            Ok(SupervisorReply::Health(health)) => Ok(health),
            Ok(other) => Err(ClientError::Protocol(format!(
                "answered health with {other:?}"
            ))),
            Err(e) => Err(ClientError::Protocol(e.to_string())),
        }
    }
}
