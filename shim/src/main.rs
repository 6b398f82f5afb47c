//! `containerd-shim-sandboxd-v2`: containerd's runtime `io.containerd.sandboxd.v2`.
//! containerd starts it per task (`start`, which spawns the serving copy,
//! or finds the one already serving the task's pod),
//! talks ttrpc to that copy (`service.rs`), and runs `delete` to clean up
//! after a shim that died. Everything it does goes through sandboxd's API
//! (`daemon.rs`); see ARCHITECTURE.md, "containerd shim".

mod daemon;
mod metrics;
mod process;
mod publisher;
mod service;
mod spec;

use std::sync::Arc;

use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{api, Config, DeleteResponse, ExitSignal, Flags, Shim, StartOpts};

const RUNTIME_ID: &str = "io.containerd.sandboxd.v2";

struct SandboxdShim {
    namespace: String,
    id: String,
    exit: Arc<ExitSignal>,
}

impl Shim for SandboxdShim {
    type T = service::Service;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        SandboxdShim {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // containerd runs `start` in the task's bundle. A pod's tasks share
        // one shim (the pod sandbox's id groups them): if it already
        // serves, the new copy answers its address and leaves.
        let config = spec::read_bundle(std::path::Path::new("."))
            .map_err(|e| containerd_shim::Error::InvalidArgument(e.to_string()))?;
        let grouping = spec::grouping(&config, &opts.id);
        // A pod member's shim is its pod's, serving already: answer its
        // address without the spawn-and-wait of a serving copy, which is
        // only to find the socket taken (as Go shims do). That wait is
        // where a member's `start` hung until containerd killed it.
        if grouping != opts.id {
            let address =
                containerd_shim::socket_address(&opts.address, &opts.namespace, &grouping);
            if serving(&address) {
                containerd_shim::util::write_address(&address)?;
                return Ok(address);
            }
        }
        let (_, address) = containerd_shim::spawn(opts, &grouping, Vec::new())?;
        containerd_shim::util::write_address(&address)?;
        Ok(address)
    }

    /// containerd's cleanup after this task's shim died: remove the task's
    /// sandbox, found by the labels the create gave it.
    fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        let daemon = daemon::Daemon::from_env();
        let query = format!(
            "/v1/sandboxes?label={}&label={}",
            query_escape(&format!("{}={}", spec::LABEL_NAMESPACE, self.namespace)),
            query_escape(&format!("{}={}", spec::LABEL_ID, self.id)),
        );
        let list = daemon
            .call("GET", &query, None)
            .map_err(|e| containerd_shim::Error::Other(e.to_string()))?;
        for sandbox in list["sandboxes"].as_array().into_iter().flatten() {
            if let Some(id) = sandbox["id"].as_str() {
                match daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None) {
                    Ok(_) | Err(daemon::DaemonError::Refused { status: 404, .. }) => {}
                    Err(e) => return Err(containerd_shim::Error::Other(e.to_string())),
                }
            }
        }
        Ok(api::DeleteResponse {
            exit_status: 137,
            exited_at: containerd_shim::protos::protobuf::MessageField::some(
                containerd_shim::util::timestamp()?,
            ),
            ..Default::default()
        })
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        service::Service::new(&self.namespace, publisher, Arc::clone(&self.exit))
    }
}

/// Whether a shim answers at `address` (`unix://PATH`).
fn serving(address: &str) -> bool {
    address
        .strip_prefix("unix://")
        .is_some_and(|path| std::os::unix::net::UnixStream::connect(path).is_ok())
}

/// Percent-encodes everything but unreserved characters.
fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn main() {
    containerd_shim::run::<SandboxdShim>(RUNTIME_ID, None);
}
