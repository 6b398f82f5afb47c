//! Image routes: list the image cache, pull a registry image or build a
//! declarative one ahead of creates, prune what nothing uses.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{parse_json, ApiError, ApiResult};
use super::types::ImageChoice;
use crate::image::built::BuiltImage;
use crate::image::oci::PulledImage;
use crate::image::{ImageInfo, PruneReport};
use crate::sandbox::Manager;

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

/// Pulls `image` (a registry reference) now, following a moved tag, or
/// builds a declarative spec unless built, so later creates find it.
pub async fn pull(State(manager): State<Arc<Manager>>, body: Bytes) -> ApiResult<Json<ReadyImage>> {
    let request: PullImage = parse_json(&body)?;
    let name = match request.image {
        ImageChoice::Spec(spec) => {
            let built = manager.build_image(&spec, &|_| {}, None).await?;
            return Ok(Json(ReadyImage::Built(built)));
        }
        ImageChoice::Named(name) => name,
    };
    if !crate::image::oci::is_reference(&name) {
        return Err(ApiError::bad(
            "invalid_image",
            format!(
                "{name:?} is not a registry reference; write it with a tag (e.g. {name}:latest) or a registry, or send a spec to build"
            ),
        ));
    }
    Ok(Json(ReadyImage::Pulled(manager.pull_image(&name).await?)))
}

pub async fn prune(State(manager): State<Arc<Manager>>) -> ApiResult<Json<PruneReport>> {
    Ok(Json(manager.prune_images().await?))
}
