//! `GET /v1/events?cursor=N&follow=true`: the event log as NDJSON, from just
//! after `cursor`, then live. A cursor older than what retention kept starts
//! with an `events_lost` line so a scheduler knows to resynchronise.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;

use super::extract::Query;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::{ApiError, ApiResult};
use crate::sandbox::Manager;

fn line<T: serde::Serialize>(value: &T) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

pub async fn events(
    State(manager): State<Arc<Manager>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> ApiResult<Response> {
    let mut cursor: u64 = match query.get("cursor") {
        None => 0,
        Some(c) => c.parse().map_err(|_| {
            ApiError::bad(
                "invalid_cursor",
                format!("cursor must be a non-negative integer, got {c:?}"),
            )
        })?,
    };
    let follow = match query.get("follow").map(String::as_str) {
        None | Some("true") | Some("1") => true,
        Some("false") | Some("0") => false,
        Some(other) => {
            return Err(ApiError::bad(
                "invalid_query",
                format!("follow must be true or false, got {other:?}"),
            ))
        }
    };
    let mut changes = manager.events.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut first = true;
        loop {
            changes.borrow_and_update();
            let (events, lost) = manager.events.after(cursor);
            if lost && first {
                let marker = serde_json::json!({"kind": "events_lost", "cursor": cursor});
                if tx.send(line(&marker)).await.is_err() {
                    return;
                }
            }
            first = false;
            for event in events {
                cursor = event.cursor;
                if tx.send(line(&event)).await.is_err() {
                    return;
                }
            }
            if !follow {
                return;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
                // A stopping daemon ends the stream; the client resumes from its cursor.
                _ = manager.stopped() => return,
            }
        }
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<Bytes, std::io::Error>));
    Ok(([("content-type", "application/x-ndjson")], body).into_response())
}
