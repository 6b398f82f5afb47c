//! Raw TCP exposures: each has a host port of its own (from
//! `ingress_tcp_ports`) whose connections are carried as they are into the
//! sandbox's port. A token port wants `TOKEN\n` as the first bytes.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::counted::Counted;

use crate::model::PortAuth;
use crate::sandbox::port_links::TcpExposure;
use crate::sandbox::{token_matches, Manager};

/// How long a client has to send its token line.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest token line read (a token is 43 bytes).
const MAX_TOKEN_LINE: usize = 256;
/// Connections of one exposure that may wait on their token line at once.
const MAX_WAITING_FOR_TOKEN: usize = 64;

/// Serves every raw TCP exposure the manager binds, for the daemon's life.
pub async fn serve_exposures(manager: Arc<Manager>) {
    loop {
        for exposure in manager.links.next_tcp().await {
            let manager = Arc::clone(&manager);
            tokio::spawn(serve_one(manager, exposure));
        }
    }
}

async fn serve_one(manager: Arc<Manager>, exposure: TcpExposure) {
    let TcpExposure {
        sandbox,
        port,
        listener,
        mut closed,
    } = exposure;
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(%sandbox, port, "raw TCP exposure not served: {e}");
            return;
        }
    };
    let unauthenticated = Arc::new(Semaphore::new(MAX_WAITING_FOR_TOKEN));
    loop {
        // A rotation is taken in before the next accept: a connection
        // made after it must not be checked against the cancelled token
        // (select! would otherwise pick a ready accept half of the time).
        let accepted = tokio::select! {
            biased;
            _ = closed.cancelled() => {
                // A rotated token closes the port's connections, not its
                // listener: carry on while the port is still exposed here.
                let host_port = listener.local_addr().ok().map(|a| a.port());
                match manager.ingress_route(&sandbox, port) {
                    Ok(exposed) if exposed.host_port.is_some() && exposed.host_port == host_port => {
                        closed = manager.links.port_closed(&sandbox, port);
                        continue;
                    }
                    _ => return,
                }
            }
            accepted = listener.accept() => accepted,
        };
        let (client, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(%sandbox, port, "raw TCP accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Connections still owing their token line are bounded: each
        // holds a descriptor for up to the token timeout.
        let Ok(waiting) = Arc::clone(&unauthenticated).try_acquire_owned() else {
            manager.metrics.ingress_request("tcp_refused");
            continue;
        };
        let manager = Arc::clone(&manager);
        let sandbox = sandbox.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            if let Err(why) = carry(&manager, &sandbox, port, client, waiting, closed).await {
                // Debug: anyone can make these, and the log is not theirs to fill.
                tracing::debug!(%sandbox, port, %peer, "raw TCP connection refused: {why}");
                manager.metrics.ingress_request("tcp_refused");
            }
        });
    }
}

/// Reads the token line byte by byte, so nothing after it is consumed.
async fn token_line(client: &mut TcpStream) -> Result<String, String> {
    let mut line = Vec::new();
    let read = async {
        loop {
            let byte = client
                .read_u8()
                .await
                .map_err(|e| format!("reading the token line: {e}"))?;
            if byte == b'\n' {
                return Ok(());
            }
            if line.len() >= MAX_TOKEN_LINE {
                return Err("the first line is not a token".to_string());
            }
            line.push(byte);
        }
    };
    tokio::time::timeout(TOKEN_TIMEOUT, read)
        .await
        .map_err(|_| format!("no token line within {TOKEN_TIMEOUT:?}"))??;
    let text = String::from_utf8(line).map_err(|_| "the token line is not text".to_string())?;
    Ok(text.trim_end_matches('\r').to_string())
}

async fn carry(
    manager: &Arc<Manager>,
    sandbox: &str,
    port: u16,
    mut client: TcpStream,
    waiting: OwnedSemaphorePermit,
    closed: CancellationToken,
) -> Result<(), String> {
    let _ = client.set_nodelay(true);
    let exposed = manager
        .ingress_route(sandbox, port)
        .map_err(|e| e.to_string())?;
    if exposed.auth == PortAuth::Token {
        let token = token_line(&mut client).await?;
        // Checked against the exposure as it is now, not as it was when
        // the connection came: a rotation or unexpose meanwhile wins.
        let current = manager
            .ingress_route(sandbox, port)
            .map_err(|e| e.to_string())?;
        if closed.is_cancelled()
            || !token_matches(current.token_sha256.as_deref().unwrap_or(""), &token)
        {
            return Err("wrong token".into());
        }
    }
    drop(waiting);
    let link = manager
        .links
        .open(sandbox, port, manager.config.ingress.max_connections)
        .map_err(|_| "the sandbox's ingress connections are all in use".to_string())?;
    let app = manager
        .dial_port(sandbox, port)
        .await
        .map_err(|e| e.to_string())?;
    let app = TcpStream::from_std(app).map_err(|e| e.to_string())?;
    manager.metrics.ingress_request("tcp");
    let mut app = Counted::new(app, link.byte_counter());
    tokio::select! {
        _ = copy_both(&mut client, &mut app) => {}
        _ = link.closed.cancelled() => {}
    };
    manager.metrics.ingress_bytes(app.written, app.read);
    Ok(())
}

/// Bytes both ways until each side ends. Copied through 1 MiB buffers: on
/// loopback this beat splice(2) here (about 1.6 against 1.2 GB/s), the
/// receive path copying either way.
async fn copy_both(
    client: &mut TcpStream,
    app: &mut Counted<TcpStream>,
) -> std::io::Result<(u64, u64)> {
    tokio::io::copy_bidirectional_with_sizes(client, app, 1 << 20, 1 << 20).await
}
