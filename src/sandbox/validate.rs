//! Request validation: every bad field becomes a 400 that names the field and
//! says what would be accepted.

use std::collections::BTreeMap;

use super::SandboxError;
use crate::config::Config;
use crate::model::{CreateRequest, HostVolume, Limits};
use sandbox_proto::limits::{CPU_SHARES, DEFAULT_CPU_SHARES};

const MAX_ENV: usize = 256;
const MAX_LABELS: usize = 64;
// PATH_MAX counts the terminating NUL.
const MAX_PATH: usize = 4095;
/// Ten years: anything longer is a mistake, and -1 says "forever" explicitly.
const MAX_TTL_SECONDS: i64 = 10 * 365 * 24 * 3600;

/// Limits of a create request with the daemon's defaults filled in.
pub fn validated_limits(req: &CreateRequest, config: &Config) -> Result<Limits, SandboxError> {
    let cpu = req.cpu.unwrap_or(config.default_cpu);
    if !cpu.is_finite() || cpu < 0.01 || cpu > config.max_cpu {
        return Err(SandboxError::bad(
            "invalid_cpu",
            format!(
                "cpu must be between 0.01 and {} cores, got {cpu}",
                config.max_cpu
            ),
        ));
    }
    let memory_mib = req.memory_mib.unwrap_or(config.default_memory_mib);
    if memory_mib < 16 || memory_mib > config.max_memory_mib {
        return Err(SandboxError::bad(
            "invalid_memory",
            format!(
                "memory_mib must be between 16 and {}, got {memory_mib}",
                config.max_memory_mib
            ),
        ));
    }
    let disk_mib = req.disk_mib.unwrap_or(config.default_disk_mib);
    if disk_mib < 16 || disk_mib > config.max_disk_mib {
        return Err(SandboxError::bad(
            "invalid_disk",
            format!(
                "disk_mib must be between 16 and {}, got {disk_mib}",
                config.max_disk_mib
            ),
        ));
    }
    let pids = req.pids.unwrap_or(config.default_pids);
    if pids < 8 || pids > config.max_pids {
        return Err(SandboxError::bad(
            "invalid_pids",
            format!("pids must be between 8 and {}, got {pids}", config.max_pids),
        ));
    }
    let cpu_shares = req.cpu_shares.map(checked_cpu_shares).transpose()?;
    Ok(Limits {
        cpu,
        memory_mib,
        disk_mib,
        pids,
        // The kernel's default named is the default: a pool claim, and the
        // same weight as a snapshot's without one.
        cpu_shares: cpu_shares.filter(|s| *s != DEFAULT_CPU_SHARES),
    })
}

/// A CPU weight in cgroup v1 shares, a sandbox's or a pod container's.
pub fn checked_cpu_shares(shares: u64) -> Result<u64, SandboxError> {
    if CPU_SHARES.contains(&shares) {
        Ok(shares)
    } else {
        Err(SandboxError::bad(
            "invalid_cpu_shares",
            format!(
                "cpu_shares must be between {} and {} (1024 is the default weight), got {shares}",
                CPU_SHARES.start(),
                CPU_SHARES.end()
            ),
        ))
    }
}

/// The most directories a host root may stack (as for pulled images).
const MAX_HOST_ROOTFS_LAYERS: usize = 128;

/// Checks a host root's directories: absolute, existing directories, not
/// symlinks, and the sandbox's only root (no image, spec or snapshot). A
/// microVM boots them as a disk (`image::host_ext4`).
pub fn validated_host_rootfs(req: &CreateRequest) -> Result<(), SandboxError> {
    let bad = |message: String| SandboxError::bad("invalid_host_rootfs", message);
    if req.host_rootfs.is_empty() {
        return Ok(());
    }
    if req.image.is_some() || req.image_spec.is_some() || req.from_snapshot.is_some() {
        return Err(bad(
            "host_rootfs is the sandbox's root: give it without image or from_snapshot".into(),
        ));
    }
    validated_host_dirs("invalid_host_rootfs", "host_rootfs", &req.host_rootfs)
}

/// The most volumes one root takes (a Kubernetes container has a handful).
const MAX_VOLUMES: usize = 64;

/// Where a volume may not go: the sandbox binds its own `/proc`, `/dev`
/// and `/sys` over the root, its `/etc` files that name it on the
/// network, and its agent, which would hide a volume there (or the
/// volume them).
const SANDBOX_SERVED: [&str; 7] = [
    "/proc",
    "/dev",
    "/sys",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/.sandboxd",
];

/// Checks a root's (or a sandbox's) volumes: host sources that are a directory or a
/// regular file (no symlink at the last component), destinations that are
/// clean absolute paths outside what the sandbox serves itself.
pub fn validated_volumes(volumes: &[HostVolume]) -> Result<(), SandboxError> {
    let bad = |message: String| SandboxError::bad("invalid_volume", message);
    if volumes.len() > MAX_VOLUMES {
        return Err(bad(format!(
            "at most {MAX_VOLUMES} volumes are taken, got {}",
            volumes.len()
        )));
    }
    for (index, volume) in volumes.iter().enumerate() {
        let field = format!("volumes[{index}]");
        let source = &volume.source;
        if !source.is_absolute() {
            return Err(bad(format!(
                "{field}.source: {} is not an absolute path",
                source.display()
            )));
        }
        match std::fs::symlink_metadata(source) {
            Ok(meta) if meta.is_dir() || meta.is_file() => {}
            Ok(_) => {
                return Err(bad(format!(
                    "{field}.source: {} is neither a directory nor a regular file (symlinks are not followed)",
                    source.display()
                )))
            }
            Err(e) => return Err(bad(format!("{field}.source: {}: {e}", source.display()))),
        }
        let destination = volume.destination.as_str();
        let clean = destination.starts_with('/')
            && destination.len() <= 4096
            && !destination.contains('\0')
            && destination[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !clean || destination == "/" {
            return Err(bad(format!(
                "{field}.destination: {destination:?} is not an absolute path below / without empty, . or .. components"
            )));
        }
        // Component-wise (`/devices` is not under `/dev`); the destination
        // is clean by now.
        let at = std::path::Path::new(destination);
        if let Some(served) = SANDBOX_SERVED.iter().find(|s| at.starts_with(s)) {
            return Err(bad(format!(
                "{field}.destination: {destination} is under {served}, which the sandbox serves itself"
            )));
        }
        // A volume on /etc would take the sandbox's own files there (made
        // in the host's directory) or hide them.
        if let Some(served) = SANDBOX_SERVED
            .iter()
            .find(|s| std::path::Path::new(s).starts_with(at))
        {
            return Err(bad(format!(
                "{field}.destination: {destination} holds {served}, which the sandbox serves itself; bind what you need below it"
            )));
        }
    }
    Ok(())
}

/// Checks that no volume of a create with brokered secrets covers the
/// trust bundle, which the daemon writes its CA into: through a volume
/// that would be the host's file. The destinations are clean
/// ([`validated_create_volumes`] ran first).
pub fn validated_volumes_beside_secrets(
    volumes: &[HostVolume],
    secrets: bool,
) -> Result<(), SandboxError> {
    let bundle = crate::secrets::TRUST_BUNDLE_PATH;
    let covering = volumes
        .iter()
        .position(|v| std::path::Path::new(bundle).starts_with(&v.destination));
    match covering {
        Some(index) if secrets => Err(SandboxError::bad(
            "invalid_volume",
            format!("volumes[{index}].destination: {} covers {bundle}, where the sandbox's brokered secrets put their CA; bind the volume elsewhere or drop the secrets", volumes[index].destination),
        )),
        _ => Ok(()),
    }
}

/// Checks a create's volumes: for a sandbox made fresh (a fork keeps its
/// snapshot's mounts). A microVM's are copied into its guest
/// (`runtime::guest_volumes`).
pub fn validated_create_volumes(req: &CreateRequest) -> Result<(), SandboxError> {
    if req.volumes.is_empty() {
        return Ok(());
    }
    if req.runtime == Some(crate::model::RuntimeKind::Vm) && req.join_netns.is_some() {
        // Its agent keeps the pod roots' layers and volume copies under
        // the VM's /run, which a volume of its own could cover.
        return Err(SandboxError::bad(
            "invalid_volume",
            "a microVM pod's sandbox takes no volumes of its own: give them to its containers' roots",
        ));
    }
    if req.from_snapshot.is_some() {
        return Err(SandboxError::bad(
            "invalid_volume",
            "a fork keeps its snapshot's mounts: give volumes to a fresh create",
        ));
    }
    validated_volumes(&req.volumes)
}

/// Checks a CRI pod's namespace to join: a network namespace file, for a
/// sandbox made fresh (a fork keeps its snapshot's namespace setup).
pub fn validated_join_netns(req: &CreateRequest) -> Result<(), SandboxError> {
    let Some(path) = &req.join_netns else {
        return Ok(());
    };
    let bad = |message: String| SandboxError::bad("invalid_join_netns", message);
    if req.from_snapshot.is_some() {
        return Err(bad(
            "a fork cannot join a network namespace; create the sandbox fresh".into(),
        ));
    }
    if !path.is_absolute() {
        return Err(bad(format!(
            "join_netns: {} is not an absolute path to a network namespace file (such as /var/run/netns/NAME)",
            path.display()
        )));
    }
    crate::net::netns::open_foreign(path)
        .map(drop)
        .map_err(|why| {
            bad(format!(
                "join_netns: {why} (give a pod's, such as /var/run/netns/NAME)"
            ))
        })
}

/// Checks a hostname the create names: one to 63 of letters, digits, `-`
/// and `.`, neither first nor last a `-` or `.` (a Kubernetes pod's name
/// fits); for a sandbox made fresh (a fork keeps its snapshot's).
pub fn validated_hostname(req: &CreateRequest) -> Result<(), SandboxError> {
    let Some(name) = &req.hostname else {
        return Ok(());
    };
    let bad = |message: String| SandboxError::bad("invalid_hostname", message);
    if req.from_snapshot.is_some() {
        return Err(bad(
            "a fork keeps its snapshot's hostname; create without hostname".into(),
        ));
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c == '-' || c == '.');
    let valid = (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !edge(name.chars().next())
        && !edge(name.chars().last());
    if !valid {
        return Err(bad(format!(
            "{name:?} is not a hostname: use 1 to 63 of letters, digits, - and ., not starting or ending with - or ."
        )));
    }
    Ok(())
}

/// Checks host directories given as layers of a root (`field` names them
/// in errors): at most [`MAX_HOST_ROOTFS_LAYERS`], absolute, existing
/// directories, not symlinks.
pub fn validated_host_dirs(
    code: &'static str,
    field: &str,
    dirs: &[std::path::PathBuf],
) -> Result<(), SandboxError> {
    let bad = |message: String| SandboxError::bad(code, message);
    if dirs.len() > MAX_HOST_ROOTFS_LAYERS {
        return Err(bad(format!(
            "{field} stacks at most {MAX_HOST_ROOTFS_LAYERS} directories, got {}",
            dirs.len()
        )));
    }
    for dir in dirs {
        if !dir.is_absolute() {
            return Err(bad(format!(
                "{field}: {} is not an absolute path",
                dir.display()
            )));
        }
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(bad(format!(
                    "{field}: {} is not a directory (symlinks are not followed)",
                    dir.display()
                )))
            }
            Err(e) => {
                return Err(bad(format!("{field}: {}: {e}", dir.display())));
            }
        }
    }
    Ok(())
}

pub fn validated_ttl(ttl: i64) -> Result<i64, SandboxError> {
    if ttl == -1 || (1..=MAX_TTL_SECONDS).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(SandboxError::bad(
            "invalid_ttl",
            format!(
                "ttl_seconds must be -1 (no TTL) or between 1 and {MAX_TTL_SECONDS}, got {ttl}"
            ),
        ))
    }
}

pub fn validated_env(env: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    if env.len() > MAX_ENV {
        return Err(SandboxError::bad(
            "invalid_env",
            format!("at most {MAX_ENV} environment variables, got {}", env.len()),
        ));
    }
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(SandboxError::bad(
                "invalid_env",
                format!("environment variable {key:?}: names must be non-empty without '=' or NUL, values without NUL"),
            ));
        }
    }
    Ok(())
}

pub fn validated_labels(labels: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    if labels.len() > MAX_LABELS {
        return Err(SandboxError::bad(
            "invalid_labels",
            format!("at most {MAX_LABELS} labels, got {}", labels.len()),
        ));
    }
    for (key, value) in labels {
        if key.is_empty() || key.len() > 128 || value.len() > 1024 {
            return Err(SandboxError::bad(
                "invalid_labels",
                format!("label {key:?}: keys are 1-128 bytes, values at most 1024"),
            ));
        }
    }
    Ok(())
}

/// Normalises a path inside the sandbox. It must be absolute; `..` may not
/// climb above the sandbox's root. Symlinks are resolved inside the sandbox
/// by the agent, whose root is the sandbox's root.
pub fn sandbox_path(raw: &str) -> Result<String, SandboxError> {
    if raw.len() > MAX_PATH || raw.contains('\0') {
        return Err(SandboxError::bad(
            "invalid_path",
            format!("path must be at most {MAX_PATH} bytes without NUL"),
        ));
    }
    if !raw.starts_with('/') {
        return Err(SandboxError::bad(
            "invalid_path",
            format!("path {raw:?} must be absolute (start with /)"),
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(SandboxError::bad(
                        "path_escape",
                        format!("path {raw:?} climbs above the sandbox's root"),
                    ));
                }
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_creates_volumes_are_for_a_fresh_sandbox() {
        let code = |req: &CreateRequest| match validated_create_volumes(req) {
            Ok(()) => "ok",
            Err(SandboxError::BadRequest { code, .. }) => code,
            Err(e) => panic!("{e}"),
        };
        let volume = HostVolume {
            source: "/".into(),
            destination: "/host".into(),
            read_only: true,
        };
        let mut req = CreateRequest {
            volumes: vec![volume.clone()],
            ..Default::default()
        };
        assert_eq!(code(&req), "ok");
        req.runtime = Some(crate::model::RuntimeKind::Vm);
        assert_eq!(code(&req), "ok", "a microVM's are copied into its guest");
        req.join_netns = Some("/var/run/netns/cni-1".into());
        assert_eq!(code(&req), "invalid_volume", "a microVM pod's own");
        req.join_netns = None;
        req.runtime = None;
        req.from_snapshot = Some("snap-1".into());
        assert_eq!(code(&req), "invalid_volume");
        req.from_snapshot = None;
        req.volumes = vec![volume.clone(); MAX_VOLUMES + 1];
        assert_eq!(code(&req), "invalid_volume");
        req.volumes = vec![HostVolume {
            destination: "/etc".into(),
            ..volume.clone()
        }];
        assert_eq!(code(&req), "invalid_volume", "/etc holds /etc/hosts");
        let at = |destination: &str| HostVolume {
            destination: destination.into(),
            ..volume.clone()
        };
        for covering in ["/etc/ssl", "/etc/ssl/certs/ca-certificates.crt"] {
            assert!(validated_volumes_beside_secrets(&[at("/data"), at(covering)], true).is_err());
            assert!(validated_volumes_beside_secrets(&[at(covering)], false).is_ok());
        }
        assert!(validated_volumes_beside_secrets(&[at("/etc/ssl2")], true).is_ok());
        // None asked: nothing to refuse, whatever else the create is.
        req.volumes.clear();
        req.runtime = Some(crate::model::RuntimeKind::Vm);
        assert_eq!(code(&req), "ok");
    }

    #[test]
    fn paths_normalise_and_escapes_are_refused() {
        assert_eq!(sandbox_path("/tmp/./a//b/../c").expect("ok"), "/tmp/a/c");
        assert_eq!(sandbox_path("/").expect("ok"), "/");
        assert!(matches!(
            sandbox_path("../../etc/shadow"),
            Err(SandboxError::BadRequest { .. })
        ));
        assert!(matches!(
            sandbox_path("/tmp/../../etc/shadow"),
            Err(SandboxError::BadRequest {
                code: "path_escape",
                ..
            })
        ));
        assert!(sandbox_path("/a\0b").is_err());
    }

    #[test]
    fn ttl_bounds() {
        assert!(validated_ttl(-1).is_ok());
        assert!(validated_ttl(1).is_ok());
        assert!(validated_ttl(0).is_err());
        assert!(validated_ttl(-5).is_err());
        assert!(validated_ttl(i64::MAX).is_err());
    }

    #[test]
    fn absurd_limits_name_the_field() {
        let config = crate::config::Config::load(None, Default::default()).expect("defaults");
        let req = CreateRequest {
            memory_mib: Some(u64::MAX),
            ..Default::default()
        };
        let err = validated_limits(&req, &config).expect_err("absurd");
        assert!(err.to_string().contains("memory_mib"), "{err}");
        let req = CreateRequest {
            cpu: Some(-1.0),
            ..Default::default()
        };
        assert!(validated_limits(&req, &config)
            .expect_err("negative")
            .to_string()
            .contains("cpu"));
    }
}
