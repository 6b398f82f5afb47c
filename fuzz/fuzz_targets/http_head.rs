//! Fuzzes the HTTP request-head parser and the keep-alive request framer:
//! no panics; a head found in a prefix is the head of the whole; a prefix
//! refused stays refused; and the framer sees the same requests whether the
//! bytes come at once or in small pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandboxd::net::http::{parse_request_head, HeadStatus, RequestFramer, Step};

/// Runs the framer over `data` in pieces of `chunk` bytes: the heads it
/// handed out (as Debug text), whether it ended refusing, and how many bytes
/// it let through.
fn frame(data: &[u8], chunk: usize) -> (Vec<String>, bool, usize) {
    let mut framer = RequestFramer::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut heads = Vec::new();
    let mut forwarded = 0;
    loop {
        match framer.step(&pending) {
            Step::NeedMore => {
                if fed == data.len() {
                    return (heads, false, forwarded);
                }
                let end = (fed + chunk).min(data.len());
                pending.extend_from_slice(&data[fed..end]);
                fed = end;
            }
            Step::Head(h) => {
                assert!(h.head_len > 0 && h.head_len <= pending.len());
                pending.drain(..h.head_len);
                forwarded += h.head_len;
                heads.push(format!("{h:?}"));
            }
            Step::Forward(n) => {
                assert!(n > 0 && n <= pending.len());
                pending.drain(..n);
                forwarded += n;
            }
            Step::Malformed(_) => return (heads, true, forwarded),
            Step::UpgradePending | Step::Opaque => return (heads, false, forwarded),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = parse_request_head(data);
    if let HeadStatus::Complete(h) = &whole {
        assert!(h.head_len <= data.len());
    }
    for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        if cut >= data.len() {
            continue;
        }
        match parse_request_head(&data[..cut]) {
            HeadStatus::NeedMore => {}
            HeadStatus::Complete(h) => {
                assert_eq!(
                    whole,
                    HeadStatus::Complete(h),
                    "head changed with more bytes"
                )
            }
            HeadStatus::Malformed(_) => assert!(
                matches!(whole, HeadStatus::Malformed(_)),
                "refused prefix accepted later: {whole:?}"
            ),
        }
    }
    let chunk = 1 + data.first().map_or(0, |b| usize::from(b % 7));
    let at_once = frame(data, data.len().max(1));
    let pieces = frame(data, chunk);
    assert_eq!(at_once, pieces, "framing depends on how bytes arrive");
});
