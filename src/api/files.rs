//! File routes: upload, download, list, stat, mkdir, remove. Paths are
//! normalised here (escapes above the root are a 400) and resolved inside the
//! sandbox by its agent. Transfers stream in bounded chunks both ways.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;

use super::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use sandbox_proto::{FileKind, FileStat, MAX_CHUNK};

use super::error::{ApiError, ApiResult};
use super::types::{FileInfo, FileList};
use crate::sandbox::{sandbox_path, Manager, SandboxError};
use crate::supervisor::client::SupervisorClient;

type Params = Query<BTreeMap<String, String>>;

fn path_param(query: &BTreeMap<String, String>) -> ApiResult<String> {
    let raw = query
        .get("path")
        .ok_or_else(|| ApiError::bad("invalid_path", "the `path` query parameter is required"))?;
    Ok(sandbox_path(raw)?)
}

fn flag(query: &BTreeMap<String, String>, name: &str) -> ApiResult<bool> {
    match query.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::bad(
            "invalid_query",
            format!("{name} must be true or false, got {other:?}"),
        )),
    }
}

fn mode(query: &BTreeMap<String, String>, default: u32) -> ApiResult<u32> {
    match query.get("mode") {
        None => Ok(default),
        Some(m) => m
            .parse::<u32>()
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                ApiError::bad(
                    "invalid_mode",
                    format!("mode must be a decimal number up to 4095 (0o7777), got {m:?}"),
                )
            }),
    }
}

fn info(stat: FileStat) -> FileInfo {
    FileInfo {
        name: stat.name,
        kind: match stat.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
        .into(),
        size: stat.size,
        mode: stat.mode,
        uid: stat.uid,
        gid: stat.gid,
        mtime: stat.mtime_secs,
        link_target: stat.link_target,
    }
}

async fn stat_of(client: &mut SupervisorClient, path: &str) -> ApiResult<FileInfo> {
    Ok(info(client.stat(path.to_string()).await?))
}

pub async fn upload(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
    body: Body,
) -> ApiResult<impl IntoResponse> {
    let path = path_param(&query)?;
    let mode = mode(&query, 0o644)?;
    let limit = manager.config.max_upload_mib * 1024 * 1024;
    let mut client = manager.connect(&id).await?;
    let handle = client.open_write(path.clone(), mode).await?;
    let result = async {
        let mut stream = body.into_data_stream();
        let mut pending: Vec<u8> = Vec::with_capacity(MAX_CHUNK);
        let mut total: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad("upload_interrupted", format!("reading the upload: {e}"))
            })?;
            total += chunk.len() as u64;
            if total > limit {
                return Err(ApiError(SandboxError::TooLarge {
                    message: format!(
                        "uploads are limited to {} MiB",
                        manager.config.max_upload_mib
                    ),
                }));
            }
            let mut rest: &[u8] = &chunk;
            while !rest.is_empty() {
                let take = (MAX_CHUNK - pending.len()).min(rest.len());
                pending.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if pending.len() == MAX_CHUNK {
                    let data = std::mem::replace(&mut pending, Vec::with_capacity(MAX_CHUNK));
                    client.write(handle, data).await?;
                }
            }
        }
        if !pending.is_empty() {
            client.write(handle, pending).await?;
        }
        Ok(())
    }
    .await;
    let closed = client.close(handle).await;
    if let Err(e) = result {
        // A partial file is worse than none.
        let _ = client.remove(path, false).await;
        return Err(e);
    }
    closed?;
    Ok((
        StatusCode::CREATED,
        Json(stat_of(&mut client, &path).await?),
    ))
}

pub async fn download(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
) -> ApiResult<Response> {
    let path = path_param(&query)?;
    let mut client = manager.connect(&id).await?;
    let (handle, size) = client.open_read(path).await?;
    let stream = futures::stream::unfold(Some(client), move |client| async move {
        let mut client = client?;
        match client.read(handle, MAX_CHUNK as u32).await {
            Ok(data) if !data.is_empty() => {
                Some((Ok::<Bytes, std::io::Error>(Bytes::from(data)), Some(client)))
            }
            Ok(_) => {
                let _ = client.close(handle).await;
                None
            }
            _ => Some((
                Err(std::io::Error::other(
                    "reading the file inside the sandbox failed",
                )),
                None,
            )),
        }
    });
    Ok((
        [
            ("content-type", "application/octet-stream".to_string()),
            ("content-length", size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

pub async fn list(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
) -> ApiResult<impl IntoResponse> {
    let path = path_param(&query)?;
    let mut client = manager.connect(&id).await?;
    let entries = client.list_dir(path.clone()).await?;
    Ok(Json(FileList {
        path,
        entries: entries.into_iter().map(info).collect(),
    }))
}

pub async fn stat(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
) -> ApiResult<impl IntoResponse> {
    let path = path_param(&query)?;
    let mut client = manager.connect(&id).await?;
    Ok(Json(stat_of(&mut client, &path).await?))
}

pub async fn mkdir(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
) -> ApiResult<impl IntoResponse> {
    let path = path_param(&query)?;
    let parents = flag(&query, "parents")?;
    let mode = mode(&query, 0o755)?;
    let mut client = manager.connect(&id).await?;
    client.mkdir(path.clone(), parents, mode).await?;
    Ok((
        StatusCode::CREATED,
        Json(stat_of(&mut client, &path).await?),
    ))
}

pub async fn remove(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Params,
) -> ApiResult<StatusCode> {
    let path = path_param(&query)?;
    if path == "/" {
        return Err(ApiError::bad(
            "invalid_path",
            "refusing to remove the sandbox's root",
        ));
    }
    let recursive = flag(&query, "recursive")?;
    let mut client = manager.connect(&id).await?;
    client.remove(path, recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}
