//! Where a sandbox's allowed connections leave from, and who resolves their
//! names. The supervisor moves the thread that runs its proxy into the
//! configured upstream namespace (`upstream_netns`; default: the host's), so
//! every upstream socket and every resolver query is made there. Names are
//! resolved by the proxy itself (hickory-resolver), never by the sandbox:
//! the sandbox's own DNS answers are synthetic.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use serde::{Deserialize, Serialize};

/// How long one upstream DNS query may take before the next server or
/// attempt.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// The upstream side of every sandbox's proxy (from the daemon's config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamConfig {
    /// The network namespace connections are dialled from (a bind-mounted
    /// namespace file, e.g. `/run/netns/egress`); `None` for the
    /// supervisor's own, the host's.
    pub netns: Option<PathBuf>,
    /// Name servers to resolve with; empty for those in the namespace's
    /// resolv.conf (`/etc/netns/<name>/resolv.conf` for a named namespace,
    /// as `ip netns exec` uses, else `/etc/resolv.conf`).
    pub dns: Vec<SocketAddr>,
    /// PEM files of extra CAs that intercepted hosts' certificates may
    /// chain to (`egress_extra_ca`), beside the system's roots.
    #[serde(default)]
    pub extra_ca: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("entering the upstream network namespace {path}: {source}; check `upstream_netns` names an existing namespace (ip netns list)")]
    Enter { path: String, source: io::Error },
    #[error("reading name servers from {path}: {source}; set `upstream_dns` to name them")]
    ResolvConf { path: String, source: io::Error },
    #[error("{path} names no name server; set `upstream_dns` to name them")]
    NoNameServer { path: String },
}

/// `name` (a namespace made by `ip netns add`) or an absolute path.
pub fn netns_path(name_or_path: &str) -> PathBuf {
    if name_or_path.contains('/') {
        PathBuf::from(name_or_path)
    } else {
        Path::new("/run/netns").join(name_or_path)
    }
}

impl UpstreamConfig {
    /// Moves the calling thread into the upstream namespace (nothing to do
    /// for the host's). Threads it creates later start there too.
    pub fn enter(&self) -> Result<(), UpstreamError> {
        let Some(path) = &self.netns else {
            return Ok(());
        };
        let err = |source: io::Error| UpstreamError::Enter {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(err)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| err(e.into()))
    }

    /// The resolv.conf that names this namespace's name servers.
    fn resolv_conf(&self) -> PathBuf {
        let named = self
            .netns
            .as_deref()
            .filter(|p| p.parent() == Some(Path::new("/run/netns")))
            .and_then(|p| p.file_name())
            .map(|name| Path::new("/etc/netns").join(name).join("resolv.conf"));
        match named {
            Some(path) if path.exists() => path,
            _ => PathBuf::from("/etc/resolv.conf"),
        }
    }

    /// The name servers to use: the configured ones, else the namespace's.
    pub fn name_servers(&self) -> Result<Vec<SocketAddr>, UpstreamError> {
        if !self.dns.is_empty() {
            return Ok(self.dns.clone());
        }
        let path = self.resolv_conf();
        let text = std::fs::read_to_string(&path).map_err(|source| UpstreamError::ResolvConf {
            path: path.display().to_string(),
            source,
        })?;
        let servers = parse_name_servers(&text);
        if servers.is_empty() {
            return Err(UpstreamError::NoNameServer {
                path: path.display().to_string(),
            });
        }
        Ok(servers)
    }

    /// A resolver asking [`Self::name_servers`] over UDP, then TCP. Its
    /// sockets are made by the thread that runs the lookups, which
    /// [`Self::enter`] put in the upstream namespace.
    pub fn resolver(&self) -> Result<TokioResolver, UpstreamError> {
        let mut servers = Vec::new();
        for addr in self.name_servers()? {
            servers.push(NameServerConfig::new(addr, Protocol::Udp));
            servers.push(NameServerConfig::new(addr, Protocol::Tcp));
        }
        let config = ResolverConfig::from_parts(None, Vec::new(), servers);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default());
        let opts = builder.options_mut();
        opts.timeout = QUERY_TIMEOUT;
        opts.attempts = 1;
        // The proxy wants every address, to drop the denied ones and dial
        // one that passed.
        opts.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        Ok(builder.build())
    }
}

/// The `nameserver` lines of a resolv.conf (port 53).
fn parse_name_servers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some("nameserver"), Some(addr)) => {
                    // A scoped IPv6 address (fe80::1%eth0) is not usable
                    // from another namespace anyway.
                    addr.parse::<IpAddr>()
                        .ok()
                        .map(|ip| SocketAddr::new(ip, 53))
                }
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_servers_come_from_nameserver_lines() {
        let text = "# comment\nsearch example.com\nnameserver 192.0.2.53\nnameserver 2001:db8::53\nnameserver fe80::1%eth0\noptions ndots:2\n";
        assert_eq!(
            parse_name_servers(text),
            vec![
                "192.0.2.53:53".parse().unwrap(),
                "[2001:db8::53]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn configured_name_servers_win() {
        let config = UpstreamConfig {
            netns: None,
            dns: vec!["198.51.100.53:5353".parse().unwrap()],
            extra_ca: Vec::new(),
        };
        assert_eq!(config.name_servers().unwrap(), config.dns);
    }

    #[test]
    fn a_bare_name_is_under_run_netns() {
        assert_eq!(netns_path("egress"), PathBuf::from("/run/netns/egress"));
        assert_eq!(
            netns_path("/proc/1/ns/net"),
            PathBuf::from("/proc/1/ns/net")
        );
    }
}
