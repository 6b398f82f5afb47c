//! Secret routes: create, list, get, rotate, delete. Bodies carrying a
//! value are parsed here and the value moved into wiped memory at once; no
//! answer, log line or error quotes it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;

use super::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use zeroize::Zeroizing;

use super::error::{parse_json, ApiResult};
use super::types::{CreateSecret, RotateSecret, Secret, SecretList};
use crate::sandbox::Manager;
use crate::secrets::{NewSecret, SecretChange};

fn wiped(value: String) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(value.into_bytes())
}

pub async fn create(
    State(manager): State<Arc<Manager>>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let body: CreateSecret = parse_json(&body)?;
    let info = manager.create_secret(NewSecret {
        name: body.name,
        value: wiped(body.value),
        hosts: body.hosts,
        allow_wildcards: body.allow_wildcards,
    })?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn list(State(manager): State<Arc<Manager>>) -> ApiResult<Json<SecretList>> {
    Ok(Json(SecretList {
        secrets: manager.list_secrets()?,
    }))
}

pub async fn get(
    State(manager): State<Arc<Manager>>,
    Path(name): Path<String>,
) -> ApiResult<Json<Secret>> {
    Ok(Json(manager.get_secret(&name)?))
}

pub async fn rotate(
    State(manager): State<Arc<Manager>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Secret>> {
    let body: RotateSecret = parse_json(&body)?;
    let change = SecretChange {
        value: body.value.map(wiped),
        hosts: body.hosts,
        allow_wildcards: body.allow_wildcards,
    };
    Ok(Json(manager.rotate_secret(&name, change).await?))
}

pub async fn delete(
    State(manager): State<Arc<Manager>>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    manager.delete_secret(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
