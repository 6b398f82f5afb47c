//! Image routes: list the image cache, prune what nothing uses.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::error::ApiResult;
use crate::image::{ImageInfo, PruneReport};
use crate::sandbox::Manager;

#[derive(Debug, Serialize)]
pub struct ImageList {
    pub images: Vec<ImageInfo>,
}

pub async fn list(State(manager): State<Arc<Manager>>) -> Json<ImageList> {
    Json(ImageList {
        images: manager.images(),
    })
}

pub async fn prune(State(manager): State<Arc<Manager>>) -> ApiResult<Json<PruneReport>> {
    Ok(Json(manager.prune_images().await?))
}
