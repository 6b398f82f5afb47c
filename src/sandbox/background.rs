//! The manager's background work: TTL expiry, usage sampling and event
//! pruning, and the metrics exposition.

use super::events::EventKind;
use super::record::now_ms;
use crate::model::{RuntimeKind, SandboxState};
use std::sync::Arc;
use std::time::Duration;

use super::manager::Manager;
use super::record::SandboxRecord;

impl Manager {
    /// Reads each supervisor's egress counters into the sandbox's usage
    /// (bytes) and the daemon's metrics (verdicts, caps hit, throttling).
    pub async fn sample_egress(&self) {
        let ids: Vec<String> = self
            .records()
            .values()
            .filter(|r| r.state == SandboxState::Ready && !r.pooled)
            .map(|r| r.id.clone())
            .collect();
        let mut egress_bytes = Vec::with_capacity(ids.len());
        for id in ids {
            let Ok(health) = self.supervisors.health(&id).await else {
                continue;
            };
            let now = health.egress;
            let before = self
                .egress_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone(), now)
                .unwrap_or_default();
            self.metrics.egress(&before, &now);
            let mut seen = self
                .substitutions_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let counted = seen.entry(id.clone()).or_default();
            for (secret, total) in health.substitutions {
                let before = counted.insert(secret.clone(), total).unwrap_or(0);
                self.metrics
                    .secret_substituted(&secret, total.saturating_sub(before));
            }
            drop(seen);
            egress_bytes.push((id, now.bytes));
        }
        self.record_usage("egress usage", egress_bytes, |record, egress| {
            let ingress = self.links.bytes(&record.id).max(record.usage.ingress_bytes);
            let changed =
                record.usage.egress_bytes != egress || record.usage.ingress_bytes != ingress;
            record.usage.egress_bytes = egress;
            record.usage.ingress_bytes = ingress;
            changed
        });
    }

    /// Applies `update` to the record of each sandbox in `samples` and
    /// stores those it changed, all in one commit (one fsync per round, not
    /// one per sandbox) made under the records lock: a delete removes the
    /// map entry first, so a round never brings a deleted record back.
    fn record_usage<T>(
        &self,
        what: &str,
        samples: Vec<(String, T)>,
        mut update: impl FnMut(&mut SandboxRecord, T) -> bool,
    ) {
        let mut records = self.records();
        let mut changed = Vec::new();
        for (id, sample) in samples {
            if let Some(record) = records.get_mut(&id) {
                if update(record, sample) {
                    changed.push(id);
                }
            }
        }
        let batch = changed
            .iter()
            .filter_map(|id| records.get(id).map(|r| (id.as_str(), r)));
        if let Err(e) = self.store.put_all(batch) {
            tracing::warn!("recording {what} of {} sandboxes: {e}", changed.len());
        }
    }

    /// Starts the background work: the TTL reaper, the network slots, the
    /// standby supervisors and the warm pools.
    pub fn start_background(self: &Arc<Self>) {
        tokio::spawn(Arc::clone(self).reap_expired());
        self.start_slot_maker();
        self.start_standby_maker();
        let vm_pools = self
            .config
            .warm_pools
            .iter()
            .any(|p| p.runtime == RuntimeKind::Vm);
        if let Some(why) = self.vm_unavailable().filter(|_| vm_pools) {
            tracing::warn!("the microVM pools stay empty: {why}");
        }
        self.start_refill();
        let this = Arc::clone(self);
        tokio::spawn(async move {
            const SAMPLE: Duration = Duration::from_secs(5);
            let mut every = tokio::time::interval(SAMPLE);
            let mut ticks: u64 = 0;
            loop {
                every.tick().await;
                let sampler = Arc::clone(&this);
                let _ = tokio::task::spawn_blocking(move || sampler.sample_usage(SAMPLE)).await;
                this.sample_egress().await;
                ticks += 1;
                if ticks % 12 == 0 {
                    this.events.prune();
                }
            }
        });
    }

    /// The metrics exposition, with sandbox states as of now.
    pub fn render_metrics(&self) -> String {
        let states: Vec<(String, String)> = self
            .records()
            .values()
            .map(|r| {
                let state = if r.pooled {
                    "pooled".to_string()
                } else {
                    serde_json::to_value(r.state)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                };
                (state, r.runtime.to_string())
            })
            .collect();
        self.metrics.render(&states)
    }

    /// Samples CPU and memory of every running sandbox into its usage
    /// (CPU-seconds, memory GiB-seconds) and the per-sandbox metrics.
    pub(super) fn sample_usage(&self, interval: Duration) {
        let ids: Vec<(String, String)> = self
            .records()
            .values()
            .filter(|r| r.state == SandboxState::Ready)
            .map(|r| (r.id.clone(), r.cgroups_path.clone()))
            .collect();
        let layout = crate::runtime::cgroups::Layout::detect();
        let mut samples = Vec::with_capacity(ids.len());
        for (id, path) in ids {
            let cgroups = crate::runtime::cgroups::SandboxCgroups::new(layout, &path);
            let cpu = cgroups.cpu_seconds();
            let memory = cgroups.memory_bytes().unwrap_or(0);
            self.metrics.sandbox_usage(&id, cpu.unwrap_or(0.0), memory);
            samples.push((id, (cpu, memory)));
        }
        self.record_usage("usage", samples, |record, (cpu, memory)| {
            if let Some(cpu) = cpu {
                record.usage.cpu_seconds = cpu;
            }
            record.usage.memory_gib_seconds +=
                memory as f64 / (1u64 << 30) as f64 * interval.as_secs_f64();
            true
        });
    }

    /// Ends sandboxes whose TTL has passed; sleeps until the next expiry or
    /// until a TTL changes.
    pub async fn reap_expired(self: Arc<Self>) {
        loop {
            let now = now_ms();
            let (expired, next): (Vec<String>, Option<u64>) = {
                let records = self.records();
                let expired = records
                    .values()
                    .filter(|r| {
                        r.state != SandboxState::Creating && r.state != SandboxState::Deleting
                    })
                    .filter(|r| r.expires_at_ms.is_some_and(|t| t <= now))
                    .map(|r| r.id.clone())
                    .collect();
                let next = records
                    .values()
                    .filter_map(|r| r.expires_at_ms)
                    .filter(|t| *t > now)
                    .min();
                (expired, next)
            };
            for id in expired {
                tracing::info!(sandbox = %id, "TTL expired; removing");
                self.events.emit(EventKind::Expired, &id, None, None);
                self.metrics.ttl_expired();
                if let Err(e) = self.delete(&id).await {
                    tracing::warn!(sandbox = %id, "expiry: {e}");
                }
            }
            let wait = next
                .map(|t| Duration::from_millis(t.saturating_sub(now_ms())))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.ttl_changed.notified() => {}
            }
        }
    }
}
