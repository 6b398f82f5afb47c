//! Fuzzes the DNS responder with arbitrary messages under block, open and
//! allow-list policies: no panics; every reply is a response with the
//! query's id that decodes again; an A answer is a live synthetic address
//! that maps back to a name the policy allows.
#![no_main]

use std::net::IpAddr;
use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::RData;
use libfuzzer_sys::fuzz_target;
use sandboxd::net::dns::{DnsConfig, DnsResponder};
use sandboxd::net::policy::EgressPolicy;

fn policies() -> &'static [EgressPolicy; 3] {
    static P: OnceLock<[EgressPolicy; 3]> = OnceLock::new();
    P.get_or_init(|| {
        [
            EgressPolicy::block(),
            EgressPolicy::open(),
            EgressPolicy::allow_list(&["a.test", "*.wild.test", "192.0.2.0/24"]).unwrap(),
        ]
    })
}

fn responder() -> &'static DnsResponder {
    static R: OnceLock<DnsResponder> = OnceLock::new();
    R.get_or_init(|| {
        DnsResponder::new(DnsConfig {
            max_entries: 64,
            ..DnsConfig::default()
        })
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let r = responder();
    for (i, policy) in policies().iter().enumerate() {
        let Some(reply) = r.handle(data, policy) else {
            continue;
        };
        assert!(reply.len() >= 12);
        assert_eq!(&reply[..2], &data[..2], "id not echoed");
        assert_ne!(reply[2] & 0x80, 0, "not marked as a response");
        let msg = Message::from_vec(&reply).expect("our reply decodes");
        assert_eq!(msg.message_type(), MessageType::Response);
        for rec in msg.answers() {
            let RData::A(a) = rec.data() else {
                panic!("unexpected answer {rec:?}");
            };
            assert_ne!(i, 0, "block mode answered");
            let ip = IpAddr::V4(a.0);
            assert!(r.in_pool(ip));
            let name = r.lookup_synthetic(ip).expect("answered address maps back");
            assert!(policy.allows_host(&name), "{name}");
        }
    }
    assert!(r.mappings() <= 64);
});
