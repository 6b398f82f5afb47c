//! The device grant of a GPU sandbox, from the inventory, the character
//! device majors in /proc/devices and the device folder: each assigned
//! `/dev/nvidiaN`, the shared control nodes (`nvidiactl`, `nvidia-uvm`,
//! `nvidia-uvm-tools`, `nvidia-modeset`) that exist, the driver files, the
//! environment, and the masked /proc entries of every GPU not assigned.
//!
//! Each node is checked on the host to be the character device its name
//! says, so the bind mount can only carry what the cgroup rule allows.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::discovery::GpuInfo;
use super::driver::{DriverFiles, LIBRARY_DIR_IN_SANDBOX};
use super::error::GrantError;
use super::grant::{DeviceGrant, GpuGrant, GrantedDevice};

/// The major the NVIDIA driver has registered for `nvidia*` nodes since its
/// first release; used only when /proc/devices does not name it (no driver
/// loaded: the fake inventory of tests).
pub const CONVENTIONAL_NVIDIA_MAJOR: u32 = 195;

/// Minor numbers of the control nodes under the nvidia major.
pub const NVIDIACTL_MINOR: u32 = 255;
pub const NVIDIA_MODESET_MINOR: u32 = 254;

/// Where each GPU's /proc entry lives; one folder per PCI bus id.
pub const PROC_GPUS_DIR: &str = "/proc/driver/nvidia/gpus";

/// Character device majors of the driver's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Majors {
    pub nvidia: u32,
    /// Whether `nvidia` came from /proc/devices (not the convention).
    pub nvidia_registered: bool,
    /// `nvidia-uvm` is loaded on demand; absent until then.
    pub uvm: Option<u32>,
}

impl Majors {
    /// Reads the "Character devices:" section of /proc/devices.
    pub fn parse(proc_devices: &str) -> Self {
        let mut nvidia = None;
        let mut uvm = None;
        let mut in_char = false;
        for line in proc_devices.lines() {
            let line = line.trim();
            if line.ends_with(':') {
                in_char = line == "Character devices:";
                continue;
            }
            if !in_char {
                continue;
            }
            let Some((major, name)) = line.split_once(char::is_whitespace) else {
                continue;
            };
            let Ok(major) = major.parse::<u32>() else {
                continue;
            };
            match name.trim() {
                // The driver registers its frontend as "nvidia-frontend"
                // (or "nvidia" on some builds).
                "nvidia-frontend" | "nvidia" => nvidia = nvidia.or(Some(major)),
                "nvidia-uvm" => uvm = Some(major),
                _ => {}
            }
        }
        Self {
            nvidia: nvidia.unwrap_or(CONVENTIONAL_NVIDIA_MAJOR),
            nvidia_registered: nvidia.is_some(),
            uvm,
        }
    }
}

/// `00000000:3B:00.0` (NVML) → `0000:3b:00.0` (the folder name under
/// [`PROC_GPUS_DIR`]); `None` if it does not look like a PCI address.
pub fn proc_bus_id(nvml_bus_id: &str) -> Option<String> {
    let (domain, rest) = nvml_bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    if device > 0x1f || function > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// The /proc entries of `gpus`, to be masked.
fn masks(gpus: &[&GpuInfo]) -> Vec<String> {
    gpus.iter()
        .filter_map(|g| proc_bus_id(&g.pci_bus_id))
        .map(|id| format!("{PROC_GPUS_DIR}/{id}"))
        .collect()
}

/// The grant of a sandbox without GPUs: every GPU's /proc entry masked.
pub fn masks_only(inventory: &[GpuInfo]) -> DeviceGrant {
    DeviceGrant {
        masked_paths: masks(&inventory.iter().collect::<Vec<_>>()),
        ..Default::default()
    }
}

pub struct GrantInput<'a> {
    /// The sandbox's GPUs.
    pub assigned: &'a [GpuInfo],
    /// All GPUs of the host.
    pub inventory: &'a [GpuInfo],
    pub majors: &'a Majors,
    /// Host folder of the device nodes (/dev).
    pub dev_dir: &'a Path,
    pub driver: &'a DriverFiles,
}

/// What a sandbox holding `input.assigned` gets.
pub fn grant(input: &GrantInput<'_>) -> Result<GpuGrant, GrantError> {
    let mut devices = Vec::new();
    for gpu in input.assigned {
        let name = format!("nvidia{}", gpu.minor_number);
        devices.push(node(
            input.dev_dir,
            &name,
            input.majors.nvidia,
            gpu.minor_number,
        )?);
    }
    // nvidiactl is needed by every client of the driver.
    devices.push(node(
        input.dev_dir,
        "nvidiactl",
        input.majors.nvidia,
        NVIDIACTL_MINOR,
    )?);
    let mut optional = vec![("nvidia-modeset", input.majors.nvidia, NVIDIA_MODESET_MINOR)];
    if let Some(uvm) = input.majors.uvm {
        optional.push(("nvidia-uvm", uvm, 0));
        optional.push(("nvidia-uvm-tools", uvm, 1));
    }
    for (name, major, minor) in optional {
        match node(input.dev_dir, name, major, minor) {
            Ok(device) => devices.push(device),
            Err(GrantError::MissingNode { .. }) => {
                tracing::debug!(node = name, "optional NVIDIA node absent; not granted")
            }
            Err(e) => return Err(e),
        }
    }
    let others: Vec<&GpuInfo> = input
        .inventory
        .iter()
        .filter(|g| !input.assigned.iter().any(|a| a.uuid == g.uuid))
        .collect();
    let uuids = input
        .assigned
        .iter()
        .map(|g| g.uuid.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut env = vec![
        ("NVIDIA_VISIBLE_DEVICES".to_string(), uuids.clone()),
        // CUDA numbers only the GPUs it can open, so host indexes would be
        // wrong inside; UUIDs are right everywhere.
        ("CUDA_VISIBLE_DEVICES".to_string(), uuids),
    ];
    if input.driver.has_libraries() {
        env.push((
            "LD_LIBRARY_PATH".to_string(),
            LIBRARY_DIR_IN_SANDBOX.to_string(),
        ));
    }
    Ok(GpuGrant {
        devices: DeviceGrant {
            devices,
            files: input.driver.files.clone(),
            masked_paths: masks(&others),
        },
        env,
    })
}

/// `dev_dir/name`, checked to be the character device `major:minor`.
fn node(dev_dir: &Path, name: &str, major: u32, minor: u32) -> Result<GrantedDevice, GrantError> {
    let host_path = dev_dir.join(name);
    let meta = std::fs::metadata(&host_path).map_err(|source| GrantError::MissingNode {
        path: host_path.clone(),
        source,
    })?;
    let expected = format!("c {major}:{minor}");
    let found = if meta.file_type().is_char_device() {
        let rdev = meta.rdev();
        format!(
            "c {}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        )
    } else {
        "not a character device".to_string()
    };
    if found != expected {
        return Err(GrantError::WrongNode {
            path: host_path,
            expected,
            found,
        });
    }
    Ok(GrantedDevice {
        host_path,
        path: PathBuf::from("/dev").join(name),
        major,
        minor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::grant::GrantedFile;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n\
        136 pts\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n 42 nvidia-uvm\n";

    #[test]
    fn majors_come_from_the_character_section() {
        let m = Majors::parse(PROC_DEVICES);
        assert_eq!(
            m,
            Majors {
                nvidia: 195,
                nvidia_registered: true,
                uvm: Some(510)
            }
        );
        let other = Majors::parse("Character devices:\n200 nvidia\n");
        assert_eq!(other.nvidia, 200);
        let none = Majors::parse("Character devices:\n  1 mem\n\nBlock devices:\n");
        assert_eq!(
            none,
            Majors {
                nvidia: CONVENTIONAL_NVIDIA_MAJOR,
                nvidia_registered: false,
                uvm: None
            }
        );
    }

    #[test]
    fn bus_ids_become_proc_folder_names() {
        assert_eq!(
            proc_bus_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            proc_bus_id("00000001:C1:1F.7").as_deref(),
            Some("0001:c1:1f.7")
        );
        for bad in ["", "3B:00.0", "0000:3B:20.0", "zz:3B:00.0", "0000:3B:00.8"] {
            assert_eq!(proc_bus_id(bad), None, "{bad}");
        }
    }

    fn gpu(index: u32, minor: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            memory_mib: 143_771,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
            minor_number: minor,
        }
    }

    /// Makes `name` as char device `major:minor` (needs root: mknod).
    fn mknod(dir: &Path, name: &str, major: u32, minor: u32) -> bool {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        mknod(
            &dir.join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major.into(), minor.into()),
        )
        .is_ok()
    }

    #[test]
    fn grant_binds_the_assigned_gpu_and_control_nodes_and_masks_the_rest() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        if !mknod(d, "nvidia0", 195, 0) {
            sandboxd_test_support::skip!(
                sandboxd_test_support::Reason::NotRoot,
                "mknod needs root"
            );
        }
        assert!(mknod(d, "nvidia1", 195, 1));
        assert!(mknod(d, "nvidiactl", 195, 255));
        assert!(mknod(d, "nvidia-uvm", 510, 0));
        // nvidia-uvm-tools and nvidia-modeset absent: skipped.
        let inventory = vec![gpu(0, 0), gpu(1, 1)];
        let driver = DriverFiles {
            files: vec![GrantedFile {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
                path: format!("{LIBRARY_DIR_IN_SANDBOX}/libcuda.so.1").into(),
            }],
        };
        let majors = Majors::parse(PROC_DEVICES);
        let g = grant(&GrantInput {
            assigned: &inventory[1..],
            inventory: &inventory,
            majors: &majors,
            dev_dir: d,
            driver: &driver,
        })
        .expect("grant");
        let nodes: Vec<(String, u32, u32)> = g
            .devices
            .devices
            .iter()
            .map(|n| (n.path.display().to_string(), n.major, n.minor))
            .collect();
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidia1".to_string(), 195, 1),
                ("/dev/nvidiactl".to_string(), 195, 255),
                ("/dev/nvidia-uvm".to_string(), 510, 0),
            ]
        );
        assert_eq!(g.devices.devices[0].host_path, d.join("nvidia1"));
        assert_eq!(
            g.devices.masked_paths,
            vec!["/proc/driver/nvidia/gpus/0000:10:00.0".to_string()]
        );
        assert_eq!(g.devices.files, driver.files);
        assert!(g
            .env
            .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "GPU-1".to_string())));
        assert!(g
            .env
            .contains(&("NVIDIA_VISIBLE_DEVICES".to_string(), "GPU-1".to_string())));
        assert!(g.env.contains(&(
            "LD_LIBRARY_PATH".to_string(),
            LIBRARY_DIR_IN_SANDBOX.to_string()
        )));

        // A node that is not what its name says is refused.
        assert!(mknod(d, "nvidia-modeset", 1, 3));
        let err = grant(&GrantInput {
            assigned: &inventory[..1],
            inventory: &inventory,
            majors: &majors,
            dev_dir: d,
            driver: &DriverFiles::default(),
        })
        .expect_err("wrong node");
        assert!(
            matches!(&err, GrantError::WrongNode { expected, .. } if expected == "c 195:254"),
            "{err}"
        );

        // A missing GPU node is an error that says what to do.
        let missing = [gpu(7, 7)];
        let err = grant(&GrantInput {
            assigned: &missing,
            inventory: &missing,
            majors: &majors,
            dev_dir: d,
            driver: &DriverFiles::default(),
        })
        .expect_err("no node");
        assert!(matches!(err, GrantError::MissingNode { .. }), "{err}");
        assert!(err.to_string().contains("nvidia7"), "{err}");
    }

    #[test]
    fn a_sandbox_without_gpus_gets_every_gpu_masked() {
        let g = masks_only(&[gpu(0, 0), gpu(1, 1)]);
        assert!(g.devices.is_empty() && g.files.is_empty());
        assert_eq!(
            g.masked_paths,
            vec![
                "/proc/driver/nvidia/gpus/0000:10:00.0".to_string(),
                "/proc/driver/nvidia/gpus/0000:11:00.0".to_string()
            ]
        );
        assert!(masks_only(&[]).is_empty());
    }
}
