//! The per-sandbox DNS responder's logic (message in, message out; the
//! UDP/TCP sockets are the caller's). Names the policy allows get an A record
//! with a synthetic address from a private pool that only means something
//! inside that sandbox's namespace; the egress proxy maps the address a
//! connection was sent to back to the name with
//! [`DnsResponder::lookup_synthetic`]. So a connection to an allowed name
//! works on any port without SNI or Host, and DNS rebinding gets nowhere
//! (the sandbox never learns a real address). Other names get REFUSED at
//! once; in block mode every query does. AAAA and other types for allowed
//! names get an empty NOERROR answer, so clients fall back to A at once.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::net::host::{canonical_ip, normalize_host};
use crate::net::policy::EgressPolicy;

/// How the responder hands out synthetic addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// First address of the pool (its network address).
    pub pool: Ipv4Addr,
    /// Pool prefix length; the pool must hold more than `max_entries` + 2
    /// addresses.
    pub pool_prefix: u8,
    /// TTL put on answers.
    pub answer_ttl: Duration,
    /// How long a name↔address mapping lives after it was last answered or
    /// used (much longer than `answer_ttl`: clients cache past the TTL).
    pub retention: Duration,
    /// Most live mappings; past this the one closest to expiry is dropped.
    pub max_entries: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            pool: Ipv4Addr::new(10, 255, 0, 0),
            pool_prefix: 16,
            answer_ttl: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            max_entries: 4096,
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsConfigError {
    #[error("synthetic pool prefix /{0} must be between /8 and /30")]
    Prefix(u8),
    #[error("synthetic pool {pool}/{prefix} has host bits set")]
    HostBits { pool: Ipv4Addr, prefix: u8 },
    #[error(
        "max_entries {max} does not fit in a pool of {size} addresses (leave at least 2 spare)"
    )]
    TooManyEntries { max: usize, size: u64 },
    #[error("max_entries must be at least 1")]
    NoEntries,
}

#[derive(Debug)]
struct Mapping {
    name: String,
    expires: Instant,
}

#[derive(Debug, Default)]
struct SyntheticMap {
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, Mapping>,
    /// Offset in the pool of the last address handed out; new ones go round
    /// the pool so an address is reused as late as possible.
    cursor: u32,
}

impl SyntheticMap {
    fn remove_ip(&mut self, ip: Ipv4Addr) {
        if let Some(m) = self.by_ip.remove(&ip) {
            if self.by_name.get(&m.name) == Some(&ip) {
                self.by_name.remove(&m.name);
            }
        }
    }

    fn purge_expired(&mut self, now: Instant) {
        let expired: Vec<Ipv4Addr> = self
            .by_ip
            .iter()
            .filter(|(_, m)| m.expires <= now)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in expired {
            self.remove_ip(ip);
        }
    }
}

/// A sandbox's DNS responder. Shared between the DNS server and the proxy
/// (it locks internally); the policy is passed per query so a policy change
/// applies to the next one.
#[derive(Debug)]
pub struct DnsResponder {
    config: DnsConfig,
    pool_base: u32,
    pool_size: u32,
    map: Mutex<SyntheticMap>,
}

/// EDNS payload size we advertise (the DNS flag day 2020 value).
const EDNS_PAYLOAD: u16 = 1232;

impl DnsResponder {
    pub fn new(config: DnsConfig) -> Result<Self, DnsConfigError> {
        if !(8..=30).contains(&config.pool_prefix) {
            return Err(DnsConfigError::Prefix(config.pool_prefix));
        }
        let size: u32 = 1 << (32 - u32::from(config.pool_prefix));
        let base = u32::from(config.pool);
        if base & (size - 1) != 0 {
            return Err(DnsConfigError::HostBits {
                pool: config.pool,
                prefix: config.pool_prefix,
            });
        }
        if config.max_entries == 0 {
            return Err(DnsConfigError::NoEntries);
        }
        if config.max_entries as u64 > u64::from(size) - 2 {
            return Err(DnsConfigError::TooManyEntries {
                max: config.max_entries,
                size: u64::from(size),
            });
        }
        Ok(DnsResponder {
            config,
            pool_base: base,
            pool_size: size,
            map: Mutex::new(SyntheticMap::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyntheticMap> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // in a way that matters more than losing them; keep serving.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ip` lies in the synthetic pool (live mapping or not).
    pub fn in_pool(&self, ip: IpAddr) -> bool {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => u32::from(v4).wrapping_sub(self.pool_base) < self.pool_size,
            IpAddr::V6(_) => false,
        }
    }

    /// The name a synthetic address was handed out for, if that mapping is
    /// still live; a hit keeps it alive for another `retention`. The proxy
    /// must still check the name against the policy in force now.
    pub fn lookup_synthetic(&self, ip: IpAddr) -> Option<String> {
        self.lookup_synthetic_at(ip, Instant::now())
    }

    pub fn lookup_synthetic_at(&self, ip: IpAddr, now: Instant) -> Option<String> {
        let IpAddr::V4(v4) = canonical_ip(ip) else {
            return None;
        };
        let mut map = self.lock();
        let m = map.by_ip.get_mut(&v4)?;
        if m.expires <= now {
            return None;
        }
        m.expires = now + self.config.retention;
        Some(m.name.clone())
    }

    /// How many mappings are held (live or not yet purged).
    pub fn mappings(&self) -> usize {
        self.lock().by_ip.len()
    }

    /// The synthetic address for `name` (normalised), making one if needed.
    fn assign(&self, name: &str, now: Instant) -> Option<Ipv4Addr> {
        let mut map = self.lock();
        let expires = now + self.config.retention;
        if let Some(&ip) = map.by_name.get(name) {
            if let Some(m) = map.by_ip.get_mut(&ip) {
                m.expires = expires;
                return Some(ip);
            }
        }
        if map.by_ip.len() >= self.config.max_entries {
            map.purge_expired(now);
        }
        if map.by_ip.len() >= self.config.max_entries {
            let oldest = map
                .by_ip
                .iter()
                .min_by_key(|(_, m)| m.expires)
                .map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                map.remove_ip(ip);
            }
        }
        // Skip the pool's first and last address. Fewer than max_entries
        // addresses are taken, so a free one turns up within one round.
        for _ in 0..self.pool_size {
            map.cursor = (map.cursor + 1) % self.pool_size;
            let offset = map.cursor;
            if offset == 0 || offset == self.pool_size - 1 {
                continue;
            }
            let ip = Ipv4Addr::from(self.pool_base + offset);
            let free = match map.by_ip.get(&ip) {
                None => true,
                Some(m) => m.expires <= now,
            };
            if free {
                map.remove_ip(ip);
                map.by_ip.insert(
                    ip,
                    Mapping {
                        name: name.to_string(),
                        expires,
                    },
                );
                map.by_name.insert(name.to_string(), ip);
                return Some(ip);
            }
        }
        None
    }

    /// Answers one DNS message (without the TCP length prefix). `None`
    /// means send nothing (too short to answer, or not a query).
    pub fn handle(&self, query: &[u8], policy: &EgressPolicy) -> Option<Vec<u8>> {
        self.handle_at(query, policy, Instant::now())
    }

    pub fn handle_at(&self, query: &[u8], policy: &EgressPolicy, now: Instant) -> Option<Vec<u8>> {
        if query.len() < 12 {
            return None;
        }
        if query[2] & 0x80 != 0 {
            // A response: never answer one (no loops, no reflection).
            return None;
        }
        let msg = match Message::from_vec(query) {
            Ok(m) => m,
            Err(_) => return Some(raw_error(query, ResponseCode::FormErr)),
        };
        if msg.message_type() != MessageType::Query {
            return None;
        }
        let mut resp = Message::new();
        let mut header = Header::response_from_request(msg.header());
        header.set_recursion_available(true);
        resp.set_header(header);
        if msg.extensions().is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            resp.set_edns(edns);
        }
        if msg.op_code() != OpCode::Query {
            resp.set_response_code(ResponseCode::NotImp);
            return encode(resp, query);
        }
        let [q] = msg.queries() else {
            resp.set_response_code(ResponseCode::FormErr);
            return encode(resp, query);
        };
        resp.add_query(q.clone());
        let code = self.answer(
            &mut resp,
            q.name(),
            q.query_type(),
            q.query_class(),
            policy,
            now,
        );
        resp.set_response_code(code);
        encode(resp, query)
    }

    fn answer(
        &self,
        resp: &mut Message,
        qname: &Name,
        qtype: RecordType,
        qclass: DNSClass,
        policy: &EgressPolicy,
        now: Instant,
    ) -> ResponseCode {
        if policy.is_block() || qclass != DNSClass::IN {
            return ResponseCode::Refused;
        }
        let Some(name) = name_text(qname).and_then(|n| normalize_host(&n).ok()) else {
            return ResponseCode::Refused;
        };
        if !policy.allows_normalized(&name) {
            return ResponseCode::Refused;
        }
        if qtype != RecordType::A {
            // Allowed name, no data of this type (AAAA included: synthetic
            // addresses are IPv4 only).
            return ResponseCode::NoError;
        }
        let Some(ip) = self.assign(&name, now) else {
            return ResponseCode::ServFail;
        };
        let ttl = u32::try_from(self.config.answer_ttl.as_secs()).unwrap_or(u32::MAX);
        resp.add_answer(Record::from_rdata(qname.clone(), ttl, RData::A(A(ip))));
        ResponseCode::NoError
    }
}

/// The question name as text, if every label is printable ASCII without
/// dots or backslashes (anything else is not a host name).
fn name_text(name: &Name) -> Option<String> {
    let mut out = String::new();
    for label in name.iter() {
        if label.is_empty()
            || !label
                .iter()
                .all(|&b| b.is_ascii_graphic() && b != b'.' && b != b'\\')
        {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(std::str::from_utf8(label).ok()?);
    }
    if out.is_empty() {
        None
    } else {
        Some(out)
    }
}

fn encode(resp: Message, query: &[u8]) -> Option<Vec<u8>> {
    match resp.to_vec() {
        Ok(bytes) => Some(bytes),
        Err(_) => Some(raw_error(query, ResponseCode::ServFail)),
    }
}

/// A bare 12-byte error response echoing the query's id, opcode and RD bit,
/// for messages we cannot (or need not) decode.
fn raw_error(query: &[u8], code: ResponseCode) -> Vec<u8> {
    let opcode_rd = query.get(2).copied().unwrap_or(0) & 0x79;
    let rcode = (u16::from(code) & 0x0f) as u8;
    vec![
        query.first().copied().unwrap_or(0),
        query.get(1).copied().unwrap_or(0),
        0x80 | opcode_rd,
        0x80 | rcode,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use std::str::FromStr;

    fn query(name: &str, ty: RecordType) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x1234)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(true);
        m.add_query(Query::query(Name::from_str(name).unwrap(), ty));
        m.to_vec().unwrap()
    }

    fn ask(r: &DnsResponder, p: &EgressPolicy, name: &str, ty: RecordType) -> Message {
        let bytes = r.handle(&query(name, ty), p).expect("an answer");
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.id(), 0x1234);
        assert_eq!(m.message_type(), MessageType::Response);
        assert!(m.recursion_desired());
        m
    }

    fn a_of(m: &Message) -> Ipv4Addr {
        assert_eq!(m.response_code(), ResponseCode::NoError);
        match m.answers() {
            [rec] => match rec.data() {
                RData::A(A(ip)) => *ip,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    fn responder() -> DnsResponder {
        DnsResponder::new(DnsConfig::default()).unwrap()
    }

    #[test]
    fn allowed_names_get_stable_synthetic_addresses() {
        let r = responder();
        let p = EgressPolicy::allow_list(&["api.example.test", "*.wild.test"]).unwrap();
        let m = ask(&r, &p, "api.example.test.", RecordType::A);
        let ip = a_of(&m);
        assert!(r.in_pool(IpAddr::V4(ip)));
        assert_eq!(m.answers()[0].ttl(), 30);
        assert_eq!(m.queries().len(), 1);
        // Case and trailing dot do not matter; the same name keeps its address.
        let again = a_of(&ask(&r, &p, "API.Example.Test", RecordType::A));
        assert_eq!(again, ip);
        assert_eq!(
            r.lookup_synthetic(IpAddr::V4(ip)).as_deref(),
            Some("api.example.test")
        );
        let v6_mapped: IpAddr = format!("::ffff:{ip}").parse().unwrap();
        assert_eq!(
            r.lookup_synthetic(v6_mapped).as_deref(),
            Some("api.example.test")
        );
        let other = a_of(&ask(&r, &p, "a.b.wild.test", RecordType::A));
        assert_ne!(other, ip);
        assert_eq!(
            r.lookup_synthetic(IpAddr::V4(other)).as_deref(),
            Some("a.b.wild.test")
        );
        assert_eq!(r.lookup_synthetic("10.255.200.200".parse().unwrap()), None);
        assert!(!r.in_pool("10.254.0.1".parse().unwrap()));
    }

    #[test]
    fn other_names_are_refused_at_once() {
        let r = responder();
        let p = EgressPolicy::allow_list(&["*.wild.test"]).unwrap();
        for name in ["wild.test.", "evil.test.", "a.wild.test.evil."] {
            let m = ask(&r, &p, name, RecordType::A);
            assert_eq!(m.response_code(), ResponseCode::Refused, "{name}");
            assert!(m.answers().is_empty());
        }
        assert_eq!(r.mappings(), 0);
    }

    #[test]
    fn block_mode_refuses_everything() {
        let r = responder();
        let p = EgressPolicy::block();
        for ty in [RecordType::A, RecordType::AAAA, RecordType::TXT] {
            let m = ask(&r, &p, "example.test.", ty);
            assert_eq!(m.response_code(), ResponseCode::Refused);
        }
    }

    #[test]
    fn open_mode_answers_any_name_but_not_ip_literals() {
        let r = responder();
        let p = EgressPolicy::open();
        a_of(&ask(&r, &p, "anything.example.", RecordType::A));
        let m = ask(&r, &p, "127.0.0.1.", RecordType::A);
        assert_eq!(m.response_code(), ResponseCode::Refused);
    }

    #[test]
    fn aaaa_and_other_types_are_empty_for_allowed_names() {
        let r = responder();
        let p = EgressPolicy::allow_list(&["a.test"]).unwrap();
        for ty in [
            RecordType::AAAA,
            RecordType::MX,
            RecordType::TXT,
            RecordType::ANY,
        ] {
            let m = ask(&r, &p, "a.test.", ty);
            assert_eq!(m.response_code(), ResponseCode::NoError, "{ty}");
            assert!(m.answers().is_empty());
        }
        assert_eq!(r.mappings(), 0, "only A queries make mappings");
    }

    #[test]
    fn malformed_queries() {
        let r = responder();
        let p = EgressPolicy::open();
        assert_eq!(r.handle(b"short", &p), None);
        // Header promising a question that is not there: FORMERR, same id.
        let bad = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        let resp = r.handle(&bad, &p).unwrap();
        assert_eq!(&resp[..2], &[0xab, 0xcd]);
        assert_eq!(resp[2] & 0x80, 0x80);
        assert_eq!(resp[2] & 0x01, 0x01, "RD echoed");
        assert_eq!(resp[3] & 0x0f, 1, "FORMERR");
        // A response is never answered.
        let mut resp_in = query("a.test.", RecordType::A);
        resp_in[2] |= 0x80;
        assert_eq!(r.handle(&resp_in, &p), None);
        // No question: FORMERR.
        let mut m = Message::new();
        m.set_id(7).set_message_type(MessageType::Query);
        let out = Message::from_vec(&r.handle(&m.to_vec().unwrap(), &p).unwrap()).unwrap();
        assert_eq!(out.response_code(), ResponseCode::FormErr);
        // Not a QUERY: NOTIMP.
        let mut m = Message::new();
        m.set_id(8)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Status);
        let out = Message::from_vec(&r.handle(&m.to_vec().unwrap(), &p).unwrap()).unwrap();
        assert_eq!(out.response_code(), ResponseCode::NotImp);
        // Non-IN class: REFUSED.
        let mut m = Message::new();
        m.set_id(9).set_message_type(MessageType::Query);
        let mut q = Query::query(Name::from_str("a.test.").unwrap(), RecordType::A);
        q.set_query_class(DNSClass::CH);
        m.add_query(q);
        let out = Message::from_vec(&r.handle(&m.to_vec().unwrap(), &p).unwrap()).unwrap();
        assert_eq!(out.response_code(), ResponseCode::Refused);
    }

    #[test]
    fn odd_label_bytes_are_refused() {
        let r = responder();
        let p = EgressPolicy::open();
        // Hand-made query for the one-label name "a.b" (a dot inside a label).
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(&[
            3, b'a', b'.', b'b', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1,
        ]);
        let out = Message::from_vec(&r.handle(&q, &p).unwrap()).unwrap();
        assert_eq!(out.response_code(), ResponseCode::Refused);
    }

    #[test]
    fn edns_is_answered_with_edns() {
        let r = responder();
        let p = EgressPolicy::open();
        let mut m = Message::new();
        m.set_id(0x1234)
            .set_message_type(MessageType::Query)
            .set_recursion_desired(true);
        m.add_query(Query::query(
            Name::from_str("a.test.").unwrap(),
            RecordType::A,
        ));
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        m.set_edns(edns);
        let out = Message::from_vec(&r.handle(&m.to_vec().unwrap(), &p).unwrap()).unwrap();
        assert_eq!(
            out.extensions().as_ref().map(|e| e.max_payload()),
            Some(EDNS_PAYLOAD)
        );
    }

    #[test]
    fn mappings_are_bounded_and_expire() {
        let r = DnsResponder::new(DnsConfig {
            pool: Ipv4Addr::new(10, 255, 0, 0),
            pool_prefix: 29,
            answer_ttl: Duration::from_secs(5),
            retention: Duration::from_secs(60),
            max_entries: 3,
        })
        .unwrap();
        let p = EgressPolicy::open();
        let t0 = Instant::now();
        let ask_at = |name: &str, t: Instant| {
            let bytes = r.handle_at(&query(name, RecordType::A), &p, t).unwrap();
            a_of(&Message::from_vec(&bytes).unwrap())
        };
        let a = ask_at("a.test.", t0);
        let b = ask_at("b.test.", t0 + Duration::from_secs(1));
        let c = ask_at("c.test.", t0 + Duration::from_secs(2));
        assert_eq!(r.mappings(), 3);
        for ip in [a, b, c] {
            let off = u32::from(ip) - u32::from(Ipv4Addr::new(10, 255, 0, 0));
            assert!((1..=6).contains(&off), "{ip}");
        }
        // Full: the one closest to expiry (a) goes.
        let d = ask_at("d.test.", t0 + Duration::from_secs(3));
        assert_eq!(r.mappings(), 3);
        assert_eq!(
            r.lookup_synthetic_at(IpAddr::V4(a), t0 + Duration::from_secs(3)),
            None
        );
        assert_eq!(
            r.lookup_synthetic_at(IpAddr::V4(d), t0 + Duration::from_secs(3))
                .as_deref(),
            Some("d.test")
        );
        // Expiry, and a lookup keeps a mapping alive.
        let late = t0 + Duration::from_secs(50);
        assert!(r.lookup_synthetic_at(IpAddr::V4(b), late).is_some());
        let later = t0 + Duration::from_secs(70);
        assert!(r.lookup_synthetic_at(IpAddr::V4(b), later).is_some());
        assert_eq!(r.lookup_synthetic_at(IpAddr::V4(c), later), None);
        // Many more names than slots never exceed the bound or panic.
        for i in 0..50 {
            ask_at(&format!("n{i}.test."), later + Duration::from_secs(i));
            assert!(r.mappings() <= 3);
        }
    }

    #[test]
    fn bad_configs() {
        let base = DnsConfig::default();
        assert!(DnsResponder::new(DnsConfig {
            pool_prefix: 31,
            ..base.clone()
        })
        .is_err());
        assert!(DnsResponder::new(DnsConfig {
            pool: Ipv4Addr::new(10, 255, 0, 1),
            ..base.clone()
        })
        .is_err());
        assert!(DnsResponder::new(DnsConfig {
            pool_prefix: 30,
            max_entries: 3,
            ..base.clone()
        })
        .is_err());
        assert!(DnsResponder::new(DnsConfig {
            max_entries: 0,
            ..base
        })
        .is_err());
    }
}
