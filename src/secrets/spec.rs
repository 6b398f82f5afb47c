//! What a secret may be called, where it may go, and how large it may be:
//! the checks every create and rotation passes. No message quotes a value.

use crate::net::host::normalize_host;
use crate::net::policy::{parse_entry, AllowEntry};

/// Most bytes a secret's value may hold (API keys and tokens are far
/// smaller; a PEM key fits).
pub const MAX_VALUE_BYTES: usize = 16 * 1024;
/// Most hosts one secret may be bound to.
pub const MAX_HOSTS: usize = 16;
/// Most secrets one sandbox may bind.
pub const MAX_BOUND: usize = 32;
/// Longest name, as environment variable names go.
pub const MAX_NAME_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("name {name:?}: {reason}")]
    Name { name: String, reason: &'static str },
    #[error("hosts: {0}")]
    Hosts(String),
    #[error("hosts entry {entry:?}: {reason}")]
    Host { entry: String, reason: String },
    #[error("value: {0}")]
    Value(String),
}

/// A secret's name is an environment variable name the sandbox reads it
/// by: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    let fail = |reason| SpecError::Name {
        name: name.chars().take(MAX_NAME_LEN).collect(),
        reason,
    };
    if name.is_empty() {
        return Err(fail(
            "empty; a secret is named like an environment variable (OPENAI_API_KEY)",
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(fail("longer than 128 bytes"));
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(fail(
            "must be an environment variable name: letters, digits and '_', not starting with a digit",
        ));
    }
    Ok(())
}

/// A host a secret is bound to: an exact name TLS can prove, or a
/// `*.wildcard` when `allow_wildcards` says the caller meant it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BoundHost {
    Exact(String),
    /// Any name exactly one label below this suffix, as a TLS wildcard
    /// certificate covers (not the suffix itself, nor deeper names).
    Below(String),
}

impl BoundHost {
    /// Whether a normalised name is this host.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            BoundHost::Exact(h) => h == name,
            BoundHost::Below(suffix) => name
                .strip_suffix(suffix.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        }
    }

    /// As an allow-list entry (and as the API shows it).
    pub fn entry(&self) -> String {
        match self {
            BoundHost::Exact(h) => h.clone(),
            BoundHost::Below(s) => format!("*.{s}"),
        }
    }

    /// Parses one entry of a secret's hosts.
    pub fn parse(raw: &str, allow_wildcards: bool) -> Result<BoundHost, SpecError> {
        let fail = |reason: String| SpecError::Host {
            entry: raw.chars().take(80).collect(),
            reason,
        };
        match parse_entry(raw).map_err(|e| fail(e.to_string()))? {
            AllowEntry::Host(h) => Ok(BoundHost::Exact(h)),
            // parse_entry has refused a wildcard over a whole top-level domain.
            AllowEntry::Wildcard(suffix) if allow_wildcards => Ok(BoundHost::Below(suffix)),
            AllowEntry::Wildcard(_) => Err(fail(
                "a wildcard sends the value to any subdomain, including ones someone else registers; \
                 set \"allow_wildcards\": true to bind it anyway"
                    .into(),
            )),
            AllowEntry::Net(_) => Err(fail(
                "a secret is bound to a host name that TLS can prove, not an address".into(),
            )),
        }
    }
}

/// Validates a whole hosts list; duplicates are dropped, order kept.
pub fn validate_hosts<S: AsRef<str>>(
    hosts: &[S],
    allow_wildcards: bool,
) -> Result<Vec<BoundHost>, SpecError> {
    if hosts.is_empty() {
        return Err(SpecError::Hosts(
            "at least one host is needed: the value goes only to the hosts named".into(),
        ));
    }
    if hosts.len() > MAX_HOSTS {
        return Err(SpecError::Hosts(format!(
            "{} hosts; at most {MAX_HOSTS} are allowed",
            hosts.len()
        )));
    }
    let mut out: Vec<BoundHost> = Vec::new();
    for raw in hosts {
        let host = BoundHost::parse(raw.as_ref(), allow_wildcards)?;
        if !out.contains(&host) {
            out.push(host);
        }
    }
    Ok(out)
}

/// A value is 1 to [`MAX_VALUE_BYTES`] bytes of printable ASCII: it is
/// put into HTTP header values as is.
pub fn validate_value(value: &[u8]) -> Result<(), SpecError> {
    if value.is_empty() {
        return Err(SpecError::Value("empty".into()));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(SpecError::Value(format!(
            "{} bytes; at most {MAX_VALUE_BYTES} are allowed",
            value.len()
        )));
    }
    if value.iter().any(|&b| !(0x20..0x7f).contains(&b)) {
        return Err(SpecError::Value(
            "holds a byte that is not printable ASCII (a trailing newline?); it goes into HTTP headers as is".into(),
        ));
    }
    Ok(())
}

/// The normalised form of a name TLS presented, for [`BoundHost::matches`].
pub fn normalized(name: &str) -> Option<String> {
    normalize_host(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_environment_variable_names() {
        for good in ["OPENAI_API_KEY", "_x", "a1"] {
            validate_name(good).unwrap();
        }
        for bad in ["", "1A", "A-B", "A B", "Ä", &"A".repeat(129)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_are_names_and_wildcards_need_asking() {
        assert_eq!(
            validate_hosts(&["API.OpenAI.com.", "api.openai.com"], false).unwrap(),
            vec![BoundHost::Exact("api.openai.com".into())]
        );
        let err = validate_hosts(&["192.0.2.1"], false).unwrap_err();
        assert!(err.to_string().contains("not an address"), "{err}");
        let err = validate_hosts(&["*.example.com"], false).unwrap_err();
        assert!(err.to_string().contains("allow_wildcards"), "{err}");
        assert_eq!(
            validate_hosts(&["*.example.com"], true).unwrap(),
            vec![BoundHost::Below("example.com".into())]
        );
        assert!(validate_hosts(&["*.com"], true).is_err());
        assert!(validate_hosts::<&str>(&[], false).is_err());
        assert!(validate_hosts(&["https://x.example"], false).is_err());
    }

    #[test]
    fn a_wildcard_matches_names_below_only() {
        let host = BoundHost::Below("example.com".into());
        assert!(host.matches("a.example.com"));
        assert!(
            !host.matches("a.b.example.com"),
            "one label, as the leaf's wildcard"
        );
        assert!(!host.matches("example.com"));
        assert!(!host.matches("badexample.com"));
        assert!(BoundHost::Exact("example.com".into()).matches("example.com"));
    }

    #[test]
    fn values_are_bounded_header_text_and_never_quoted() {
        validate_value(b"sk-123").unwrap();
        let secret = b"sk-secret\nvalue";
        let err = validate_value(secret).unwrap_err().to_string();
        assert!(!err.contains("sk-secret"), "{err}");
        assert!(validate_value(b"").is_err());
        assert!(validate_value(&vec![b'a'; MAX_VALUE_BYTES + 1]).is_err());
    }
}
