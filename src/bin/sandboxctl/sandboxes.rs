//! The sandbox commands: create, ls, inspect, ttl, network and rm.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use sandboxd::api::types::{CreateSandbox, Sandbox, SandboxList, SetTtl};
use sandboxd::net::policy::NetworkPolicy;

use crate::client::{sandbox_uri, Client};
use crate::output::{self, print_out, print_raw};

pub async fn create(c: &Client, json: bool, req: CreateSandbox) -> Result<i32> {
    let (sb, raw): (Sandbox, Bytes) = c.json(Method::POST, "/v1/sandboxes", Some(&req)).await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!("{}", sb.id);
    }
    Ok(0)
}

pub async fn ls(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (SandboxList, Bytes) =
        c.json(Method::GET, "/v1/sandboxes", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let rows: Vec<Vec<String>> = list
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                serde_json::to_value(s.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                s.image.clone(),
                output::fmt_cpu(s.limits.cpu),
                output::fmt_mib(s.limits.memory_mib),
                output::ttl_left(s.ttl_seconds, s.expires_at.as_deref(), now),
            ]
        })
        .collect();
    print_out(&output::table(
        &["ID", "STATE", "IMAGE", "CPU", "MEMORY", "TTL-LEFT"],
        &rows,
    ))?;
    Ok(0)
}

pub async fn inspect(c: &Client, json: bool, id: &str) -> Result<i32> {
    let (v, raw): (serde_json::Value, Bytes) =
        c.json(Method::GET, &sandbox_uri(id), None::<&()>).await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(0)
}

/// Replaces the egress policy; prints the policy now in force.
pub async fn network(c: &Client, json: bool, id: &str, body: &NetworkPolicy) -> Result<i32> {
    let (sb, raw): (Sandbox, Bytes) = c
        .json(
            Method::PATCH,
            &format!("{}/network", sandbox_uri(id)),
            Some(body),
        )
        .await?;
    if json {
        print_raw(&raw)?;
    } else if let Some(view) = sb.network {
        println!("{}", serde_json::to_string(&view)?);
    }
    Ok(0)
}

/// Sets the TTL; prints when the sandbox now expires (or `none`).
pub async fn ttl(c: &Client, json: bool, id: &str, ttl: i64) -> Result<i32> {
    let body = SetTtl { ttl_seconds: ttl };
    let (sb, raw): (Sandbox, Bytes) = c
        .json(
            Method::PUT,
            &format!("{}/ttl", sandbox_uri(id)),
            Some(&body),
        )
        .await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!("{}", sb.expires_at.as_deref().unwrap_or("none"));
    }
    Ok(0)
}

/// Removes each sandbox in turn, printing the id of each one removed; one
/// that fails is reported and the rest are still tried (exit 1 then).
pub async fn rm(c: &Client, ids: &[String]) -> Result<i32> {
    let mut code = 0;
    for id in ids {
        match c.call(Method::DELETE, &sandbox_uri(id), None::<&()>).await {
            Ok(()) => println!("{id}"),
            Err(e) => {
                eprintln!("error: {id}: {e:#}");
                code = 1;
            }
        }
    }
    Ok(code)
}
