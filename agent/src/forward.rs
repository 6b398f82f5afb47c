//! A microVM's app bound to the guest's loopback only, reached by the
//! host's ingress anyway (`RequestBody::ForwardLoopback`). The ingress
//! dials the guest's address through the tap, where such an app does not
//! listen; it then asks for a forwarder. The agent connects to the app
//! first (so a port nothing listens on is refused at once), then listens
//! on an ephemeral port of all the guest's addresses and hands one
//! connection from the host's end of the tap to the app, bytes copied
//! both ways until either side closes. A connection from anywhere else
//! (a process in the guest racing for the port) is dropped, not served.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use sandbox_proto::{AgentError, ErrorKind, Reply, VM_GATEWAY_V4};
use tokio::net::{TcpListener, TcpStream};

/// How long the forwarder waits for the host's connection.
const ACCEPT_WITHIN: Duration = Duration::from_secs(5);
/// A connect on the loopback answers at once; this bounds an app whose
/// accept queue is full.
const CONNECT_WITHIN: Duration = Duration::from_secs(3);

/// Connects to the app on `port` of the loopback and starts a forwarder to
/// it; the reply names the forwarder's port.
pub async fn open(port: u16) -> Reply {
    match start(port).await {
        Ok(forwarding) => Reply::Forwarding { port: forwarding },
        Err(e) => Reply::Error(e),
    }
}

async fn start(port: u16) -> Result<u16, AgentError> {
    if !crate::vm_init::requested() {
        return Err(AgentError::new(
            ErrorKind::InvalidInput,
            "a container's loopback is dialed by its host; only a microVM's agent forwards",
        ));
    }
    let app = connect_loopback(port).await?;
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        .await
        .map_err(|e| other(format!("listening for the host's connection: {e}")))?;
    let forwarding = listener
        .local_addr()
        .map_err(|e| other(format!("the forwarder's port: {e}")))?
        .port();
    tokio::spawn(async move {
        let Ok(Some(mut host)) = tokio::time::timeout(ACCEPT_WITHIN, from_host(&listener)).await
        else {
            return;
        };
        drop(listener);
        let mut app = app;
        let _ = tokio::io::copy_bidirectional(&mut host, &mut app).await;
    });
    Ok(forwarding)
}

/// The first connection to `listener` from the host's end of the tap.
async fn from_host(listener: &TcpListener) -> Option<TcpStream> {
    let host = Ipv4Addr::from(VM_GATEWAY_V4);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) if peer.ip() == host => {
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
async fn connect_loopback(port: u16) -> Result<TcpStream, AgentError> {
    let mut refused = Vec::new();
    for target in [
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
    ] {
        match tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => refused.push(format!("{target}: {e}")),
            Err(_) => refused.push(format!("{target}: no answer within {CONNECT_WITHIN:?}")),
        }
    }
    Err(AgentError::new(
        ErrorKind::NotFound,
        format!(
            "nothing listens on port {port} of the guest's loopback either ({})",
            refused.join("; ")
        ),
    ))
}

fn other(message: String) -> AgentError {
    AgentError::new(ErrorKind::Other, message)
}
