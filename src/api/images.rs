//! Image routes: list the image cache, pull a registry image ahead of
//! creates, prune what nothing uses.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{parse_json, ApiError, ApiResult};
use crate::image::oci::PulledImage;
use crate::image::{ImageInfo, PruneReport};
use crate::sandbox::Manager;

#[derive(Debug, Serialize)]
pub struct ImageList {
    /// Built-in and recipe images.
    pub images: Vec<ImageInfo>,
    /// Images pulled from registries.
    pub pulled: Vec<PulledImage>,
}

pub async fn list(State(manager): State<Arc<Manager>>) -> Json<ImageList> {
    Json(ImageList {
        images: manager.images(),
        pulled: manager.pulled_images(),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    pub image: String,
}

/// Pulls `image` (a registry reference) now, following a moved tag, so
/// later creates find it stored.
pub async fn pull(
    State(manager): State<Arc<Manager>>,
    body: Bytes,
) -> ApiResult<Json<PulledImage>> {
    let request: PullImage = parse_json(&body)?;
    if !crate::image::oci::is_reference(&request.image) {
        return Err(ApiError::bad(
            "invalid_image",
            format!(
                "{:?} is not a registry reference; write it with a tag (e.g. {}:latest) or a registry",
                request.image, request.image
            ),
        ));
    }
    Ok(Json(manager.pull_image(&request.image).await?))
}

pub async fn prune(State(manager): State<Arc<Manager>>) -> ApiResult<Json<PruneReport>> {
    Ok(Json(manager.prune_images().await?))
}
