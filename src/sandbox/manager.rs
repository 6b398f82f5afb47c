//! The sandbox manager: admission, create, lookup, TTL, delete and recovery
//! after a restart. Sandbox records live in the store; processes, output and
//! files live behind each sandbox's supervisor.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

use super::record::{expiry, now_ms, SandboxRecord};
use super::teardown::teardown;
use super::validate::{validated_env, validated_labels, validated_limits, validated_ttl};
use super::SandboxError;
use crate::api::types::{CreateSandbox, Limits, Sandbox, SandboxState};
use crate::config::{Config, ID_MAP_SIZE};
use crate::disk::DiskPool;
use crate::image::ImageCache;
use crate::shim::config::{SandboxPaths, ShimConfig};
use crate::shim::protocol::{ShimConn, ShimReply, ShimRequest};
use crate::shim::ReadyLine;
use crate::store::Store;

const HEALTH_DEADLINE: Duration = Duration::from_secs(5);

pub struct Manager {
    pub config: Config,
    store: Store,
    images: Arc<ImageCache>,
    disk: Arc<DiskPool>,
    records: Mutex<HashMap<String, SandboxRecord>>,
    ttl_changed: Notify,
    /// Ids of ready sandboxes of the default image and limits, not yet handed out.
    pool: Mutex<VecDeque<String>>,
    refilling: AtomicBool,
}

fn default_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("LANG", "C.UTF-8"),
        ("TZ", "UTC"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn new_id() -> String {
    let bytes: [u8; 6] = rand::random();
    format!("sb-{}", hex::encode(bytes))
}

impl Manager {
    pub fn new(config: Config, store: Store, images: ImageCache, disk: DiskPool) -> Arc<Self> {
        Arc::new(Self {
            config,
            store,
            images: Arc::new(images),
            disk: Arc::new(disk),
            records: Mutex::new(HashMap::new()),
            ttl_changed: Notify::new(),
            pool: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
        })
    }

    /// Starts the background work: the TTL reaper and the warm pool.
    pub fn start_background(self: &Arc<Self>) {
        tokio::spawn(Arc::clone(self).reap_expired());
        self.start_refill();
    }

    fn pool(&self) -> MutexGuard<'_, VecDeque<String>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn pooled(&self) -> usize {
        self.pool().len()
    }

    fn template_limits(&self) -> Limits {
        Limits {
            cpu: self.config.default_cpu,
            memory_mib: self.config.default_memory_mib,
            disk_mib: self.config.default_disk_mib,
            pids: self.config.default_pids,
        }
    }

    /// Keeps `pool_size` ready sandboxes of the default image and limits.
    fn start_refill(self: &Arc<Self>) {
        if self.config.pool_size == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            while this.pooled() < this.config.pool_size {
                let image = this.config.default_image.clone();
                let limits = this.template_limits();
                match this
                    .create_cold(image, limits, -1, BTreeMap::new(), BTreeMap::new(), true)
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
        });
    }

    /// Tears down the warm pool (on a clean stop: nobody can see or use those
    /// sandboxes, and a restart refills the pool in the background).
    pub async fn drain_pool(&self) {
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
    async fn claim_pooled(
        self: &Arc<Self>,
        image: &str,
        limits: &Limits,
        ttl_seconds: i64,
        req: &CreateSandbox,
    ) -> Result<Option<Sandbox>, SandboxError> {
        if self.config.pool_size == 0
            || image != self.config.default_image
            || *limits != self.template_limits()
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
                let set = match ShimConn::connect(&self.paths(&id).socket()).await {
                    Ok(mut conn) => {
                        conn.call(&ShimRequest::SetEnv { env }, HEALTH_DEADLINE)
                            .await
                    }
                    Err(e) => Err(e),
                };
                if !matches!(set, Ok(ShimReply::Ok)) {
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
                record.ttl_seconds = ttl_seconds;
                record.expires_at_ms = expiry(ttl_seconds);
                record.labels = req.labels.clone();
                record.env = req.env.clone();
                record.created_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                record.clone()
            };
            self.persist(&record)?;
            self.ttl_changed.notify_one();
            self.start_refill();
            return Ok(Some(record.view()));
        }
    }

    fn records(&self) -> MutexGuard<'_, HashMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn paths(&self, id: &str) -> SandboxPaths {
        SandboxPaths::new(&self.config.sandboxes_run_dir(), id)
    }

    fn persist(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        self.store
            .put(&record.id, record)
            .map_err(SandboxError::internal)
    }

    /// Sandboxes handed to callers (the warm pool is not counted).
    pub fn count(&self) -> usize {
        self.records().values().filter(|r| !r.pooled).count()
    }

    /// Creates a sandbox and returns once it is ready; on any failure nothing
    /// of it is left behind.
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<Sandbox, SandboxError> {
        match req.runtime.as_deref() {
            None | Some("container") => {}
            Some("vm") => return Err(SandboxError::bad(
                "runtime_unavailable",
                "runtime \"vm\" (microVM) is not available in this build yet; use \"container\"",
            )),
            Some(other) => {
                return Err(SandboxError::bad(
                    "invalid_runtime",
                    format!("runtime must be \"container\" or \"vm\", got {other:?}"),
                ))
            }
        }
        let limits = validated_limits(&req, &self.config)?;
        let ttl_seconds =
            validated_ttl(req.ttl_seconds.unwrap_or(self.config.default_ttl_seconds))?;
        validated_env(&req.env)?;
        validated_labels(&req.labels)?;
        let image_name = req
            .image
            .clone()
            .unwrap_or_else(|| self.config.default_image.clone());
        if let Some(view) = self
            .claim_pooled(&image_name, &limits, ttl_seconds, &req)
            .await?
        {
            return Ok(view);
        }
        self.create_cold(image_name, limits, ttl_seconds, req.labels, req.env, false)
            .await
    }

    async fn create_cold(
        self: &Arc<Self>,
        image_name: String,
        limits: Limits,
        ttl_seconds: i64,
        labels: BTreeMap<String, String>,
        env: BTreeMap<String, String>,
        pooled: bool,
    ) -> Result<Sandbox, SandboxError> {
        let id = new_id();
        let record = {
            let mut records = self.records();
            if records.len() >= self.config.max_sandboxes {
                return Err(SandboxError::Unavailable {
                    resource: "sandboxes",
                    message: format!(
                        "this host already runs its maximum of {} sandboxes",
                        self.config.max_sandboxes
                    ),
                });
            }
            let record = SandboxRecord {
                id: id.clone(),
                state: SandboxState::Creating,
                runtime: "container".into(),
                image: image_name.clone(),
                image_digest: String::new(),
                limits: limits.clone(),
                ttl_seconds,
                expires_at_ms: expiry(ttl_seconds),
                created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                labels,
                env,
                cgroups_path: format!("/sandboxd/{id}"),
                shim_pid: 0,
                oom_kills: 0,
                failure: None,
                pooled,
            };
            records.insert(id.clone(), record.clone());
            record
        };
        match self.start(record, &image_name).await {
            Ok(view) => {
                self.ttl_changed.notify_one();
                Ok(view)
            }
            Err(e) => {
                let record = self.records().get(&id).cloned();
                if let Some(record) = record {
                    self.remove_everything(&record).await;
                }
                Err(e)
            }
        }
    }

    async fn start(
        &self,
        mut record: SandboxRecord,
        image_name: &str,
    ) -> Result<Sandbox, SandboxError> {
        self.persist(&record)?;
        let images = Arc::clone(&self.images);
        let name = image_name.to_string();
        let image = tokio::task::spawn_blocking(move || images.resolve(&name))
            .await
            .map_err(SandboxError::internal)?
            .map_err(|e| {
                if e.is_client_error() {
                    SandboxError::NotFound {
                        code: "image_not_found",
                        message: e.to_string(),
                    }
                } else {
                    SandboxError::internal(e)
                }
            })?;
        record.image_digest = image.digest.clone();

        let disk = Arc::clone(&self.disk);
        let layer_id = record.id.clone();
        let base = self.config.id_map_base;
        let limit = record.limits.disk_mib * 1024 * 1024;
        let layer_dir =
            tokio::task::spawn_blocking(move || disk.create_layer(&layer_id, limit, base, base))
                .await
                .map_err(SandboxError::internal)?
                .map_err(SandboxError::internal)?;

        let paths = self.paths(&record.id);
        std::fs::create_dir_all(&paths.dir).map_err(SandboxError::internal)?;
        let mut env = default_env();
        env.extend(record.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let shim_config = ShimConfig {
            id: record.id.clone(),
            hostname: record.id.clone(),
            image_rootfs: image.rootfs.clone(),
            layer_dir,
            agent_path: self.config.agent_path.clone(),
            cgroups_path: record.cgroups_path.clone(),
            cpu: record.limits.cpu,
            memory_bytes: record.limits.memory_mib * 1024 * 1024,
            pids: record.limits.pids as i64,
            id_map_base: self.config.id_map_base,
            id_map_size: ID_MAP_SIZE,
            shm_bytes: self.config.shm_mib * 1024 * 1024,
            nofile: self.config.nofile,
            env,
            output_buffer_bytes: (self.config.output_buffer_kib * 1024) as usize,
            ready_timeout_ms: self.config.ready_timeout_seconds * 1000,
        };
        let json = serde_json::to_vec(&shim_config).map_err(SandboxError::internal)?;
        std::fs::write(paths.config(), json).map_err(SandboxError::internal)?;

        let (shim_pid, ready) = self.spawn_shim(&paths).await?;
        record.shim_pid = shim_pid;
        if !ready.ok {
            return Err(SandboxError::internal(format!(
                "the sandbox could not be started: {}",
                ready.error.unwrap_or_else(|| "no reason given".into())
            )));
        }
        tracing::debug!(sandbox = %record.id, phases_us = ?ready.phases_us, "sandbox ready");
        record.state = SandboxState::Ready;
        self.persist(&record)?;
        let view = record.view();
        self.records().insert(record.id.clone(), record);
        Ok(view)
    }

    /// Starts `sandboxd shim DIR` in its own session and waits for its ready line.
    async fn spawn_shim(&self, paths: &SandboxPaths) -> Result<(i32, ReadyLine), SandboxError> {
        // The running binary itself, even if an upgrade replaced the file:
        // a supervisor speaks the protocol of the daemon that started it.
        let exe = std::path::PathBuf::from("/proc/self/exe");
        let log = std::fs::File::create(paths.log()).map_err(SandboxError::internal)?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("shim")
            .arg(&paths.dir)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        // SAFETY: setsid is async-signal-safe; it detaches the supervisor from
        // the daemon's session so it outlives the daemon.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(SandboxError::internal)?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| SandboxError::internal("supervisor has no stdout"))?;
        let mut line = String::new();
        let deadline = Duration::from_secs(self.config.ready_timeout_seconds + 5);
        let read =
            tokio::time::timeout(deadline, BufReader::new(stdout).read_line(&mut line)).await;
        // The supervisor lives on; tokio reaps it if it ever exits while we run.
        drop(child);
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => {
                return Err(SandboxError::internal(format!(
                    "the sandbox's supervisor exited before it was ready; see {}",
                    paths.log().display()
                )))
            }
            Err(_) => {
                return Err(SandboxError::internal(format!(
                    "the sandbox was not ready within {deadline:?}"
                )))
            }
        }
        let ready: ReadyLine = serde_json::from_str(line.trim()).map_err(SandboxError::internal)?;
        Ok((pid, ready))
    }

    async fn remove_everything(&self, record: &SandboxRecord) {
        let paths = self.paths(&record.id);
        let problems = teardown(&record.id, &record.cgroups_path, &paths, &self.disk).await;
        if problems.is_empty() {
            let _ = self.store.remove(&record.id);
            self.records().remove(&record.id);
        } else {
            for p in &problems {
                tracing::warn!(sandbox = %record.id, "teardown: {p}");
            }
            // Kept as failed so the operator sees it and a later delete retries.
            let mut failed = record.clone();
            failed.state = SandboxState::Failed;
            failed.failure = Some(format!("teardown incomplete: {}", problems.join("; ")));
            let _ = self.persist(&failed);
            self.records().insert(failed.id.clone(), failed);
        }
    }

    /// A caller's sandbox; pooled ones are not visible until handed out.
    fn record(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        self.records()
            .get(id)
            .filter(|r| !r.pooled)
            .cloned()
            .ok_or_else(|| SandboxError::sandbox_not_found(id))
    }

    /// The sandbox as it is now, with fresh OOM and failure facts from its supervisor.
    pub async fn get(&self, id: &str) -> Result<Sandbox, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Ok(record.view());
        }
        let health = match ShimConn::connect(&self.paths(id).socket()).await {
            Ok(mut conn) => conn.call(&ShimRequest::Health, HEALTH_DEADLINE).await.ok(),
            Err(_) => None,
        };
        let mut records = self.records();
        let Some(current) = records.get_mut(id) else {
            return Err(SandboxError::sandbox_not_found(id));
        };
        match health {
            Some(ShimReply::Health(h)) => {
                current.oom_kills = h.oom_kills;
                if let Some(reason) = h.failure {
                    current.state = SandboxState::Failed;
                    current.failure = Some(reason);
                }
            }
            _ => {
                current.state = SandboxState::Failed;
                current.failure = Some("the sandbox's supervisor is gone".into());
            }
        }
        let view = current.view();
        let snapshot = current.clone();
        drop(records);
        if snapshot.state == SandboxState::Failed {
            let _ = self.persist(&snapshot);
        }
        Ok(view)
    }

    pub fn list(&self) -> Vec<Sandbox> {
        let mut all: Vec<Sandbox> = self
            .records()
            .values()
            .filter(|r| !r.pooled)
            .map(SandboxRecord::view)
            .collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        all
    }

    /// A connection to a ready sandbox's supervisor (409 when it is not ready).
    pub async fn connect(&self, id: &str) -> Result<ShimConn, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Err(SandboxError::Conflict {
                code: "sandbox_not_ready",
                message: format!(
                    "sandbox {id} is {:?}, not ready{}",
                    record.state,
                    record
                        .failure
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                ),
            });
        }
        ShimConn::connect(&self.paths(id).socket())
            .await
            .map_err(|e| SandboxError::Conflict {
                code: "sandbox_not_running",
                message: format!("sandbox {id} is not running: {e}"),
            })
    }

    pub async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        let record = {
            let mut records = self.records();
            let record = records
                .get_mut(id)
                .filter(|r| !r.pooled)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            if record.state == SandboxState::Creating {
                return Err(SandboxError::Conflict {
                    code: "sandbox_creating",
                    message: format!(
                        "sandbox {id} is still being created; delete it once create returns"
                    ),
                });
            }
            record.state = SandboxState::Deleting;
            record.clone()
        };
        self.persist(&record)?;
        self.remove_everything(&record).await;
        match self.records().get(id) {
            Some(left) => Err(SandboxError::internal(
                left.failure.clone().unwrap_or_default(),
            )),
            None => Ok(()),
        }
    }

    pub fn set_ttl(&self, id: &str, ttl_seconds: i64) -> Result<Sandbox, SandboxError> {
        let ttl_seconds = validated_ttl(ttl_seconds)?;
        let record = {
            let mut records = self.records();
            let record = records
                .get_mut(id)
                .filter(|r| !r.pooled)
                .ok_or_else(|| SandboxError::sandbox_not_found(id))?;
            record.ttl_seconds = ttl_seconds;
            record.expires_at_ms = expiry(ttl_seconds);
            record.clone()
        };
        self.persist(&record)?;
        self.ttl_changed.notify_one();
        Ok(record.view())
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

    /// Loads the store after a (re)start: sandboxes whose supervisor answers
    /// are kept as they are; half-made or half-deleted ones are finished off;
    /// ones whose supervisor is gone are torn down and kept as failed.
    pub async fn recover(&self) -> Result<(), SandboxError> {
        let stored: Vec<SandboxRecord> = self.store.all().map_err(SandboxError::internal)?;
        for mut record in stored {
            let alive = match ShimConn::connect(&self.paths(&record.id).socket()).await {
                Ok(mut conn) => matches!(
                    conn.call(&ShimRequest::Health, HEALTH_DEADLINE).await,
                    Ok(ShimReply::Health(_))
                ),
                Err(_) => false,
            };
            match record.state {
                SandboxState::Ready if alive => {
                    tracing::info!(sandbox = %record.id, "recovered");
                    if record.pooled {
                        self.pool().push_back(record.id.clone());
                    }
                    self.records().insert(record.id.clone(), record);
                }
                SandboxState::Creating | SandboxState::Deleting => {
                    tracing::info!(sandbox = %record.id, "finishing an interrupted create/delete");
                    self.remove_everything(&record).await;
                }
                _ => {
                    let problems = teardown(
                        &record.id,
                        &record.cgroups_path,
                        &self.paths(&record.id),
                        &self.disk,
                    )
                    .await;
                    record.state = SandboxState::Failed;
                    if record.failure.is_none() {
                        record.failure =
                            Some("the sandbox's supervisor was gone after a daemon restart".into());
                    }
                    if !problems.is_empty() {
                        tracing::warn!(sandbox = %record.id, "recovery teardown: {}", problems.join("; "));
                    }
                    self.persist(&record)?;
                    self.records().insert(record.id.clone(), record);
                }
            }
        }
        Ok(())
    }
}
