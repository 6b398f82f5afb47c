//! Prometheus metrics (text exposition format) at `/metrics` on the API
//! socket and, when `metrics_address` is set, on TCP: sandboxes by state,
//! create latency by phase, failures by reason, OOM kills, TTL expiries,
//! process starts, egress verdicts, and per-sandbox CPU and memory.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::model::RuntimeKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
    runtime: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
    runtime: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolClaimLabels {
    runtime: String,
    image: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandOverLabels {
    via: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SecretLabels {
    secret: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    sandbox: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateCreateLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: String,
}

type PhaseHistograms = Family<PhaseLabels, Histogram, fn() -> Histogram>;

fn phase_histogram() -> Histogram {
    // 0.25 ms .. ~8 s
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    sandboxes: Family<StateLabels, Gauge>,
    create_phase_seconds: PhaseHistograms,
    create_failures: Family<ReasonLabels, Counter>,
    pool_claims: Family<PoolClaimLabels, Counter>,
    pool_hand_overs: Family<HandOverLabels, Counter>,
    boot_template_creates: Family<TemplateCreateLabels, Counter>,
    boot_templates: Gauge,
    oom_kills: Counter,
    ttl_expiries: Counter,
    process_starts: Counter,
    egress_connections: Family<VerdictLabels, Counter>,
    egress_limited: Family<LimitLabels, Counter>,
    egress_throttled_seconds: Counter<f64, AtomicU64>,
    secret_substitutions: Family<SecretLabels, Counter>,
    sandbox_cpu_seconds: Family<SandboxLabels, Gauge<f64, AtomicU64>>,
    sandbox_memory_bytes: Family<SandboxLabels, Gauge>,
    ingress_requests: Family<StatusLabels, Counter>,
    ingress_bytes: Family<DirectionLabels, Counter>,
    /// Serialises scrapes: the state gauges are rebuilt on each one.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sandboxd");
        let sandboxes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "sandboxes",
            "Sandboxes by state and runtime",
            sandboxes.clone(),
        );
        let create_phase_seconds: PhaseHistograms = Family::new_with_constructor(phase_histogram);
        registry.register(
            "create_phase_seconds",
            "Time spent in each phase of a cold sandbox create",
            create_phase_seconds.clone(),
        );
        let create_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "create_failures",
            "Creates that failed, by reason",
            create_failures.clone(),
        );
        let pool_claims = Family::<PoolClaimLabels, Counter>::default();
        registry.register(
            "pool_claims",
            "Creates of a warm-pooled image, by result: hit (served from the pool), empty (none ready), unfit (limits above the pooled ones, or GPUs)",
            pool_claims.clone(),
        );
        let pool_hand_overs = Family::<HandOverLabels, Counter>::default();
        registry.register(
            "pool_hand_overs",
            "Pool claims that changed what a pooled sandbox's supervisor holds, by how it was told: mailbox (posted, taken before its next request), request (a HandOver round trip: a microVM's pids limit, no mailbox, or a post that failed)",
            pool_hand_overs.clone(),
        );
        let boot_template_creates = Family::<TemplateCreateLabels, Counter>::default();
        registry.register(
            "vm_boot_template_creates",
            "MicroVM creates a boot template could serve, by result: hit (forked from the template), miss (none yet: booted, and a template made after), failed (the fork failed: the template was dropped and the VM booted)",
            boot_template_creates.clone(),
        );
        let boot_templates = Gauge::default();
        registry.register(
            "vm_boot_templates",
            "MicroVM boot templates ready to fork",
            boot_templates.clone(),
        );
        let oom_kills = Counter::default();
        registry.register(
            "oom_kills",
            "Processes killed by the OOM killer",
            oom_kills.clone(),
        );
        let ttl_expiries = Counter::default();
        registry.register(
            "ttl_expiries",
            "Sandboxes ended by their TTL",
            ttl_expiries.clone(),
        );
        let process_starts = Counter::default();
        registry.register(
            "process_starts",
            "Processes started in sandboxes",
            process_starts.clone(),
        );
        let egress_connections = Family::<VerdictLabels, Counter>::default();
        registry.register(
            "egress_connections",
            "Outbound connections by verdict (allowed, refused)",
            egress_connections.clone(),
        );
        let secret_substitutions = Family::<SecretLabels, Counter>::default();
        registry.register(
            "secret_substitutions",
            "Intercepted requests a brokered secret's value was put into, by secret name",
            secret_substitutions.clone(),
        );
        let egress_limited = Family::<LimitLabels, Counter>::default();
        registry.register(
            "egress_limited",
            "Connections and DNS queries refused by a per-sandbox cap (connections, dns_qps)",
            egress_limited.clone(),
        );
        let egress_throttled_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "egress_throttled_seconds",
            "Time egress proxies paused connections to hold the per-sandbox bandwidth cap",
            egress_throttled_seconds.clone(),
        );
        let sandbox_cpu_seconds = Family::<SandboxLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "sandbox_cpu_seconds",
            "CPU time used by each sandbox",
            sandbox_cpu_seconds.clone(),
        );
        let sandbox_memory_bytes = Family::<SandboxLabels, Gauge>::default();
        registry.register(
            "sandbox_memory_bytes",
            "Memory charged to each sandbox now",
            sandbox_memory_bytes.clone(),
        );
        let ingress_requests = Family::<StatusLabels, Counter>::default();
        registry.register(
            "ingress_requests",
            "Requests and raw TCP connections through the ingress (preview URLs), by answer",
            ingress_requests.clone(),
        );
        let ingress_bytes = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "ingress_bytes",
            "Bytes carried through the ingress: in (to sandboxes) and out (to clients)",
            ingress_bytes.clone(),
        );
        Self {
            registry,
            sandboxes,
            ingress_requests,
            ingress_bytes,
            create_phase_seconds,
            create_failures,
            pool_claims,
            pool_hand_overs,
            boot_template_creates,
            boot_templates,
            oom_kills,
            ttl_expiries,
            process_starts,
            egress_connections,
            egress_limited,
            egress_throttled_seconds,
            secret_substitutions,
            sandbox_cpu_seconds,
            sandbox_memory_bytes,
            scrape: Mutex::new(()),
        }
    }

    /// One phase of a create of a sandbox of `runtime`.
    pub fn observe_phase(&self, phase: &str, runtime: RuntimeKind, seconds: f64) {
        self.create_phase_seconds
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
                runtime: runtime.as_str().to_string(),
            })
            .observe(seconds);
    }

    pub fn create_failed(&self, reason: &str) {
        self.create_failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A create of a pooled runtime and image: `hit`, `empty` or `unfit`.
    pub fn pool_claim(&self, runtime: RuntimeKind, image: &str, result: &str) {
        self.pool_claims
            .get_or_create(&PoolClaimLabels {
                runtime: runtime.as_str().to_string(),
                image: image.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// A claim's hand-over to a pooled sandbox's supervisor: `mailbox` or
    /// `request`.
    pub fn pool_hand_over(&self, via: &str) {
        self.pool_hand_overs
            .get_or_create(&HandOverLabels {
                via: via.to_string(),
            })
            .inc();
    }

    /// A microVM create a boot template could serve: `hit`, `miss` or
    /// `failed`.
    pub fn boot_template_create(&self, result: &str) {
        self.boot_template_creates
            .get_or_create(&TemplateCreateLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// How many boot templates are ready now.
    pub fn boot_templates_ready(&self, count: usize) {
        self.boot_templates
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One request (or raw TCP connection) through the ingress, by its
    /// status code, or `tcp`.
    pub fn ingress_request(&self, status: &str) {
        self.ingress_requests
            .get_or_create(&StatusLabels {
                status: status.to_string(),
            })
            .inc();
    }

    pub fn ingress_bytes(&self, bytes_in: u64, bytes_out: u64) {
        for (direction, n) in [("in", bytes_in), ("out", bytes_out)] {
            self.ingress_bytes
                .get_or_create(&DirectionLabels {
                    direction: direction.to_string(),
                })
                .inc_by(n);
        }
    }

    pub fn oom_killed(&self) {
        self.oom_kills.inc();
    }

    pub fn ttl_expired(&self) {
        self.ttl_expiries.inc();
    }

    pub fn process_started(&self) {
        self.process_starts.inc();
    }

    /// Adds what a sandbox's proxy did between two samples of its counters.
    pub fn egress(
        &self,
        before: &crate::net::proxy::EgressCounters,
        now: &crate::net::proxy::EgressCounters,
    ) {
        let delta =
            |f: fn(&crate::net::proxy::EgressCounters) -> u64| f(now).saturating_sub(f(before));
        for (verdict, n) in [
            ("allowed", delta(|c| c.allowed)),
            ("refused", delta(|c| c.refused)),
        ] {
            self.egress_connections
                .get_or_create(&VerdictLabels {
                    verdict: verdict.to_string(),
                })
                .inc_by(n);
        }
        for (limit, n) in [
            ("connections", delta(|c| c.connections_limited)),
            ("dns_qps", delta(|c| c.dns_limited)),
        ] {
            self.egress_limited
                .get_or_create(&LimitLabels {
                    limit: limit.to_string(),
                })
                .inc_by(n);
        }
        self.egress_throttled_seconds
            .inc_by(delta(|c| c.throttled_us) as f64 / 1e6);
    }

    /// Adds `n` requests that carried secret `secret`'s value.
    pub fn secret_substituted(&self, secret: &str, n: u64) {
        self.secret_substitutions
            .get_or_create(&SecretLabels {
                secret: secret.to_string(),
            })
            .inc_by(n);
    }

    pub fn sandbox_usage(&self, sandbox: &str, cpu_seconds: f64, memory_bytes: u64) {
        let labels = SandboxLabels {
            sandbox: sandbox.to_string(),
        };
        self.sandbox_cpu_seconds
            .get_or_create(&labels)
            .set(cpu_seconds);
        self.sandbox_memory_bytes
            .get_or_create(&labels)
            .set(i64::try_from(memory_bytes).unwrap_or(i64::MAX));
    }

    pub fn sandbox_gone(&self, sandbox: &str) {
        let labels = SandboxLabels {
            sandbox: sandbox.to_string(),
        };
        self.sandbox_cpu_seconds.remove(&labels);
        self.sandbox_memory_bytes.remove(&labels);
    }

    /// The exposition text, with the state gauges set from `states`
    /// (one `(state, runtime)` per sandbox).
    pub fn render(&self, states: &[(String, String)]) -> String {
        let _guard = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.sandboxes.clear();
        for (state, runtime) in states {
            self.sandboxes
                .get_or_create(&StateLabels {
                    state: state.clone(),
                    runtime: runtime.clone(),
                })
                .inc();
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_families_and_values() {
        let metrics = Metrics::new();
        metrics.observe_phase("runtime", RuntimeKind::Container, 0.02);
        metrics.create_failed("image_not_found");
        metrics.process_started();
        metrics.sandbox_usage("sb-1", 1.5, 4096);
        let text = metrics.render(&[("ready".into(), "container".into())]);
        assert!(
            text.contains("sandboxd_sandboxes{state=\"ready\",runtime=\"container\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "sandboxd_create_phase_seconds_count{phase=\"runtime\",runtime=\"container\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("sandboxd_create_failures_total{reason=\"image_not_found\"} 1"),
            "{text}"
        );
        assert!(text.contains("sandboxd_process_starts_total 1"), "{text}");
        assert!(
            text.contains("sandboxd_sandbox_memory_bytes{sandbox=\"sb-1\"} 4096"),
            "{text}"
        );
        metrics.sandbox_gone("sb-1");
        let text = metrics.render(&[]);
        assert!(!text.contains("sb-1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
