//! The ingress's way into a sandbox: connections to the app's ports made
//! from inside the sandbox's network namespace, so an app bound to
//! `127.0.0.1` is reached as well as one on `0.0.0.0`, and nothing in the
//! host's namespace changes. A microVM's namespace holds its tap, and the
//! app is in the guest: the connection goes through the tap to the guest's
//! address, where an app bound to all addresses (or that one) is reached;
//! for one bound to the guest's loopback only, the supervisor has the
//! guest's agent forward one connection (`server::connect_guest_app`).
//!
//! The supervisor's runtime thread lives in the
//! upstream namespace (egress dials from there), so one thread of its own
//! stays in the sandbox's namespace and only makes sockets: a socket
//! belongs to the namespace it was made in, whichever thread connects it.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

use super::protocol::{SupervisorError, SupervisorErrorKind};

/// A connect on the sandbox's loopback answers at once; this bounds an
/// app whose accept queue is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

type SocketRequest = (AddressFamily, oneshot::Sender<io::Result<OwnedFd>>);

/// Makes TCP sockets in one network namespace.
pub struct Dialer {
    requests: mpsc::Sender<SocketRequest>,
}

impl Dialer {
    /// Starts the socket-making thread inside the namespace pinned at `netns`.
    pub fn start(netns: &Path) -> io::Result<Dialer> {
        let ns = std::fs::File::open(netns)?;
        let (requests, incoming) = mpsc::channel::<SocketRequest>();
        let (entered_tx, entered) = mpsc::channel();
        std::thread::Builder::new()
            .name("ingress-dialer".into())
            .spawn(move || {
                let joined = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET);
                let _ = entered_tx.send(joined.map_err(io::Error::from));
                if joined.is_err() {
                    return;
                }
                drop(ns);
                // Ends when the supervisor drops its Dialer.
                for (family, reply) in incoming {
                    let made = socket(
                        family,
                        SockType::Stream,
                        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                        None,
                    )
                    .map_err(io::Error::from);
                    let _ = reply.send(made);
                }
            })?;
        entered.recv().map_err(|_| {
            io::Error::other("the dialer thread ended before joining the namespace")
        })??;
        Ok(Dialer { requests })
    }

    async fn socket(&self, family: AddressFamily) -> io::Result<OwnedFd> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send((family, tx))
            .map_err(|_| io::Error::other("the dialer thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("the dialer thread is gone"))?
    }

    /// Connects to `port` on the sandbox's loopback: 127.0.0.1, then ::1
    /// (a server that asked for `localhost` may have bound only that).
    pub async fn connect_loopback(&self, port: u16) -> Result<TcpStream, SupervisorError> {
        let targets = [
            (
                AddressFamily::Inet,
                SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            ),
            (
                AddressFamily::Inet6,
                SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
            ),
        ];
        self.connect(&targets, "its accept queue may be full")
            .await
            .map_err(|failure| failure.into_error(port, ""))
    }

    /// Connects to `port` of a microVM's guest, through its tap (the guest
    /// has no IPv6 address).
    pub async fn connect_guest(&self, port: u16) -> Result<TcpStream, DialFailure> {
        let socket = self.tcp_socket(AddressFamily::Inet).await?;
        connect_one(socket, guest_target(port), GUEST_BUSY)
            .await
            .map_err(|(why, refused)| DialFailure::Missed { why, refused })
    }

    /// A socket for a microVM's guest bound to the tap's host end, and
    /// its port there: a forwarder in the guest takes this socket's
    /// connection only ([`Self::connect_guest_from`]).
    pub async fn bound_guest_socket(&self) -> Result<(TcpSocket, u16), DialFailure> {
        let socket = self.tcp_socket(AddressFamily::Inet).await?;
        let host_end = SocketAddr::from((Ipv4Addr::from(sandbox_proto::VM_GATEWAY_V4), 0));
        let bound = socket
            .bind(host_end)
            .and_then(|()| socket.local_addr())
            .map_err(|e| {
                DialFailure::Socket(SupervisorError::new(
                    SupervisorErrorKind::Internal,
                    format!("binding a socket to the tap's address {host_end}: {e}"),
                ))
            })?;
        Ok((socket, bound.port()))
    }

    /// Connects `socket` (from [`Self::bound_guest_socket`]) to `port` of
    /// the guest.
    pub async fn connect_guest_from(
        &self,
        socket: TcpSocket,
        port: u16,
    ) -> Result<TcpStream, DialFailure> {
        connect_one(socket, guest_target(port), GUEST_BUSY)
            .await
            .map_err(|(why, refused)| DialFailure::Missed { why, refused })
    }

    /// A TCP socket made in the sandbox's namespace.
    async fn tcp_socket(&self, family: AddressFamily) -> Result<TcpSocket, DialFailure> {
        let fd = self.socket(family).await.map_err(|e| {
            DialFailure::Socket(SupervisorError::new(
                SupervisorErrorKind::Internal,
                format!("making a socket in the sandbox's namespace: {e}"),
            ))
        })?;
        Ok(TcpSocket::from_std_stream(std::net::TcpStream::from(fd)))
    }

    /// Connects to the first of `targets` that accepts; `busy` says why
    /// one may not answer in time.
    async fn connect(
        &self,
        targets: &[(AddressFamily, SocketAddr)],
        busy: &str,
    ) -> Result<TcpStream, DialFailure> {
        let (mut missed, mut refused) = (Vec::new(), true);
        for &(family, target) in targets {
            let socket = self.tcp_socket(family).await?;
            match connect_one(socket, target, busy).await {
                Ok(stream) => return Ok(stream),
                Err((why, reset)) => {
                    refused &= reset;
                    missed.push(why);
                }
            }
        }
        Err(DialFailure::Missed {
            why: missed.join("; "),
            refused,
        })
    }
}

/// Why a microVM's guest may not answer a connect in time.
const GUEST_BUSY: &str = "a firewall in the guest, or the guest busy or not running";

fn guest_target(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::from(sandbox_proto::VM_GUEST_V4), port))
}

/// Connects `socket` to `target`; else what happened, and whether the
/// target reset it (nothing listens there).
async fn connect_one(
    socket: TcpSocket,
    target: SocketAddr,
    busy: &str,
) -> Result<TcpStream, (String, bool)> {
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err((
            format!("{target}: {e}"),
            e.kind() == io::ErrorKind::ConnectionRefused,
        )),
        Err(_) => Err((
            format!("{target}: no answer within {CONNECT_TIMEOUT:?} ({busy})"),
            false,
        )),
    }
}

/// Why a dial found no app.
#[derive(Debug)]
pub enum DialFailure {
    /// No socket could be made in the namespace.
    Socket(SupervisorError),
    /// No target took the connection: `why`, each target's answer;
    /// `refused`, each one reset it (nothing listens there).
    Missed { why: String, refused: bool },
}

impl DialFailure {
    /// The failure as the supervisor's error for a dial of `port`, `hint`
    /// after what each target answered.
    pub fn into_error(self, port: u16, hint: &str) -> SupervisorError {
        match self {
            DialFailure::Socket(e) => e,
            DialFailure::Missed { why, .. } => SupervisorError::new(
                SupervisorErrorKind::Refused,
                format!("nothing accepts connections on port {port} in the sandbox ({why}){hint}"),
            ),
        }
    }
}
