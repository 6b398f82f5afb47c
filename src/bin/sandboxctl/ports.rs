//! The preview-URL commands: expose, ports, unexpose, port-token.

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use sandboxd::api::types::{PortList, PortUrl};
use serde_json::json;

use crate::client::{sandbox_uri, Client};
use crate::output::{self, print_out, print_raw};

/// The URL (path form when there is no host-name one, the address of a
/// raw TCP port), then the token when there is one.
fn show(json_out: bool, raw: &Bytes, port: &PortUrl) -> Result<i32> {
    if json_out {
        print_raw(raw)?;
        return Ok(0);
    }
    let mut out = String::new();
    if let Some(address) = &port.address {
        out.push_str(&format!("{address}\n"));
    }
    for url in [&port.url, &port.path_url].into_iter().flatten() {
        out.push_str(&format!("{url}\n"));
    }
    if let Some(token) = &port.token {
        out.push_str(&format!("token: {token}\n"));
    }
    print_out(&out)?;
    Ok(0)
}

pub async fn expose(
    c: &Client,
    json_out: bool,
    id: &str,
    port: u32,
    public: bool,
    tcp: bool,
) -> Result<i32> {
    let body = json!({
        "port": port,
        "auth": if public { "none" } else { "token" },
        "protocol": if tcp { "tcp" } else { "http" },
    });
    let path = format!("{}/ports", sandbox_uri(id));
    let (exposed, raw): (PortUrl, Bytes) = c.json(Method::POST, &path, Some(&body)).await?;
    show(json_out, &raw, &exposed)
}

pub async fn list(c: &Client, json_out: bool, id: &str, listening: bool) -> Result<i32> {
    let query = if listening { "?listening=true" } else { "" };
    let path = format!("{}/ports{query}", sandbox_uri(id));
    let (list, raw): (PortList, Bytes) = c.json(Method::GET, &path, None::<&()>).await?;
    if json_out {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .ports
        .iter()
        .map(|p| {
            vec![
                p.port.to_string(),
                format!("{:?}", p.protocol).to_lowercase(),
                format!("{:?}", p.auth).to_lowercase(),
                p.url
                    .clone()
                    .or_else(|| p.path_url.clone())
                    .or_else(|| p.address.clone())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = output::table(&["PORT", "PROTOCOL", "AUTH", "URL"], &rows);
    if let Some(listening) = &list.listening {
        let rows: Vec<Vec<String>> = listening
            .iter()
            .map(|l| {
                vec![
                    l.port.to_string(),
                    l.address.clone(),
                    if l.exposed { "yes" } else { "no" }.to_string(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&output::table(&["LISTENING", "ADDRESS", "EXPOSED"], &rows));
    }
    print_out(&out)?;
    Ok(0)
}

pub async fn unexpose(c: &Client, id: &str, port: u32) -> Result<i32> {
    let path = format!("{}/ports/{port}", sandbox_uri(id));
    c.call(Method::DELETE, &path, None::<&()>).await?;
    Ok(0)
}

pub async fn rotate_token(c: &Client, json_out: bool, id: &str, port: u32) -> Result<i32> {
    let path = format!("{}/ports/{port}/token", sandbox_uri(id));
    let (exposed, raw): (PortUrl, Bytes) = c.json(Method::POST, &path, None::<&()>).await?;
    show(json_out, &raw, &exposed)
}
