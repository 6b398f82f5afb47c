//! Finding the host's GPUs: NVML through `nvml-wrapper` (which loads
//! libnvidia-ml at run time, so the daemon builds and runs without the
//! driver), or a fixed fake inventory for tests. A host without the driver
//! has no GPUs; that is not an error.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

use super::error::DiscoveryError;

/// One GPU as discovery reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML's index (PCI bus order).
    pub index: u32,
    /// `GPU-xxxxxxxx-...`, stable across reboots; what sandboxes hold.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total frame-buffer memory.
    pub memory_mib: u64,
    /// PCI bus id as NVML gives it, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor_number: u32,
}

/// Where GPUs come from.
pub trait GpuDiscovery: Send + Sync {
    /// The GPUs on this host now; none without the driver. Blocking.
    fn discover(&self) -> Result<Vec<GpuInfo>, DiscoveryError>;
    /// What this source is, for the log.
    fn describe(&self) -> String;
}

/// NVML, initialised on first use and kept; retried while it cannot load.
pub struct NvmlDiscovery {
    library: PathBuf,
    nvml: Mutex<Option<Nvml>>,
}

impl NvmlDiscovery {
    pub fn new(library: PathBuf) -> Self {
        Self {
            library,
            nvml: Mutex::new(None),
        }
    }
}

/// NVML errors that mean "no NVIDIA driver here" rather than a fault.
fn means_no_driver(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::LibloadingError(_) | NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound
    )
}

impl GpuDiscovery for NvmlDiscovery {
    fn discover(&self) -> Result<Vec<GpuInfo>, DiscoveryError> {
        let mut guard = self.nvml.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            match Nvml::builder().lib_path(self.library.as_os_str()).init() {
                Ok(nvml) => *guard = Some(nvml),
                Err(e) if means_no_driver(&e) => {
                    tracing::debug!(library = %self.library.display(), "NVML unavailable: {e}");
                    return Ok(Vec::new());
                }
                Err(e) => return Err(DiscoveryError::Init(e.to_string())),
            }
        }
        let Some(nvml) = guard.as_ref() else {
            return Ok(Vec::new());
        };
        let count = nvml
            .device_count()
            .map_err(|e| DiscoveryError::Query(format!("counting devices: {e}")))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let one = || -> Result<GpuInfo, NvmlError> {
                let device = nvml.device_by_index(index)?;
                Ok(GpuInfo {
                    index,
                    uuid: device.uuid()?,
                    name: device.name()?,
                    memory_mib: device.memory_info()?.total / (1024 * 1024),
                    pci_bus_id: device.pci_info()?.bus_id,
                    minor_number: device.minor_number()?,
                })
            };
            match one() {
                Ok(gpu) => gpus.push(gpu),
                // A GPU the driver cannot describe cannot be handed out either.
                Err(e) => tracing::warn!(index, "skipping a GPU NVML cannot describe: {e}"),
            }
        }
        Ok(gpus)
    }

    fn describe(&self) -> String {
        format!("NVML ({})", self.library.display())
    }
}

/// A fixed inventory (tests, hosts without GPUs pretending to have some).
pub struct FakeDiscovery {
    gpus: Vec<GpuInfo>,
}

impl FakeDiscovery {
    pub fn new(gpus: Vec<GpuInfo>) -> Self {
        Self { gpus }
    }
}

impl GpuDiscovery for FakeDiscovery {
    fn discover(&self) -> Result<Vec<GpuInfo>, DiscoveryError> {
        Ok(self.gpus.clone())
    }

    fn describe(&self) -> String {
        "fake inventory (gpu.fake, test only)".into()
    }
}

/// Parses `INDEX:NAME:UUID:MINOR[:MEMORY_MIB[:PCI_BUS_ID]]` entries separated
/// by commas. The bus id is last because it contains colons itself; without
/// one each GPU gets a distinct made-up id.
pub fn parse_fake(text: &str) -> Result<Vec<GpuInfo>, String> {
    let mut gpus = Vec::new();
    let (mut indexes, mut uuids, mut minors) = (HashSet::new(), HashSet::new(), HashSet::new());
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            format!("entry {entry:?}: {why}; write INDEX:NAME:UUID:MINOR[:MEMORY_MIB[:PCI_BUS_ID]]")
        };
        let fields: Vec<&str> = entry.splitn(6, ':').collect();
        if fields.len() < 4 {
            return Err(bad("it has fewer than 4 fields"));
        }
        let index: u32 = fields[0]
            .parse()
            .map_err(|_| bad("INDEX is not a number"))?;
        let name = fields[1].trim();
        if name.is_empty() {
            return Err(bad("NAME is empty"));
        }
        let uuid = fields[2].trim();
        if uuid.is_empty() || !uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(bad("UUID must be letters, digits and '-'"));
        }
        let minor_number: u32 = fields[3]
            .parse()
            .map_err(|_| bad("MINOR is not a number"))?;
        // 254 and 255 are nvidia-modeset and nvidiactl.
        if minor_number >= 254 {
            return Err(bad("MINOR must be below 254"));
        }
        let memory_mib: u64 = match fields.get(4) {
            Some(m) => m.parse().map_err(|_| bad("MEMORY_MIB is not a number"))?,
            None => 0,
        };
        let pci_bus_id = match fields.get(5) {
            Some(b) if super::devices::proc_bus_id(b).is_some() => b.to_string(),
            Some(_) => return Err(bad("PCI_BUS_ID must look like 00000000:3B:00.0")),
            None => format!("00000000:{:02X}:00.0", 0x10 + (index % 0xe0)),
        };
        if !indexes.insert(index) || !uuids.insert(uuid.to_string()) || !minors.insert(minor_number)
        {
            return Err(bad("INDEX, UUID and MINOR must each be unique"));
        }
        gpus.push(GpuInfo {
            index,
            uuid: uuid.to_string(),
            name: name.to_string(),
            memory_mib,
            pci_bus_id,
            minor_number,
        });
    }
    if gpus.is_empty() {
        return Err("it lists no GPU".into());
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_inventory_parses_with_defaults_and_bus_ids() {
        let gpus =
            parse_fake("1:NVIDIA H200:GPU-b:1:143771:00000000:3B:00.0, 0:NVIDIA H200:GPU-a:0")
                .expect("valid");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].index, 0, "sorted by index");
        assert_eq!(gpus[0].uuid, "GPU-a");
        assert_eq!(gpus[0].memory_mib, 0);
        assert_eq!(gpus[0].pci_bus_id, "00000000:10:00.0");
        assert_eq!(gpus[1].name, "NVIDIA H200");
        assert_eq!(gpus[1].memory_mib, 143_771);
        assert_eq!(gpus[1].pci_bus_id, "00000000:3B:00.0");
        assert_eq!(gpus[1].minor_number, 1);
    }

    #[test]
    fn fake_inventory_errors_say_what_is_wrong() {
        for (text, needle) in [
            ("", "no GPU"),
            ("0:H200:GPU-a", "fewer than 4"),
            ("x:H200:GPU-a:0", "INDEX"),
            ("0::GPU-a:0", "NAME"),
            ("0:H200:GPU a:0", "UUID"),
            ("0:H200:GPU-a:255", "below 254"),
            ("0:H200:GPU-a:0,1:H200:GPU-a:1", "unique"),
            ("0:H200:GPU-a:0:lots", "MEMORY_MIB"),
            ("0:H200:GPU-a:0:1:nonsense", "PCI_BUS_ID"),
        ] {
            let err = parse_fake(text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn nvml_without_the_driver_means_no_gpus() {
        // This build host has no NVIDIA driver; a GPU host skips the check.
        let discovery = NvmlDiscovery::new("libnvidia-ml.so.1".into());
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return;
        }
        assert_eq!(discovery.discover().expect("no error"), Vec::new());
        let missing = NvmlDiscovery::new("/nonexistent/libnvidia-ml.so.1".into());
        assert_eq!(missing.discover().expect("no error"), Vec::new());
    }
}
