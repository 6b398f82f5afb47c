//! The daemon <-> supervisor protocol on each sandbox's `shim.sock`.
//!
//! Same framing as the agent link (`sandbox_proto::encode`). A connection
//! carries requests one after another; each gets one reply, except `Attach`,
//! which streams output until the process exits and then ends the connection.
//! Only root (the daemon) can reach the socket, so the supervisor trusts it.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::model::Process;
use sandbox_proto::{FrameDecoder, PtySize, Reply, RequestBody, Stream};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SupervisorRequest {
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
    /// (The fields of [`crate::net::policy::NetworkPolicy`], spelled out:
    /// its serde skips absent fields, which this binary framing cannot.)
    SetPolicy {
        block_network: Option<bool>,
        allow_list: Option<Vec<String>>,
    },
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
    Checkpoint {
        criu: std::path::PathBuf,
        freezer: std::path::PathBuf,
        images_dir: std::path::PathBuf,
        work_dir: std::path::PathBuf,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub code: Option<Vec<u8>>,
    /// Added to (and overriding) the sandbox's environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub stdin: bool,
    pub pty: Option<PtySize>,
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SupervisorReply {
    Health(SupervisorHealth),
    Ok,
    Process(Process),
    Processes(Vec<Process>),
    Output {
        stream: Stream,
        offset: u64,
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
}

/// What a supervisor reports without being asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SupervisorEvent {
    ProcessExited(Process),
    /// The sandbox died on its own (agent gone, init exited).
    Failed(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SupervisorHealth {
    pub init_pid: i32,
    pub oom_kills: u64,
    /// Set once the sandbox died on its own (agent gone).
    pub failure: Option<String>,
    pub egress: crate::net::proxy::EgressCounters,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorErrorKind {
    UnknownProcess,
    InvalidInput,
    /// The process exists but the request does not fit its state.
    Conflict,
    /// The agent is gone or did not answer in time.
    AgentGone,
    Internal,
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
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
        loop {
            if let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                return sandbox_proto::decode(&frame)
                    .map(Some)
                    .map_err(|e| ClientError::Protocol(e.to_string()));
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
}
