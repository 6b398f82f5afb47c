//! The image-cache commands: images (list), image-pull, image-build and
//! image-prune.

use std::io::{IsTerminal, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hyper::Method;

use crate::client::{self, Client};
use crate::output::{self, print_out, print_raw, LineSplitter};

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
struct BuiltRow {
    name: String,
    digest: String,
    size_bytes: u64,
    base: String,
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
    #[serde(default)]
    built: Vec<BuiltRow>,
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
    for b in &list.built {
        rows.push(vec![
            b.name.chars().take(18).collect(),
            format!("built on {}", b.base),
            output::fmt_mib(b.size_bytes >> 20),
            b.digest.chars().take(19).collect(),
        ]);
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
    ready(c, serde_json::json!({ "image": image }), json).await
}

/// Builds a declarative image from a spec file (`-`: stdin) unless built;
/// prints its name and digest.
pub async fn build(c: &Client, file: &Path, json: bool) -> Result<i32> {
    let text = if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let spec: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON spec", file.display()))?;
    ready(c, serde_json::json!({ "image": spec }), json).await
}

/// `POST /v1/images?progress=true`: layer bytes as a bar and the build log
/// on stderr while it runs, then the image on stdout (`--json`: every
/// line as the daemon sent it).
async fn ready(c: &Client, body: serde_json::Value, json: bool) -> Result<i32> {
    let bytes = serde_json::to_vec(&body)?;
    let resp = c
        .send_ok(
            Method::POST,
            "/v1/images?progress=true",
            client::full(bytes),
            Some("application/json"),
            None,
        )
        .await?;
    let mut stream = resp.into_body();
    let mut lines = LineSplitter::default();
    let mut bar = LayerBar::default();
    while let Some(chunk) = client::next_chunk(&mut stream).await {
        for line in lines.push(&chunk?)? {
            if json {
                print_raw(&line)?;
            }
            let value: serde_json::Value =
                serde_json::from_slice(&line).context("unexpected progress line from sandboxd")?;
            match value["type"].as_str() {
                Some("layer") if !json => bar.show(&value),
                Some("log") if !json => {
                    bar.end();
                    eprint!("{}", value["data"].as_str().unwrap_or_default());
                }
                Some("done") => {
                    bar.end();
                    if !json {
                        let image = &value["image"];
                        let name = image["name"]
                            .as_str()
                            .or_else(|| image["references"][0].as_str())
                            .unwrap_or_default();
                        print_out(&format!(
                            "{name} {}\n",
                            image["digest"].as_str().unwrap_or_default()
                        ))?;
                    }
                    return Ok(0);
                }
                Some("error") => {
                    bar.end();
                    if !json {
                        eprintln!(
                            "error: {} ({})",
                            value["error"]["message"].as_str().unwrap_or_default(),
                            value["error"]["code"].as_str().unwrap_or_default()
                        );
                    }
                    return Ok(1);
                }
                _ => {}
            }
        }
    }
    bail!("sandboxd ended the stream before saying whether the image is ready")
}

/// One stderr line per layer, redrawn in place on a terminal.
#[derive(Default)]
struct LayerBar {
    open: Option<String>,
}

impl LayerBar {
    fn show(&mut self, report: &serde_json::Value) {
        let digest = report["digest"].as_str().unwrap_or_default();
        let short: String = digest
            .trim_start_matches("sha256:")
            .chars()
            .take(12)
            .collect();
        let (bytes, total) = (
            report["bytes"].as_u64().unwrap_or(0),
            report["total"].as_u64().unwrap_or(0),
        );
        if self.open.as_deref() != Some(digest) {
            self.end();
            self.open = Some(digest.to_string());
        }
        let filled = (bytes * 30).checked_div(total).unwrap_or(0).min(30) as usize;
        let line = format!(
            "{short} [{}{}] {:.1}/{:.1} MiB",
            "#".repeat(filled),
            " ".repeat(30 - filled),
            bytes as f64 / 1048576.0,
            total as f64 / 1048576.0
        );
        if std::io::stderr().is_terminal() {
            eprint!("\r{line}");
        } else if bytes >= total {
            eprintln!("{line}");
        }
    }

    fn end(&mut self) {
        if self.open.take().is_some() && std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
}
