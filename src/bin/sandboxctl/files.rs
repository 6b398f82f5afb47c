//! The file commands: upload and download (streamed both ways), files
//! (list a directory), stat, mkdir and rm-file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use hyper::Method;
use sandboxd::api::types::{FileInfo, FileList};
use tokio::io::AsyncWriteExt;

use crate::client::{self, enc_query, sandbox_uri, Client};
use crate::output::{self, print_out, print_raw, write_stream, Stream};

pub async fn upload(
    c: &Client,
    json: bool,
    id: &str,
    local: &Path,
    remote: &str,
    mode: Option<u32>,
) -> Result<i32> {
    let (body, len, mode) = if local.as_os_str() == "-" {
        (
            client::reader_body(tokio::io::stdin()),
            None,
            mode.unwrap_or(0o644),
        )
    } else {
        let f = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("opening {}", local.display()))?;
        let meta = f
            .metadata()
            .await
            .with_context(|| format!("reading {}", local.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", local.display());
        }
        // Known length: the daemon can refuse an oversized upload before it
        // arrives, and hyper checks we send exactly that many bytes.
        (
            client::reader_body(f),
            Some(meta.len()),
            mode.unwrap_or(meta.permissions().mode() & 0o777),
        )
    };
    let uri = format!(
        "{}/files?path={}&mode={mode}",
        sandbox_uri(id),
        enc_query(remote)
    );
    let resp = c
        .send_ok(
            Method::PUT,
            &uri,
            body,
            Some("application/octet-stream"),
            len,
        )
        .await?;
    let raw = client::read_all(resp.into_body(), 1 << 20).await?;
    if json {
        print_raw(&raw)?;
    }
    Ok(0)
}

pub async fn download(c: &Client, id: &str, remote: &str, local: &Path) -> Result<i32> {
    let uri = format!("{}/files?path={}", sandbox_uri(id), enc_query(remote));
    // Ask first, create the local file after: a 404 must not leave an empty file.
    let resp = c
        .send_ok(Method::GET, &uri, client::empty(), None, None)
        .await?;
    let mut body = resp.into_body();
    if local.as_os_str() == "-" {
        while let Some(chunk) = client::next_chunk(&mut body).await {
            write_stream(
                Stream::Stdout,
                &chunk.context("reading the file from sandboxd")?,
            )?;
        }
        return Ok(0);
    }
    // Like cp: into a directory means under the remote file's name.
    let target = if local.is_dir() {
        let name = Path::new(remote)
            .file_name()
            .ok_or_else(|| anyhow!("{remote:?} has no file name to put in {}", local.display()))?;
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let mut f = tokio::fs::File::create(&target)
        .await
        .with_context(|| format!("creating {}", target.display()))?;
    let copied: Result<()> = async {
        while let Some(chunk) = client::next_chunk(&mut body).await {
            let chunk = chunk.context("reading the file from sandboxd")?;
            f.write_all(&chunk)
                .await
                .with_context(|| format!("writing {}", target.display()))?;
        }
        f.flush().await?;
        Ok(())
    }
    .await;
    if let Err(e) = copied {
        // A partial file would look like a good one; remove it.
        drop(f);
        let _ = tokio::fs::remove_file(&target).await;
        return Err(e);
    }
    Ok(0)
}

/// Lists a directory.
pub async fn list(c: &Client, json: bool, id: &str, path: &str) -> Result<i32> {
    let uri = format!("{}/files/list?path={}", sandbox_uri(id), enc_query(path));
    let (list, raw): (FileList, Bytes) = c.json(Method::GET, &uri, None::<&()>).await?;
    if json {
        print_raw(&raw)?;
    } else {
        let rows: Vec<Vec<String>> = list.entries.iter().map(output::file_row).collect();
        print_out(&output::table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows))?;
    }
    Ok(0)
}

/// Shows one file's metadata, as one row of the `files` table.
pub async fn stat(c: &Client, json: bool, id: &str, path: &str) -> Result<i32> {
    let uri = format!("{}/files/stat?path={}", sandbox_uri(id), enc_query(path));
    let (info, raw): (FileInfo, Bytes) = c.json(Method::GET, &uri, None::<&()>).await?;
    if json {
        print_raw(&raw)?;
    } else {
        let rows = vec![output::file_row(&info)];
        print_out(&output::table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows))?;
    }
    Ok(0)
}

pub async fn mkdir(c: &Client, json: bool, id: &str, path: &str, parents: bool) -> Result<i32> {
    let uri = format!(
        "{}/files/mkdir?path={}&parents={parents}",
        sandbox_uri(id),
        enc_query(path)
    );
    let (_, raw): (FileInfo, Bytes) = c.json(Method::POST, &uri, None::<&()>).await?;
    if json {
        print_raw(&raw)?;
    }
    Ok(0)
}

pub async fn rm(c: &Client, id: &str, path: &str, recursive: bool) -> Result<i32> {
    let uri = format!(
        "{}/files?path={}&recursive={recursive}",
        sandbox_uri(id),
        enc_query(path)
    );
    c.call(Method::DELETE, &uri, None::<&()>).await?;
    Ok(0)
}
