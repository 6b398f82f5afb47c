//! The egress policy of a sandbox: the API shape (`block_network` /
//! `allow_list`), its validation, and the compiled
//! [`EgressPolicy`] that the proxy and the DNS responder ask
//! [`EgressPolicy::allows_host`] and [`EgressPolicy::allows_ip`].
//!
//! Whatever a policy says, the addresses in [`crate::net::deny`] stay
//! refused: [`EgressPolicy::allows_ip`] consults the fixed deny list itself,
//! and the proxy also checks the host's own interface addresses with a
//! [`crate::net::deny::DenyList`]. How a host or address in an entry is
//! spelled and read is [`crate::net::host`]'s.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::net::deny;
use crate::net::host::{
    looks_numeric, normalize_host, IpNet, NameError, MAX_NAME_LEN, MAX_RAW_LEN,
};

/// Most entries an allow list may hold.
pub const MAX_ALLOW_ENTRIES: usize = 64;

/// Why a policy request was refused; every message names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("block_network and allow_list were both given; send one of them")]
    BothGiven,
    #[error("allow_list has {count} entries; at most {max} are allowed")]
    TooMany { count: usize, max: usize },
    #[error("allow_list entry {entry:?}: {reason}")]
    Entry { entry: String, reason: String },
}

/// The network part of a create request, and the body of
/// `PATCH /v1/sandboxes/{id}/network`.
///
/// * `{"block_network": true}`: nothing leaves the sandbox, DNS included.
/// * `{"allow_list": [...]}`: only the listed destinations.
/// * `{"block_network": false}`: open (public internet; the deny list still holds).
/// * `{}`: the daemon's `default_egress` decides.
///
/// Both `block_network: true` and an `allow_list` is an error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_list: Option<Vec<String>>,
}

/// The daemon's `default_egress` setting: what a sandbox gets when its
/// request names no policy. Ships as [`DefaultEgress::Block`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultEgress {
    #[default]
    Block,
    Open,
}

/// Which kind of policy is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// Nothing leaves; DNS is refused.
    Block,
    /// Any public destination (the deny list still applies).
    Open,
    /// Only the destinations in the allow list.
    AllowList,
}

/// The policy in force, as `GET /v1/sandboxes/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    pub mode: EgressMode,
    pub block_network: bool,
    /// The entries as normalised (lower case, IDNA A-labels, no trailing dot).
    pub allow_list: Vec<String>,
}

/// One validated allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AllowEntry {
    /// A normalised host name that must match exactly.
    Host(String),
    /// `*.suffix`: any name below `suffix` (at any depth), not `suffix` itself.
    /// Holds the normalised suffix without the `*.`.
    Wildcard(String),
    /// An address or CIDR block, matched against the original destination.
    Net(IpNet),
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Host(h) => f.write_str(h),
            AllowEntry::Wildcard(s) => write!(f, "*.{s}"),
            AllowEntry::Net(n) => write!(f, "{n}"),
        }
    }
}

/// Parses one allow-list entry.
pub fn parse_entry(raw: &str) -> Result<AllowEntry, PolicyError> {
    let fail = |reason: String| PolicyError::Entry {
        entry: shorten(raw),
        reason,
    };
    let entry = raw.trim();
    if entry.is_empty() {
        return Err(fail("empty entry".into()));
    }
    if entry.len() > MAX_RAW_LEN {
        return Err(fail(format!("longer than {MAX_RAW_LEN} bytes")));
    }
    // Addresses and CIDRs: anything holding ':' or '/', or whose last label
    // is numeric, must parse as one.
    let last_label = entry
        .strip_suffix('.')
        .unwrap_or(entry)
        .rsplit('.')
        .next()
        .unwrap_or("");
    if entry.contains("://") {
        return Err(fail(
            "write the host alone, without a scheme (example.com, not https://example.com)".into(),
        ));
    }
    if entry.bytes().filter(|&b| b == b':').count() == 1 && !entry.starts_with('[') {
        return Err(fail(
            "entries have no port; write the host or address alone (any port is allowed)".into(),
        ));
    }
    if entry.contains(':') || entry.contains('/') || looks_numeric(last_label) {
        let inner = entry
            .strip_prefix('[')
            .and_then(|e| e.strip_suffix(']'))
            .unwrap_or(entry);
        return inner.parse::<IpNet>().map(AllowEntry::Net).map_err(|e| {
            fail(format!(
                "{e}; an address entry is a dotted quad (192.0.2.1), an IPv6 address, or a CIDR (192.0.2.0/24)"
            ))
        });
    }
    if let Some(suffix) = entry.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(fail(
                "only one leading '*.' is allowed in a wildcard".into(),
            ));
        }
        let suffix = normalize_host(suffix).map_err(|e| fail(e.to_string()))?;
        if !suffix.contains('.') {
            return Err(fail(
                "a wildcard must sit below a name with a dot (*.example.com): *.com would open a whole top-level domain; list its hosts instead"
                    .into(),
            ));
        }
        if suffix.len() + 2 > MAX_NAME_LEN {
            return Err(fail(NameError::TooLong.to_string()));
        }
        return Ok(AllowEntry::Wildcard(suffix));
    }
    if entry.contains('*') {
        return Err(fail(
            "a wildcard must be written '*.example.com' ('*' alone, or inside a name, is not allowed)"
                .into(),
        ));
    }
    normalize_host(entry)
        .map(AllowEntry::Host)
        .map_err(|e| fail(e.to_string()))
}

/// Keeps error messages bounded when someone sends a huge entry.
fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// A validated, compiled policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    mode: EgressMode,
    entries: Vec<AllowEntry>,
    hosts: HashSet<String>,
    wildcards: Vec<String>,
    nets: Vec<IpNet>,
}

impl EgressPolicy {
    /// Nothing leaves.
    pub fn block() -> Self {
        Self::from_mode(EgressMode::Block)
    }

    /// Any public destination.
    pub fn open() -> Self {
        Self::from_mode(EgressMode::Open)
    }

    fn from_mode(mode: EgressMode) -> Self {
        EgressPolicy {
            mode,
            entries: Vec::new(),
            hosts: HashSet::new(),
            wildcards: Vec::new(),
            nets: Vec::new(),
        }
    }

    /// Only the given entries (validated; duplicates are dropped).
    pub fn allow_list<S: AsRef<str>>(entries: &[S]) -> Result<Self, PolicyError> {
        if entries.len() > MAX_ALLOW_ENTRIES {
            return Err(PolicyError::TooMany {
                count: entries.len(),
                max: MAX_ALLOW_ENTRIES,
            });
        }
        let mut policy = Self::from_mode(EgressMode::AllowList);
        for raw in entries {
            policy.add(parse_entry(raw.as_ref())?);
        }
        Ok(policy)
    }

    /// Adds one entry to a list (once).
    fn add(&mut self, entry: AllowEntry) {
        if self.entries.contains(&entry) {
            return;
        }
        match &entry {
            AllowEntry::Host(h) => {
                self.hosts.insert(h.clone());
            }
            AllowEntry::Wildcard(s) => self.wildcards.push(format!(".{s}")),
            AllowEntry::Net(n) => self.nets.push(*n),
        }
        self.entries.push(entry);
    }

    /// This policy with `entries` (validated allow-list entries: a brokered
    /// secret's hosts) reachable too. An open policy stays open, a block
    /// becomes a list of just these, a list gains them (past the cap: they
    /// are the daemon's, not the caller's).
    pub fn widened<S: AsRef<str>>(&self, entries: &[S]) -> EgressPolicy {
        if entries.is_empty() || self.mode == EgressMode::Open {
            return self.clone();
        }
        let mut policy = match self.mode {
            EgressMode::Block => Self::from_mode(EgressMode::AllowList),
            _ => self.clone(),
        };
        // The entries were validated when the secret was stored.
        for entry in entries
            .iter()
            .filter_map(|raw| parse_entry(raw.as_ref()).ok())
        {
            policy.add(entry);
        }
        policy
    }

    /// Validates a request body and compiles it; `default` decides when the
    /// request names no policy.
    pub fn from_request(req: &NetworkPolicy, default: DefaultEgress) -> Result<Self, PolicyError> {
        match (req.block_network, &req.allow_list) {
            (Some(true), Some(_)) => Err(PolicyError::BothGiven),
            (Some(true), None) => Ok(Self::block()),
            (_, Some(list)) => Self::allow_list(list),
            (Some(false), None) => Ok(Self::open()),
            (None, None) => Ok(Self::from_default(default)),
        }
    }

    pub fn from_default(default: DefaultEgress) -> Self {
        match default {
            DefaultEgress::Block => Self::block(),
            DefaultEgress::Open => Self::open(),
        }
    }

    pub fn mode(&self) -> EgressMode {
        self.mode
    }

    pub fn entries(&self) -> &[AllowEntry] {
        &self.entries
    }

    /// Whether nothing at all may leave (DNS included).
    pub fn is_block(&self) -> bool {
        self.mode == EgressMode::Block
    }

    /// Whether a connection to host name `name` (as it came in SNI, Host or a
    /// DNS question, not yet normalised) is allowed. A name that does not
    /// normalise is refused; IP literals are not names (see
    /// [`crate::net::host::parse_host`] and [`Self::allows_ip`]).
    pub fn allows_host(&self, name: &str) -> bool {
        match self.mode {
            EgressMode::Block => false,
            EgressMode::Open => normalize_host(name).is_ok(),
            EgressMode::AllowList => match normalize_host(name) {
                Ok(n) => self.allows_normalized(&n),
                Err(_) => false,
            },
        }
    }

    /// [`Self::allows_host`] for a name already passed through
    /// [`normalize_host`].
    pub fn allows_normalized(&self, name: &str) -> bool {
        match self.mode {
            EgressMode::Block => false,
            EgressMode::Open => true,
            EgressMode::AllowList => {
                self.hosts.contains(name)
                    || self
                        .wildcards
                        .iter()
                        .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix.as_str()))
            }
        }
    }

    /// Whether a connection whose original destination is `ip` may go out
    /// on the strength of an IP/CIDR entry (or open mode). Addresses on the
    /// fixed deny list are refused whatever the policy says.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        if deny::always_denied(ip).is_some() {
            return false;
        }
        match self.mode {
            EgressMode::Block => false,
            EgressMode::Open => true,
            EgressMode::AllowList => self.nets.iter().any(|n| n.contains(ip)),
        }
    }

    /// Whether the list holds any IP/CIDR entry (a ClientHello without SNI,
    /// or with ECH, can only pass through one of those).
    pub fn has_ip_entries(&self) -> bool {
        !self.nets.is_empty()
    }

    /// The policy as the API shows it.
    pub fn view(&self) -> PolicyView {
        PolicyView {
            mode: self.mode,
            block_network: self.mode == EgressMode::Block,
            allow_list: self.entries.iter().map(|e| e.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn widening_adds_hosts_and_never_narrows() {
        let open = EgressPolicy::open().widened(&["api.example.com"]);
        assert_eq!(open.mode(), EgressMode::Open);
        let blocked = EgressPolicy::block().widened(&["api.example.com"]);
        assert_eq!(blocked.mode(), EgressMode::AllowList);
        assert!(blocked.allows_normalized("api.example.com"));
        assert!(!blocked.allows_normalized("other.example.com"));
        assert!(EgressPolicy::block().widened::<&str>(&[]).is_block());
        let list = EgressPolicy::allow_list(&["a.example.com"])
            .unwrap()
            .widened(&["b.example.com", "a.example.com"]);
        assert!(list.allows_normalized("a.example.com"));
        assert!(list.allows_normalized("b.example.com"));
        assert_eq!(list.entries().len(), 2);
    }

    use super::*;

    fn allow(list: &[&str]) -> EgressPolicy {
        EgressPolicy::allow_list(list).expect("valid list")
    }

    #[test]
    fn request_combinations() {
        let both = NetworkPolicy {
            block_network: Some(true),
            allow_list: Some(vec!["example.com".into()]),
        };
        assert_eq!(
            EgressPolicy::from_request(&both, DefaultEgress::Block),
            Err(PolicyError::BothGiven)
        );
        let block = NetworkPolicy {
            block_network: Some(true),
            allow_list: None,
        };
        assert!(EgressPolicy::from_request(&block, DefaultEgress::Open)
            .unwrap()
            .is_block());
        let open = NetworkPolicy {
            block_network: Some(false),
            allow_list: None,
        };
        assert_eq!(
            EgressPolicy::from_request(&open, DefaultEgress::Block)
                .unwrap()
                .mode(),
            EgressMode::Open
        );
        let with_false = NetworkPolicy {
            block_network: Some(false),
            allow_list: Some(vec!["a.test".into()]),
        };
        assert_eq!(
            EgressPolicy::from_request(&with_false, DefaultEgress::Block)
                .unwrap()
                .mode(),
            EgressMode::AllowList
        );
        let none = NetworkPolicy::default();
        assert!(EgressPolicy::from_request(&none, DefaultEgress::Block)
            .unwrap()
            .is_block());
        assert_eq!(
            EgressPolicy::from_request(&none, DefaultEgress::Open)
                .unwrap()
                .mode(),
            EgressMode::Open
        );
        assert_eq!(DefaultEgress::default(), DefaultEgress::Block);
    }

    #[test]
    fn serde_shapes() {
        let p: NetworkPolicy = serde_json::from_str(r#"{"allow_list":["a.test"]}"#).unwrap();
        assert_eq!(p.allow_list, Some(vec!["a.test".to_string()]));
        assert_eq!(p.block_network, None);
        let err = serde_json::from_str::<NetworkPolicy>(r#"{"allowlist":["a.test"]}"#);
        assert!(err.is_err(), "unknown fields are refused");
        let d: DefaultEgress = serde_json::from_str(r#""open""#).unwrap();
        assert_eq!(d, DefaultEgress::Open);
        let view = allow(&["*.Example.COM", "192.0.2.0/24", "b.test."]).view();
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "mode": "allow_list",
                "block_network": false,
                "allow_list": ["*.example.com", "192.0.2.0/24", "b.test"]
            })
        );
        let json = serde_json::to_value(EgressPolicy::block().view()).unwrap();
        assert_eq!(json["mode"], "block");
        assert_eq!(json["block_network"], true);
    }

    #[test]
    fn too_many_entries() {
        let list: Vec<String> = (0..65).map(|i| format!("h{i}.test")).collect();
        assert_eq!(
            EgressPolicy::allow_list(&list),
            Err(PolicyError::TooMany { count: 65, max: 64 })
        );
        assert!(EgressPolicy::allow_list(&list[..64]).is_ok());
    }

    #[test]
    fn malformed_entries_are_named() {
        for bad in [
            "",
            "*",
            "*.",
            "*.com",
            "*.bücher",
            "a.*.com",
            "*example.com",
            "*.*.example.com",
            "exa mple.com",
            "-bad.com",
            "bad-.com",
            "a..b",
            ".a.b",
            "http://example.com",
            "example.com:443",
            "10.0.0.1/33",
            "10.0.0.1/8",
            "10.0.0.0/x",
            "2001:db8::/129",
            "2001:db8::1/64",
            "1.2.3",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "1.2.3.4.5",
            "256.1.1.1",
            "xn--zz.com",
            "a\u{0}b.com",
        ] {
            match EgressPolicy::allow_list(&[bad]) {
                Err(PolicyError::Entry { entry, reason }) => {
                    assert_eq!(entry, bad, "{reason}");
                    let msg = PolicyError::Entry {
                        entry: entry.clone(),
                        reason,
                    }
                    .to_string();
                    assert!(msg.contains("allow_list entry"), "{msg}");
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        let msg = EgressPolicy::allow_list(&["example.com:443"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no port"), "{msg}");
        let msg = EgressPolicy::allow_list(&["https://example.com"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("without a scheme"), "{msg}");
        let msg = EgressPolicy::allow_list(&["10.0.0.1/8"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("10.0.0.0/8"), "{msg}");
        let long = "a".repeat(5000);
        match EgressPolicy::allow_list(&[long.as_str()]) {
            Err(PolicyError::Entry { entry, .. }) => assert!(entry.len() < 100),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exact_and_wildcard_hosts() {
        let p = allow(&["api.example.test", "*.wild.test", "bücher.de"]);
        assert!(p.allows_host("api.example.test"));
        assert!(p.allows_host("API.Example.Test."));
        assert!(!p.allows_host("example.test"));
        assert!(!p.allows_host("x.api.example.test"));
        assert!(p.allows_host("a.wild.test"));
        assert!(p.allows_host("a.b.c.wild.test"));
        assert!(
            !p.allows_host("wild.test"),
            "a wildcard does not cover its apex"
        );
        assert!(!p.allows_host("evilwild.test"));
        assert!(!p.allows_host("wild.test.evil"));
        assert!(p.allows_host("xn--bcher-kva.de"));
        assert!(p.allows_host("BÜCHER.de"));
        assert!(!p.allows_host("a..wild.test"));
        assert!(!p.allows_host(""));
        // Apex listed as well as wildcard.
        let p = allow(&["*.example.test", "example.test"]);
        assert!(p.allows_host("example.test"));
        assert!(p.allows_host("sub.example.test"));
    }

    #[test]
    fn ip_and_cidr_entries() {
        let p = allow(&[
            "192.0.2.7",
            "198.51.100.0/24",
            "2001:db8::/32",
            "[2001:db8:1::5]",
            "::ffff:203.0.113.0/120",
        ]);
        assert!(p.has_ip_entries());
        assert!(p.allows_ip("192.0.2.7".parse().unwrap()));
        assert!(!p.allows_ip("192.0.2.8".parse().unwrap()));
        assert!(p.allows_ip("198.51.100.200".parse().unwrap()));
        assert!(p.allows_ip("::ffff:198.51.100.1".parse().unwrap()));
        assert!(p.allows_ip("2001:db8:ffff::1".parse().unwrap()));
        assert!(p.allows_ip("203.0.113.9".parse().unwrap()));
        assert!(!p.allows_ip("203.0.114.9".parse().unwrap()));
        assert!(!p.allows_host("192.0.2.7"), "IP entries are not names");
        assert_eq!(
            p.view().allow_list,
            vec![
                "192.0.2.7",
                "198.51.100.0/24",
                "2001:db8::/32",
                "2001:db8:1::5",
                "203.0.113.0/24"
            ]
        );
    }

    #[test]
    fn deny_list_wins_over_entries() {
        let p = allow(&[
            "127.0.0.1",
            "10.0.0.0/8",
            "169.254.169.254",
            "fd00:ec2::254",
            "0.0.0.0/0",
        ]);
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "192.168.1.1",
        ] {
            assert!(!p.allows_ip(ip.parse().unwrap()), "{ip}");
        }
        assert!(p.allows_ip("203.0.113.1".parse().unwrap()));
        assert!(!EgressPolicy::open().allows_ip("127.0.0.1".parse().unwrap()));
        assert!(EgressPolicy::open().allows_ip("203.0.113.1".parse().unwrap()));
    }

    #[test]
    fn block_and_open_modes() {
        let b = EgressPolicy::block();
        assert!(!b.allows_host("example.test"));
        assert!(!b.allows_ip("203.0.113.1".parse().unwrap()));
        let o = EgressPolicy::open();
        assert!(o.allows_host("anything.example"));
        assert!(!o.allows_host("bad..name"));
        let empty = EgressPolicy::allow_list::<&str>(&[]).unwrap();
        assert!(!empty.allows_host("example.test"));
        assert!(!empty.allows_ip("203.0.113.1".parse().unwrap()));
    }

    #[test]
    fn duplicates_collapse() {
        let p = allow(&["a.test", "A.test.", "192.0.2.1", "192.0.2.1/32"]);
        assert_eq!(p.entries().len(), 2);
    }
}
