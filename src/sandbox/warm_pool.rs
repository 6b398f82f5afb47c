//! The warm pool: ready sandboxes of the default image and limits, made
//! ahead of demand and handed to a create that asks for exactly that. (The
//! disk pool, `disk/pool.rs`, is the btrfs filesystem layers live on.)

use super::events::EventKind;
use super::record::expiry;
use super::SandboxError;
use super::SandboxRecord;
use crate::model::{CreateRequest, Limits, RuntimeKind};
use crate::net::policy::{DefaultEgress, NetworkPolicy};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::SystemTime;

use super::create::{default_env, ColdCreate};
use super::manager::Manager;

impl Manager {
    pub(super) fn pool(&self) -> MutexGuard<'_, VecDeque<String>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn pooled(&self) -> usize {
        self.pool().len()
    }

    pub(super) fn template_limits(&self) -> Limits {
        Limits {
            cpu: self.config.default_cpu,
            memory_mib: self.config.default_memory_mib,
            disk_mib: self.config.default_disk_mib,
            pids: self.config.default_pids,
        }
    }

    /// Keeps `pool_size` ready sandboxes of the default image and limits.
    pub(super) fn start_refill(self: &Arc<Self>) {
        if self.config.pool_size == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            while this.pooled() < this.config.pool_size && !*this.stopping.borrow() {
                let image = this.config.default_image.clone();
                let limits = this.template_limits();
                match this
                    .create_cold(ColdCreate {
                        id: super::create::new_id(),
                        secrets: Vec::new(),
                        from_snapshot: None,
                        runtime: RuntimeKind::Container,
                        image_name: image,
                        limits,
                        ttl_seconds: -1,
                        labels: BTreeMap::new(),
                        env: BTreeMap::new(),
                        pooled: true,
                        gpu: None,
                        idempotency_key: None,
                        request_digest: None,
                        network: NetworkPolicy {
                            block_network: Some(this.config.default_egress == DefaultEgress::Block),
                            allow_list: None,
                        },
                    })
                    .await
                {
                    Ok(view) => this.pool().push_back(view.id),
                    Err(e) => {
                        // No retry loop: the next claim or restart tries again.
                        tracing::warn!("refilling the warm pool: {e}");
                        break;
                    }
                }
            }
            this.refilling.store(false, Ordering::Release);
            this.refill_done.notify_waiters();
        });
    }

    /// Tears down the warm pool (on a clean stop: nobody can see or use those
    /// sandboxes, and a restart refills the pool in the background).
    pub async fn drain_pool(&self) {
        // A refill still making a sandbox would add it after the drain and
        // leave it running with nobody to adopt it; it stops once the daemon
        // is stopping, so wait for it first.
        loop {
            let done = self.refill_done.notified();
            if !self.refilling.load(Ordering::Acquire) {
                break;
            }
            done.await;
        }
        let ids: Vec<String> = self.pool().drain(..).collect();
        for id in ids {
            let record = self.records().get(&id).cloned();
            if let Some(record) = record {
                self.remove_everything(&record).await;
            }
        }
    }

    /// Hands out a pooled sandbox when the request asks for exactly what the
    /// pool holds; `None` means start one cold.
    pub(super) async fn claim_pooled(
        self: &Arc<Self>,
        image: &str,
        limits: &Limits,
        ttl_seconds: i64,
        req: &CreateRequest,
        request_digest: Option<&str>,
    ) -> Result<Option<SandboxRecord>, SandboxError> {
        if self.config.pool_size == 0
            || image != self.config.default_image
            || *limits != self.template_limits()
            || req.gpu.is_some()
            || req.gpu_count.is_some_and(|n| n > 0)
            || req.network.block_network.is_some()
            || req.network.allow_list.is_some()
        {
            return Ok(None);
        }
        loop {
            let Some(id) = self.pool().pop_front() else {
                self.start_refill();
                return Ok(None);
            };
            if !req.env.is_empty() {
                let mut env = default_env();
                env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                let set = self.supervisors.set_env(&id, env).await;
                if set.is_err() {
                    tracing::warn!(sandbox = %id, "pooled sandbox is broken; removing it");
                    let record = self.records().get(&id).cloned();
                    if let Some(record) = record {
                        self.remove_everything(&record).await;
                    }
                    continue;
                }
            }
            let record = {
                let mut records = self.records();
                let Some(record) = records.get_mut(&id) else {
                    continue;
                };
                record.pooled = false;
                record.idempotency_key = req.idempotency_key.clone();
                record.request_digest = request_digest.map(String::from);
                record.ttl_seconds = ttl_seconds;
                record.expires_at_ms = expiry(ttl_seconds);
                record.labels = req.labels.clone();
                record.env = req.env.clone();
                record.created_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                record.clone()
            };
            self.persist(&record)?;
            self.events.emit(
                EventKind::Created,
                &id,
                None,
                Some("from the warm pool".into()),
            );
            self.events.emit(EventKind::Ready, &id, None, None);
            self.watch_supervisor(id.clone());
            self.ttl_changed.notify_one();
            self.start_refill();
            return Ok(Some(record));
        }
    }
}
