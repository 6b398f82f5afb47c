//! A microVM's app bound to the guest's loopback only, reached by the
//! host's ingress anyway (`RequestBody::ForwardLoopback`). The ingress
//! dials the guest's address through the tap, where such an app does not
//! listen; it then asks for a forwarder. The agent connects to the app
//! first (so a port nothing listens on is refused at once), then listens
//! on an ephemeral port of all the guest's addresses and hands one
//! connection from the host's end of the tap, from the port the host named
//! (the very dial that asked), to the app, bytes copied both ways until
//! both sides close. A connection from anywhere else (a process in the
//! guest racing for the port, another dial of the host's) is dropped, not
//! served. At most [`MAX_FORWARDERS`] are open at once: each holds two of
//! the agent's descriptors for as long as its connection lasts.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use sandbox_proto::{AgentError, ErrorKind, Reply, VM_GATEWAY_V4};
use tokio::net::{TcpListener, TcpStream};

/// How long the forwarder waits for the host's connection.
const ACCEPT_WITHIN: Duration = Duration::from_secs(5);
/// A connect on the loopback answers at once; this bounds an app whose
/// accept queue is full (the supervisor gives this whole set-up 3.5 s).
const CONNECT_WITHIN: Duration = Duration::from_millis(1500);
/// Forwarders open at once. Each holds two of the agent's descriptors (PID
/// 1 has 1024) for as long as its connection lasts, and the ingress keeps
/// idle connections to a sandbox open for reuse, so this bound, not the
/// ingress's, is what keeps the agent's descriptors for its own work.
pub const MAX_FORWARDERS: usize = 128;

static FORWARDERS: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(MAX_FORWARDERS)));

/// Connects to the app on `port` of the loopback and starts a forwarder to
/// it for the host's connection from `from_port`; the reply names the
/// forwarder's port.
pub async fn open(port: u16, from_port: u16) -> Reply {
    match start(port, from_port).await {
        Ok(forwarding) => Reply::Forwarding { port: forwarding },
        Err(e) => Reply::Error(e),
    }
}

async fn start(port: u16, from_port: u16) -> Result<u16, AgentError> {
    if !crate::vm_init::requested() {
        return Err(AgentError::new(
            ErrorKind::InvalidInput,
            "a container's loopback is dialed by its host; only a microVM's agent forwards",
        ));
    }
    let Ok(slot) = FORWARDERS.clone().try_acquire_owned() else {
        return Err(other(format!(
            "{MAX_FORWARDERS} forwarded connections to the guest's loopback are open already; \
             listen on 0.0.0.0 to be reached without one"
        )));
    };
    let app = connect_loopback(port).await?;
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        .await
        .map_err(|e| other(format!("listening for the host's connection: {e}")))?;
    let forwarding = listener
        .local_addr()
        .map_err(|e| other(format!("the forwarder's port: {e}")))?
        .port();
    tokio::spawn(async move {
        let accepted = tokio::time::timeout(ACCEPT_WITHIN, from_host(&listener, from_port)).await;
        drop(listener);
        if let Ok(Some(mut host)) = accepted {
            let mut app = app;
            let _ = tokio::io::copy_bidirectional(&mut host, &mut app).await;
        }
        drop(slot);
    });
    Ok(forwarding)
}

/// The first connection to `listener` from port `from_port` of the host's
/// end of the tap.
async fn from_host(listener: &TcpListener, from_port: u16) -> Option<TcpStream> {
    let host = SocketAddr::from((Ipv4Addr::from(VM_GATEWAY_V4), from_port));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) if peer == host => {
                let _ = stream.set_nodelay(true);
                return Some(stream);
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(_) => return None,
        }
    }
}

/// The app on `port` of the loopback: 127.0.0.1, then ::1.
/// `NotFound` when both refused (nothing listens): anything else, a full
/// accept queue's timeout among them, is no sign of a missing app.
async fn connect_loopback(port: u16) -> Result<TcpStream, AgentError> {
    let (mut missed, mut all_refused) = (Vec::new(), true);
    for target in [
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
    ] {
        match tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => {
                // A guest without IPv6 (or its ::1) has no ::1 to refuse.
                all_refused &= matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::AddrNotAvailable
                        | io::ErrorKind::NetworkUnreachable
                ) || e.raw_os_error() == Some(libc::EAFNOSUPPORT);
                missed.push(format!("{target}: {e}"));
            }
            Err(_) => {
                all_refused = false;
                missed.push(format!("{target}: no answer within {CONNECT_WITHIN:?}"));
            }
        }
    }
    let missed = missed.join("; ");
    if all_refused {
        Err(AgentError::new(
            ErrorKind::NotFound,
            format!("nothing listens on port {port} of the guest's loopback ({missed})"),
        ))
    } else {
        Err(other(format!(
            "the app on port {port} of the guest's loopback did not take a connection ({missed})"
        )))
    }
}

fn other(message: String) -> AgentError {
    AgentError::new(ErrorKind::Other, message)
}
