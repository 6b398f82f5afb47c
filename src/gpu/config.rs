//! The `[gpu]` section of the daemon's configuration (flags `--gpu-*`):
//! where GPU discovery looks, and the test-only fake inventory.

use std::path::PathBuf;

use serde::Deserialize;

use super::discovery::{parse_fake, GpuInfo};

/// A `[gpu]` field that cannot be used; the daemon's configuration reports it.
#[derive(Debug, thiserror::Error)]
#[error("config field `{field}` is invalid: {message}")]
pub struct InvalidGpuConfig {
    pub field: &'static str,
    pub message: String,
}

/// NVML as the driver installs it (the unversioned name is only in the
/// development package).
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Every field optional: the TOML `[gpu]` table and the `--gpu-*` flags that
/// override it.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct GpuConfigOverrides {
    /// TEST ONLY: use this fake GPU inventory instead of NVML, as
    /// `INDEX:NAME:UUID:MINOR[:MEMORY_MIB[:PCI_BUS_ID]]` entries separated by
    /// commas, e.g. `0:NVIDIA H200:GPU-0000...:0,1:NVIDIA H200:GPU-0001...:1`.
    /// The device nodes must still exist in `gpu-dev-dir`.
    #[arg(long = "gpu-fake", id = "gpu_fake")]
    pub fake: Option<String>,
    /// Folder holding the NVIDIA device nodes (`nvidia0`, `nvidiactl`, ...);
    /// default /dev. Tests point it at a folder of fake nodes.
    #[arg(long = "gpu-dev-dir", id = "gpu_dev_dir")]
    pub dev_dir: Option<PathBuf>,
    /// Where the character device majors are read from; default
    /// /proc/devices. Tests point it at a file naming a fake `nvidia-uvm` major.
    #[arg(long = "gpu-proc-devices", id = "gpu_proc_devices")]
    pub proc_devices: Option<PathBuf>,
    /// NVML library to load (a name the dynamic linker finds, or a path);
    /// default libnvidia-ml.so.1. A path also adds its folder to `driver_dirs`.
    #[arg(long = "gpu-nvml-library", id = "gpu_nvml_library")]
    pub nvml_library: Option<PathBuf>,
    /// Extra folders holding the driver's user-space libraries and
    /// `nvidia-smi`, for a driver the linker cache does not list.
    #[arg(long = "gpu-driver-dirs", id = "gpu_driver_dirs")]
    pub driver_dirs: Option<Vec<PathBuf>>,
}

/// The merged GPU configuration.
#[derive(Debug, Clone)]
pub struct GpuConfig {
    /// `Some` only in tests: the fake inventory that replaces NVML.
    pub fake: Option<Vec<GpuInfo>>,
    pub dev_dir: PathBuf,
    pub proc_devices: PathBuf,
    pub nvml_library: PathBuf,
    pub driver_dirs: Vec<PathBuf>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            fake: None,
            dev_dir: PathBuf::from("/dev"),
            proc_devices: PathBuf::from("/proc/devices"),
            nvml_library: PathBuf::from(DEFAULT_NVML_LIBRARY),
            driver_dirs: Vec::new(),
        }
    }
}

impl GpuConfig {
    /// `flags` over `file` over the defaults, validated.
    pub fn merge(
        flags: &GpuConfigOverrides,
        file: &GpuConfigOverrides,
    ) -> Result<Self, InvalidGpuConfig> {
        let defaults = Self::default();
        let fake = match flags.fake.as_ref().or(file.fake.as_ref()) {
            Some(text) => Some(parse_fake(text).map_err(|message| InvalidGpuConfig {
                field: "gpu.fake",
                message,
            })?),
            None => None,
        };
        let config = Self {
            fake,
            dev_dir: flags
                .dev_dir
                .clone()
                .or(file.dev_dir.clone())
                .unwrap_or(defaults.dev_dir),
            proc_devices: flags
                .proc_devices
                .clone()
                .or(file.proc_devices.clone())
                .unwrap_or(defaults.proc_devices),
            nvml_library: flags
                .nvml_library
                .clone()
                .or(file.nvml_library.clone())
                .unwrap_or(defaults.nvml_library),
            driver_dirs: flags
                .driver_dirs
                .clone()
                .or(file.driver_dirs.clone())
                .unwrap_or(defaults.driver_dirs),
        };
        for (field, path) in [
            ("gpu.dev_dir", &config.dev_dir),
            ("gpu.proc_devices", &config.proc_devices),
        ] {
            if !path.is_absolute() {
                return Err(InvalidGpuConfig {
                    field,
                    message: format!("must be an absolute path, got {}", path.display()),
                });
            }
        }
        if let Some(dir) = config.driver_dirs.iter().find(|d| !d.is_absolute()) {
            return Err(InvalidGpuConfig {
                field: "gpu.driver_dirs",
                message: format!("must be absolute paths, got {}", dir.display()),
            });
        }
        if config.nvml_library.as_os_str().is_empty() {
            return Err(InvalidGpuConfig {
                field: "gpu.nvml_library",
                message: "must name a library, e.g. libnvidia-ml.so.1".into(),
            });
        }
        Ok(config)
    }

    /// The configured driver folders, plus the NVML library's own folder when
    /// it was given as a path.
    pub fn all_driver_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.driver_dirs.clone();
        if self.nvml_library.is_absolute() {
            if let Some(parent) = self.nvml_library.parent() {
                if !dirs.iter().any(|d| d == parent) {
                    dirs.push(parent.to_path_buf());
                }
            }
        }
        dirs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_defaults_fill_in() {
        let file = GpuConfigOverrides {
            dev_dir: Some("/file/dev".into()),
            proc_devices: Some("/file/devices".into()),
            ..Default::default()
        };
        let flags = GpuConfigOverrides {
            dev_dir: Some("/flag/dev".into()),
            ..Default::default()
        };
        let c = GpuConfig::merge(&flags, &file).expect("valid");
        assert_eq!(c.dev_dir, PathBuf::from("/flag/dev"));
        assert_eq!(c.proc_devices, PathBuf::from("/file/devices"));
        assert_eq!(c.nvml_library, PathBuf::from(DEFAULT_NVML_LIBRARY));
        assert!(c.fake.is_none());
    }

    #[test]
    fn a_bad_fake_inventory_names_the_field() {
        let flags = GpuConfigOverrides {
            fake: Some("0:H200".into()),
            ..Default::default()
        };
        let err = GpuConfig::merge(&flags, &GpuConfigOverrides::default()).expect_err("bad");
        assert!(err.to_string().contains("gpu.fake"), "{err}");
    }

    #[test]
    fn relative_paths_are_refused() {
        let flags = GpuConfigOverrides {
            dev_dir: Some("dev".into()),
            ..Default::default()
        };
        let err = GpuConfig::merge(&flags, &GpuConfigOverrides::default()).expect_err("rel");
        assert!(err.to_string().contains("gpu.dev_dir"), "{err}");
    }

    #[test]
    fn an_nvml_path_adds_its_folder_to_the_driver_dirs() {
        let flags = GpuConfigOverrides {
            nvml_library: Some("/opt/driver/lib/libnvidia-ml.so.1".into()),
            driver_dirs: Some(vec!["/opt/driver/bin".into()]),
            ..Default::default()
        };
        let c = GpuConfig::merge(&flags, &GpuConfigOverrides::default()).expect("valid");
        assert_eq!(
            c.all_driver_dirs(),
            vec![
                PathBuf::from("/opt/driver/bin"),
                PathBuf::from("/opt/driver/lib")
            ]
        );
    }
}
