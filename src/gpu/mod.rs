//! NVIDIA GPUs for container sandboxes: discovery (NVML, or a fake inventory
//! for tests), exclusive whole-GPU allocation to sandboxes, and the device
//! grant that wires the assigned GPUs into a sandbox (device nodes, device
//! cgroup rules, driver libraries, `nvidia-smi`, environment, masked /proc
//! entries of the other GPUs).
//!
//! [`GpuService`] is what the sandbox manager holds. The pure parts are
//! [`alloc`] (who holds which GPU), [`devices`] (the grant from an inventory,
//! `/proc/devices` and the device folder) and [`driver`] (which driver files
//! to bind into a sandbox); [`discovery`] is the only one that talks to the
//! driver.

pub mod alloc;
pub mod config;
pub mod devices;
pub mod discovery;
pub mod driver;
mod error;
pub mod grant;
pub mod request;

use std::sync::{Arc, Mutex, MutexGuard};

pub use alloc::{GpuAllocator, Holding};
pub use config::{GpuConfig, GpuConfigOverrides, InvalidGpuConfig};
pub use discovery::{FakeDiscovery, GpuDiscovery, GpuInfo, NvmlDiscovery};
pub use driver::DriverFiles;
pub use error::{AllocError, DiscoveryError, GrantError, RequestError};
pub use grant::{DeviceGrant, GpuGrant, GrantedDevice, GrantedFile};
pub use request::{GpuModel, GpuRequest};

/// The host's GPUs, who holds them, and how a sandbox is given its own.
pub struct GpuService {
    config: GpuConfig,
    discovery: Box<dyn GpuDiscovery>,
    allocator: GpuAllocator,
    /// Driver libraries and tools found at the last discovery that saw GPUs.
    driver: Mutex<DriverFiles>,
}

impl GpuService {
    /// The service for `config`: the fake inventory when one is configured
    /// (tests), NVML otherwise. Runs the first discovery; a host without the
    /// NVIDIA driver simply has no GPUs.
    pub fn new(config: GpuConfig) -> Arc<Self> {
        let discovery: Box<dyn GpuDiscovery> = match &config.fake {
            Some(gpus) => Box::new(FakeDiscovery::new(gpus.clone())),
            None => Box::new(NvmlDiscovery::new(config.nvml_library.clone())),
        };
        Self::with_discovery(config, discovery)
    }

    pub fn with_discovery(config: GpuConfig, discovery: Box<dyn GpuDiscovery>) -> Arc<Self> {
        let service = Arc::new(Self {
            config,
            discovery,
            allocator: GpuAllocator::new(Vec::new()),
            driver: Mutex::new(DriverFiles::default()),
        });
        service.refresh();
        let count = service.allocator.inventory().len();
        if count > 0 {
            tracing::info!(gpus = count, source = %service.discovery.describe(), "GPUs found");
        } else {
            tracing::info!(source = %service.discovery.describe(), "no GPUs on this host");
        }
        service
    }

    fn driver(&self) -> MutexGuard<'_, DriverFiles> {
        self.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Discovers the GPUs again (blocking: NVML calls). A failed discovery
    /// keeps the last inventory, so a passing driver hiccup frees no GPU.
    pub fn refresh(&self) {
        match self.discovery.discover() {
            Ok(gpus) => {
                if !gpus.is_empty() {
                    let files =
                        driver::find(&self.config.all_driver_dirs(), driver::ldconfig_cache);
                    if files.files.is_empty() {
                        tracing::warn!(
                            "GPUs found but no NVIDIA driver libraries; give their folder in gpu.driver_dirs"
                        );
                    }
                    *self.driver() = files;
                }
                self.allocator.set_inventory(gpus);
            }
            Err(e) => tracing::warn!("GPU discovery failed, keeping the last inventory: {e}"),
        }
    }

    /// Every GPU with the sandbox that holds it, after a fresh discovery.
    pub fn list(&self) -> Vec<Holding> {
        self.refresh();
        self.allocator.inventory()
    }

    /// Gives `sandbox` the GPUs `request` asks for, exclusively; returns their UUIDs.
    pub fn allocate(&self, sandbox: &str, request: &GpuRequest) -> Result<Vec<String>, AllocError> {
        Ok(self
            .allocator
            .allocate(sandbox, request)?
            .into_iter()
            .map(|g| g.uuid)
            .collect())
    }

    /// Frees whatever `sandbox` holds (nothing is fine).
    pub fn release(&self, sandbox: &str) {
        let freed = self.allocator.release(sandbox);
        if !freed.is_empty() {
            tracing::info!(sandbox, gpus = ?freed, "GPUs released");
        }
    }

    /// Replaces the holders with those of the stored sandbox records (after a
    /// restart): `(sandbox id, GPU UUIDs)`.
    pub fn rebuild<I>(&self, holders: I)
    where
        I: IntoIterator<Item = (String, Vec<String>)>,
    {
        for problem in self.allocator.rebuild(holders) {
            tracing::warn!("rebuilding GPU holders: {problem}");
        }
    }

    /// What a sandbox holding `uuids` is given; for a sandbox without GPUs
    /// that is only the masking of every GPU's /proc entry.
    pub fn grant(&self, uuids: &[String]) -> Result<GpuGrant, GrantError> {
        let inventory: Vec<GpuInfo> = self
            .allocator
            .inventory()
            .into_iter()
            .map(|h| h.gpu)
            .collect();
        if uuids.is_empty() {
            return Ok(GpuGrant {
                devices: devices::masks_only(&inventory),
                env: Vec::new(),
            });
        }
        let assigned = uuids
            .iter()
            .map(|uuid| {
                inventory
                    .iter()
                    .find(|g| &g.uuid == uuid)
                    .cloned()
                    .ok_or_else(|| GrantError::Gone { uuid: uuid.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let proc_devices =
            std::fs::read_to_string(&self.config.proc_devices).map_err(|source| {
                GrantError::ProcDevices {
                    path: self.config.proc_devices.clone(),
                    source,
                }
            })?;
        let majors = devices::Majors::parse(&proc_devices);
        let driver = self.driver().clone();
        devices::grant(&devices::GrantInput {
            assigned: &assigned,
            inventory: &inventory,
            majors: &majors,
            dev_dir: &self.config.dev_dir,
            driver: &driver,
        })
    }
}
