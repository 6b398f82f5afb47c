//! A token URL's credentials: where a request may carry the token
//! (`Authorization: Bearer`, `X-Sandbox-Token`, `?sandbox_token=`, the
//! ingress's cookie), and their removal before the request reaches the app.

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, COOKIE, ORIGIN};

pub const TOKEN_HEADER: &str = "x-sandbox-token";
pub const TOKEN_QUERY: &str = "sandbox_token";
pub const TOKEN_COOKIE: &str = "sandboxd_token";

/// The tokens a request presents, by where they came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presented {
    /// `?sandbox_token=`, with the path and query without it (`clean`).
    pub query: Option<(String, String)>,
    /// `X-Sandbox-Token` and a bearer `Authorization` (which may be the
    /// app's own): deliberate, so no browser sends them unasked.
    pub headers: Vec<String>,
    /// Every `sandboxd_token` cookie: a browser sends these with any
    /// request to the host, so they count only from the URL's own origin.
    pub cookies: Vec<String>,
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn cookies(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .collect()
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

/// Every token the request presents, wherever it is.
pub fn presented(headers: &HeaderMap, path_and_query: &str) -> Presented {
    let mut deliberate: Vec<String> = headers
        .get_all(TOKEN_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .collect();
    deliberate.extend(bearer(headers));
    Presented {
        query: from_query(path_and_query),
        headers: deliberate,
        cookies: cookies(headers),
    }
}

/// Why a request may not use the URL's cookie, if it may not: it was sent
/// by a page of another origin (`Sec-Fetch-Site`, else `Origin`). Other
/// sandboxes' host names are the same site, so SameSite=Lax alone would
/// let their pages use it.
pub fn foreign_origin(headers: &HeaderMap, host: &str) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Some(format!("Sec-Fetch-Site is {site}"));
        }
    }
    let origin = headers.get(ORIGIN)?.to_str().unwrap_or("null");
    let named = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    match named {
        Some(authority) if authority.eq_ignore_ascii_case(host) => None,
        _ => Some(format!("the request comes from {origin}")),
    }
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

/// The cookie a `?sandbox_token=` visit to a host-name URL sets:
/// host-only (no Domain), HttpOnly, SameSite=Lax, Secure under TLS.
pub fn set_cookie(token: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax{secure}")
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
        let t = "tok".to_string();
        let p = presented(&headers(&[("authorization", "Bearer tok")]), "/");
        assert_eq!(p.headers, vec![t.clone()]);
        let p = presented(&headers(&[("x-sandbox-token", "tok")]), "/");
        assert_eq!(p.headers, vec![t.clone()]);
        let p = presented(
            &headers(&[
                ("cookie", "sandboxd_token=old; a=1"),
                ("cookie", "sandboxd_token=tok"),
            ]),
            "/",
        );
        assert_eq!(
            p.cookies,
            vec!["old".to_string(), t.clone()],
            "every cookie counts"
        );
        assert_eq!(
            presented(&HeaderMap::new(), "/x?a=1&sandbox_token=tok&b=2").query,
            Some((t.clone(), "/x?a=1&b=2".into()))
        );
        assert_eq!(
            presented(&HeaderMap::new(), "/x?sandbox_token=tok").query,
            Some((t, "/x".into()))
        );
        assert_eq!(
            presented(&headers(&[("cookie", "a=1")]), "/?a=1"),
            Presented::default()
        );
    }

    #[test]
    fn only_the_urls_own_origin_may_use_its_cookie() {
        let host = "sb-1-80.sbx.test";
        assert_eq!(
            foreign_origin(&HeaderMap::new(), host),
            None,
            "a plain client"
        );
        assert_eq!(
            foreign_origin(&headers(&[("sec-fetch-site", "none")]), host),
            None,
            "the user typed or followed the URL"
        );
        assert_eq!(
            foreign_origin(
                &headers(&[
                    ("sec-fetch-site", "same-origin"),
                    ("origin", "https://sb-1-80.sbx.test")
                ]),
                host
            ),
            None
        );
        for refused in [
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("origin", "https://sb-2-80.sbx.test")]),
            headers(&[("origin", "null")]),
        ] {
            assert!(foreign_origin(&refused, host).is_some(), "{refused:?}");
        }
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
    fn the_cookie_is_host_only_and_locked_down() {
        assert_eq!(
            set_cookie("t", true),
            "sandboxd_token=t; Path=/; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(
            set_cookie("t", false),
            "sandboxd_token=t; Path=/; HttpOnly; SameSite=Lax"
        );
    }
}
