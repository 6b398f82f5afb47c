//! What the daemon says about itself and its host: health and gpus.

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use sandboxd::api::types::{GpuList, Health};

use crate::client::Client;
use crate::output::{self, print_out, print_raw};

/// Checks that the daemon answers; exit 1 unless it says ok.
pub async fn health(c: &Client, json: bool) -> Result<i32> {
    let (h, raw): (Health, Bytes) = c.json(Method::GET, "/v1/health", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!(
            "{} (sandboxd {}, {} sandboxes)",
            h.status, h.version, h.sandboxes
        );
    }
    Ok(if h.status == "ok" { 0 } else { 1 })
}

pub async fn gpus(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (GpuList, Bytes) = c.json(Method::GET, "/v1/gpus", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.name.clone(),
                output::fmt_mib(g.memory_mib),
                g.pci_bus_id.clone(),
                g.uuid.clone(),
                g.held_by.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_out(&output::table(
        &["INDEX", "NAME", "MEMORY", "BUS-ID", "UUID", "HELD-BY"],
        &rows,
    ))?;
    Ok(0)
}
