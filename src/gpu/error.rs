//! The GPU module's errors, one enum per concern, and how each maps onto the
//! API's error table (400 for a request this host can never meet, 503 with
//! `resource: "gpu"` for one it cannot meet now, 500 for a host fault).

use std::path::PathBuf;

/// Discovery failed for a reason other than "no driver here".
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("NVML could not start: {0}; check the NVIDIA driver (`nvidia-smi`) and that sandboxd runs as root")]
    Init(String),
    #[error("NVML query failed: {0}")]
    Query(String),
}

/// The `gpu` / `gpu_count` fields of a create request are unusable.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("gpu must name a GPU model such as \"H200\" or \"A100\", or be \"any\"; got {0:?}")]
    BadModel(String),
    #[error("gpu_count must be between 1 and {max} when a GPU is asked for; got {got}")]
    BadCount { got: u32, max: u32 },
    #[error("runtime \"vm\" cannot have GPUs: microVMs are CPU-only for now; use runtime \"container\" for a GPU sandbox")]
    VmRuntime,
}

/// A GPU request that cannot be met.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("this host has no GPU matching {model:?}; it has {available}")]
    NoSuchModel { model: String, available: String },
    #[error("asked for {requested} GPUs matching {model:?} but this host has only {present}; ask for at most {present}")]
    TooMany {
        model: String,
        requested: u32,
        present: u32,
    },
    #[error("all GPUs matching {model:?} are in use ({free} of {present} free, {requested} asked for); try again once a sandbox holding one is deleted")]
    Busy {
        model: String,
        requested: u32,
        free: u32,
        present: u32,
    },
    #[error("sandbox {0} already holds GPUs")]
    AlreadyHolds(String),
}

/// The assigned GPUs cannot be wired into the sandbox on this host.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("GPU {uuid} is no longer on this host; delete the sandbox and create it again")]
    Gone { uuid: String },
    #[error("cannot read the device majors from {path}: {source}")]
    ProcDevices {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the device node {path} is missing ({source}); load the NVIDIA driver (`nvidia-modprobe -c 0`) or fix gpu.dev_dir")]
    MissingNode {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not the character device {expected}; found {found}. Fix gpu.dev_dir or the node"
    )]
    WrongNode {
        path: PathBuf,
        expected: String,
        found: String,
    },
}
