//! Fuzzes host parsing (every spelling a Host header or SNI may carry),
//! allow-list entries and name normalisation: no panics, normalised names
//! are fixed points, and an entry shown back by the API parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandboxd::net::deny::always_denied;
use sandboxd::net::host::{normalize_host, parse_host, HostSpec};
use sandboxd::net::policy::{parse_entry, EgressPolicy};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(hp) = parse_host(s) {
        match hp.host {
            HostSpec::Name(n) => {
                assert_eq!(normalize_host(&n).as_deref(), Ok(n.as_str()));
                assert_eq!(
                    parse_host(&n).map(|h| h.host),
                    Ok(HostSpec::Name(n.clone()))
                );
            }
            HostSpec::Ip(ip) => {
                let _ = always_denied(ip);
            }
        }
    }
    if let Ok(n) = normalize_host(s) {
        assert!(n.len() <= 253 && n.is_ascii());
        assert_eq!(normalize_host(&n).as_deref(), Ok(n.as_str()));
    }
    if let Ok(entry) = parse_entry(s) {
        let shown = entry.to_string();
        assert_eq!(parse_entry(&shown), Ok(entry), "{shown:?}");
    }
    if let Ok(p) = EgressPolicy::allow_list(&[s]) {
        let _ = p.allows_host(s);
        let _ = p.view();
    }
});
