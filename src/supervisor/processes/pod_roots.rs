//! A pod's container roots inside its one sandbox: made and attached on
//! the host for a container (`runtime::pod_roots`), or as disks its agent
//! mounts in a microVM, each with a group of its own when it has limits,
//! and detached again with the processes started in it; a microVM root's
//! use, read by its agent.

use std::time::Duration;

use sandbox_proto::{ErrorKind, GuestRootUsage, Reply, RequestBody};

use super::{err, unexpected_guest_reply, Supervisor, GUEST_COUNT_DEADLINE};
use crate::model::ProcessState;
use crate::runtime::sandbox::ProcessControl;
use crate::supervisor::protocol::{SupervisorError, SupervisorErrorKind};

/// A root's ceilings as a microVM's agent keeps them; a negative one (the
/// daemon never sends it) is refused rather than dropped.
fn guest_root_limits(
    limits: crate::runtime::cgroups::RootLimits,
) -> Result<sandbox_proto::GuestRootLimits, SupervisorError> {
    let positive = |what: &str, value: i64| {
        u64::try_from(value).map_err(|_| {
            err(
                SupervisorErrorKind::InvalidInput,
                format!("a root's {what} limit must not be negative, got {value}"),
            )
        })
    };
    Ok(sandbox_proto::GuestRootLimits {
        cpu_quota_us: limits
            .cpu_quota_us
            .map(|q| positive("CPU quota", q))
            .transpose()?,
        cpu_period_us: crate::runtime::spec::CPU_PERIOD_US,
        memory_bytes: limits.memory_bytes,
        pids_max: limits.pids_max.map(|p| positive("pids", p)).transpose()?,
        cpu_weight: limits
            .cpu_shares
            .map(crate::runtime::cgroups::cpu_weight_of_shares),
        oom_group: limits.oom_group,
    })
}

/// How long a microVM root's detach waits for each of its killed
/// processes to exit before the agent unmounts it.
const GUEST_ROOT_EXIT_WAIT: Duration = Duration::from_secs(5);

impl Supervisor {
    /// The lock over pod container roots, once the sandbox is known to be
    /// live.
    async fn roots_held(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, SupervisorError> {
        let held = self.roots.lock().await;
        self.ensure_live()?;
        Ok(held)
    }

    pub(super) fn limited_roots(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.limited_roots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn limited_guest_roots(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.limited_guest_roots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn roots_with_volumes(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.roots_with_volumes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes limited root `name`'s (empty) group; once none is left, a v2
    /// sandbox's group takes its controllers and agent back.
    fn forget_limited_root(&self, name: &str) {
        let none_left = {
            let mut limited = self.limited_roots();
            if !limited.remove(name) {
                return;
            }
            limited.is_empty()
        };
        self.cgroups.remove_root_group(name);
        if none_left {
            if let Err(e) = self.cgroups.take_controllers_back() {
                tracing::warn!("the sandbox's cgroup keeps handing controllers down: {e}");
            }
        }
    }

    /// Makes pod container root `name` on `layers`, with its own group under
    /// the sandbox's when it has `limits`, and attaches it inside the
    /// sandbox (see `runtime::pod_roots`).
    pub async fn attach_root(
        &self,
        name: String,
        layers: Vec<std::path::PathBuf>,
        limits: Option<crate::runtime::cgroups::RootLimits>,
        disk: Option<std::path::PathBuf>,
        volumes: Vec<crate::model::HostVolume>,
    ) -> Result<(), SupervisorError> {
        if self.process_control() == ProcessControl::GuestAgent {
            return self.attach_guest_root(name, disk, limits, volumes).await;
        }
        let _roots = self.roots_held().await?;
        let has_volumes = !volumes.is_empty();
        let (spec, paths, made_name) = (self.config.spec.clone(), self.paths.clone(), name.clone());
        let mount = tokio::task::spawn_blocking(move || {
            crate::runtime::pod_roots::make(&spec, &paths, &made_name, &layers, &volumes)
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
        .map_err(|e| match e {
            crate::runtime::pod_roots::PodRootError::Exists(_) => {
                err(SupervisorErrorKind::Conflict, e.to_string())
            }
            // A layer that cannot be idmapped (its filesystem, or it went
            // since validation) is the caller's to fix, as is a volume the
            // image has no place for.
            crate::runtime::pod_roots::PodRootError::Volume { ref source, .. }
                if !source.is_callers() =>
            {
                err(SupervisorErrorKind::Internal, e.to_string())
            }
            crate::runtime::pod_roots::PodRootError::Idmap { .. }
            | crate::runtime::pod_roots::PodRootError::Volume { .. } => {
                err(SupervisorErrorKind::InvalidInput, e.to_string())
            }
            e => err(SupervisorErrorKind::Internal, e.to_string()),
        })?;
        if let Some(limits) = limits {
            let (cgroups, group_name) = (self.cgroups.clone(), name.clone());
            let grouped = tokio::task::spawn_blocking(move || {
                cgroups.create_root_group(&group_name, &limits)
            })
            .await
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))
            .and_then(|made| {
                made.map_err(|e| {
                    err(
                        SupervisorErrorKind::Internal,
                        format!("making the root's limited cgroup: {e}"),
                    )
                })
            });
            if let Err(e) = grouped {
                let _ = crate::runtime::pod_roots::remove(&self.config.spec, &name);
                return Err(e);
            }
            self.limited_roots().insert(name.clone());
        }
        let (init_pid, attach_name) = (self.init_pid, name.clone());
        let attached = tokio::task::spawn_blocking(move || {
            crate::runtime::pod_roots::attach(init_pid, &attach_name, &mount)
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        let refused = match attached {
            Ok(()) => {
                if has_volumes {
                    self.roots_with_volumes().insert(name);
                }
                return Ok(());
            }
            // Something in the sandbox holds the name's place there.
            Err(e @ crate::runtime::pod_roots::PodRootError::Exists(_)) => {
                err(SupervisorErrorKind::Conflict, e.to_string())
            }
            Err(e @ crate::runtime::pod_roots::PodRootError::UnsafeTarget { .. }) => {
                err(SupervisorErrorKind::InvalidInput, e.to_string())
            }
            Err(e) => err(SupervisorErrorKind::Internal, e.to_string()),
        };
        // The writable layer was this attach's own (make claimed the name).
        let _ = crate::runtime::pod_roots::remove(&self.config.spec, &name);
        self.forget_limited_root(&name);
        Err(refused)
    }

    fn guest_root_slots(&self) -> std::sync::MutexGuard<'_, Vec<Option<String>>> {
        self.guest_root_slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a free slot for root `name`; its disk number.
    fn claim_guest_root_slot(&self, name: &str) -> Result<usize, SupervisorError> {
        let mut slots = self.guest_root_slots();
        if slots.iter().flatten().any(|held| held == name) {
            return Err(err(
                SupervisorErrorKind::Conflict,
                format!("container root {name:?} is attached already"),
            ));
        }
        let total = slots.len();
        let Some(free) = slots.iter().position(Option::is_none) else {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                format!("the microVM's {total} root slots are all in use: a microVM pod holds at most {total} containers besides its sandbox"),
            ));
        };
        slots[free] = Some(name.to_owned());
        Ok(crate::runtime::microvm::FIRST_ROOT_SLOT_DISK + free)
    }

    fn free_guest_root_slot(&self, disk_number: usize) {
        if let Some(slot) = self
            .guest_root_slots()
            .get_mut(disk_number - crate::runtime::microvm::FIRST_ROOT_SLOT_DISK)
        {
            *slot = None;
        }
    }

    /// A microVM's root: `disk` into a free slot, mounted by the agent,
    /// with `limits` kept by the agent's group for it.
    async fn attach_guest_root(
        &self,
        name: String,
        disk: Option<std::path::PathBuf>,
        limits: Option<crate::runtime::cgroups::RootLimits>,
        volumes: Vec<crate::model::HostVolume>,
    ) -> Result<(), SupervisorError> {
        let _roots = self.roots_held().await?;
        let Some(disk) = disk else {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "a microVM's container root comes as an ext4 disk, not as host directories",
            ));
        };
        let limits = limits.map(guest_root_limits).transpose()?;
        // Copied before the disk takes a slot: a volume too large to copy
        // costs the guest nothing else.
        let mut guest_volumes = Vec::with_capacity(volumes.len());
        for volume in volumes {
            let (key, within) = self.copy_volume_into_guest(&volume).await?;
            guest_volumes.push(sandbox_proto::GuestVolume {
                key,
                destination: volume.destination,
                read_only: volume.read_only,
                within,
            });
        }
        let limited = limits.is_some();
        let disk_number = self.claim_guest_root_slot(&name)?;
        let paths = self.paths.clone();
        let put = tokio::task::spawn_blocking(move || {
            crate::runtime::microvm::attach_disk(&paths, disk_number, &disk)
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))
        .and_then(|put| put.map_err(|e| err(SupervisorErrorKind::Internal, e.to_string())));
        let sectors = match put {
            Ok(sectors) => sectors,
            Err(e) => {
                // The VMM may have taken the disk before the answer was
                // lost: empty the slot (an empty one answers as well).
                self.empty_guest_root_slot(disk_number).await;
                return Err(e);
            }
        };
        let mounted = self
            .agent(RequestBody::MountRoot {
                name: name.clone(),
                disk_id: format!("disk{disk_number}"),
                sectors,
                limits,
                volumes: guest_volumes,
            })
            .await;
        let refused = match mounted {
            Ok(Reply::Ok) => {
                if limited {
                    self.limited_guest_roots().insert(name);
                }
                return Ok(());
            }
            Ok(Reply::Error(e)) => err(
                match e.kind {
                    ErrorKind::AlreadyExists => SupervisorErrorKind::Conflict,
                    ErrorKind::InvalidInput => SupervisorErrorKind::InvalidInput,
                    _ => SupervisorErrorKind::Internal,
                },
                e.message,
            ),
            Ok(other) => unexpected_guest_reply("a root's mount", other),
            Err(e) => e,
        };
        self.empty_guest_root_slot(disk_number).await;
        Err(refused)
    }

    /// Empties a slot in the VMM and frees it here; a slot the VMM would
    /// not empty stays taken, so no later root meets its old disk.
    async fn empty_guest_root_slot(&self, disk_number: usize) {
        let paths = self.paths.clone();
        let emptied = tokio::task::spawn_blocking(move || {
            crate::runtime::microvm::detach_disk(&paths, disk_number)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        match emptied {
            Ok(()) => self.free_guest_root_slot(disk_number),
            Err(e) => tracing::warn!("disk slot {disk_number} stays in use: {e}"),
        }
    }

    /// A microVM's root: its processes killed, unmounted by the agent, its
    /// slot emptied.
    async fn detach_guest_root(&self, name: String) -> Result<(), SupervisorError> {
        let _roots = self.roots_held().await?;
        let Some(disk_number) = self
            .guest_root_slots()
            .iter()
            .position(|held| held.as_deref() == Some(name.as_str()))
            .map(|slot| crate::runtime::microvm::FIRST_ROOT_SLOT_DISK + slot)
        else {
            return Err(err(
                SupervisorErrorKind::UnknownRoot,
                format!("no container root named {name:?} is attached"),
            ));
        };
        // Ended ones too: the agent kills through an ended process's guest
        // group what it left running there.
        let started_there: Vec<u64> = self
            .procs()
            .iter()
            .filter(|(_, entry)| entry.root.as_deref() == Some(name.as_str()))
            .map(|(id, _)| *id)
            .collect();
        for &proc in &started_there {
            self.kill(proc).await?;
        }
        // Their files on the root's disk close as they exit; the agent then
        // finds the disk free (it answers an error while it is held, and the
        // slot stays taken rather than meet a later root's disk).
        for proc in started_there {
            let _ = self.wait(proc, GUEST_ROOT_EXIT_WAIT).await;
        }
        match self
            .agent(RequestBody::UnmountRoot { name: name.clone() })
            .await?
        {
            Reply::Ok => {}
            // Its mount failed half way and was undone: only the slot is left.
            Reply::Error(e) if e.kind == ErrorKind::NotFound => {}
            Reply::Error(e) => return Err(err(SupervisorErrorKind::Internal, e.message)),
            other => return Err(unexpected_guest_reply("a root's unmount", other)),
        }
        // The agent removed its group with it.
        self.limited_guest_roots().remove(&name);
        self.empty_guest_root_slot(disk_number).await;
        Ok(())
    }

    /// Kills what runs in pod container root `name`, unmounts it inside
    /// the sandbox and removes its writable layer.
    pub async fn detach_root(&self, name: String) -> Result<(), SupervisorError> {
        if self.process_control() == ProcessControl::GuestAgent {
            return self.detach_guest_root(name).await;
        }
        let _roots = self.roots_held().await?;
        // Every process started there, ended or not: an ended one's cgroup
        // still holds what it left running in the background.
        let (mut running, mut ended) = (Vec::new(), Vec::new());
        for (id, entry) in self.procs().iter() {
            if entry.root.as_deref() == Some(name.as_str()) {
                if entry.info.state == ProcessState::Running {
                    running.push(*id);
                } else {
                    ended.push(*id);
                }
            }
        }
        for proc in running {
            self.kill(proc).await?;
        }
        let cgroups = self.cgroups.clone();
        let limited = self.limited_roots().contains(&name);
        let group_name = name.clone();
        tokio::task::spawn_blocking(move || {
            if limited {
                // The whole group: what processes forgotten since left
                // running there too.
                return cgroups.kill_root_group(&group_name);
            }
            for proc in ended {
                // A group already gone has nothing left to kill.
                let _ = cgroups.kill_process_group(proc, None);
            }
            Ok(())
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
        .map_err(|e| {
            err(
                SupervisorErrorKind::Internal,
                format!("ending the root's processes: {e}"),
            )
        })?;
        self.forget_limited_root(&name);
        self.roots_with_volumes().remove(&name);
        let (init_pid, spec) = (self.init_pid, self.config.spec.clone());
        tokio::task::spawn_blocking(move || {
            let detached = crate::runtime::pod_roots::detach(init_pid, &name);
            // A root whose attach failed half way has a writable layer only.
            let had_layer = crate::runtime::pod_roots::writable_dir(&spec, &name).exists();
            crate::runtime::pod_roots::remove(&spec, &name)?;
            match detached {
                Err(crate::runtime::pod_roots::PodRootError::Missing(_)) if had_layer => Ok(()),
                other => other,
            }
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?
        .map_err(|e| match e {
            crate::runtime::pod_roots::PodRootError::Missing(_) => {
                err(SupervisorErrorKind::UnknownRoot, e.to_string())
            }
            e => err(SupervisorErrorKind::Internal, e.to_string()),
        })
    }

    /// What a microVM's container root `name` uses, read by its agent from
    /// the root's own group; `UnknownRoot` for a root without one.
    pub async fn guest_root_usage(&self, name: &str) -> Result<GuestRootUsage, SupervisorError> {
        let what = format!("container root {name:?}'s use");
        // Answered here, so a root without limits never waits on a busy
        // guest (its container's stats are then the pod's); a container
        // sandbox is refused by `guest_call`.
        let guest = self.process_control() == ProcessControl::GuestAgent;
        if guest && !self.limited_guest_roots().contains(name) {
            return Err(err(
                SupervisorErrorKind::UnknownRoot,
                format!("no container root {name:?} with limits of its own is attached"),
            ));
        }
        let request = RequestBody::RootUsage {
            name: name.to_owned(),
        };
        let unknown = Some(SupervisorErrorKind::UnknownRoot);
        match self
            .guest_call(&what, request, GUEST_COUNT_DEADLINE, unknown)
            .await?
        {
            Reply::RootUsage(usage) => Ok(usage),
            other => Err(unexpected_guest_reply(&what, other)),
        }
    }
}
