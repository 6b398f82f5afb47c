//! Which sandbox and port a request is for: by host name
//! (`<sandbox-id>-<port>.<ingress_domain>`, Beam's form) or by path
//! (`/<sandbox-id>/<port>/...`, for hosts without wildcard DNS).

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub sandbox: String,
    pub port: u16,
    /// The path form's `/<id>/<port>`, stripped before the app sees it.
    pub prefix: Option<String>,
    /// The path and query the app gets.
    pub path_and_query: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{0}")]
    Malformed(String),
    #[error("no preview URL here: use <sandbox-id>-<port>.<domain> or /<sandbox-id>/<port>/")]
    NoRoute,
    /// `/<id>/<port>` without its slash: the app's relative links need it.
    #[error("moved to {0}")]
    AddSlash(String),
}

/// The host without its port, lower-cased; `[v6]` keeps its brackets.
fn host_only(host: &str) -> String {
    let host = host.trim();
    let bare = if host.starts_with('[') {
        host.split_once(']')
            .map(|(h, _)| format!("{h}]"))
            .unwrap_or_else(|| host.to_string())
    } else {
        host.rsplit_once(':')
            .map(|(h, _)| h.to_string())
            .unwrap_or_else(|| host.to_string())
    };
    bare.trim_end_matches('.').to_ascii_lowercase()
}

/// `<id>-<port>`: the sandbox id and the port. Also how the pooled
/// client's URI authority names its target (`proxy.rs`).
pub(super) fn split_label(label: &str) -> Option<(String, u16)> {
    let (sandbox, port) = label.rsplit_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    (!sandbox.is_empty() && sandbox.starts_with("sb-")).then(|| (sandbox.to_string(), port))
}

pub fn route(
    domain: Option<&str>,
    host: Option<&str>,
    path_and_query: &str,
) -> Result<Route, RouteError> {
    if let (Some(domain), Some(host)) = (domain, host) {
        let host = host_only(host);
        if let Some(label) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')) {
            return match (label.contains('.'), split_label(label)) {
                (false, Some((sandbox, port))) => Ok(Route {
                    sandbox,
                    port,
                    prefix: None,
                    path_and_query: path_and_query.to_string(),
                }),
                _ => Err(RouteError::Malformed(format!(
                    "{host} is not a preview URL's host name: it must be <sandbox-id>-<port>.{domain}"
                ))),
            };
        }
    }
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let mut parts = path.splitn(4, '/');
    let (Some(""), Some(sandbox), Some(port)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(RouteError::NoRoute);
    };
    let rest = parts.next();
    if !sandbox.starts_with("sb-") {
        return Err(RouteError::NoRoute);
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
        RouteError::Malformed(format!(
            "{port:?} in /{sandbox}/{port}/ is not a port in 1..65535"
        ))
    })?;
    let prefix = format!("/{sandbox}/{port}");
    let query_suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
    let Some(rest) = rest else {
        return Err(RouteError::AddSlash(format!("{prefix}/{query_suffix}")));
    };
    Ok(Route {
        sandbox: sandbox.to_string(),
        port,
        prefix: Some(prefix),
        path_and_query: format!("/{rest}{query_suffix}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: Option<&str> = Some("sbx.test");

    #[test]
    fn host_names_route_to_the_sandbox_and_port_they_name() {
        let r =
            route(DOMAIN, Some("sb-0123456789ab-3000.sbx.test:8080"), "/a?b=1").expect("routes");
        assert_eq!(
            r,
            Route {
                sandbox: "sb-0123456789ab".into(),
                port: 3000,
                prefix: None,
                path_and_query: "/a?b=1".into()
            }
        );
        assert!(route(DOMAIN, Some("SB-0123456789AB-80.SBX.TEST."), "/").is_ok());
    }

    #[test]
    fn malformed_host_names_under_the_domain_are_refused() {
        for host in [
            "nonsense.sbx.test",
            "sb-0123456789ab-0.sbx.test",
            "sb-0123456789ab-70000.sbx.test",
            "a.sb-0123456789ab-80.sbx.test",
            "sb-0123456789ab.sbx.test",
        ] {
            assert!(
                matches!(
                    route(DOMAIN, Some(host), "/"),
                    Err(RouteError::Malformed(_))
                ),
                "{host}"
            );
        }
    }

    #[test]
    fn paths_route_with_the_prefix_stripped() {
        let r = route(
            DOMAIN,
            Some("127.0.0.1:8080"),
            "/sb-0123456789ab/8000/x/y?q=1",
        )
        .expect("routes");
        assert_eq!(r.sandbox, "sb-0123456789ab");
        assert_eq!(r.port, 8000);
        assert_eq!(r.prefix.as_deref(), Some("/sb-0123456789ab/8000"));
        assert_eq!(r.path_and_query, "/x/y?q=1");
        let root = route(None, None, "/sb-0123456789ab/8000/").expect("routes");
        assert_eq!(root.path_and_query, "/");
        assert_eq!(
            route(None, None, "/sb-0123456789ab/8000?x=1"),
            Err(RouteError::AddSlash("/sb-0123456789ab/8000/?x=1".into()))
        );
        assert_eq!(route(None, None, "/"), Err(RouteError::NoRoute));
        assert_eq!(route(None, None, "/favicon.ico"), Err(RouteError::NoRoute));
        assert!(matches!(
            route(None, None, "/sb-0123456789ab/http/"),
            Err(RouteError::Malformed(_))
        ));
    }
}
