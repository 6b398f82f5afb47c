//! Image routes: list the image cache, pull a registry image or build a
//! declarative one ahead of creates, prune what nothing uses.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::{parse_json, ApiError, ApiResult};
use super::types::ImageChoice;
use crate::image::built::BuiltImage;
use crate::image::oci::PulledImage;
use crate::image::ProgressSink;
use crate::image::{ImageInfo, PruneReport};
use crate::sandbox::{Manager, SandboxError};

#[derive(Debug, Serialize)]
pub struct ImageList {
    /// Built-in and recipe images.
    pub images: Vec<ImageInfo>,
    /// Images pulled from registries.
    pub pulled: Vec<PulledImage>,
    /// Images built from declarative specs.
    pub built: Vec<BuiltImage>,
}

pub async fn list(State(manager): State<Arc<Manager>>) -> Json<ImageList> {
    Json(ImageList {
        images: manager.images(),
        pulled: manager.pulled_images(),
        built: manager.built_images(),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    pub image: ImageChoice,
}

/// What `POST /v1/images` made ready.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ReadyImage {
    Pulled(PulledImage),
    Built(BuiltImage),
}

/// One line of the progress stream: a report, then `done` or `error`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamLine {
    Done { image: Box<ReadyImage> },
    Error { error: super::types::ErrorDetail },
}

/// Pulls `image` (a registry reference) now, following a moved tag, or
/// builds a declarative spec unless built, so later creates find it.
/// With `?progress=true` the answer is NDJSON: progress reports, then a
/// `done` line with the image or an `error` line.
pub async fn pull(
    State(manager): State<Arc<Manager>>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<Response> {
    // Parsed here, not by axum, so a bad value is the API's JSON 400.
    let progress = match query.get("progress").map(String::as_str) {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => {
            return Err(ApiError::bad(
                "invalid_query",
                format!("progress must be true or false, got {other:?}"),
            ))
        }
    };
    let request: PullImage = parse_json(&body)?;
    if let ImageChoice::Named(name) = &request.image {
        if !crate::image::oci::is_reference(name) {
            return Err(ApiError::bad(
                "invalid_image",
                format!(
                    "{name:?} is not a registry reference; write it with a tag (e.g. {name}:latest) or a registry, or send a spec to build"
                ),
            ));
        }
    }
    if !progress {
        return Ok(Json(make_ready(&manager, request.image, None).await?).into_response());
    }
    let (sink, reports) = tokio::sync::mpsc::unbounded_channel();
    let work = tokio::spawn(async move { make_ready(&manager, request.image, Some(sink)).await });
    let reports = UnboundedReceiverStream::new(reports).map(|p| line(&p));
    let last = futures::stream::once(async move {
        let last = match work.await {
            Ok(Ok(image)) => StreamLine::Done {
                image: Box::new(image),
            },
            Ok(Err(e)) => StreamLine::Error {
                error: ApiError::from(e).detail(),
            },
            Err(e) => StreamLine::Error {
                error: ApiError::from(SandboxError::internal(e)).detail(),
            },
        };
        line(&last)
    });
    let body = Body::from_stream(reports.chain(last).map(Ok::<Bytes, std::io::Error>));
    Ok(([("content-type", "application/x-ndjson")], body).into_response())
}

async fn make_ready(
    manager: &Arc<Manager>,
    image: ImageChoice,
    progress: Option<ProgressSink>,
) -> Result<ReadyImage, SandboxError> {
    Ok(match image {
        ImageChoice::Spec(spec) => {
            ReadyImage::Built(manager.build_image(&spec, &|_| {}, progress).await?)
        }
        ImageChoice::Named(name) => ReadyImage::Pulled(manager.pull_image(&name, progress).await?),
    })
}

fn line(value: &impl Serialize) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub async fn prune(State(manager): State<Arc<Manager>>) -> ApiResult<Json<PruneReport>> {
    Ok(Json(manager.prune_images().await?))
}
