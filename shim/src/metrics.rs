//! sandboxd's stats of a sandbox (`GET /v1/sandboxes/{id}/stats`) as the
//! cgroup v1 `Metrics` message containerd decodes for `ctr task metrics`
//! and CRI's container stats. Only what sandboxd measures is filled in:
//! CPU time, memory in use and its limit, tasks and their limit, OOM kills.
//! Memory is the cgroup's charge, page cache included, so a kubelet's
//! working set reads high by the inactive file pages.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryOomControl, MemoryStat, Metrics, PidsStat,
};
use containerd_shim::protos::protobuf::MessageField;
use serde_json::Value;

/// The type URL containerd registers the v1 metrics under.
pub const TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";

pub fn from_stats(stats: &Value) -> Metrics {
    let number = |key: &str| stats[key].as_u64().unwrap_or(0);
    let cpu_ns = (stats["cpu_seconds"].as_f64().unwrap_or(0.0) * 1e9) as u64;
    Metrics {
        cpu: MessageField::some(CPUStat {
            usage: MessageField::some(CPUUsage {
                total: cpu_ns,
                ..Default::default()
            }),
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            usage: MessageField::some(MemoryEntry {
                usage: number("memory_bytes"),
                limit: number("memory_limit_bytes"),
                ..Default::default()
            }),
            hierarchical_memory_limit: number("memory_limit_bytes"),
            ..Default::default()
        }),
        pids: MessageField::some(PidsStat {
            current: number("pids"),
            limit: number("pids_limit"),
            ..Default::default()
        }),
        memory_oom_control: MessageField::some(MemoryOomControl {
            oom_kill: number("oom_kills"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandboxd_stats_fill_the_v1_fields_containerd_reads() {
        let m = from_stats(&json!({
            "cpu_seconds": 1.5, "memory_bytes": 4096, "memory_limit_bytes": 8192,
            "pids": 3, "pids_limit": 64, "oom_kills": 1
        }));
        assert_eq!(m.cpu.usage.total, 1_500_000_000);
        assert_eq!((m.memory.usage.usage, m.memory.usage.limit), (4096, 8192));
        assert_eq!((m.pids.current, m.pids.limit), (3, 64));
        assert_eq!(m.memory_oom_control.oom_kill, 1);
    }
}
