//! The mapping between the API's bodies and the domain: a create body
//! becomes the manager's [`CreateRequest`], a sandbox record becomes the
//! [`Sandbox`] a caller sees. The only place that knows both shapes.

use std::time::{Duration, UNIX_EPOCH};

use super::error::ApiError;
use super::types::{CreateSandbox, ImageChoice, PortUrl, Sandbox};
use crate::config::IngressSettings;
use crate::model::{CreateRequest, ExposedPort, PortProtocol, PortRequest, RuntimeKind};
use crate::net::policy::{DefaultEgress, EgressPolicy, NetworkPolicy};
use crate::sandbox::PortGrant;
use crate::sandbox::SandboxRecord;

impl TryFrom<CreateSandbox> for CreateRequest {
    type Error = ApiError;

    fn try_from(body: CreateSandbox) -> Result<Self, ApiError> {
        let runtime = body
            .runtime
            .as_deref()
            .map(str::parse::<RuntimeKind>)
            .transpose()
            .map_err(|e| ApiError::bad("invalid_runtime", e.to_string()))?;
        let (image, image_spec) = match body.image {
            Some(ImageChoice::Named(name)) => (Some(name), None),
            Some(ImageChoice::Spec(spec)) => (None, Some(spec)),
            None => (None, None),
        };
        Ok(CreateRequest {
            image,
            image_spec,
            runtime,
            cpu: body.cpu,
            memory_mib: body.memory_mib,
            disk_mib: body.disk_mib,
            pids: body.pids,
            cpu_shares: body.cpu_shares,
            ttl_seconds: body.ttl_seconds,
            env: body.env,
            labels: body.labels,
            idempotency_key: body.idempotency_key,
            gpu: body.gpu,
            gpu_count: body.gpu_count,
            network: NetworkPolicy {
                block_network: body.block_network,
                allow_list: body.allow_list,
            },
            from_snapshot: body.from_snapshot,
            secrets: body.secrets,
            ports: body.ports.into_iter().map(PortRequest::http).collect(),
            host_rootfs: body.host_rootfs.into_iter().map(Into::into).collect(),
            join_netns: body.join_netns.map(Into::into),
            hostname: body.hostname,
            volumes: body.volumes,
        })
    }
}

impl From<&SandboxRecord> for Sandbox {
    fn from(record: &SandboxRecord) -> Self {
        Sandbox {
            id: record.id.clone(),
            state: record.state,
            runtime: record.runtime,
            image: record.image.clone(),
            image_digest: record.image_digest.clone(),
            limits: record.limits.clone(),
            ttl_seconds: record.ttl_seconds,
            expires_at: record.expires_at_ms.map(|ms| {
                humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
            }),
            created_at: record.created_at.clone(),
            labels: record.labels.clone(),
            oom_kills: record.oom_kills,
            failure: record.failure.clone(),
            usage: record.usage.clone(),
            gpus: record.gpus.clone(),
            network: EgressPolicy::from_request(&record.network, DefaultEgress::Block)
                .ok()
                .map(|p| p.view()),
            secrets: record.secrets.iter().map(|b| b.name.clone()).collect(),
            ports: Vec::new(),
        }
    }
}

/// The sandbox as a caller sees it, its ports' URLs included; `grants`
/// carry the tokens just made (a create's answer).
pub fn sandbox_view(
    ingress: &IngressSettings,
    record: &SandboxRecord,
    grants: &[PortGrant],
) -> Sandbox {
    let mut view = Sandbox::from(record);
    view.ports = record
        .ports
        .iter()
        .map(|exposed| {
            let token = grants
                .iter()
                .find(|g| g.exposed.port == exposed.port)
                .and_then(|g| g.token.clone());
            port_url(ingress, &record.id, exposed, token)
        })
        .collect();
    view
}

/// Where an exposed port is reached: `<id>-<port>.<domain>` and
/// `/<id>/<port>/` on the first ingress listener, or a raw TCP port's
/// address.
pub fn port_url(
    ingress: &IngressSettings,
    sandbox: &str,
    exposed: &ExposedPort,
    token: Option<String>,
) -> PortUrl {
    let listen = ingress.listen.first().copied();
    let listen_ip = listen
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let ip_text = match listen_ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    // Where clients reach the ingress: the configured public URL, else
    // the first listener (named by the domain when there is one).
    let (https, port, path_host) = match &ingress.public_url {
        Some(public) => (public.https, public.port, public.host.clone()),
        None => (
            ingress.tls_files.is_some(),
            listen.map(|a| a.port()),
            ingress.domain.clone().unwrap_or_else(|| ip_text.clone()),
        ),
    };
    let scheme = if https { "https" } else { "http" };
    let port_suffix = match port {
        Some(443) if https => String::new(),
        Some(80) if !https => String::new(),
        Some(p) => format!(":{p}"),
        None => String::new(),
    };
    let (url, path_url, address) = match (exposed.protocol, exposed.host_port) {
        (PortProtocol::Tcp, Some(host_port)) => {
            // Raw TCP listens on the first listener's IP: name it, unless
            // that is every address and the domain is the better name.
            let named_ip = listen.is_some_and(|a| !a.ip().is_unspecified());
            let host = match (&ingress.domain, named_ip) {
                (Some(domain), false) => domain.clone(),
                _ => ip_text,
            };
            (None, None, Some(format!("{host}:{host_port}")))
        }
        _ => {
            let url = ingress.domain.as_ref().map(|domain| {
                format!(
                    "{scheme}://{sandbox}-{}.{domain}{port_suffix}/",
                    exposed.port
                )
            });
            let path_url = format!(
                "{scheme}://{path_host}{port_suffix}/{sandbox}/{}/",
                exposed.port
            );
            (url, Some(path_url), None)
        }
    };
    PortUrl {
        port: exposed.port,
        protocol: exposed.protocol,
        auth: exposed.auth,
        url,
        path_url,
        address,
        token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{IngressHostHeader, PublicUrl};
    use crate::model::PortAuth;

    fn settings(listen: &str, domain: Option<&str>, public: Option<PublicUrl>) -> IngressSettings {
        IngressSettings {
            listen: vec![listen.parse().expect("address")],
            domain: domain.map(str::to_string),
            tls_files: None,
            max_connections: 8,
            tcp_ports: Some((31000, 31009)),
            host_header: IngressHostHeader::Original,
            public_url: public,
        }
    }

    fn exposed(protocol: PortProtocol, host_port: Option<u16>) -> ExposedPort {
        ExposedPort {
            port: 3000,
            protocol,
            auth: PortAuth::Token,
            token_sha256: None,
            host_port,
        }
    }

    #[test]
    fn urls_name_the_listener_the_domain_or_the_public_url() {
        let http = exposed(PortProtocol::Http, None);
        let plain = port_url(&settings("127.0.0.1:8080", None, None), "sb-1", &http, None);
        assert_eq!(plain.url, None, "no host-name URL without a domain");
        assert_eq!(
            plain.path_url.as_deref(),
            Some("http://127.0.0.1:8080/sb-1/3000/")
        );
        let named = port_url(
            &settings("0.0.0.0:80", Some("sbx.test"), None),
            "sb-1",
            &http,
            None,
        );
        assert_eq!(named.url.as_deref(), Some("http://sb-1-3000.sbx.test/"));
        let public = PublicUrl {
            https: true,
            host: "preview.example.com".into(),
            port: None,
        };
        let fronted = port_url(
            &settings("0.0.0.0:8080", Some("sbx.example.com"), Some(public)),
            "sb-1",
            &http,
            Some("t".into()),
        );
        assert_eq!(
            fronted.url.as_deref(),
            Some("https://sb-1-3000.sbx.example.com/")
        );
        assert_eq!(
            fronted.path_url.as_deref(),
            Some("https://preview.example.com/sb-1/3000/")
        );
        assert_eq!(fronted.token.as_deref(), Some("t"));
        let tcp = port_url(
            &settings("127.0.0.1:8080", Some("sbx.test"), None),
            "sb-1",
            &exposed(PortProtocol::Tcp, Some(31002)),
            None,
        );
        assert_eq!(tcp.address.as_deref(), Some("127.0.0.1:31002"));
        assert_eq!((tcp.url, tcp.path_url), (None, None));
    }
}
