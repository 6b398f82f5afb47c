//! The frame reader: pulls bytes and descriptors off the link, cuts frames,
//! and routes each request to its handler without waiting for it, so one slow
//! request never holds up the next. Per-process stdin and per-handle file
//! operations go to queues that keep their order.

use std::io;
use std::sync::Arc;

use sandbox_proto::{
    decode, AgentError, ErrorKind, FrameDecoder, Reply, Request, RequestBody, PROTOCOL_VERSION,
};
use tokio::sync::OwnedSemaphorePermit;

use crate::agent::{Agent, MAX_IN_FLIGHT};
use crate::files;
use crate::guest_groups::GuestGroups;
use crate::handles::{self, HandleOp};
use crate::link::{FdQueue, Link, LinkError};
use crate::process;
use crate::stdin::{self, StdinOp};

const RECV_BUFFER: usize = 64 * 1024;

/// Serves requests until the host closes the link (Ok) or breaks the framing (Err).
pub async fn serve(agent: Arc<Agent>, link: Arc<Link>) -> Result<(), LinkError> {
    let mut decoder = FrameDecoder::new();
    let mut queue = FdQueue::default();
    let mut buf = vec![0u8; RECV_BUFFER];
    let mut received = Vec::new();
    loop {
        let n = link.recv(&mut buf, &mut received).await?;
        for fd in received.drain(..) {
            queue.push(fd)?;
        }
        if n == 0 {
            return Ok(());
        }
        decoder.push(&buf[..n]);
        while let Some(frame) = decoder.next_frame()? {
            match decode::<Request>(&frame) {
                Ok(request) => route(&agent, request, &mut queue).await,
                Err(e) => refuse_undecodable(&agent, &frame, e).await?,
            }
        }
    }
}

/// A frame that does not decode may still start with a readable id (a newer
/// host using a request this agent lacks): answer that id and carry on.
/// Without even an id there is nobody to answer, and the link is dropped.
async fn refuse_undecodable(
    agent: &Agent,
    frame: &[u8],
    error: sandbox_proto::FrameError,
) -> Result<(), LinkError> {
    match postcard::take_from_bytes::<u64>(frame) {
        Ok((id, _)) => {
            let message = format!("unsupported or malformed request: {error}");
            let _ = agent
                .outbox
                .error(id, AgentError::new(ErrorKind::InvalidInput, message))
                .await;
            Ok(())
        }
        Err(_) => Err(LinkError::Frame(error)),
    }
}

async fn route(agent: &Arc<Agent>, request: Request, queue: &mut FdQueue) {
    let Request { id, body } = request;
    // Descriptors are claimed even if the request is refused below, so the
    // ones sent with later Spawn frames still line up.
    let claimed = match &body {
        RequestBody::Spawn(spawn) => Some(queue.claim(usize::from(spawn.cgroup_fds))),
        _ => None,
    };
    // Cheap requests are answered right here: they need no budget, and a
    // host that floods them while not reading only stalls its own link.
    let immediate = match &body {
        RequestBody::Health => Some(Ok(Reply::Health {
            version: PROTOCOL_VERSION,
        })),
        RequestBody::Signal { proc, signal } => Some(process::signal(agent, *proc, *signal)),
        RequestBody::ResizePty { proc, size } => Some(process::resize(agent, *proc, *size)),
        RequestBody::Abandon { proc } => Some(process::abandon(agent, *proc)),
        RequestBody::LimitPids { max } => {
            let reply = limit_pids(*max);
            let _ = agent.outbox.reply(id, reply).await;
            return;
        }
        RequestBody::GuestPids => {
            let _ = agent.outbox.reply(id, guest_pids()).await;
            return;
        }
        RequestBody::ForwardLoopback { port, from_port } => {
            // Its connect may wait: off the dispatch loop.
            let (agent, port, from_port) = (agent.clone(), *port, *from_port);
            tokio::spawn(async move {
                let reply = crate::forward::open(port, from_port).await;
                let _ = agent.outbox.reply(id, reply).await;
            });
            return;
        }
        _ => None,
    };
    if let RequestBody::Reseed { seed, unix_time_ns } = &body {
        let reply = match crate::vm_init::reseed(seed, *unix_time_ns) {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::Error(AgentError::new(ErrorKind::InvalidInput, e.to_string())),
        };
        let _ = agent.outbox.reply(id, reply).await;
        return;
    }
    if let Some(result) = immediate {
        let reply = into_reply(result.map_err(AgentError::from));
        let _ = agent.outbox.reply(id, reply).await;
        return;
    }
    if matches!(
        body,
        RequestBody::Spawn(_) | RequestBody::WarmInterpreter { .. }
    ) && crate::vm_init::reseed_failed()
    {
        let message = "this microVM fork could not take a fresh RNG seed and clock, so it \
                       starts no process (it would share its random numbers with its \
                       snapshot's other forks): delete it and fork again";
        let _ = agent
            .outbox
            .error(id, AgentError::new(ErrorKind::Other, message))
            .await;
        return;
    }
    let Ok(permit) = agent.in_flight.clone().try_acquire_owned() else {
        let message = format!("too many requests in flight (limit {MAX_IN_FLIGHT})");
        let _ = agent
            .outbox
            .error(id, AgentError::new(ErrorKind::Other, message))
            .await;
        return;
    };
    match body {
        // Answered above.
        RequestBody::Health
        | RequestBody::Signal { .. }
        | RequestBody::ResizePty { .. }
        | RequestBody::Reseed { .. }
        | RequestBody::LimitPids { .. }
        | RequestBody::Abandon { .. }
        | RequestBody::GuestPids
        | RequestBody::ForwardLoopback { .. } => {}
        // Files of the guest's cgroupfs; a root's removal holds the
        // groups' lock while it waits for the root's group to empty.
        RequestBody::RootUsage { name } => {
            blocking(agent, id, permit, move || Ok(root_usage(&name)))
        }
        RequestBody::Spawn(spawn) => {
            let claimed = claimed.unwrap_or_else(|| Ok(Vec::new()));
            tokio::spawn(process::spawn(agent.clone(), id, spawn, claimed, permit));
        }
        RequestBody::WriteStdin { proc, data } => {
            stdin::submit(agent, id, proc, StdinOp::Write(data), permit)
        }
        RequestBody::CloseStdin { proc } => stdin::submit(agent, id, proc, StdinOp::Close, permit),
        RequestBody::OpenWrite { path, mode } => {
            tokio::spawn(handles::open(agent.clone(), id, path, Some(mode), permit));
        }
        RequestBody::OpenRead { path } => {
            tokio::spawn(handles::open(agent.clone(), id, path, None, permit));
        }
        RequestBody::Write { handle, data } => {
            handles::submit(agent, id, handle, HandleOp::Write(data), permit)
        }
        RequestBody::Read { handle, max } => {
            handles::submit(agent, id, handle, HandleOp::Read(max), permit)
        }
        RequestBody::Close { handle } => {
            handles::submit(agent, id, handle, HandleOp::Close, permit)
        }
        RequestBody::Stat { path } => blocking(agent, id, permit, move || {
            files::stat(&path).map(Reply::Stat)
        }),
        RequestBody::ListDir { path } => blocking(agent, id, permit, move || {
            files::list_dir(&path).map(Reply::Entries)
        }),
        RequestBody::Mkdir {
            path,
            parents,
            mode,
        } => blocking(agent, id, permit, move || {
            files::mkdir(&path, parents, mode).map(|()| Reply::Ok)
        }),
        RequestBody::Remove { path, recursive } => blocking(agent, id, permit, move || {
            files::remove(&path, recursive).map(|()| Reply::Ok)
        }),
        RequestBody::ListeningPorts => blocking(agent, id, permit, move || {
            crate::listening::sockets().map(Reply::Listening)
        }),
        RequestBody::MountRoot {
            name,
            disk_id,
            sectors,
            limits,
            volumes,
        } => guest_root(agent, id, permit, move || {
            crate::guest_roots::mount_root(&name, &disk_id, sectors, limits.as_ref(), &volumes)
        }),
        RequestBody::WriteVolume {
            key,
            fresh,
            entries,
        } => guest_root(agent, id, permit, move || {
            crate::guest_volumes::write(&key, fresh, &entries)
        }),
        RequestBody::BindVolumes { volumes } => guest_root(agent, id, permit, move || {
            crate::guest_volumes::bind_task_volumes(&volumes)
        }),
        RequestBody::ReplaceVolume { key, from } => guest_root(agent, id, permit, move || {
            crate::volume_replace::replace(&key, &from)
        }),
        RequestBody::UnmountRoot { name } => guest_root(agent, id, permit, move || {
            crate::guest_roots::unmount_root(&name)
        }),
        RequestBody::WarmInterpreter {
            argv,
            env,
            uid,
            gid,
        } => {
            let agent = agent.clone();
            tokio::spawn(async move {
                let starter = agent.clone();
                let started = tokio::task::spawn_blocking(move || {
                    crate::warm::start(&starter, argv, env, uid, gid)
                })
                .await;
                let reply = match started {
                    Ok(Ok(())) => Reply::Ok,
                    Ok(Err(crate::warm::WarmError::Start(e))) => Reply::Error(e.into()),
                    Ok(Err(e)) => Reply::Error(AgentError::new(ErrorKind::Other, e.to_string())),
                    Err(e) => Reply::Error(AgentError::new(ErrorKind::Other, e.to_string())),
                };
                let _ = agent.outbox.reply(id, reply).await;
                drop(permit);
            });
        }
    }
}

fn into_reply(result: Result<Reply, AgentError>) -> Reply {
    result.unwrap_or_else(Reply::Error)
}

/// Runs a filesystem call on the blocking pool and replies with its result.
fn blocking<F>(agent: &Arc<Agent>, id: u64, permit: OwnedSemaphorePermit, call: F)
where
    F: FnOnce() -> Result<Reply, files::FileError> + Send + 'static,
{
    let outbox = agent.outbox.clone();
    tokio::spawn(async move {
        let reply = match tokio::task::spawn_blocking(call).await {
            Ok(result) => into_reply(result.map_err(AgentError::from)),
            Err(e) => Reply::Error(AgentError::new(
                ErrorKind::Other,
                format!("file operation failed: {e}"),
            )),
        };
        let _ = outbox.reply(id, reply).await;
        drop(permit);
    });
}

/// Runs a microVM's root change on the blocking pool and replies. A
/// container's roots are the host's to attach, so its agent refuses.
fn guest_root<F, E>(agent: &Arc<Agent>, id: u64, permit: OwnedSemaphorePermit, change: F)
where
    F: FnOnce() -> Result<(), E> + Send + 'static,
    E: Into<AgentError> + Send + 'static,
{
    let outbox = agent.outbox.clone();
    tokio::spawn(async move {
        let reply = if crate::guest_groups::get().is_none() {
            Reply::Error(AgentError::new(
                ErrorKind::InvalidInput,
                "a container's roots are attached by the host, not by its agent",
            ))
        } else {
            match tokio::task::spawn_blocking(change).await {
                Ok(Ok(())) => Reply::Ok,
                Ok(Err(e)) => Reply::Error(e.into()),
                Err(e) => Reply::Error(AgentError::new(ErrorKind::Other, e.to_string())),
            }
        };
        let _ = outbox.reply(id, reply).await;
        drop(permit);
    });
}

/// Runs `f` on a microVM's process groups. A container's agent has none
/// (its cgroup is the host's), so it refuses `what` there.
fn on_guest_groups(what: &str, f: impl FnOnce(&GuestGroups) -> io::Result<Reply>) -> Reply {
    let Some(groups) = crate::guest_groups::get() else {
        return Reply::Error(AgentError::new(
            ErrorKind::InvalidInput,
            format!("{what} of a container is kept by the host on its cgroup, not by the agent"),
        ));
    };
    f(groups)
        .unwrap_or_else(|e| Reply::Error(AgentError::new(ErrorKind::Other, format!("{what}: {e}"))))
}

/// What a microVM's processes hold against its pids limit.
fn guest_pids() -> Reply {
    on_guest_groups("the guest's task count", |groups| {
        Ok(Reply::Pids {
            current: groups.pids_current()?,
        })
    })
}

/// What a microVM container root with limits of its own uses.
fn root_usage(name: &str) -> Reply {
    on_guest_groups(&format!("container root {name:?}'s use"), |groups| {
        Ok(match groups.root_usage(name)? {
            Some(usage) => Reply::RootUsage(usage),
            None => Reply::Error(AgentError::new(
                ErrorKind::NotFound,
                format!("container root {name:?} has no limits of its own, so no group of its own"),
            )),
        })
    })
}

/// A microVM's pids limit, on the group above every process group.
fn limit_pids(max: u64) -> Reply {
    on_guest_groups(&format!("the guest's pids limit of {max}"), |groups| {
        groups.limit_pids(max)?;
        Ok(Reply::Ok)
    })
}
