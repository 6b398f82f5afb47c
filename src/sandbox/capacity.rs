//! Host capacity and admission: what this worker can hold (from the config,
//! with overcommit ratios), what its sandboxes hold now, and the at-once 503
//! naming the short resource when a create does not fit, so a scheduler can
//! place it elsewhere.

use serde::{Deserialize, Serialize};

use super::{SandboxError, SandboxRecord};
use crate::config::Config;
use crate::model::{Limits, SandboxState};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Amount {
    pub total: f64,
    pub used: f64,
    pub free: f64,
}

impl Amount {
    pub fn new(total: f64, used: f64) -> Self {
        Self {
            total,
            used,
            free: (total - used).max(0.0),
        }
    }
}

/// `GET /v1/capacity`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// CPU cores (limits, after `cpu_overcommit`).
    pub cpu: Amount,
    pub memory_mib: Amount,
    pub disk_mib: Amount,
    pub sandboxes: Amount,
    /// Whole GPUs on this host and how many are held.
    #[serde(default)]
    pub gpus: Amount,
}

/// What the sandboxes hold: failed ones were torn down and hold nothing,
/// except those left running under a supervisor of another build.
fn holding<'a>(records: &[&'a SandboxRecord]) -> Vec<&'a Limits> {
    records
        .iter()
        .filter(|r| r.state != SandboxState::Failed || r.foreign_supervisor)
        .map(|r| &r.limits)
        .collect()
}

pub fn capacity(config: &Config, records: &[&SandboxRecord]) -> Capacity {
    let held = holding(records);
    let cpu: f64 = held.iter().map(|l| l.cpu).sum();
    let memory: u64 = held.iter().map(|l| l.memory_mib).sum();
    let disk: u64 = held.iter().map(|l| l.disk_mib).sum();
    Capacity {
        cpu: Amount::new(config.capacity_cpu, cpu),
        memory_mib: Amount::new(config.capacity_memory_mib as f64, memory as f64),
        disk_mib: Amount::new(config.capacity_disk_mib as f64, disk as f64),
        sandboxes: Amount::new(config.max_sandboxes as f64, held.len() as f64),
        gpus: Amount::default(),
    }
}

/// Refuses a create that does not fit, naming the first short resource.
pub fn admit(
    config: &Config,
    records: &[&SandboxRecord],
    want: &Limits,
) -> Result<(), SandboxError> {
    let now = capacity(config, records);
    let short = |resource: &'static str, want: f64, amount: &Amount, unit: &str| {
        SandboxError::Unavailable {
        resource,
        message: format!(
            "this host cannot take {want}{unit} more {resource} now ({} of {} free); try another host or later",
            amount.free, amount.total
        ),
    }
    };
    if now.sandboxes.free < 1.0 {
        return Err(SandboxError::Unavailable {
            resource: "sandboxes",
            message: format!(
                "this host already runs its maximum of {} sandboxes",
                config.max_sandboxes
            ),
        });
    }
    // A small epsilon keeps 0.1 + 0.2 from failing to fit 0.3.
    if want.cpu > now.cpu.free + 1e-9 {
        return Err(short("cpu", want.cpu, &now.cpu, " cores"));
    }
    if want.memory_mib as f64 > now.memory_mib.free {
        return Err(short(
            "memory",
            want.memory_mib as f64,
            &now.memory_mib,
            " MiB",
        ));
    }
    if want.disk_mib as f64 > now.disk_mib.free {
        return Err(short("disk", want.disk_mib as f64, &now.disk_mib, " MiB"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigOverrides;

    fn record(cpu: f64, memory_mib: u64, state: SandboxState) -> SandboxRecord {
        SandboxRecord {
            id: "sb-x".into(),
            state,
            runtime: crate::model::RuntimeKind::Container,
            image: "busybox".into(),
            image_digest: String::new(),
            limits: Limits {
                cpu,
                memory_mib,
                disk_mib: 1024,
                pids: 64,
                cpu_shares: None,
            },
            ttl_seconds: 60,
            expires_at_ms: None,
            created_at: String::new(),
            labels: Default::default(),
            env: Default::default(),
            cgroups_path: String::new(),
            supervisor_pid: 0,
            init_pid: 0,
            oom_kills: 0,
            failure: None,
            pooled: false,
            claiming: false,
            supervisor_events_seen: 0,
            gpus: Vec::new(),
            usage: Default::default(),
            idempotency_key: None,
            request_digest: None,
            network: Default::default(),
            base_snapshot: None,
            vm_uid: None,
            secrets: Vec::new(),
            ports: Vec::new(),
            process_user: None,
            foreign_supervisor: false,
            host_rootfs: Vec::new(),
            join_netns: None,
            hostname: None,
            volumes: Vec::new(),
        }
    }

    fn config() -> Config {
        Config::load(
            None,
            ConfigOverrides {
                capacity_cpu: Some(2.0),
                capacity_memory_mib: Some(1024),
                max_sandboxes: Some(3),
                max_cpu: Some(2.0),
                max_memory_mib: Some(1024),
                default_cpu: Some(1.0),
                default_memory_mib: Some(256),
                ..Default::default()
            },
        )
        .expect("config")
    }

    #[test]
    fn refuses_the_short_resource_and_ignores_failed_sandboxes() {
        let config = config();
        let a = record(1.5, 256, SandboxState::Ready);
        let dead = record(2.0, 1024, SandboxState::Failed);
        let want = |cpu, memory_mib| Limits {
            cpu,
            memory_mib,
            disk_mib: 1024,
            pids: 64,
            cpu_shares: None,
        };
        assert!(admit(&config, &[&a, &dead], &want(0.5, 256)).is_ok());
        match admit(&config, &[&a], &want(1.0, 256)) {
            Err(SandboxError::Unavailable { resource, .. }) => assert_eq!(resource, "cpu"),
            other => panic!("{other:?}"),
        }
        match admit(&config, &[&a], &want(0.1, 1000)) {
            Err(SandboxError::Unavailable { resource, .. }) => assert_eq!(resource, "memory"),
            other => panic!("{other:?}"),
        }
        let b = record(0.1, 16, SandboxState::Ready);
        let c = record(0.1, 16, SandboxState::Creating);
        match admit(&config, &[&a, &b, &c], &want(0.1, 16)) {
            Err(SandboxError::Unavailable { resource, .. }) => assert_eq!(resource, "sandboxes"),
            other => panic!("{other:?}"),
        }
        let view = capacity(&config, &[&a, &dead]);
        assert_eq!(view.cpu.used, 1.5);
        assert_eq!(view.sandboxes.used, 1.0);
    }

    #[test]
    fn a_failed_sandbox_left_running_under_a_foreign_supervisor_still_holds() {
        let config = config();
        let a = record(1.5, 256, SandboxState::Ready);
        let mut foreign = record(0.5, 256, SandboxState::Failed);
        foreign.foreign_supervisor = true;
        let view = capacity(&config, &[&a, &foreign]);
        assert_eq!(view.cpu.used, 2.0);
        assert_eq!(view.sandboxes.used, 2.0);
        let want = Limits {
            cpu: 0.5,
            memory_mib: 16,
            disk_mib: 1024,
            pids: 64,
            cpu_shares: None,
        };
        match admit(&config, &[&a, &foreign], &want) {
            Err(SandboxError::Unavailable { resource, .. }) => assert_eq!(resource, "cpu"),
            other => panic!("{other:?}"),
        }
    }
}
