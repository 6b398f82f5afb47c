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

use super::events::{EventKind, EventLog};
use super::record::{expiry, now_ms, SandboxRecord};
use super::teardown::teardown;
use super::validate::{validated_env, validated_labels, validated_limits, validated_ttl};
use super::SandboxError;
use crate::api::types::{CreateSandbox, Limits, Sandbox, SandboxState};
use crate::config::{Config, ID_MAP_SIZE};
use crate::disk::DiskPool;
use crate::gpu::{GpuRequest, GpuService};
use crate::image::ImageCache;
use crate::shim::config::{SandboxPaths, ShimConfig};
use crate::shim::protocol::{ShimConn, ShimEvent, ShimReply, ShimRequest};
use crate::shim::ReadyLine;
use crate::store::Store;

const HEALTH_DEADLINE: Duration = Duration::from_secs(5);

pub struct Manager {
    pub config: Config,
    store: Arc<Store>,
    pub events: EventLog,
    pub metrics: crate::metrics::Metrics,
    images: Arc<ImageCache>,
    disk: Arc<DiskPool>,
    /// The host's GPUs and who holds them.
    gpus: Arc<GpuService>,
    records: Mutex<HashMap<String, SandboxRecord>>,
    ttl_changed: Notify,
    /// Ids of ready sandboxes of the default image and limits, not yet handed out.
    pool: Mutex<VecDeque<String>>,
    refilling: AtomicBool,
    /// Set once the daemon stops: long-lived streams end so that in-flight
    /// requests can finish and the daemon can exit.
    stopping: tokio::sync::watch::Sender<bool>,
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

/// Marks a create as abandoned when the request future is dropped before
/// the create finished.
struct AbandonOnDrop(Option<Arc<AtomicBool>>);

impl AbandonOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, Ordering::Release);
        }
    }
}

fn new_id() -> String {
    let bytes: [u8; 6] = rand::random();
    format!("sb-{}", hex::encode(bytes))
}

impl Manager {
    pub fn new(config: Config, store: Store, images: ImageCache, disk: DiskPool) -> Arc<Self> {
        let store = Arc::new(store);
        Arc::new(Self {
            events: EventLog::open(Arc::clone(&store), config.event_retention_seconds),
            metrics: crate::metrics::Metrics::new(),
            gpus: GpuService::new(config.gpu.clone()),
            config,
            store,
            images: Arc::new(images),
            disk: Arc::new(disk),
            records: Mutex::new(HashMap::new()),
            ttl_changed: Notify::new(),
            pool: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
            stopping: tokio::sync::watch::channel(false).0,
        })
    }

    /// Ends the event and output streams; creates in flight finish.
    pub fn begin_stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once the daemon is stopping.
    pub async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|stopping| *stopping).await;
    }

    /// Starts the background work: the TTL reaper and the warm pool.
    pub fn start_background(self: &Arc<Self>) {
        tokio::spawn(Arc::clone(self).reap_expired());
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
                ticks += 1;
                if ticks % 12 == 0 {
                    this.events.prune();
                }
            }
        });
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
                    .create_cold(
                        image,
                        limits,
                        -1,
                        BTreeMap::new(),
                        BTreeMap::new(),
                        true,
                        None,
                    )
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

    /// Follows a sandbox supervisor's events (process exits, OOM kills, the
    /// sandbox dying) into the event log, from where it left off.
    fn watch_supervisor(self: &Arc<Self>, id: String) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let after = match this.records().get(&id) {
                Some(r) => r.supervisor_events_seen,
                None => return,
            };
            let Ok(mut conn) = ShimConn::connect(&this.paths(&id).socket()).await else {
                return;
            };
            if conn.send(&ShimRequest::Watch { after }).await.is_err() {
                return;
            }
            while let Ok(Some(ShimReply::Event { seq, event })) = conn.next().await {
                this.record_supervisor_event(&id, seq, event);
            }
        });
    }

    fn record_supervisor_event(&self, id: &str, seq: u64, event: ShimEvent) {
        match event {
            ShimEvent::ProcessExited(p) => {
                if p.oom_killed {
                    self.metrics.oom_killed();
                    self.events.emit(EventKind::Oom, id, Some(p.id), None);
                }
                let detail = match (p.exit_code, p.signal) {
                    (Some(code), _) => format!("exit code {code}"),
                    (None, Some(signal)) => format!("signal {signal}"),
                    _ => "ended".to_string(),
                };
                let detail = if p.timed_out {
                    format!("{detail} (timed out)")
                } else {
                    detail
                };
                self.events
                    .emit(EventKind::ProcessExited, id, Some(p.id), Some(detail));
            }
            ShimEvent::Failed(reason) => {
                let newly_failed = {
                    let mut records = self.records();
                    match records.get_mut(id) {
                        Some(r) if r.state == SandboxState::Ready => {
                            r.state = SandboxState::Failed;
                            r.failure = Some(reason.clone());
                            true
                        }
                        _ => false,
                    }
                };
                if newly_failed {
                    self.events.emit(EventKind::Failed, id, None, Some(reason));
                }
            }
        }
        // Persisted under the records lock: a delete removes the map entry
        // first, so a cursor update can never bring a deleted record back.
        let mut records = self.records();
        if let Some(record) = records.get_mut(id) {
            record.supervisor_events_seen = seq;
            if let Err(e) = self.store.put_eventual(id, record) {
                tracing::warn!(sandbox = %id, "recording an event cursor: {e}");
            }
        }
    }

    /// Deletes every sandbox (a clean stop with `stop_sandboxes_on_exit`).
    pub async fn delete_all(&self) {
        let ids: Vec<String> = self.records().keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.delete(&id).await {
                tracing::warn!(sandbox = %id, "deleting on exit: {e}");
            }
        }
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
            || req.gpu.is_some()
            || req.gpu_count.is_some_and(|n| n > 0)
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

    pub fn capacity(&self) -> super::capacity::Capacity {
        let records = self.records();
        let all: Vec<&SandboxRecord> = records.values().collect();
        super::capacity::capacity(&self.config, &all)
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
                (state, r.runtime.clone())
            })
            .collect();
        self.metrics.render(&states)
    }

    /// Samples CPU and memory of every running sandbox into its usage
    /// (CPU-seconds, memory GiB-seconds) and the per-sandbox metrics.
    fn sample_usage(&self, interval: Duration) {
        let ids: Vec<(String, String)> = self
            .records()
            .values()
            .filter(|r| r.state == SandboxState::Ready)
            .map(|r| (r.id.clone(), r.cgroups_path.clone()))
            .collect();
        let layout = crate::runtime::cgroups::Layout::detect();
        for (id, path) in ids {
            let cgroups = crate::runtime::cgroups::SandboxCgroups::new(layout, &path);
            let cpu = cgroups.cpu_seconds();
            let memory = cgroups.memory_bytes().unwrap_or(0);
            self.metrics.sandbox_usage(&id, cpu.unwrap_or(0.0), memory);
            let mut records = self.records();
            if let Some(record) = records.get_mut(&id) {
                if let Some(cpu) = cpu {
                    record.usage.cpu_seconds = cpu;
                }
                record.usage.memory_gib_seconds +=
                    memory as f64 / (1u64 << 30) as f64 * interval.as_secs_f64();
                if let Err(e) = self.store.put_eventual(&id, record) {
                    tracing::warn!(sandbox = %id, "recording usage: {e}");
                }
            }
        }
    }

    /// Sandboxes handed to callers (the warm pool is not counted).
    pub fn count(&self) -> usize {
        self.records().values().filter(|r| !r.pooled).count()
    }

    /// Creates a sandbox and returns once it is ready; on any failure nothing
    /// of it is left behind.
    /// Creates a sandbox and returns once it is ready. The work runs in its
    /// own task: when the caller goes away (the client disconnected and the
    /// request future was dropped) a sandbox made anyway is removed, so an
    /// abandoned create leaves nothing behind.
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<Sandbox, SandboxError> {
        let abandoned = Arc::new(AtomicBool::new(false));
        let guard = AbandonOnDrop(Some(Arc::clone(&abandoned)));
        let this = Arc::clone(self);
        let task = tokio::spawn(async move {
            let result = this.create_now(req).await;
            if let Err(e) = &result {
                this.metrics.create_failed(e.code());
            }
            if abandoned.load(Ordering::Acquire) {
                if let Ok(view) = &result {
                    tracing::info!(sandbox = %view.id, "create abandoned by its caller; removing");
                    if let Err(e) = this.delete(&view.id).await {
                        tracing::warn!(sandbox = %view.id, "removing an abandoned sandbox: {e}");
                    }
                }
            }
            result
        });
        let result = task.await.map_err(SandboxError::internal);
        guard.disarm();
        result?
    }

    async fn create_now(self: &Arc<Self>, req: CreateSandbox) -> Result<Sandbox, SandboxError> {
        let gpu =
            GpuRequest::from_create(req.runtime.as_deref(), req.gpu.as_deref(), req.gpu_count)?;
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
        self.create_cold(
            image_name,
            limits,
            ttl_seconds,
            req.labels,
            req.env,
            false,
            gpu,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_cold(
        self: &Arc<Self>,
        image_name: String,
        limits: Limits,
        ttl_seconds: i64,
        labels: BTreeMap<String, String>,
        env: BTreeMap<String, String>,
        pooled: bool,
        gpu: Option<GpuRequest>,
    ) -> Result<Sandbox, SandboxError> {
        let id = new_id();
        let record = {
            let mut records = self.records();
            let all: Vec<&SandboxRecord> = records.values().collect();
            super::capacity::admit(&self.config, &all, &limits)?;
            // Held from here; every failure after this ends in remove_everything.
            let gpus = match &gpu {
                Some(request) => self.gpus.allocate(&id, request)?,
                None => Vec::new(),
            };
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
                cgroups_path: format!("{}/{id}", self.config.cgroup_parent.trim_end_matches('/')),
                shim_pid: 0,
                oom_kills: 0,
                failure: None,
                pooled,
                supervisor_events_seen: 0,
                gpus,
                usage: Default::default(),
            };
            records.insert(id.clone(), record.clone());
            record
        };
        if !pooled {
            self.events.emit(EventKind::Created, &id, None, None);
        }
        match self.start(record, &image_name).await {
            Ok(view) => {
                self.ttl_changed.notify_one();
                if !pooled {
                    self.events.emit(EventKind::Ready, &id, None, None);
                    self.watch_supervisor(id.clone());
                }
                Ok(view)
            }
            Err(e) => {
                if !pooled {
                    self.events
                        .emit(EventKind::Failed, &id, None, Some(e.to_string()));
                }
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
        let begun = std::time::Instant::now();
        let mut lap = std::time::Instant::now();
        let mut phase = |name: &str| {
            self.metrics
                .observe_phase(name, lap.elapsed().as_secs_f64());
            lap = std::time::Instant::now();
        };
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
        phase("image");

        let disk = Arc::clone(&self.disk);
        let layer_id = record.id.clone();
        let base = self.config.id_map_base;
        let limit = record.limits.disk_mib * 1024 * 1024;
        let layer_dir =
            tokio::task::spawn_blocking(move || disk.create_layer(&layer_id, limit, base, base))
                .await
                .map_err(SandboxError::internal)?
                .map_err(SandboxError::internal)?;
        phase("disk");

        let paths = self.paths(&record.id);
        std::fs::create_dir_all(&paths.dir).map_err(SandboxError::internal)?;
        let gpu = self.gpus.grant(&record.gpus)?;
        let mut env = default_env();
        env.extend(gpu.env);
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
            devices: gpu.devices,
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
        phase("supervisor");
        for (name, us) in &ready.phases_us {
            let name = match name.as_str() {
                "netns" => "namespace",
                "rootfs_and_spec" => "rootfs",
                other => other,
            };
            self.metrics.observe_phase(name, *us as f64 / 1e6);
        }
        self.metrics
            .observe_phase("total", begun.elapsed().as_secs_f64());
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
            self.records().remove(&record.id);
            let _ = self.store.remove(&record.id);
            self.gpus.release(&record.id);
            self.metrics.sandbox_gone(&record.id);
            if !record.pooled && record.state != SandboxState::Creating {
                let usage = serde_json::to_string(&record.usage).ok();
                self.events
                    .emit(EventKind::Deleted, &record.id, None, usage);
            }
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
            self.events
                .emit(EventKind::Failed, id, None, snapshot.failure.clone());
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

    /// Loads the store after a (re)start: sandboxes whose supervisor answers
    /// are kept as they are; half-made or half-deleted ones are finished off;
    /// ones whose supervisor is gone are torn down and kept as failed.
    pub async fn recover(self: &Arc<Self>) -> Result<(), SandboxError> {
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
                    let (id, pooled) = (record.id.clone(), record.pooled);
                    self.records().insert(id.clone(), record);
                    if pooled {
                        self.pool().push_back(id);
                    } else {
                        self.watch_supervisor(id);
                    }
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
        self.sweep_unowned().await;
        // A sandbox holds its GPUs until it is removed, whatever its state.
        let holders: Vec<(String, Vec<String>)> = self
            .records()
            .values()
            .map(|r| (r.id.clone(), r.gpus.clone()))
            .collect();
        self.gpus.rebuild(holders);
        Ok(())
    }

    /// Removes what no record owns: run dirs, writable layers and cgroups of
    /// sandboxes whose creation was cut off before their record was written
    /// (or whose record was lost).
    async fn sweep_unowned(&self) {
        let known: std::collections::HashSet<String> = self.records().keys().cloned().collect();
        let mut unowned: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(self.config.sandboxes_run_dir()) {
            unowned.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
        if let Ok(layers) = self.disk.list_layers() {
            unowned.extend(layers);
        }
        unowned.extend(crate::runtime::cgroups::sandbox_group_ids(
            &self.config.cgroup_parent,
        ));
        for id in unowned.into_iter().filter(|id| !known.contains(id)) {
            if crate::disk::validate_id(&id).is_err() {
                continue;
            }
            tracing::info!(sandbox = %id, "removing leftovers no record owns");
            let cgroups_path = format!("{}/{id}", self.config.cgroup_parent.trim_end_matches('/'));
            let problems = teardown(&id, &cgroups_path, &self.paths(&id), &self.disk).await;
            for p in problems {
                tracing::warn!(sandbox = %id, "removing leftovers: {p}");
            }
        }
    }

    /// The host's GPUs and who holds them.
    pub fn gpus(&self) -> Arc<GpuService> {
        Arc::clone(&self.gpus)
    }
}
