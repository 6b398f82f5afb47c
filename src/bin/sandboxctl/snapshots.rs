//! The snapshot commands: snapshot (take one), snapshots (list) and
//! rm-snapshot.

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use sandboxd::sandbox::SnapshotView;

use crate::client::{enc_seg, sandbox_uri, Client};
use crate::output::{self, print_out, print_raw};

/// Snapshots a running sandbox, its memory too unless `filesystem`; prints
/// the snapshot's id.
pub async fn take(c: &Client, json: bool, id: &str, filesystem: bool) -> Result<i32> {
    let kind = if filesystem { "filesystem" } else { "memory" };
    let body = serde_json::json!({ "kind": kind });
    let (snap, raw): (SnapshotView, Bytes) = c
        .json(
            Method::POST,
            &format!("{}/snapshots", sandbox_uri(id)),
            Some(&body),
        )
        .await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!("{}", snap.id);
    }
    Ok(0)
}

#[derive(serde::Deserialize)]
struct SnapshotList {
    snapshots: Vec<SnapshotView>,
}

pub async fn list(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (SnapshotList, Bytes) =
        c.json(Method::GET, "/v1/snapshots", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .snapshots
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                serde_json::to_value(s.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                s.sandbox.clone(),
                s.image.clone(),
                output::fmt_mib(s.size_bytes >> 20),
                s.created_at.clone(),
            ]
        })
        .collect();
    print_out(&output::table(
        &["ID", "KIND", "SANDBOX", "IMAGE", "SIZE", "CREATED"],
        &rows,
    ))?;
    Ok(0)
}

/// Deletes each snapshot in turn, printing the id of each one deleted; one
/// that fails is reported and the rest are still tried (exit 1 then).
pub async fn rm(c: &Client, ids: &[String]) -> Result<i32> {
    let mut code = 0;
    for id in ids {
        let uri = format!("/v1/snapshots/{}", enc_seg(id));
        match c.call(Method::DELETE, &uri, None::<&()>).await {
            Ok(()) => println!("{id}"),
            Err(e) => {
                eprintln!("error: {id}: {e:#}");
                code = 1;
            }
        }
    }
    Ok(code)
}
