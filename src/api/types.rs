//! The JSON bodies of the `/v1` API, shared by the daemon and `sandboxctl`.
//!
//! Units live in field names (`memory_mib`, `disk_mib`, `ttl_seconds`, `cpu`
//! in cores). Unknown fields are refused so a typo is a 400, not a surprise.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The domain's types the API speaks as they are.
pub use crate::model::{
    Limits, PortAuth, PortProtocol, Process, ProcessState, RuntimeKind, SandboxState, Usage,
};

/// An image as a create or `POST /v1/images` names it: a name
/// (`"python"`), a registry reference (`"node:20"`), or a declarative spec
/// (`{"python_version": "3.11", "python_packages": ["pandas"]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ImageChoice {
    Named(String),
    Spec(crate::image::built::ImageSpec),
}

// By hand rather than `untagged`: a spec with a typo must say which field,
// not "data did not match any variant".
impl<'de> Deserialize<'de> for ImageChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(name) => Ok(ImageChoice::Named(name)),
            spec @ serde_json::Value::Object(_) => {
                crate::image::built::ImageSpec::deserialize(spec)
                    .map(ImageChoice::Spec)
                    .map_err(D::Error::custom)
            }
            _ => Err(D::Error::custom(
                "image is a name (\"python\"), a registry reference (\"node:20\") or a spec object ({\"python_packages\": [...]})",
            )),
        }
    }
}

/// `POST /v1/sandboxes`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// An image name or registry reference, or a declarative spec built
    /// on first use; defaults to the daemon's `default_image`.
    #[serde(default)]
    pub image: Option<ImageChoice>,
    /// `"container"` (default) or `"vm"` (a KVM microVM).
    #[serde(default)]
    pub runtime: Option<String>,
    /// CPU cores, fractional allowed (0.5 = half a core).
    #[serde(default)]
    pub cpu: Option<f64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Size limit of the sandbox's writable layer.
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Maximum number of tasks (processes and threads).
    #[serde(default)]
    pub pids: Option<u64>,
    /// CPU weight under contention, in cgroup v1 shares (2-262144; the
    /// default is the kernel's 1024, the same as none). A claim from the
    /// warm pool is made at the default, so a create that names another
    /// weight is a cold one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// Seconds until the sandbox is removed; -1 means never.
    #[serde(default)]
    pub ttl_seconds: Option<i64>,
    /// Extra environment for every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Caller labels, returned as given.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Retrying a create with the same key and body returns what the first
    /// attempt did (its sandbox, or its error; after a 503, a new attempt)
    /// instead of making another;
    /// the key with another body is a 409 `idempotency_key_reused`.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// GPU model the sandbox needs as users write it, e.g. `"H200"`,
    /// `"RTX4090"` or `"A100-80GB"`, or `"any"`. Case-insensitive; letters
    /// and digits are cut apart on both sides, and the request must be, in
    /// order, whole words of the NVML product name (`"RTX4090"` matches
    /// "NVIDIA GeForce RTX 4090"; `"A10"` matches neither an A100 nor an
    /// A10G). Containers only.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Whole GPUs, held exclusively until the sandbox ends; default 1 when
    /// `gpu` is given. Alone, it means GPUs of any model.
    #[serde(default)]
    pub gpu_count: Option<u32>,
    /// `true`: nothing leaves the sandbox, DNS included. `false` (alone):
    /// open egress (public internet; the deny list still holds). Absent
    /// with no `allow_list`: the daemon's `default_egress` decides.
    #[serde(default)]
    pub block_network: Option<bool>,
    /// Up to 64 hostnames, `*.wildcards`, IP addresses and CIDRs the
    /// sandbox may reach (and nothing else).
    #[serde(default)]
    pub allow_list: Option<Vec<String>>,
    /// A memory snapshot to fork: the sandbox starts with the snapshot's
    /// processes running where they stood, its files, limits and
    /// environment.
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// Brokered secrets to bind (`POST /v1/secrets` made them): `$NAME`
    /// holds a placeholder, and HTTPS requests to the secret's hosts carry
    /// the value in its place. The hosts are reachable whatever the
    /// egress policy says.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Ports to expose through the ingress once it is ready (HTTP, token
    /// auth); the create's answer lists them with their tokens.
    #[serde(default)]
    pub ports: Vec<u32>,
    /// Directories on the daemon's host, top first, stacked read-only as
    /// the sandbox's root instead of an image; owned by host ids, which
    /// the sandbox sees shifted into its own (idmapped, no copy). What
    /// containerd's shim passes for a bundle's root. Containers only;
    /// refused on the remote API.
    #[serde(default)]
    pub host_rootfs: Vec<String>,
    /// A network namespace on the daemon's host (a CRI pod's, made by
    /// CNI) for the sandbox to use instead of its own; its egress rules
    /// are added there. Containers only; refused on the remote API.
    #[serde(default)]
    pub join_netns: Option<String>,
    /// The sandbox's hostname (default: its id). Containers only.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Host files and directories bound into the sandbox's root, as a
    /// pod container's root takes them (a microVM's copied into its
    /// guest). Refused on the remote API.
    #[serde(default)]
    pub volumes: Vec<crate::model::HostVolume>,
}

/// `POST /v1/sandboxes/{id}/ports`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    pub port: u32,
    /// `"token"` (default) or `"none"` (a public URL).
    #[serde(default)]
    pub auth: Option<PortAuth>,
    /// `"http"` (default) or `"tcp"` (a host port of its own).
    #[serde(default)]
    pub protocol: Option<PortProtocol>,
}

/// An exposed port and where it is reached.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortUrl {
    pub port: u16,
    pub protocol: PortProtocol,
    pub auth: PortAuth,
    /// Host-name routing (`<id>-<port>.<ingress_domain>`); absent without
    /// `ingress_domain` and for raw TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Path routing (`/<id>/<port>/`); absent for raw TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_url: Option<String>,
    /// A raw TCP port's `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Only in the answer that made it (expose, rotate, create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A TCP socket listening in the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListeningPort {
    pub port: u16,
    pub address: String,
    /// Whether the port is exposed through the ingress.
    pub exposed: bool,
}

/// `GET /v1/sandboxes/{id}/ports`
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortList {
    pub ports: Vec<PortUrl>,
    /// With `?listening=true`: what listens in the sandbox, exposed or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listening: Option<Vec<ListeningPort>>,
}

/// `POST /v1/secrets`. The value is never returned, logged or shown.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSecret {
    /// An environment variable name (`OPENAI_API_KEY`).
    pub name: String,
    /// Printable ASCII, at most 16 KiB.
    pub value: String,
    /// Host names the value may be sent to (no addresses).
    pub hosts: Vec<String>,
    /// Allow `*.example.com` hosts: the value then goes to any name one
    /// label below, including ones someone else may register.
    #[serde(default)]
    pub allow_wildcards: bool,
}

/// `PUT /v1/secrets/{name}`: a new value and/or hosts, in force for the
/// next request of every bound sandbox.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    #[serde(default)]
    pub allow_wildcards: bool,
}

/// One secret as the API shows it (`GET /v1/secrets/{name}`).
pub use crate::secrets::SecretInfo as Secret;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretList {
    pub secrets: Vec<Secret>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sandbox {
    pub id: String,
    pub state: SandboxState,
    pub runtime: RuntimeKind,
    pub image: String,
    pub image_digest: String,
    pub limits: Limits,
    pub ttl_seconds: i64,
    /// RFC 3339 instant when the TTL ends, absent when the TTL is -1.
    pub expires_at: Option<String>,
    pub created_at: String,
    pub labels: BTreeMap<String, String>,
    /// Times the kernel's OOM killer killed a process in this sandbox.
    pub oom_kills: u64,
    /// Why the sandbox failed, when it did.
    pub failure: Option<String>,
    /// Resources used so far, for billing.
    #[serde(default)]
    pub usage: Usage,
    /// UUIDs of the GPUs this sandbox holds.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// The egress policy in force.
    #[serde(default)]
    pub network: Option<crate::net::policy::PolicyView>,
    /// Names of the brokered secrets it binds.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Its exposed ports (preview URLs); tokens only in a create's answer.
    #[serde(default)]
    pub ports: Vec<PortUrl>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// One GPU of the host (`GET /v1/gpus`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
    pub pci_bus_id: String,
    /// N of `/dev/nvidiaN`.
    pub minor_number: u32,
    /// The sandbox holding it, absent when free.
    #[serde(default)]
    pub held_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuList {
    pub gpus: Vec<Gpu>,
}

/// `PUT /v1/sandboxes/{id}/ttl`: the new TTL counts from now.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetTtl {
    pub ttl_seconds: i64,
}

/// `POST /v1/sandboxes/{id}/roots`: a separate root for a pod's container,
/// on host directories (top first), owned by host ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRoot {
    pub name: String,
    pub host_rootfs: Vec<std::path::PathBuf>,
    /// Ceilings of this container alone, within the sandbox's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::model::RootLimits>,
    /// Host files and directories bound into this root (a microVM's
    /// copied into its guest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::model::HostVolume>,
}

/// `POST /v1/sandboxes/{id}/processes`: give `argv`, or `code` (+ `language`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub code: Option<String>,
    /// Language of `code`: `python` (default), `bash`, `sh`, `node`.
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Numeric uid inside the sandbox (default 0).
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    /// Keep stdin open for `POST .../stdin`; otherwise stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// Kill the whole process tree after this many seconds.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Run in this root (`POST .../roots`) instead of the sandbox's.
    #[serde(default)]
    pub root: Option<String>,
    /// Supplementary group ids inside the sandbox (default none).
    #[serde(default)]
    pub groups: Vec<u32>,
    /// The capabilities the process keeps, by their OCI names, all within
    /// the sandbox's set (default: the whole set).
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// A seccomp profile in the OCI runtime spec's `linux.seccomp` form,
    /// loaded on top of the sandbox's own filter (default: none).
    #[serde(default)]
    pub seccomp: Option<serde_json::Value>,
    /// The process's `oom_score_adj`, 0 to 1000 (default: the sandbox's, 0).
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessList {
    pub processes: Vec<Process>,
}

/// One line of `GET .../processes/{pid}/output` (NDJSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    /// `data` is base64; `offset` counts bytes of that stream before this chunk.
    Stdout {
        offset: u64,
        data: String,
    },
    Stderr {
        offset: u64,
        data: String,
    },
    /// Bytes of a stream lost before `offset` because the buffer overflowed.
    Dropped {
        stream: String,
        bytes: u64,
    },
    Exit {
        process: Process,
    },
}

/// `POST .../processes/{pid}/signal`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendSignal {
    /// A number (15) or a name (`TERM`, `SIGTERM`).
    pub signal: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileInfo {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub link_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub version: String,
    /// Sandboxes handed to callers.
    pub sandboxes: usize,
    /// Ready sandboxes waiting in the warm pool.
    #[serde(default)]
    pub pooled: usize,
    /// What this host offers microVMs: `hardware` (VMX/SVM), `pvm`
    /// (kvm_pvm: PVM guest kernels only) or `none`.
    #[serde(default = "no_virtualization")]
    pub virtualization: crate::runtime::virt::Virtualization,
    /// Whether this daemon serves preview URLs (`ingress_listen` is set).
    #[serde(default)]
    pub ingress: bool,
}

fn no_virtualization() -> crate::runtime::virt::Virtualization {
    crate::runtime::virt::Virtualization::None
}

/// The one error shape of the API.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// With 400: the request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
