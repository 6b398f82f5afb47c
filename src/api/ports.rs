//! Port routes (preview URLs): expose, list (with what listens), unexpose,
//! rotate a token. The ingress that serves the URLs is `crate::ingress`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::error::{parse_json, ApiError, ApiResult};
use super::extract::{Path, Query};
use super::types::{ExposePort, ListeningPort, PortList};
use super::views::port_url;
use crate::model::PortRequest;
use crate::sandbox::{Manager, PortGrant};

fn granted(manager: &Manager, id: &str, grant: PortGrant) -> super::types::PortUrl {
    port_url(&manager.config.ingress, id, &grant.exposed, grant.token)
}

pub async fn expose(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let body: ExposePort = parse_json(&body)?;
    let request = PortRequest {
        port: body.port,
        auth: body.auth.unwrap_or_default(),
        protocol: body.protocol.unwrap_or_default(),
    };
    let grant = manager.expose_port(&id, request).await?;
    Ok((StatusCode::CREATED, Json(granted(&manager, &id, grant))))
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    listening: Option<String>,
}

pub async fn list(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<PortList>> {
    let listening = match query.listening.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad(
                "invalid_query",
                format!("listening must be true or false, got {other:?}"),
            ))
        }
    };
    let exposed = manager.exposed_ports(&id)?;
    let listening = if listening {
        let sockets = manager.listening_ports(&id).await?;
        Some(
            sockets
                .into_iter()
                .map(|s| ListeningPort {
                    exposed: exposed.iter().any(|e| e.port == s.port),
                    port: s.port,
                    address: s.address,
                })
                .collect(),
        )
    } else {
        None
    };
    let ports = exposed
        .iter()
        .map(|e| port_url(&manager.config.ingress, &id, e, None))
        .collect();
    Ok(Json(PortList { ports, listening }))
}

pub async fn unexpose(
    State(manager): State<Arc<Manager>>,
    Path((id, port)): Path<(String, u32)>,
) -> ApiResult<StatusCode> {
    manager.unexpose_port(&id, port)?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn rotate_token(
    State(manager): State<Arc<Manager>>,
    Path((id, port)): Path<(String, u32)>,
) -> ApiResult<impl IntoResponse> {
    let grant = manager.rotate_port_token(&id, port)?;
    Ok(Json(granted(&manager, &id, grant)))
}
