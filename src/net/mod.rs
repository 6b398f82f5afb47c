//! Sandbox networking. Each sandbox gets its own network namespace
//! ([`netns`]) with a veth pair inside it ([`plumbing`]) and nftables rules
//! ([`rules`], loaded in the daemon through [`libnftables`]) that send
//! every TCP connection to the daemon's egress proxy and every DNS query to
//! its DNS responder ([`dns`]). The egress policy
//! ([`policy`]), the fixed deny list ([`deny`]), the spelling of hosts and
//! addresses that both read ([`host`]),
//! and what the proxy uses to learn where a connection goes ([`origdst`],
//! [`sni`], [`http`]) live here too, and so does the per-sandbox proxy and
//! DNS server that serve them ([`proxy`]), with its caps ([`limits`]), its
//! zero-copy forwarding ([`splice`]) and its way out ([`upstream`]:
//! namespace and resolver), and the interception of bound hosts' TLS for
//! brokered secrets ([`intercept`]). Namespaces with their interfaces and
//! rules are made ahead of creates as [`slots`].

pub mod deny;
pub mod dns;
pub mod host;
pub mod http;
pub mod intercept;
pub mod libnftables;
pub mod limits;
pub mod netns;
pub mod origdst;
pub mod plumbing;
pub mod policy;
pub mod proxy;
pub mod rules;
pub mod slots;
pub mod sni;
pub mod splice;
pub mod upstream;
