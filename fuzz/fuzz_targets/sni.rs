//! Fuzzes the TLS ClientHello parser: no panics, well-formed names only, and
//! an answer given on a prefix (anything but NeedMore) never changes when
//! more bytes arrive, which is what lets the proxy stop reading there.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandboxd::net::sni::{parse_client_hello, ClientHello};

fuzz_target!(|data: &[u8]| {
    let whole = parse_client_hello(data);
    if let ClientHello::Sni(name) = &whole {
        assert!(!name.is_empty() && name.len() <= 255);
        assert!(name.bytes().all(|b| b.is_ascii_graphic()));
    }
    let cuts = [
        1,
        5,
        6,
        9,
        10,
        43,
        44,
        data.len() / 2,
        data.len().saturating_sub(1),
    ];
    for &cut in &cuts {
        if cut >= data.len() {
            continue;
        }
        let early = parse_client_hello(&data[..cut]);
        if early != ClientHello::NeedMore {
            assert_eq!(early, whole, "answer on {cut} bytes changed with more");
        }
    }
});
