//! The brokered-secret commands: secret create, ls, rotate, rm. A value is
//! read from stdin or from an environment variable, never from argv (which
//! every user of the host can read in /proc).

use std::io::Read;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hyper::Method;
use sandboxd::api::types::{Secret, SecretList};
use serde_json::json;
use zeroize::Zeroizing;

use crate::client::Client;
use crate::output::{self, print_out, print_raw};

/// Where a value comes from: `--from-env VAR`, else stdin (one trailing
/// newline dropped, as `echo` and here-strings add one).
pub fn read_value(from_env: Option<&str>) -> Result<Zeroizing<String>> {
    let mut value = match from_env {
        Some(var) => Zeroizing::new(
            std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?,
        ),
        None => {
            let mut buf = Zeroizing::new(String::new());
            std::io::stdin()
                .read_to_string(&mut buf)
                .context("reading the secret's value from stdin")?;
            buf
        }
    };
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        bail!("the value is empty: pipe it on stdin or name a variable with --from-env");
    }
    Ok(value)
}

fn show(json_out: bool, raw: &Bytes, secret: &Secret) -> Result<i32> {
    if json_out {
        print_raw(raw)?;
    } else {
        print_out(&format!("{}\n", secret.name))?;
    }
    Ok(0)
}

pub async fn create(
    c: &Client,
    json_out: bool,
    name: &str,
    hosts: &[String],
    allow_wildcards: bool,
    from_env: Option<&str>,
) -> Result<i32> {
    let value = read_value(from_env)?;
    // A short-lived process: the value's copies in the request die with it.
    let body = json!({
        "name": name,
        "value": value.as_str(),
        "hosts": hosts,
        "allow_wildcards": allow_wildcards,
    });
    let (secret, raw): (Secret, Bytes) = c.json(Method::POST, "/v1/secrets", Some(&body)).await?;
    show(json_out, &raw, &secret)
}

pub async fn list(c: &Client, json_out: bool) -> Result<i32> {
    let (list, raw): (SecretList, Bytes) = c.json(Method::GET, "/v1/secrets", None::<&()>).await?;
    if json_out {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .secrets
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.hosts.join(","),
                s.created_at.clone(),
                s.rotated_at.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_out(&output::table(
        &["NAME", "HOSTS", "CREATED", "ROTATED"],
        &rows,
    ))?;
    Ok(0)
}

/// A new value (from stdin, `--from-env`, or neither when only `--host`
/// is given) and/or new hosts.
pub async fn rotate(
    c: &Client,
    json_out: bool,
    name: &str,
    hosts: &[String],
    allow_wildcards: bool,
    from_env: Option<&str>,
    stdin: bool,
) -> Result<i32> {
    let value = if from_env.is_some() || stdin || hosts.is_empty() {
        Some(read_value(from_env)?)
    } else {
        None
    };
    let mut body = json!({ "allow_wildcards": allow_wildcards });
    if let Some(v) = &value {
        body["value"] = json!(v.as_str());
    }
    if !hosts.is_empty() {
        body["hosts"] = json!(hosts);
    }
    let (secret, raw): (Secret, Bytes) = c
        .json(Method::PUT, &format!("/v1/secrets/{name}"), Some(&body))
        .await?;
    show(json_out, &raw, &secret)
}

pub async fn rm(c: &Client, names: &[String]) -> Result<i32> {
    for name in names {
        c.call(Method::DELETE, &format!("/v1/secrets/{name}"), None::<&()>)
            .await?;
    }
    Ok(0)
}
