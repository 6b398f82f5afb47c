//! A token URL's credentials: where a request may carry the token
//! (`Authorization: Bearer`, `X-Sandbox-Token`, `?sandbox_token=`, the
//! ingress's cookie), and their removal before the request reaches the app.

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, COOKIE};

pub const TOKEN_HEADER: &str = "x-sandbox-token";
pub const TOKEN_QUERY: &str = "sandbox_token";
pub const TOKEN_COOKIE: &str = "sandboxd_token";

/// Where a presented token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// A header or the cookie: checked, then stripped.
    Header(String),
    /// The query parameter: answered with a redirect that sets the cookie,
    /// to `clean` (the same path and query without it).
    Query { token: String, clean: String },
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.trim().to_string())
}

/// `path?query` without `sandbox_token`, and the token it carried.
fn from_query(path_and_query: &str) -> Option<(String, String)> {
    let (path, query) = path_and_query.split_once('?')?;
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((TOKEN_QUERY, value)) => {
                token = Some(value.to_string());
                false
            }
            _ => true,
        })
        .collect();
    let token = token?;
    let clean = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    Some((token, clean))
}

/// The token a request presents, if any: the query first (it asks for the
/// cookie), then the headers, then the cookie.
pub fn presented(headers: &HeaderMap, path_and_query: &str) -> Option<Presented> {
    if let Some((token, clean)) = from_query(path_and_query) {
        return Some(Presented::Query { token, clean });
    }
    headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .or_else(|| bearer(headers))
        .or_else(|| cookie(headers))
        .map(Presented::Header)
}

/// Removes the ingress's credentials: its header, a bearer token that is
/// the port's token (an app's own `Authorization` passes), and its cookie
/// (other cookies pass).
pub fn strip(headers: &mut HeaderMap, token: Option<&str>) {
    headers.remove(TOKEN_HEADER);
    if let (Some(presented), Some(token)) = (bearer(headers), token) {
        if presented == token {
            headers.remove(AUTHORIZATION);
        }
    }
    let cookies: Vec<String> = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .filter(|pair| pair.split_once('=').map(|(n, _)| n) != Some(TOKEN_COOKIE))
        .map(str::to_string)
        .collect();
    headers.remove(COOKIE);
    if !cookies.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&cookies.join("; ")) {
            headers.insert(COOKIE, value);
        }
    }
}

/// The cookie a `?sandbox_token=` visit sets: host-only (no Domain), or
/// scoped to the path form's prefix.
pub fn set_cookie(token: &str, path_prefix: Option<&str>, tls: bool) -> String {
    let path = path_prefix
        .map(|p| format!("{p}/"))
        .unwrap_or_else(|| "/".to_string());
    let secure = if tls { "; Secure" } else { "" };
    format!("{TOKEN_COOKIE}={token}; Path={path}; HttpOnly; SameSite=Lax{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    #[test]
    fn each_form_presents_the_token() {
        let t = "tok";
        assert_eq!(
            presented(&headers(&[("authorization", "Bearer tok")]), "/"),
            Some(Presented::Header(t.into()))
        );
        assert_eq!(
            presented(&headers(&[("x-sandbox-token", "tok")]), "/"),
            Some(Presented::Header(t.into()))
        );
        assert_eq!(
            presented(&headers(&[("cookie", "a=1; sandboxd_token=tok")]), "/"),
            Some(Presented::Header(t.into()))
        );
        assert_eq!(
            presented(&HeaderMap::new(), "/x?a=1&sandbox_token=tok&b=2"),
            Some(Presented::Query {
                token: t.into(),
                clean: "/x?a=1&b=2".into()
            })
        );
        assert_eq!(
            presented(&HeaderMap::new(), "/x?sandbox_token=tok"),
            Some(Presented::Query {
                token: t.into(),
                clean: "/x".into()
            })
        );
        assert_eq!(presented(&headers(&[("cookie", "a=1")]), "/?a=1"), None);
    }

    #[test]
    fn stripping_removes_only_the_ingress_credentials() {
        let mut h = headers(&[
            ("authorization", "Bearer tok"),
            ("x-sandbox-token", "tok"),
            ("cookie", "a=1; sandboxd_token=tok; b=2"),
            ("x-mine", "kept"),
        ]);
        strip(&mut h, Some("tok"));
        assert!(h.get("authorization").is_none());
        assert!(h.get("x-sandbox-token").is_none());
        assert_eq!(
            h.get("cookie").map(|v| v.to_str().ok()),
            Some(Some("a=1; b=2"))
        );
        assert_eq!(h.get("x-mine").map(|v| v.to_str().ok()), Some(Some("kept")));
        let mut app_auth = headers(&[("authorization", "Bearer the-apps-own")]);
        strip(&mut app_auth, Some("tok"));
        assert!(
            app_auth.get("authorization").is_some(),
            "the app's own credentials pass"
        );
    }

    #[test]
    fn the_cookie_is_scoped_and_locked_down() {
        assert_eq!(
            set_cookie("t", None, true),
            "sandboxd_token=t; Path=/; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(
            set_cookie("t", Some("/sb-1/80"), false),
            "sandboxd_token=t; Path=/sb-1/80/; HttpOnly; SameSite=Lax"
        );
    }
}
