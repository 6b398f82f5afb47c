//! The per-sandbox egress proxy and DNS server, run by the sandbox's
//! supervisor. [`prepare`] sets up the sandbox namespace (veth pair,
//! nftables rules) and opens the listening sockets inside it; [`Egress`]
//! serves them: every TCP connection the sandbox makes arrives here, is
//! matched against the policy in force (synthetic DNS address, IP/CIDR
//! entry, TLS SNI or HTTP Host), and is spliced to exactly one upstream
//! address that passed the deny list, dialled from the supervisor's own
//! (the host's) namespace. A policy change applies to the next connection
//! and closes open ones the new policy forbids. A TLS connection to a host
//! a brokered secret is bound to is handed to [`crate::net::intercept`]
//! instead of spliced; those hosts are reachable whatever the requested
//! policy says.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Notify;

use crate::net::deny::DenyList;
use crate::net::dns::{DnsConfig, DnsConfigError, DnsResponder};
use crate::net::host::{canonical_ip, normalize_host, HostPort, HostSpec};
use crate::net::http::{parse_request_head, HeadStatus, RequestFramer, Step, MAX_HEAD_LEN};
use crate::net::intercept::forward::{self, RequestRecord};
use crate::net::intercept::{Brokered, InterceptError, Interceptor};
use crate::net::limits::{Bandwidth, EgressLimits, TokenBucket};
use crate::net::origdst::{original_destination, was_redirected};
use crate::net::plumbing::{self, PlumbingError};
use crate::net::policy::EgressPolicy;
use crate::net::rules::{self, RulesError};
use crate::net::sni::{parse_client_hello, ClientHello, MAX_HELLO_LEN};
use crate::net::splice;

/// The proxy's port inside every sandbox namespace.
pub const PROXY_PORT: u16 = 15001;
/// The DNS server's port (UDP and TCP) inside every sandbox namespace.
pub const DNS_PORT: u16 = 15053;
/// Whether `port` in a sandbox's namespace is one of sandboxd's own
/// sockets (not an app's, never exposed).
pub fn is_sandboxd_port(port: u16) -> bool {
    port == PROXY_PORT || port == DNS_PORT
}

/// How long the proxy waits for a ClientHello or a request head.
const SNIFF_DEADLINE: Duration = Duration::from_secs(5);
/// How long resolving a name upstream may take.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(5);
/// How long dialling one upstream address may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// Bytes read per step when carrying a connection's data.
const COPY_CHUNK: usize = 64 * 1024;
/// How long a DNS-over-TCP client may take to send its query.
const DNS_TCP_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("setting up the sandbox's interfaces: {0}")]
    Plumbing(#[from] PlumbingError),
    #[error("loading the sandbox's nftables rules: {0}")]
    Rules(#[from] RulesError),
    #[error("opening the egress sockets in the sandbox namespace: {0}")]
    Socket(io::Error),
    #[error("the DNS responder: {0}")]
    Dns(#[from] DnsConfigError),
    #[error("letting the pod's namespace forward to its microVM: {0}")]
    Forwarding(io::Error),
}

/// The listening sockets, made inside the sandbox's namespace (they stay
/// there wherever they are used).
#[derive(Debug)]
pub struct Sockets {
    proxy: std::net::TcpListener,
    /// On 127.0.0.1 and ::1, where the output hook's redirect delivers: a
    /// wildcard UDP socket would answer from the wrong source address and
    /// conntrack could not map the reply back.
    dns_udp: Vec<std::net::UdpSocket>,
    dns_tcp: std::net::TcpListener,
}

/// The interfaces and rules of a sandbox's namespace: the same in every
/// sandbox, so they can be made ahead of any (`net::slots`).
pub fn prepare_network(netns: &Path, loader: rules::Loader) -> Result<(), EgressError> {
    plumbing::setup(netns)?;
    rules::apply(loader, netns, PROXY_PORT, DNS_PORT)?;
    Ok(())
}

/// Loads a CRI pod's rules into the namespace at `netns` (joined, not
/// made: CNI gave it its interfaces). Blocking.
pub fn prepare_pod_network(netns: &Path, loader: rules::Loader) -> Result<(), EgressError> {
    rules::apply_pod(loader, netns, PROXY_PORT, DNS_PORT)?;
    Ok(())
}

/// Loads the rules of a CRI pod whose sandbox is a microVM into the pod's
/// namespace at `netns`, and lets it forward (new TCP to the pod IP goes
/// on to the guest). The VM's own sockets open later, on its tap. Blocking.
pub fn prepare_vm_pod(netns: &Path, loader: rules::Loader) -> Result<(), EgressError> {
    rules::apply_vm_pod(loader, netns, PROXY_PORT, DNS_PORT)?;
    plumbing::in_netns(netns, || {
        std::fs::write("/proc/sys/net/ipv4/conf/all/forwarding", "1")
    })?
    .map_err(EgressError::Forwarding)
}

/// The same for a microVM, whose DNS queries come in on its tap: the
/// prerouting hook's redirect delivers them to the tap's own address
/// (`tap_addr`, assigned before this), where a UDP socket answers too.
pub fn open_vm_sockets(netns: &Path, tap_addr: Ipv4Addr) -> Result<Sockets, EgressError> {
    plumbing::in_netns(netns, || open_sockets_here(Some(tap_addr)))?.map_err(EgressError::Socket)
}

/// Opens the proxy and DNS sockets (dual-stack, on every address; DNS also
/// on `tap_addr`) in the calling thread's network namespace, a prepared
/// sandbox's: a container's start opens them with its agent link, in the
/// one visit to the namespace it makes anyway.
pub fn open_sockets_here(tap_addr: Option<Ipv4Addr>) -> io::Result<Sockets> {
    let any = Ipv6Addr::UNSPECIFIED;
    let proxy = std::net::TcpListener::bind((any, PROXY_PORT))?;
    let mut dns_udp = vec![std::net::UdpSocket::bind((
        std::net::Ipv4Addr::LOCALHOST,
        DNS_PORT,
    ))?];
    // IPv6 may be off in the namespace; IPv4 DNS still works then.
    if let Ok(v6) = std::net::UdpSocket::bind((Ipv6Addr::LOCALHOST, DNS_PORT)) {
        dns_udp.push(v6);
    }
    if let Some(addr) = tap_addr {
        dns_udp.push(std::net::UdpSocket::bind((addr, DNS_PORT))?);
    }
    let dns_tcp = std::net::TcpListener::bind((any, DNS_PORT))?;
    proxy.set_nonblocking(true)?;
    for sock in &dns_udp {
        sock.set_nonblocking(true)?;
    }
    dns_tcp.set_nonblocking(true)?;
    Ok(Sockets {
        proxy: std::net::TcpListener::from(numbered_high(proxy.into())?),
        dns_udp: dns_udp
            .into_iter()
            .map(|s| numbered_high(s.into()).map(std::net::UdpSocket::from))
            .collect::<io::Result<_>>()?,
        dns_tcp: std::net::TcpListener::from(numbered_high(dns_tcp.into())?),
    })
}

/// Renumbers `fd` to 10 or above (close-on-exec), so the low descriptors
/// the container start hands out by number (the agent link's fd 3) are free.
fn numbered_high(fd: OwnedFd) -> io::Result<OwnedFd> {
    let raw = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// What a connection was allowed as (re-checked when the policy changes).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A normalised host name.
    Name(String),
    /// An original destination allowed by an IP/CIDR entry (or open mode).
    Ip(IpAddr),
}

impl Target {
    fn permitted_by(&self, policy: &EgressPolicy) -> bool {
        match self {
            Target::Name(n) => policy.allows_normalized(n),
            Target::Ip(ip) => policy.allows_ip(*ip),
        }
    }
}

struct Live {
    target: Target,
    cancel: Arc<Notify>,
}

/// One sandbox's egress: the policy in force, the DNS responder whose
/// synthetic addresses the proxy maps back to names, and the open
/// connections.
pub struct Egress {
    sandbox: String,
    /// The policy the daemon set; [`Self::policy`] is it widened by the
    /// hosts of the bound secrets.
    requested: RwLock<Arc<EgressPolicy>>,
    policy: RwLock<Arc<EgressPolicy>>,
    interceptor: Arc<Interceptor>,
    dns: DnsResponder,
    deny: DenyList,
    /// Why there is none, when the upstream's name servers are unknown:
    /// sandboxes still start, and names fail with the reason.
    resolver: Result<TokioResolver, String>,
    limits: EgressLimits,
    dns_rate: TokenBucket,
    upload: Bandwidth,
    download: Bandwidth,
    live: Mutex<HashMap<u64, Live>>,
    next_conn: AtomicU64,
    /// Connections allowed and refused, and bytes carried both ways, since
    /// the supervisor started (for the daemon's metrics and usage).
    allowed: AtomicU64,
    refused: AtomicU64,
    bytes: AtomicU64,
    dns_queries: AtomicU64,
    dns_limited: AtomicU64,
    connections_limited: AtomicU64,
    throttled_us: AtomicU64,
    log: Mutex<std::collections::VecDeque<EgressLogEntry>>,
}

/// One line of a sandbox's egress log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressLogEntry {
    pub time: String,
    /// `allowed` (logged when the connection closed) or `refused`.
    pub verdict: String,
    pub host: String,
    pub port: u16,
    /// The upstream address the proxy dialled (allowed connections).
    #[serde(default)]
    pub address: Option<String>,
    /// Bytes carried both ways (allowed connections).
    pub bytes: u64,
    /// Why it was refused.
    pub reason: Option<String>,
    /// An intercepted request (verdict `intercepted`, or `refused` with
    /// the reason): never a header value.
    #[serde(default)]
    pub request: Option<LoggedRequest>,
}

/// One HTTP request on an intercepted connection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoggedRequest {
    pub method: String,
    /// Without the query string.
    pub path: String,
    pub status: u16,
    /// The secrets whose values were put into its headers.
    pub secrets: Vec<String>,
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Lines of egress log each sandbox keeps; older ones go first.
const EGRESS_LOG_LINES: usize = 1024;

/// What the proxy has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct EgressCounters {
    pub allowed: u64,
    pub refused: u64,
    pub bytes: u64,
    /// DNS queries answered, and those refused by the rate cap.
    pub dns_queries: u64,
    pub dns_limited: u64,
    /// Connections refused because the sandbox had the most open.
    pub connections_limited: u64,
    /// Microseconds the proxy paused carrying data to hold the bandwidth cap.
    pub throttled_us: u64,
}

/// Removes a connection from the registry when its task ends.
struct Registered<'a> {
    egress: &'a Egress,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.egress.live().remove(&self.id);
    }
}

impl Egress {
    /// `own_addrs` are the addresses of the namespaces the supervisor lives
    /// in (the host's, and the upstream one): refused like loopback.
    pub fn new(
        sandbox: &str,
        policy: EgressPolicy,
        limits: EgressLimits,
        resolver: Result<TokioResolver, String>,
        own_addrs: Vec<IpAddr>,
        interceptor: Interceptor,
    ) -> Result<Arc<Self>, EgressError> {
        let qps = f64::from(limits.dns_qps);
        let policy = Arc::new(policy);
        Ok(Arc::new(Egress {
            sandbox: sandbox.to_string(),
            requested: RwLock::new(Arc::clone(&policy)),
            policy: RwLock::new(policy),
            interceptor: Arc::new(interceptor),
            dns: DnsResponder::new(DnsConfig::default())?,
            deny: DenyList::new(own_addrs),
            resolver,
            limits,
            dns_rate: TokenBucket::new(qps, qps),
            upload: Bandwidth::new(limits.bandwidth_bytes_per_sec),
            download: Bandwidth::new(limits.bandwidth_bytes_per_sec),
            live: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            allowed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            dns_queries: AtomicU64::new(0),
            dns_limited: AtomicU64::new(0),
            connections_limited: AtomicU64::new(0),
            throttled_us: AtomicU64::new(0),
            log: Mutex::new(std::collections::VecDeque::new()),
        }))
    }

    fn live(&self) -> MutexGuard<'_, HashMap<u64, Live>> {
        // The map stays consistent whatever panicked while holding it.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<EgressPolicy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `policy` (widened by the bound secrets' hosts) in force for new
    /// connections and DNS queries, and closes open connections it forbids.
    /// Returns how many were closed.
    pub fn set_policy(&self, policy: EgressPolicy) -> usize {
        *self.requested.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
        self.enforce()
    }

    /// Puts `brokered` in force: its hosts reachable and intercepted, its
    /// values in the next request of every connection. Connections to
    /// hosts no longer reachable are closed.
    pub fn set_secrets(&self, brokered: &Brokered) -> Result<usize, InterceptError> {
        self.interceptor.set(brokered)?;
        tracing::info!(sandbox = %self.sandbox, "brokered secrets now {brokered:?}");
        Ok(self.enforce())
    }

    /// Requests each secret was put into.
    pub fn substitution_counts(&self) -> Vec<(String, u64)> {
        self.interceptor.substitution_counts()
    }

    /// Recomputes the policy in force from the requested one and the bound
    /// secrets' hosts; closes open connections it forbids.
    fn enforce(&self) -> usize {
        let requested = Arc::clone(&self.requested.read().unwrap_or_else(|e| e.into_inner()));
        let policy = Arc::new(requested.widened(&self.interceptor.allow_entries()));
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&policy);
        let mut closed = 0;
        for live in self.live().values() {
            if !live.target.permitted_by(&policy) {
                live.cancel.notify_one();
                closed += 1;
            }
        }
        tracing::info!(sandbox = %self.sandbox, closed, "egress policy changed to {:?}", policy.view());
        closed
    }

    /// Open connections through the proxy.
    pub fn open_connections(&self) -> usize {
        self.live().len()
    }

    /// Starts serving `sockets`; call inside a tokio runtime.
    pub fn spawn(self: &Arc<Self>, sockets: Sockets) -> io::Result<()> {
        let proxy = TcpListener::from_std(sockets.proxy)?;
        let dns_tcp = TcpListener::from_std(sockets.dns_tcp)?;
        tokio::spawn(Arc::clone(self).accept_loop(proxy));
        for sock in sockets.dns_udp {
            tokio::spawn(Arc::clone(self).dns_udp_loop(UdpSocket::from_std(sock)?));
        }
        tokio::spawn(Arc::clone(self).dns_tcp_loop(dns_tcp));
        Ok(())
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(Arc::clone(&self).handle(stream));
                }
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(sandbox = %self.sandbox, "egress accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn dns_udp_loop(self: Arc<Self>, sock: UdpSocket) {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = match sock.recv_from(&mut buf).await {
                Ok(got) => got,
                Err(_) => continue,
            };
            if let Some(reply) = self.answer_dns(&buf[..n]) {
                let _ = sock.send_to(&reply, from).await;
            }
        }
    }

    async fn dns_tcp_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(DNS_TCP_DEADLINE, this.dns_tcp_conn(stream)).await;
            });
        }
    }

    /// Answers length-prefixed queries until the client closes.
    async fn dns_tcp_conn(&self, mut stream: TcpStream) -> io::Result<()> {
        loop {
            let len = stream.read_u16().await?;
            let mut query = vec![0u8; usize::from(len)];
            stream.read_exact(&mut query).await?;
            let Some(reply) = self.answer_dns(&query) else {
                return Ok(());
            };
            let Ok(reply_len) = u16::try_from(reply.len()) else {
                return Ok(());
            };
            stream.write_u16(reply_len).await?;
            stream.write_all(&reply).await?;
        }
    }

    /// Answers one DNS query under the policy in force, or REFUSED once the
    /// sandbox is over its queries-per-second cap.
    fn answer_dns(&self, query: &[u8]) -> Option<Vec<u8>> {
        if self.dns_rate.try_take(1.0) {
            self.dns_queries.fetch_add(1, Ordering::Relaxed);
            self.dns.handle(query, &self.policy())
        } else {
            self.dns_limited.fetch_add(1, Ordering::Relaxed);
            self.dns.handle(query, &EgressPolicy::block())
        }
    }

    fn note(&self, verdict: &str, host: &str, port: u16, bytes: u64, reason: Option<&str>) {
        self.note_dialled(verdict, host, port, None, bytes, reason)
    }

    fn note_dialled(
        &self,
        verdict: &str,
        host: &str,
        port: u16,
        address: Option<SocketAddr>,
        bytes: u64,
        reason: Option<&str>,
    ) {
        self.push_log(EgressLogEntry {
            time: now_rfc3339(),
            verdict: verdict.to_string(),
            host: host.to_string(),
            port,
            address: address.map(|a| a.to_string()),
            bytes,
            reason: reason.map(String::from),
            request: None,
        });
    }

    fn push_log(&self, entry: EgressLogEntry) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.push_back(entry);
        while log.len() > EGRESS_LOG_LINES {
            log.pop_front();
        }
    }

    /// Logs one request of an intercepted connection to `host`.
    fn note_request(&self, host: &str, port: u16, record: RequestRecord) {
        let verdict = if record.refused.is_some() {
            "refused"
        } else {
            "intercepted"
        };
        tracing::info!(
            sandbox = %self.sandbox,
            host,
            method = %record.method,
            path = %record.path,
            status = record.status,
            secrets = ?record.secrets,
            "egress request {verdict}"
        );
        self.push_log(EgressLogEntry {
            time: now_rfc3339(),
            verdict: verdict.to_string(),
            host: host.to_string(),
            port,
            address: None,
            bytes: 0,
            reason: record.refused,
            request: Some(LoggedRequest {
                method: record.method,
                path: record.path,
                status: record.status,
                secrets: record.secrets,
            }),
        });
    }

    /// The most recent egress log lines, oldest first.
    pub fn log(&self) -> Vec<EgressLogEntry> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn refuse(&self, host: &str, port: u16, reason: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.note("refused", host, port, 0, Some(reason));
        tracing::warn!(sandbox = %self.sandbox, host, port, reason, "egress refused");
    }

    pub fn counters(&self) -> EgressCounters {
        EgressCounters {
            allowed: self.allowed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            dns_queries: self.dns_queries.load(Ordering::Relaxed),
            dns_limited: self.dns_limited.load(Ordering::Relaxed),
            connections_limited: self.connections_limited.load(Ordering::Relaxed),
            throttled_us: self.throttled_us.load(Ordering::Relaxed),
        }
    }

    /// Serves one connection from the sandbox; refusals close it at once.
    async fn handle(self: Arc<Self>, mut client: TcpStream) {
        let _ = client.set_nodelay(true);
        let dest = match (client.local_addr(), original_destination(&client)) {
            (Ok(local), Ok(orig)) if was_redirected(local, orig) => orig,
            _ => return self.refuse("-", 0, "not redirected (connected straight to the proxy)"),
        };
        let ip = canonical_ip(dest.ip());
        let port = dest.port();
        let shown = ip.to_string();
        let policy = self.policy();
        if policy.is_block() {
            return self.refuse(&shown, port, "block_network is set");
        }
        if self.open_connections() >= self.limits.max_connections {
            self.connections_limited.fetch_add(1, Ordering::Relaxed);
            return self.refuse(
                &shown,
                port,
                "too many open connections (egress_max_connections)",
            );
        }
        let mut peeked = Vec::new();
        let mut http = false;
        let target = if self.dns.in_pool(ip) {
            match self.dns.lookup_synthetic(ip) {
                // A bound host's connection is read first: TLS is
                // intercepted, cleartext HTTP goes out as sent.
                Some(name) if self.interceptor.intercepts(&name) => {
                    match sniff(&mut client, &mut peeked).await {
                        Ok((sent, is_http)) if is_http || sent == name => {
                            http = is_http;
                            Target::Name(name)
                        }
                        Ok((sent, _)) => {
                            return self.refuse(
                                &name,
                                port,
                                &format!("the TLS SNI names {sent}, not the host it dialled"),
                            )
                        }
                        Err(reason) => return self.refuse(&name, port, &reason),
                    }
                }
                Some(name) => Target::Name(name),
                None => return self.refuse(&shown, port, "unknown synthetic address"),
            }
        } else if policy.allows_ip(ip) {
            Target::Ip(ip)
        } else {
            match sniff(&mut client, &mut peeked).await {
                Ok((name, is_http)) => {
                    http = is_http;
                    Target::Name(name)
                }
                Err(reason) => return self.refuse(&shown, port, &reason),
            }
        };
        let candidates: Vec<SocketAddr> = match &target {
            Target::Name(name) => {
                if !policy.allows_normalized(name) {
                    return self.refuse(name, port, "not in the allow list");
                }
                let resolved = match self.resolve(name, port).await {
                    Ok(r) => r,
                    Err(e) => return self.refuse(name, port, &format!("resolving: {e}")),
                };
                let passed: Vec<SocketAddr> = resolved
                    .into_iter()
                    .filter(|a| !self.deny.denies(a.ip()))
                    .collect();
                if passed.is_empty() {
                    return self.refuse(name, port, "every address it resolves to is denied");
                }
                passed
            }
            Target::Ip(ip) => {
                if let Some(reason) = self.deny.check(*ip) {
                    return self.refuse(&shown, port, &format!("{reason:?}"));
                }
                vec![SocketAddr::new(*ip, port)]
            }
        };
        let host = match &target {
            Target::Name(n) => n.clone(),
            Target::Ip(ip) => ip.to_string(),
        };
        let cancel = Arc::new(Notify::new());
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.live().insert(
            id,
            Live {
                target: target.clone(),
                cancel: Arc::clone(&cancel),
            },
        );
        let _registered = Registered { egress: &self, id };
        // The policy may have changed while this connection was being set up.
        if !target.permitted_by(&self.policy()) {
            return self.refuse(&host, port, "the policy changed");
        }
        let Some((upstream, dialled)) = dial(&candidates).await else {
            return self.refuse(&host, port, "no address could be reached");
        };
        self.allowed.fetch_add(1, Ordering::Relaxed);
        tracing::info!(sandbox = %self.sandbox, host, port, %dialled, "egress allowed");
        let _ = upstream.set_nodelay(true);
        let intercepted = match &target {
            Target::Name(n) if !http && self.interceptor.intercepts(n) => Some(n.clone()),
            _ => None,
        };
        let name = match &target {
            Target::Name(n) if http => Some(n.clone()),
            _ => None,
        };
        let result = tokio::select! {
            r = async {
                match intercepted {
                    Some(name) => {
                        let this = Arc::clone(&self);
                        let logged_host = name.clone();
                        let log: forward::RequestLog =
                            Arc::new(move |r| this.note_request(&logged_host, port, r));
                        let interceptor = Arc::clone(&self.interceptor);
                        forward::serve(interceptor, name, client, peeked, upstream, log)
                            .await
                            .map(|bytes| (bytes, 0))
                    }
                    None => self.splice(client, upstream, peeked, name).await,
                }
            } => r,
            _ = cancel.notified() => Err("the policy changed".to_string()),
        };
        match result {
            Ok((up, down)) => {
                self.bytes.fetch_add(up + down, Ordering::Relaxed);
                self.note_dialled("allowed", &host, port, Some(dialled), up + down, None);
                tracing::debug!(sandbox = %self.sandbox, host, port, up, down, "egress closed")
            }
            Err(reason) => self.refuse(&host, port, &reason),
        }
    }

    /// Resolves `name` upstream, once per connection: the addresses
    /// checked against the deny list are the ones dialled.
    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        // Fully qualified: no search domain of the upstream's applies.
        let fqdn = format!("{name}.");
        let resolver = self.resolver.as_ref().map_err(Clone::clone)?;
        let found = tokio::time::timeout(RESOLVE_DEADLINE, resolver.lookup_ip(fqdn))
            .await
            .map_err(|_| "the upstream resolver timed out".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(found
            .iter()
            .map(|ip| SocketAddr::new(canonical_ip(ip), port))
            .collect())
    }

    /// Copies both ways until both sides are done, under the sandbox's
    /// bandwidth cap. With `http_host`, every request head the client sends
    /// is checked to name that host.
    async fn splice(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        peeked: Vec<u8>,
        http_host: Option<String>,
    ) -> Result<(u64, u64), String> {
        let (mut cr, mut cw) = client.into_split();
        let (mut ur, mut uw) = upstream.into_split();
        let up = async {
            let r = match &http_host {
                Some(host) => self.pump_http(&mut cr, &mut uw, peeked, host).await,
                None => {
                    async {
                        uw.write_all(&peeked).await.map_err(|e| e.to_string())?;
                        let n = self
                            .carry(&mut cr, &mut uw, &self.upload)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(n + peeked.len() as u64)
                    }
                    .await
                }
            };
            let _ = uw.shutdown().await;
            r
        };
        let down = async {
            let r = self
                .carry(&mut ur, &mut cw, &self.download)
                .await
                .unwrap_or(0);
            let _ = cw.shutdown().await;
            r
        };
        tokio::pin!(up);
        tokio::pin!(down);
        let (mut up_bytes, mut down_bytes) = (None, None);
        while up_bytes.is_none() || down_bytes.is_none() {
            tokio::select! {
                r = &mut up, if up_bytes.is_none() => up_bytes = Some(r?),
                n = &mut down, if down_bytes.is_none() => down_bytes = Some(n),
            }
        }
        Ok((up_bytes.unwrap_or(0), down_bytes.unwrap_or(0)))
    }

    /// Carries bytes one way until `from` ends, under `cap`: spliced
    /// (zero-copy) when there is no cap and a pipe can be had, else copied
    /// a burst at a time, which holds a cap to the byte.
    async fn carry(
        &self,
        from: &mut OwnedReadHalf,
        to: &mut OwnedWriteHalf,
        cap: &Bandwidth,
    ) -> io::Result<u64> {
        if cap.is_unlimited() {
            match splice::Pipe::new() {
                Ok(pipe) => return splice::forward(from.as_ref(), to.as_ref(), &pipe).await,
                Err(e) => {
                    tracing::debug!(sandbox = %self.sandbox, "no pipe for splice ({e}); copying")
                }
            }
        }
        self.copy_capped(from, to, cap).await
    }

    /// Copies until `from` ends, pausing as the bandwidth cap asks.
    async fn copy_capped<R, W>(&self, from: &mut R, to: &mut W, cap: &Bandwidth) -> io::Result<u64>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf = vec![0u8; cap.step(COPY_CHUNK)];
        let mut total = 0u64;
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok(total);
            }
            to.write_all(&buf[..n]).await?;
            total += n as u64;
            self.pace(cap, n).await;
        }
    }

    /// Charges `bytes` to `cap` and sleeps off any debt.
    async fn pace(&self, cap: &Bandwidth, bytes: usize) {
        let wait = cap.charge(bytes);
        if !wait.is_zero() {
            self.throttled_us
                .fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
        }
    }
}

/// Reads the start of the connection until it names a host: TLS SNI or an
/// HTTP request's host. Returns the name (normalised) and whether it was
/// HTTP; `peeked` keeps every byte read, to be forwarded.
async fn sniff(client: &mut TcpStream, peeked: &mut Vec<u8>) -> Result<(String, bool), String> {
    let deadline = tokio::time::Instant::now() + SNIFF_DEADLINE;
    let mut chunk = [0u8; 4096];
    loop {
        if !peeked.is_empty() {
            match parse_client_hello(peeked) {
                ClientHello::Sni(raw) => {
                    return normalize_host(&raw)
                        .map(|n| (n, false))
                        .map_err(|e| format!("bad SNI {raw:?}: {e}"))
                }
                ClientHello::NoSni => {
                    return Err("TLS ClientHello without SNI, and no IP entry matches".into())
                }
                ClientHello::Ech => {
                    return Err("TLS Encrypted Client Hello, and no IP entry matches".into())
                }
                ClientHello::Malformed(why) => return Err(format!("malformed ClientHello: {why}")),
                ClientHello::NeedMore => {}
                ClientHello::NotTls => match parse_request_head(peeked) {
                    HeadStatus::Complete(head) => {
                        return match head.host {
                            Some(HostPort {
                                host: HostSpec::Name(name),
                                ..
                            }) => Ok((name, true)),
                            Some(HostPort {
                                host: HostSpec::Ip(ip),
                                ..
                            }) => Err(format!("HTTP host {ip} is not allowed by an IP entry")),
                            None => Err("HTTP request without a host".into()),
                        }
                    }
                    HeadStatus::NeedMore => {}
                    HeadStatus::Malformed(e) => {
                        return Err(format!(
                            "neither TLS with SNI nor HTTP ({e}), and no IP entry matches"
                        ))
                    }
                },
            }
            if peeked.len() > MAX_HELLO_LEN.max(MAX_HEAD_LEN) {
                return Err("no host name in the first 16 KiB".into());
            }
        }
        let n = match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Err(_) => return Err("no ClientHello or request head in time".into()),
            Ok(Err(e)) => return Err(format!("reading: {e}")),
            Ok(Ok(0)) => return Err("closed before naming a host".into()),
            Ok(Ok(n)) => n,
        };
        peeked.extend_from_slice(&chunk[..n]);
    }
}

/// Dials the candidates in order; the first that answers wins.
async fn dial(candidates: &[SocketAddr]) -> Option<(TcpStream, SocketAddr)> {
    for addr in candidates {
        if let Ok(Ok(s)) = tokio::time::timeout(CONNECT_DEADLINE, TcpStream::connect(addr)).await {
            return Some((s, *addr));
        }
    }
    None
}

impl Egress {
    /// Forwards the client's HTTP/1.x request stream, refusing (Err) a request
    /// that names a host other than `host`, or a stream that stops being HTTP.
    async fn pump_http(
        &self,
        from: &mut OwnedReadHalf,
        to: &mut OwnedWriteHalf,
        mut pending: Vec<u8>,
        host: &str,
    ) -> Result<u64, String> {
        let mut framer = RequestFramer::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let mut total = 0u64;
        let io_err = |e: io::Error| e.to_string();
        loop {
            while !pending.is_empty() {
                let take = match framer.step(&pending) {
                    Step::NeedMore => {
                        if pending.len() > MAX_HEAD_LEN {
                            return Err("request head larger than 16 KiB".into());
                        }
                        break;
                    }
                    Step::Head(head) => {
                        if let Some(HostPort { host: named, .. }) = &head.host {
                            let same = matches!(named, HostSpec::Name(n) if n == host);
                            if !same {
                                return Err(format!(
                                    "a request on the connection to {host} names another host ({named:?})"
                                ));
                            }
                        }
                        head.head_len
                    }
                    Step::Forward(n) => n,
                    // The bytes go to the same upstream whatever the server
                    // answers, so the stream is simply treated as upgraded.
                    Step::UpgradePending => {
                        framer.upgrade_accepted();
                        continue;
                    }
                    Step::Opaque => pending.len(),
                    Step::Malformed(e) => return Err(format!("malformed HTTP request: {e}")),
                };
                let take = take.min(pending.len());
                to.write_all(&pending[..take]).await.map_err(io_err)?;
                total += take as u64;
                self.pace(&self.upload, take).await;
                pending.drain(..take);
            }
            let n = from.read(&mut chunk).await.map_err(io_err)?;
            if n == 0 {
                return Ok(total);
            }
            pending.extend_from_slice(&chunk[..n]);
        }
    }
}
