//! The roots of a pod's containers inside one sandbox (`POST
//! /v1/sandboxes/{id}/roots`, `DELETE .../roots/{name}`): validated here,
//! made by the sandbox's supervisor and attached by its agent (see
//! `runtime::pod_roots`). Processes name a root to run in it.

use std::path::PathBuf;

use super::manager::not_running;
use super::validate::{checked_cpu_shares, validated_host_dirs, validated_volumes};
use super::{Manager, SandboxError};
use crate::config::Config;
use crate::model::{HostVolume, RootLimits, RuntimeKind, SandboxStats};
use crate::runtime::cgroups::{self, Layout, RootLimits as RootCgroupLimits, SandboxCgroups};
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

/// The smallest memory ceiling of one container of a pod.
const MIN_ROOT_MEMORY_MIB: u64 = 4;

/// Checks a root's own ceilings against what the daemon allows one
/// sandbox, and spells them as its cgroup does. They may be above the
/// sandbox's own, as a Kubernetes container's may be above what its pod
/// got: the root's group sits under the sandbox's, whose ceilings still
/// bound the whole pod.
pub fn validated_root_limits(
    limits: &RootLimits,
    config: &Config,
) -> Result<RootCgroupLimits, SandboxError> {
    let cpu_quota_us = match limits.cpu {
        None => None,
        Some(cpu) if cpu.is_finite() && cpu >= 0.01 && cpu <= config.max_cpu => Some(
            crate::runtime::spec::cpu_quota_us(cpu)
                .map_err(|e| SandboxError::bad("invalid_cpu", e.to_string()))?,
        ),
        Some(cpu) => {
            return Err(SandboxError::bad(
                "invalid_cpu",
                format!(
                    "limits.cpu must be between 0.01 and {} cores, got {cpu}",
                    config.max_cpu
                ),
            ))
        }
    };
    let memory_bytes = match limits.memory_mib {
        None => None,
        Some(mib) if (MIN_ROOT_MEMORY_MIB..=config.max_memory_mib).contains(&mib) => {
            Some(mib << 20)
        }
        Some(mib) => {
            return Err(SandboxError::bad(
                "invalid_memory",
                format!(
                    "limits.memory_mib must be between {MIN_ROOT_MEMORY_MIB} and {}, got {mib}",
                    config.max_memory_mib
                ),
            ))
        }
    };
    let pids_max = match limits.pids {
        None => None,
        Some(pids) if (1..=config.max_pids).contains(&pids) => {
            Some(i64::try_from(pids).unwrap_or(i64::MAX))
        }
        Some(pids) => {
            return Err(SandboxError::bad(
                "invalid_pids",
                format!(
                    "limits.pids must be between 1 and {}, got {pids}",
                    config.max_pids
                ),
            ))
        }
    };
    Ok(RootCgroupLimits {
        cpu_quota_us,
        memory_bytes,
        pids_max,
        cpu_shares: limits.cpu_shares.map(checked_cpu_shares).transpose()?,
        oom_group: limits.oom_group,
    })
}

impl Manager {
    /// Makes root `name` of sandbox `id` on the host directories `layers`
    /// (top first), owned by host ids and shown idmapped, with ceilings of
    /// its own (under the sandbox's) when `limits` are given and host
    /// `volumes` bound in.
    pub async fn attach_root(
        &self,
        id: &str,
        name: &str,
        layers: Vec<PathBuf>,
        limits: Option<&RootLimits>,
        volumes: Vec<HostVolume>,
    ) -> Result<(), SandboxError> {
        validated_root_name(name)?;
        if layers.is_empty() {
            return Err(SandboxError::bad(
                "invalid_host_rootfs",
                "host_rootfs names no directory; give the root's layers, top first",
            ));
        }
        validated_host_dirs("invalid_host_rootfs", "host_rootfs", &layers)?;
        validated_volumes(&volumes)?;
        let record = self.ready(id)?;
        let disk = match record.runtime {
            RuntimeKind::Container => None,
            RuntimeKind::Vm if record.join_netns.is_none() => {
                return Err(SandboxError::bad(
                    "roots_unsupported",
                    "a microVM takes container roots when it is a CRI pod's (created with join_netns); this one has one root",
                ))
            }
            RuntimeKind::Vm => Some(self.root_disk(layers.clone()).await?),
        };
        let limits = limits
            .map(|l| validated_root_limits(l, &self.config))
            .transpose()?;
        // A microVM's guest runs cgroup v2 whatever the host does.
        if limits.is_some_and(|l| l.oom_group)
            && record.runtime == RuntimeKind::Container
            && Layout::detect() == Layout::V1
        {
            return Err(SandboxError::bad(
                "oom_group_unsupported",
                "limits.oom_group is cgroup v2's memory.oom.group, and this host runs cgroup v1: leave it out (an OOM kill then ends one process of the root)",
            ));
        }
        let mut client = self.connect(id).await?;
        match client
            .attach_root(name, layers, limits, disk, volumes)
            .await
        {
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

    /// A microVM root's layers as one read-only ext4 disk, made once while
    /// their contents stay the same (as a task's own root is).
    async fn root_disk(&self, layers: Vec<PathBuf>) -> Result<PathBuf, SandboxError> {
        let dir = self
            .config
            .images_dir
            .join(crate::image::flatten::LAYERED_DISKS);
        tokio::task::spawn_blocking(move || {
            crate::image::host_ext4::ensure_host_ext4(&layers, &dir)
        })
        .await
        .map_err(SandboxError::internal)?
        .map_err(|e| SandboxError::bad("invalid_host_rootfs", e.to_string()))
    }

    /// What limited root `name` of sandbox `id` uses now, read from its own
    /// group (a microVM's in its guest, by its agent); its limits are the
    /// lower of its own and the sandbox's. A root without limits has no
    /// group: 404 `root_not_limited`.
    pub async fn root_stats(&self, id: &str, name: &str) -> Result<SandboxStats, SandboxError> {
        validated_root_name(name)?;
        let record = self.ready(id)?;
        let not_limited = || SandboxError::NotFound {
            code: "root_not_limited",
            message: format!(
                "sandbox {id} has no root {name:?} with limits of its own; a root without them \
                 counts in the sandbox's stats"
            ),
        };
        // Its own ceilings, `u64::MAX` where it has none.
        let own = if record.runtime == RuntimeKind::Vm {
            let mut client = self.connect(id).await?;
            let usage = match client.guest_root_usage(name).await {
                Ok(usage) => usage,
                Err(CallError::Connect(e)) => return Err(not_running(id, e)),
                Err(CallError::Refused(e)) if e.kind == SupervisorErrorKind::UnknownRoot => {
                    return Err(not_limited())
                }
                Err(e) => return Err(e.into()),
            };
            SandboxStats {
                cpu_seconds: usage.cpu_usec as f64 / 1e6,
                memory_bytes: usage.memory_bytes,
                memory_limit_bytes: usage.memory_max.unwrap_or(u64::MAX),
                pids: usage.pids,
                pids_limit: usage.pids_max.unwrap_or(u64::MAX),
                oom_kills: usage.oom_kills,
            }
        } else {
            let group = format!(
                "{}/{}",
                record.cgroups_path.trim_end_matches('/'),
                cgroups::root_group(name)
            );
            let cgroups = SandboxCgroups::new(Layout::detect(), &group);
            if record.runtime != RuntimeKind::Container || !cgroups.exists() {
                return Err(not_limited());
            }
            SandboxStats {
                cpu_seconds: cgroups.cpu_seconds().unwrap_or(0.0),
                memory_bytes: cgroups.memory_bytes().unwrap_or(0),
                memory_limit_bytes: cgroups.memory_limit_bytes().unwrap_or(u64::MAX),
                pids: cgroups.pids_current().unwrap_or(0),
                pids_limit: cgroups.pids_max().unwrap_or(u64::MAX),
                oom_kills: cgroups.oom_kills(),
            }
        };
        Ok(SandboxStats {
            memory_limit_bytes: own
                .memory_limit_bytes
                .min(record.limits.memory_mib * 1024 * 1024),
            pids_limit: own.pids_limit.min(record.limits.pids),
            ..own
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigOverrides;

    #[test]
    fn a_roots_limits_are_checked_and_spelled_as_its_cgroup_does() {
        let config = Config::load(None, ConfigOverrides::default()).expect("config");
        let limits = RootLimits {
            cpu: Some(0.5),
            memory_mib: Some(64),
            pids: Some(32),
            cpu_shares: Some(2),
            oom_group: true,
        };
        assert_eq!(
            validated_root_limits(&limits, &config).expect("valid"),
            RootCgroupLimits {
                cpu_quota_us: Some(50_000),
                memory_bytes: Some(64 << 20),
                pids_max: Some(32),
                cpu_shares: Some(2),
                oom_group: true,
            }
        );
        assert_eq!(
            validated_root_limits(&RootLimits::default(), &config).expect("valid"),
            RootCgroupLimits::default()
        );
        let refused = |limits: RootLimits| match validated_root_limits(&limits, &config) {
            Err(SandboxError::BadRequest { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        let memory = |mib| RootLimits {
            memory_mib: Some(mib),
            ..Default::default()
        };
        assert_eq!(refused(memory(3)), "invalid_memory");
        assert_eq!(refused(memory(config.max_memory_mib + 1)), "invalid_memory");
        assert_eq!(
            refused(RootLimits {
                cpu: Some(f64::NAN),
                ..Default::default()
            }),
            "invalid_cpu"
        );
        assert_eq!(
            refused(RootLimits {
                pids: Some(0),
                ..Default::default()
            }),
            "invalid_pids"
        );
        for shares in [0, 1, 262_145] {
            assert_eq!(
                refused(RootLimits {
                    cpu_shares: Some(shares),
                    ..Default::default()
                }),
                "invalid_cpu_shares"
            );
        }
    }
}
