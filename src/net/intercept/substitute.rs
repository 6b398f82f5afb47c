//! Placeholder for value, in request header values only. `Authorization:
//! Basic` is decoded, substituted and encoded again, since a client puts
//! `user:password` there in base64. Bodies, URLs and responses are never
//! touched. Only the secrets bound to the connection's host are applied,
//! so a placeholder of secret A is never replaced on B's host.

use base64::Engine;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};

/// One substitution: the placeholder to find and the value to put there.
pub struct Swap<'a> {
    pub name: &'a str,
    pub placeholder: &'a str,
    pub value: &'a str,
}

/// Replaces placeholders in every header value; returns the names of the
/// secrets that were put in (each once).
pub fn substitute_headers<'a>(headers: &mut HeaderMap, swaps: &[Swap<'a>]) -> Vec<&'a str> {
    let mut used: Vec<&'a str> = Vec::new();
    if swaps.is_empty() {
        return used;
    }
    for (name, value) in headers.iter_mut() {
        let Ok(text) = value.to_str() else {
            // Not visible ASCII: a placeholder (ASCII) could still sit in
            // it, but so could anything; leave such values as they are.
            continue;
        };
        let mut out = replace_all(text, swaps, &mut used);
        if name == AUTHORIZATION {
            if let Some(basic) = substitute_basic(out.as_deref().unwrap_or(text), swaps, &mut used)
            {
                out = Some(basic);
            }
        }
        if let Some(new) = out {
            // The value came from a validated secret (no control
            // characters), so this cannot fail in practice.
            if let Ok(mut new) = HeaderValue::from_str(&new) {
                new.set_sensitive(true);
                *value = new;
            }
        }
    }
    used
}

/// `text` with every placeholder replaced, or `None` when none was there.
fn replace_all<'a>(text: &str, swaps: &[Swap<'a>], used: &mut Vec<&'a str>) -> Option<String> {
    let mut out: Option<String> = None;
    for swap in swaps {
        let current = out.as_deref().unwrap_or(text);
        if current.contains(swap.placeholder) {
            out = Some(current.replace(swap.placeholder, swap.value));
            if !used.contains(&swap.name) {
                used.push(swap.name);
            }
        }
    }
    out
}

/// `Basic <base64(user:password)>` with placeholders replaced inside, or
/// `None` when it is not Basic or holds none.
fn substitute_basic<'a>(
    header: &str,
    swaps: &[Swap<'a>],
    used: &mut Vec<&'a str>,
) -> Option<String> {
    let (scheme, encoded) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let engine = base64::engine::general_purpose::STANDARD;
    let decoded = engine.decode(encoded.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let replaced = replace_all(&decoded, swaps, used)?;
    Some(format!("{scheme} {}", engine.encode(replaced)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Swap<'static> = Swap {
        name: "A",
        placeholder: "sandboxd-secret-aaaa",
        value: "real-a",
    };

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn bearer_and_custom_headers_get_the_value() {
        let mut map = headers(&[
            ("authorization", "Bearer sandboxd-secret-aaaa"),
            ("x-api-key", "sandboxd-secret-aaaa"),
            ("accept", "*/*"),
        ]);
        assert_eq!(substitute_headers(&mut map, &[A]), vec!["A"]);
        assert_eq!(map["authorization"], "Bearer real-a");
        assert!(map["authorization"].is_sensitive());
        assert_eq!(map["x-api-key"], "real-a");
        assert_eq!(map["accept"], "*/*");
    }

    #[test]
    fn basic_auth_is_decoded_substituted_and_encoded() {
        let engine = base64::engine::general_purpose::STANDARD;
        let sent = format!("Basic {}", engine.encode("user:sandboxd-secret-aaaa"));
        let mut map = headers(&[("authorization", &sent)]);
        assert_eq!(substitute_headers(&mut map, &[A]), vec!["A"]);
        let expect = format!("Basic {}", engine.encode("user:real-a"));
        assert_eq!(map["authorization"], expect.as_str());
    }

    #[test]
    fn nothing_bound_or_nothing_there_leaves_headers_alone() {
        let mut map = headers(&[("authorization", "Bearer sandboxd-secret-aaaa")]);
        assert!(substitute_headers(&mut map, &[]).is_empty());
        assert_eq!(map["authorization"], "Bearer sandboxd-secret-aaaa");
        let other = Swap {
            name: "B",
            placeholder: "sandboxd-secret-bbbb",
            value: "real-b",
        };
        assert!(substitute_headers(&mut map, &[other]).is_empty());
        assert_eq!(map["authorization"], "Bearer sandboxd-secret-aaaa");
    }
}
