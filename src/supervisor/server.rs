//! Serves the daemon on the supervisor's `shim.sock`: one task per
//! connection, requests answered in order, `Attach` streaming output.

use std::sync::Arc;
use std::time::Duration;

use sandbox_proto::{FrameDecoder, Reply, RequestBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use super::output::OutputItem;
use super::processes::Supervisor;
use super::protocol::{SupervisorError, SupervisorErrorKind, SupervisorReply, SupervisorRequest};

/// Accepts connections until `shutdown` is notified.
pub async fn serve(listener: UnixListener, supervisor: Arc<Supervisor>, shutdown: Arc<Notify>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let supervisor = Arc::clone(&supervisor);
                let shutdown = Arc::clone(&shutdown);
                tokio::spawn(async move { handle(stream, supervisor, shutdown).await });
            }
            _ = shutdown.notified() => return,
        }
    }
}

async fn write(stream: &mut UnixStream, reply: &SupervisorReply) -> std::io::Result<()> {
    let frame = sandbox_proto::encode(reply)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    stream.write_all(&frame).await
}

async fn handle(mut stream: UnixStream, supervisor: Arc<Supervisor>, shutdown: Arc<Notify>) {
    let mut decoder = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    // File handles this connection opened: closed if it goes away mid-transfer
    // so the agent's bounded handle table does not fill up.
    let mut open_handles: Vec<u64> = Vec::new();
    'conn: loop {
        let frame = loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => break frame,
                Ok(None) => {}
                Err(_) => break 'conn,
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break 'conn,
                Ok(n) => decoder.push(&buf[..n]),
            }
        };
        let request: SupervisorRequest = match sandbox_proto::decode(&frame) {
            Ok(r) => r,
            Err(e) => {
                let _ = write(
                    &mut stream,
                    &SupervisorReply::Error(SupervisorError::new(
                        SupervisorErrorKind::InvalidInput,
                        e.to_string(),
                    )),
                )
                .await;
                break;
            }
        };
        if matches!(request, SupervisorRequest::HandOver(_)) {
            // A daemon restarted from here on finds the sandbox claimed.
            supervisor.handing_over();
        }
        // A claim posted to the mailbox is in force before any request is
        // acted on (one that cannot be fails the sandbox).
        supervisor.settle_claim().await;
        let reply = match request {
            SupervisorRequest::OpenMailbox => {
                let _ = match supervisor.open_mailbox() {
                    Ok(fd) => write_with_fd(&mut stream, &SupervisorReply::Mailbox, &fd).await,
                    Err(e) => write(&mut stream, &SupervisorReply::Error(e)).await,
                };
                break;
            }
            SupervisorRequest::Attach {
                proc,
                stdout_offset,
                stderr_offset,
            } => {
                let _ = attach(
                    &mut stream,
                    &supervisor,
                    proc,
                    [stdout_offset, stderr_offset],
                )
                .await;
                break;
            }
            SupervisorRequest::Watch { after } => {
                // The daemon watches no pooled sandbox: this one is the
                // caller's now, whether or not its claim changed anything.
                drop(supervisor.release_trust_bundle());
                let _ = watch(&mut stream, &supervisor, after).await;
                break;
            }
            SupervisorRequest::Dial { port } => {
                let _ = dial(&mut stream, &supervisor, port).await;
                break;
            }
            SupervisorRequest::Shutdown => {
                let problems = supervisor.teardown().await;
                let reply = if problems.is_empty() {
                    SupervisorReply::Ok
                } else {
                    SupervisorReply::Error(SupervisorError::new(
                        SupervisorErrorKind::Internal,
                        problems.join("; "),
                    ))
                };
                let _ = write(&mut stream, &reply).await;
                shutdown.notify_one();
                break;
            }
            other => answer(&supervisor, other, &mut open_handles).await,
        };
        if write(&mut stream, &reply).await.is_err() {
            break;
        }
    }
    for handle in open_handles {
        let _ = supervisor.agent(RequestBody::Close { handle }).await;
    }
}

fn reply_of(result: Result<SupervisorReply, SupervisorError>) -> SupervisorReply {
    result.unwrap_or_else(SupervisorReply::Error)
}

async fn answer(
    supervisor: &Arc<Supervisor>,
    request: SupervisorRequest,
    open_handles: &mut Vec<u64>,
) -> SupervisorReply {
    match request {
        SupervisorRequest::Health => SupervisorReply::Health(supervisor.health()),
        SupervisorRequest::Checkpoint(target) => reply_of(supervisor.checkpoint(target).await),
        SupervisorRequest::CloneDisk { to } => reply_of(supervisor.clone_disk(to).await),
        SupervisorRequest::EgressLog => {
            SupervisorReply::EgressLog(supervisor.egress.get().map(|e| e.log()).unwrap_or_default())
        }
        SupervisorRequest::SetPolicy(policy) => reply_of(supervisor.set_policy(&policy.into())),
        SupervisorRequest::SetSecrets(brokered) => reply_of(supervisor.set_secrets(&brokered)),
        SupervisorRequest::HandOver(change) => reply_of(supervisor.hand_over(change).await),
        SupervisorRequest::HoldTrustBundle { path } => {
            reply_of(supervisor.hold_trust_bundle(path).await)
        }
        SupervisorRequest::Spawn(spec) => {
            reply_of(supervisor.spawn(spec).await.map(SupervisorReply::Process))
        }
        SupervisorRequest::Get { proc } => {
            reply_of(supervisor.get(proc).map(SupervisorReply::Process))
        }
        SupervisorRequest::List => SupervisorReply::Processes(supervisor.list()),
        SupervisorRequest::SetEnv { env } => {
            supervisor.set_env(env);
            SupervisorReply::Ok
        }
        SupervisorRequest::WriteStdin { proc, data } => reply_of(
            supervisor
                .process_call(proc, RequestBody::WriteStdin { proc, data })
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::CloseStdin { proc } => reply_of(
            supervisor
                .process_call(proc, RequestBody::CloseStdin { proc })
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::Signal { proc, signal } => reply_of(
            supervisor
                .process_call(proc, RequestBody::Signal { proc, signal })
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::Resize { proc, size } => reply_of(
            supervisor
                .process_call(proc, RequestBody::ResizePty { proc, size })
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::Kill { proc } => {
            reply_of(supervisor.kill(proc).await.map(|()| SupervisorReply::Ok))
        }
        SupervisorRequest::Wait { proc, timeout_ms } => reply_of(
            supervisor
                .wait(proc, Duration::from_millis(timeout_ms))
                .await
                .map(SupervisorReply::Process),
        ),
        SupervisorRequest::File(body) => {
            let closing = match &body {
                RequestBody::Close { handle } => Some(*handle),
                _ => None,
            };
            if !is_file_request(&body) {
                return SupervisorReply::Error(SupervisorError::new(
                    SupervisorErrorKind::InvalidInput,
                    "only file requests pass through File",
                ));
            }
            let reply = reply_of(supervisor.agent(body).await.map(SupervisorReply::Agent));
            if let SupervisorReply::Agent(Reply::Opened { handle, .. }) = &reply {
                open_handles.push(*handle);
            }
            if let Some(handle) = closing {
                open_handles.retain(|h| *h != handle);
            }
            reply
        }
        SupervisorRequest::ListeningPorts => reply_of(
            supervisor
                .agent(RequestBody::ListeningPorts)
                .await
                .map(|reply| match reply {
                    // The egress proxy's and DNS server's sockets are the
                    // supervisor's own, not the app's.
                    Reply::Listening(mut sockets) => {
                        sockets.retain(|s| !crate::net::proxy::is_sandboxd_port(s.port));
                        SupervisorReply::Agent(Reply::Listening(sockets))
                    }
                    other => SupervisorReply::Agent(other),
                }),
        ),
        SupervisorRequest::AttachRoot {
            name,
            layers,
            limits,
            disk,
            volumes,
        } => reply_of(
            supervisor
                .attach_root(name, layers, limits, disk, volumes)
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::DetachRoot { name } => reply_of(
            supervisor
                .detach_root(name)
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::GuestPids => reply_of(
            supervisor
                .guest_pids()
                .await
                .map(|current| SupervisorReply::Agent(Reply::Pids { current })),
        ),
        SupervisorRequest::GuestRootUsage { name } => reply_of(
            supervisor
                .guest_root_usage(&name)
                .await
                .map(|usage| SupervisorReply::Agent(Reply::RootUsage(usage))),
        ),
        SupervisorRequest::LimitGuestPids { max } => reply_of(
            supervisor
                .limit_guest_pids(max)
                .await
                .map(|()| SupervisorReply::Ok),
        ),
        SupervisorRequest::Attach { .. }
        | SupervisorRequest::Watch { .. }
        | SupervisorRequest::Dial { .. }
        | SupervisorRequest::OpenMailbox
        | SupervisorRequest::Shutdown => SupervisorReply::Error(SupervisorError::new(
            SupervisorErrorKind::Internal,
            "handled by the connection loop",
        )),
    }
}

fn is_file_request(body: &RequestBody) -> bool {
    matches!(
        body,
        RequestBody::OpenWrite { .. }
            | RequestBody::OpenRead { .. }
            | RequestBody::Write { .. }
            | RequestBody::Read { .. }
            | RequestBody::Close { .. }
            | RequestBody::Stat { .. }
            | RequestBody::ListDir { .. }
            | RequestBody::Mkdir { .. }
            | RequestBody::Remove { .. }
    )
}

/// Connects to the app's `port` inside the sandbox and sends the socket
/// with the `Dialed` frame (SCM_RIGHTS); the daemon's ingress then owns it.
async fn dial(
    stream: &mut UnixStream,
    supervisor: &Arc<Supervisor>,
    port: u16,
) -> std::io::Result<()> {
    if let Err(failed) = supervisor.ensure_live() {
        return write(stream, &SupervisorReply::Error(failed)).await;
    }
    // A fork's servers run on from the snapshot: none is reached before
    // the guest has its fresh RNG seed and clock. One budget for both.
    let started = tokio::time::Instant::now();
    if let Err(failed) = supervisor.await_fresh_seed(DIAL_BUDGET).await {
        return write(stream, &SupervisorReply::Error(failed)).await;
    }
    let Some(dialer) = supervisor.dialer.get() else {
        let refusal = SupervisorError::new(
            SupervisorErrorKind::InvalidInput,
            "this sandbox cannot be reached through the ingress (its network namespace could not be entered; see the supervisor's log)",
        );
        return write(stream, &SupervisorReply::Error(refusal)).await;
    };
    let connect = async {
        match supervisor.config.spec.kind {
            crate::runtime::sandbox::RuntimeSpec::Vm(_) => {
                connect_guest_app(supervisor, dialer, port).await
            }
            _ => dialer.connect_loopback(port).await,
        }
    };
    let connected = tokio::time::timeout(DIAL_BUDGET.saturating_sub(started.elapsed()), connect)
        .await
        .unwrap_or_else(|_| {
            // A busy sandbox, not a missing app: not `Refused`.
            Err(SupervisorError::new(
                SupervisorErrorKind::AgentTimeout,
                format!(
                    "the sandbox did not take a connection to port {port} within {DIAL_BUDGET:?}"
                ),
            ))
        });
    let app = match connected {
        Ok(app) => app.into_std()?,
        Err(e) => return write(stream, &SupervisorReply::Error(e)).await,
    };
    // The daemon holds its own copy once sent; this one closes on drop.
    write_with_fd(stream, &SupervisorReply::Dialed, &app).await
}

/// All of a dial (two connects of up to 3 s each on a container's
/// loopback; a microVM's guest and its forwarder), inside the daemon's 5 s
/// for the whole call, so a slow dial is answered as such.
const DIAL_BUDGET: Duration = Duration::from_millis(4500);

/// A microVM's app on `port`: on the guest's address through the tap, or,
/// where nothing listens there (an app bound to the guest's loopback
/// only), through a forwarder the guest's agent opens for this one
/// connection.
async fn connect_guest_app(
    supervisor: &Supervisor,
    dialer: &super::dial::Dialer,
    port: u16,
) -> Result<tokio::net::TcpStream, SupervisorError> {
    use super::dial::DialFailure;
    let why = match dialer.connect_guest(port).await {
        Ok(app) => return Ok(app),
        Err(DialFailure::Missed { why, refused: true }) => why,
        Err(failure) => return Err(failure.into_error(port, "")),
    };
    let (socket, from_port) = dialer
        .bound_guest_socket()
        .await
        .map_err(|failure| failure.into_error(port, ""))?;
    let forwarding = match supervisor.forward_guest_loopback(port, from_port).await {
        Ok(forwarding) => forwarding,
        Err(loopback) if loopback.kind == SupervisorErrorKind::Refused => {
            return Err(SupervisorError::new(
                SupervisorErrorKind::Refused,
                format!(
                    "nothing accepts connections on port {port} in the sandbox: not on the guest's address ({why}); {}",
                    loopback.message
                ),
            ))
        }
        Err(e) => return Err(e),
    };
    dialer
        .connect_guest_from(socket, forwarding)
        .await
        .map_err(|failure| match failure {
            // The app took the agent's connection: not a missing app.
            DialFailure::Missed { why, .. } => SupervisorError::new(
                SupervisorErrorKind::Internal,
                format!("the guest's forwarder (port {forwarding}) to port {port} of its loopback did not take the connection ({why})"),
            ),
            failure => failure.into_error(port, ""),
        })
}

/// Writes `reply` with `fd` passed along its first byte (SCM_RIGHTS).
async fn write_with_fd(
    stream: &mut UnixStream,
    reply: &SupervisorReply,
    fd: &impl std::os::fd::AsRawFd,
) -> std::io::Result<()> {
    let frame = sandbox_proto::encode(reply)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&*stream);
    let fds = [fd.as_raw_fd()];
    let mut sent = 0;
    while sent < frame.len() {
        let rest = &frame[sent..];
        // The descriptor goes with the first byte only.
        let with_fd = sent == 0;
        sent += stream
            .async_io(tokio::io::Interest::WRITABLE, || {
                let iov = [std::io::IoSlice::new(rest)];
                let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
                let cmsgs: &[nix::sys::socket::ControlMessage] = if with_fd { &cmsg } else { &[] };
                nix::sys::socket::sendmsg::<()>(
                    raw,
                    &iov,
                    cmsgs,
                    nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(std::io::Error::from)
            })
            .await?;
    }
    Ok(())
}

/// Streams the supervisor's events after `after` until the daemon hangs up.
async fn watch(
    stream: &mut UnixStream,
    supervisor: &Arc<Supervisor>,
    mut after: u64,
) -> std::io::Result<()> {
    let mut changes = supervisor.event_changes();
    loop {
        changes.borrow_and_update();
        for (seq, event) in supervisor.events_after(after) {
            after = seq;
            write(stream, &SupervisorReply::Event { seq, event }).await?;
        }
        if changes.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Streams output from `offsets` until the process has exited and everything
/// it printed was sent, then sends the exit and ends.
async fn attach(
    stream: &mut UnixStream,
    supervisor: &Arc<Supervisor>,
    proc: u64,
    mut offsets: [u64; 2],
) -> std::io::Result<()> {
    let mut changes = match supervisor.output_changes(proc) {
        Ok(rx) => rx,
        Err(e) => return write(stream, &SupervisorReply::Error(e)).await,
    };
    loop {
        changes.borrow_and_update();
        let read = match supervisor.read_output(proc, offsets) {
            Ok(read) => read,
            Err(e) => return write(stream, &SupervisorReply::Error(e)).await,
        };
        offsets = read.resume_at;
        for item in read.items {
            let reply = match item {
                OutputItem::Data {
                    stream: s,
                    offset,
                    data,
                } => SupervisorReply::Output {
                    stream: s,
                    offset,
                    data,
                },
                OutputItem::Dropped { stream: s, bytes } => {
                    SupervisorReply::Dropped { stream: s, bytes }
                }
            };
            write(stream, &reply).await?;
        }
        if let Some(process) = read.ended {
            return write(stream, &SupervisorReply::Exited(process)).await;
        }
        if changes.changed().await.is_err() {
            // The entry was forgotten; report what is known.
            return match supervisor.get(proc) {
                Ok(p) => write(stream, &SupervisorReply::Exited(p)).await,
                Err(e) => write(stream, &SupervisorReply::Error(e)).await,
            };
        }
    }
}
