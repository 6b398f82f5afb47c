//! How a host or an address is spelled, and how such a spelling is read:
//! host-name normalisation ([`normalize_host`], IDNA and DNS label rules),
//! the host a Host header, absolute URI or SNI carries ([`parse_host`]: with
//! or without port, bracketed IPv6, and the inet_aton spellings
//! `2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`), the one canonical form of
//! an address ([`canonical_ip`]), and address/CIDR blocks ([`IpNet`]).
//!
//! It owns spelling only: what is refused is [`crate::net::deny`]'s, what is
//! allowed is [`crate::net::policy`]'s, and both read hosts through here, so
//! that an address spelled oddly is seen as the same address by each.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Longest host name after normalisation (RFC 1035, without the root dot).
pub const MAX_NAME_LEN: usize = 253;

/// Longest raw entry or name we look at; anything longer is refused before
/// any IDNA work is done on it.
pub(crate) const MAX_RAW_LEN: usize = 1024;

/// Why a host name is not a valid name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty host name")]
    Empty,
    #[error("host name is longer than {MAX_NAME_LEN} characters")]
    TooLong,
    #[error("host name has an empty label (two dots in a row, or a leading dot)")]
    EmptyLabel,
    #[error("label {0:?} is longer than 63 characters")]
    LabelTooLong(String),
    #[error(
        "label {0:?} may hold only letters, digits, '-' and '_', and may not start or end with '-'"
    )]
    BadLabel(String),
    #[error("the last label {0:?} is numeric; write an IP address as an address, not a name")]
    NumericTld(String),
    #[error("not a valid internationalised domain name")]
    Idna,
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as IPv4; everything else unchanged.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        IpAddr::V4(_) => ip,
    }
}

/// Normalises a host name: trims one trailing dot, maps it through UTS #46
/// (IDNA: lower case, compatibility mapping, Punycode A-labels), and checks
/// that the result is a DNS host name (labels of letters, digits, `-`, `_`;
/// at most 63 per label and 253 in all; the last label not numeric, so an
/// IPv4 address in any spelling is never taken for a name).
pub fn normalize_host(name: &str) -> Result<String, NameError> {
    if name.len() > MAX_RAW_LEN {
        return Err(NameError::TooLong);
    }
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return Err(NameError::Empty);
    }
    let ascii = if trimmed.is_ascii() {
        // Fast path; also keeps IDNA from silently accepting things like
        // empty labels that it treats as fine.
        trimmed.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii_cow(trimmed.as_bytes(), idna::AsciiDenyList::URL)
            .map_err(|_| NameError::Idna)?
            .into_owned()
    };
    // The ASCII path still goes through IDNA when it holds A-labels, so that
    // invalid Punycode (`xn--zz`) is refused.
    let ascii = if ascii.split('.').any(|l| l.starts_with("xn--")) {
        idna::domain_to_ascii_cow(ascii.as_bytes(), idna::AsciiDenyList::URL)
            .map_err(|_| NameError::Idna)?
            .into_owned()
    } else {
        ascii
    };
    check_ascii_name(&ascii)?;
    Ok(ascii)
}

fn check_ascii_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(NameError::LabelTooLong(label.to_string()));
        }
        let ok_chars = label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok_chars || label.starts_with('-') || label.ends_with('-') {
            return Err(NameError::BadLabel(label.to_string()));
        }
        last = label;
    }
    if looks_numeric(last) {
        return Err(NameError::NumericTld(last.to_string()));
    }
    Ok(())
}

/// Whether a label reads as a number in the inet_aton sense (decimal, or
/// `0x` hex): such a last label makes the whole string an IPv4 spelling.
pub(crate) fn looks_numeric(label: &str) -> bool {
    if label.is_empty() {
        return false;
    }
    if label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let lower = label.to_ascii_lowercase();
    match lower.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// A host as a client named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostSpec {
    /// An address (IPv4-mapped IPv6 given as IPv4).
    Ip(IpAddr),
    /// A normalised host name (see [`normalize_host`]).
    Name(String),
}

/// A host with the port, if one was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: HostSpec,
    pub port: Option<u16>,
}

/// Why a host string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host is longer than 1024 bytes")]
    TooLong,
    #[error("unterminated or malformed bracketed IPv6 address")]
    BadBracket,
    #[error("{0:?} is not a valid IPv6 address")]
    BadIpv6(String),
    #[error("port {0:?} is not a number from 0 to 65535")]
    BadPort(String),
    #[error("{0:?} reads as a number but is not a valid IPv4 address")]
    BadIpv4(String),
    #[error("bad host name: {0}")]
    BadName(#[from] NameError),
}

/// Reads a host as written in a Host header, an absolute URI's authority, or
/// SNI: `name`, `name:port`, `a.b.c.d[:port]`, any inet_aton spelling of an
/// IPv4 address, `[v6][:port]`, or a bare IPv6 address.
pub fn parse_host(s: &str) -> Result<HostPort, HostError> {
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    if s.len() > 1024 {
        return Err(HostError::TooLong);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(HostError::BadBracket)?;
        let ip: Ipv6Addr = inner
            .parse()
            .map_err(|_| HostError::BadIpv6(inner.to_string()))?;
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(p) => parse_port(p)?,
                None => return Err(HostError::BadBracket),
            },
        };
        return Ok(HostPort {
            host: HostSpec::Ip(canonical_ip(IpAddr::V6(ip))),
            port,
        });
    }
    let colons = s.bytes().filter(|&b| b == b':').count();
    if colons > 1 {
        let ip: Ipv6Addr = s.parse().map_err(|_| HostError::BadIpv6(s.to_string()))?;
        return Ok(HostPort {
            host: HostSpec::Ip(canonical_ip(IpAddr::V6(ip))),
            port: None,
        });
    }
    let (host, port) = match s.split_once(':') {
        Some((h, p)) => (h, parse_port(p)?),
        None => (s, None),
    };
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    Ok(HostPort {
        host: parse_hostname_or_ipv4(host)?,
        port,
    })
}

fn parse_port(p: &str) -> Result<Option<u16>, HostError> {
    if p.is_empty() {
        // `Host: example.com:` is allowed by RFC 3986 (port = *DIGIT).
        return Ok(None);
    }
    if p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::BadPort(p.to_string()));
    }
    p.parse::<u16>()
        .map(Some)
        .map_err(|_| HostError::BadPort(p.to_string()))
}

/// A host without port: an IPv4 address in any inet_aton spelling, or a
/// host name. A string whose last label is numeric is an address or an error,
/// never a name (the WHATWG URL rule), so `1.2.3.0x1ffffffff` cannot slip
/// through as a "name" a resolver might read as an address.
fn parse_hostname_or_ipv4(host: &str) -> Result<HostSpec, HostError> {
    let body = host.strip_suffix('.').unwrap_or(host);
    let last = body.rsplit('.').next().unwrap_or("");
    if looks_numeric(last) || last.eq_ignore_ascii_case("0x") {
        return parse_ipv4_loose(body)
            .map(|v4| HostSpec::Ip(IpAddr::V4(v4)))
            .ok_or_else(|| HostError::BadIpv4(host.to_string()));
    }
    Ok(HostSpec::Name(normalize_host(host)?))
}

/// inet_aton(3) / WHATWG IPv4 parsing: 1 to 4 parts, each decimal, octal
/// (leading `0`) or hex (`0x`); the last part fills the remaining bytes.
pub fn parse_ipv4_loose(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = [0u64; 4];
    for (i, part) in parts.iter().enumerate() {
        nums[i] = parse_ipv4_number(part)?;
    }
    let n = parts.len();
    let (last, init) = (nums[n - 1], &nums[..n - 1]);
    if init.iter().any(|&v| v > 255) {
        return None;
    }
    // Bytes left for the last part: 4 - (n - 1).
    let last_bits = 8 * (5 - n as u32);
    if last >= 1u64 << last_bits {
        return None;
    }
    let mut value: u64 = 0;
    for (i, v) in init.iter().enumerate() {
        value |= v << (24 - 8 * i as u32);
    }
    value |= last;
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

fn parse_ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    let mut value: u64 = 0;
    for c in digits.chars() {
        let d = u64::from(c.to_digit(radix)?);
        value = value.checked_mul(u64::from(radix))?.checked_add(d)?;
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(value)
}

/// An IP network (an address is a /32 or /128). IPv4-mapped IPv6 forms are
/// stored as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// A network from an address and prefix length; host bits must be zero.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, String> {
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                // ::ffff:a.b.c.d/n is the IPv4 network a.b.c.d/(n-96).
                Some(v4) if prefix >= 96 => (IpAddr::V4(v4), prefix - 96),
                _ => (addr, prefix),
            },
            IpAddr::V4(_) => (addr, prefix),
        };
        let max = max_prefix(addr);
        if prefix > max {
            return Err(format!("prefix length /{prefix} is longer than /{max}"));
        }
        let net = IpNet { addr, prefix };
        let masked = net.network();
        if masked != addr {
            return Err(format!(
                "host bits are set; the network is {masked}/{prefix}"
            ));
        }
        Ok(net)
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let bits = u32::from(a) & mask32(self.prefix);
                IpAddr::V4(bits.into())
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a) & mask128(self.prefix);
                IpAddr::V6(bits.into())
            }
        }
    }

    /// Whether `ip` lies in this network. IPv4-mapped IPv6 addresses are
    /// compared as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical_ip(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask32(self.prefix);
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask128(self.prefix);
                u128::from(net) & m == u128::from(ip) & m
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix == max_prefix(self.addr) {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    /// `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, or `v6addr/n`. Only the
    /// canonical dotted-quad spelling of IPv4 is accepted here (no octal,
    /// hex or short forms: an allow list should say what it means).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
        let prefix = match prefix {
            None => max_prefix(addr),
            Some(p) => {
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("prefix length {p:?} is not a number"));
                }
                p.parse::<u8>()
                    .map_err(|_| format!("prefix length {p:?} is too large"))?
            }
        };
        IpNet::new(addr, prefix)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

fn mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn normalisation() {
        assert_eq!(normalize_host("Example.COM.").unwrap(), "example.com");
        assert_eq!(normalize_host("bücher.de").unwrap(), "xn--bcher-kva.de");
        assert_eq!(normalize_host("BÜCHER.de").unwrap(), "xn--bcher-kva.de");
        // Fullwidth letters and the ideographic full stop map to ASCII.
        assert_eq!(
            normalize_host("ｅｘａｍｐｌｅ。ｃｏｍ").unwrap(),
            "example.com"
        );
        assert_eq!(normalize_host("_acme.x.test").unwrap(), "_acme.x.test");
        assert!(normalize_host("a..b").is_err());
        assert!(normalize_host(".").is_err());
        assert!(normalize_host("").is_err());
        assert!(normalize_host("a.b..").is_err());
        assert!(normalize_host("127.0.0.1").is_err());
        assert!(normalize_host("a.0x7f").is_err());
        assert!(normalize_host("x.123").is_err());
        assert!(normalize_host(&"a".repeat(64)).is_err());
        assert!(normalize_host(&format!("{}.com", ["a"; 130].join("."))).is_err());
        assert!(normalize_host("a/b.com").is_err());
        assert!(normalize_host("a%2eb.com").is_err());
    }

    #[test]
    fn names_and_ports() {
        let hp = parse_host("Example.COM.:8443").unwrap();
        assert_eq!(hp.host, HostSpec::Name("example.com".into()));
        assert_eq!(hp.port, Some(8443));
        let hp = parse_host("bücher.de").unwrap();
        assert_eq!(hp.host, HostSpec::Name("xn--bcher-kva.de".into()));
        assert_eq!(hp.port, None);
        assert_eq!(parse_host("a.test:").unwrap().port, None);
        let hp = parse_host("[2001:db8::1]:443").unwrap();
        assert_eq!(hp.host, HostSpec::Ip(ip("2001:db8::1")));
        assert_eq!(hp.port, Some(443));
        // A name that merely starts with digits is a name.
        assert_eq!(
            parse_host("0x7f.example").unwrap().host,
            HostSpec::Name("0x7f.example".into())
        );
        assert_eq!(
            parse_host("123.example").unwrap().host,
            HostSpec::Name("123.example".into())
        );
    }

    #[test]
    fn malformed_hosts_are_errors() {
        for s in [
            "",
            ":80",
            "a.test:99999",
            "a.test:8a",
            "a.test:-1",
            "[::1",
            "[::1]x",
            "[::1]:",
            "[1.2.3.4]",
            "[fe80::1%eth0]",
            "1:2:3",
            "256.0.0.1",
            "1.2.3.4.5",
            "1.2.3.256",
            "1.2.65536",
            "4294967296",
            "0x100000000",
            "08.0.0.1",
            "1..2",
            "example.123",
            "a.b.0x",
            "a b.test",
            "a/b",
            "a@b.test",
            "x..test",
        ] {
            // "[::1]:" has an empty port: allowed.
            if s == "[::1]:" {
                assert!(parse_host(s).is_ok());
                continue;
            }
            assert!(
                parse_host(s).is_err(),
                "{s:?} parsed as {:?}",
                parse_host(s)
            );
        }
        let long = "a".repeat(2000);
        assert_eq!(parse_host(&long), Err(HostError::TooLong));
    }

    #[test]
    fn loose_ipv4_limits() {
        assert_eq!(
            parse_ipv4_loose("255.255.255.255"),
            Some(Ipv4Addr::BROADCAST)
        );
        assert_eq!(
            parse_ipv4_loose("1.16777215"),
            Some(Ipv4Addr::new(1, 255, 255, 255))
        );
        assert_eq!(parse_ipv4_loose("1.16777216"), None);
        assert_eq!(
            parse_ipv4_loose("1.2.65535"),
            Some(Ipv4Addr::new(1, 2, 255, 255))
        );
        assert_eq!(parse_ipv4_loose("4294967295"), Some(Ipv4Addr::BROADCAST));
        assert_eq!(parse_ipv4_loose("09"), None);
        assert_eq!(
            parse_ipv4_loose(&"0".repeat(500)),
            Some(Ipv4Addr::UNSPECIFIED)
        );
        assert_eq!(
            parse_ipv4_loose(&format!("0x{}1", "0".repeat(500))),
            Some(Ipv4Addr::new(0, 0, 0, 1))
        );
    }

    #[test]
    fn ipnet_contains_edges() {
        let all4: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all4.contains("203.0.113.1".parse().unwrap()));
        assert!(!all4.contains("2001:db8::1".parse().unwrap()));
        let all6: IpNet = "::/0".parse().unwrap();
        assert!(all6.contains("2001:db8::1".parse().unwrap()));
        let one: IpNet = "2001:db8::1".parse().unwrap();
        assert_eq!(one.prefix(), 128);
        assert!(one.contains("2001:db8::1".parse().unwrap()));
        assert!(!one.contains("2001:db8::2".parse().unwrap()));
    }
}
