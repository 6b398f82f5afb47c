//! The roots of a pod's containers inside one sandbox (`POST
//! /v1/sandboxes/{id}/roots`, `DELETE .../roots/{name}`): validated here,
//! made by the sandbox's supervisor and attached by its agent (see
//! `runtime::pod_roots`). Processes name a root to run in it.

use std::path::PathBuf;

use super::manager::not_running;
use super::validate::validated_host_dirs;
use super::{Manager, SandboxError};
use crate::model::RuntimeKind;
use crate::supervisor::client::CallError;
use crate::supervisor::protocol::SupervisorErrorKind;

/// Checks a root name as the agent will (one path component).
pub fn validated_root_name(name: &str) -> Result<(), SandboxError> {
    if sandbox_proto::valid_root_name(name) {
        Ok(())
    } else {
        Err(SandboxError::bad(
            "invalid_root_name",
            format!("{name:?} is not a root name: use 1 to 128 of A-Z a-z 0-9 _ . - and do not start with a dot"),
        ))
    }
}

impl Manager {
    /// Makes root `name` of sandbox `id` on the host directories `layers`
    /// (top first), owned by host ids and shown idmapped.
    pub async fn attach_root(
        &self,
        id: &str,
        name: &str,
        layers: Vec<PathBuf>,
    ) -> Result<(), SandboxError> {
        validated_root_name(name)?;
        if layers.is_empty() {
            return Err(SandboxError::bad(
                "invalid_host_rootfs",
                "host_rootfs names no directory; give the root's layers, top first",
            ));
        }
        validated_host_dirs("invalid_host_rootfs", "host_rootfs", &layers)?;
        let record = self.ready(id)?;
        if record.runtime != RuntimeKind::Container {
            return Err(SandboxError::bad(
                "roots_unsupported",
                "separate roots are for container sandboxes; a microVM has one root",
            ));
        }
        let mut client = self.connect(id).await?;
        match client.attach_root(name, layers).await {
            Ok(()) => Ok(()),
            Err(CallError::Connect(e)) => Err(not_running(id, e)),
            Err(CallError::Refused(e)) if e.kind == SupervisorErrorKind::Conflict => {
                Err(SandboxError::Conflict {
                    code: "root_exists",
                    message: e.message,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Kills what runs in root `name` of sandbox `id` and removes it.
    pub async fn detach_root(&self, id: &str, name: &str) -> Result<(), SandboxError> {
        validated_root_name(name)?;
        let mut client = self.connect(id).await?;
        match client.detach_root(name).await {
            Ok(()) => Ok(()),
            Err(CallError::Connect(e)) => Err(not_running(id, e)),
            Err(CallError::Refused(e)) if e.kind == SupervisorErrorKind::UnknownRoot => {
                Err(SandboxError::NotFound {
                    code: "root_not_found",
                    message: e.message,
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}
