//! The image-cache commands: images (list), image-pull and image-prune.

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
struct PulledRow {
    references: Vec<String>,
    digest: String,
    size_bytes: u64,
    layers: Vec<String>,
}

#[derive(serde::Deserialize)]
struct ImageList {
    images: Vec<ImageRow>,
    #[serde(default)]
    pulled: Vec<PulledRow>,
}

pub async fn list(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (ImageList, Bytes) = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let mut rows: Vec<Vec<String>> = list
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
    for p in &list.pulled {
        for reference in &p.references {
            rows.push(vec![
                reference.clone(),
                format!("pulled, {} layers", p.layers.len()),
                output::fmt_mib(p.size_bytes >> 20),
                p.digest.chars().take(19).collect(),
            ]);
        }
    }
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

/// Pulls a registry image now; prints its digest.
pub async fn pull(c: &Client, image: &str, json: bool) -> Result<i32> {
    let body = serde_json::json!({ "image": image });
    let (pulled, raw): (PulledRow, Bytes) = c.json(Method::POST, "/v1/images", Some(&body)).await?;
    if json {
        print_raw(&raw)?;
    } else {
        print_out(&format!(
            "{} {} ({} layers)\n",
            image,
            pulled.digest,
            pulled.layers.len()
        ))?;
    }
    Ok(0)
}
