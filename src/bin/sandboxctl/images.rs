//! The image-cache commands: images (list) and image-prune.

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;

use crate::client::Client;
use crate::output::{self, print_out, print_raw};

#[derive(serde::Deserialize)]
struct PruneReport {
    removed: Vec<String>,
    freed_bytes: u64,
}

#[derive(serde::Deserialize)]
struct ImageRow {
    name: String,
    digest: String,
    built: bool,
    size_bytes: Option<u64>,
}

#[derive(serde::Deserialize)]
struct ImageList {
    images: Vec<ImageRow>,
}

pub async fn list(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (ImageList, Bytes) = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .images
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                if i.built { "yes" } else { "no" }.to_string(),
                i.size_bytes
                    .map(|b| output::fmt_mib(b >> 20))
                    .unwrap_or_else(|| "-".into()),
                i.digest.chars().take(19).collect(),
            ]
        })
        .collect();
    print_out(&output::table(&["NAME", "BUILT", "SIZE", "DIGEST"], &rows))?;
    Ok(0)
}

/// Prunes the cache: prints each entry removed, then a summary on stderr.
pub async fn prune(c: &Client, json: bool) -> Result<i32> {
    let (report, raw): (PruneReport, Bytes) = c
        .json(Method::POST, "/v1/images/prune", None::<&()>)
        .await?;
    if json {
        print_raw(&raw)?;
    } else {
        for entry in &report.removed {
            println!("{entry}");
        }
        eprintln!(
            "{} removed, {} freed",
            report.removed.len(),
            output::fmt_mib(report.freed_bytes >> 20)
        );
    }
    Ok(0)
}
