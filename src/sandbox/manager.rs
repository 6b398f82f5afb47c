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
use super::record::{expiry, SandboxRecord};
use super::teardown::teardown;
use super::validate::{validated_env, validated_labels, validated_limits, validated_ttl};
use super::SandboxError;
use crate::config::{Config, ID_MAP_SIZE};
use crate::disk::DiskPool;
use crate::gpu::{GpuRequest, GpuService};
use crate::image::ImageCache;
use crate::model::{CreateRequest, Limits, RuntimeKind, SandboxState};
use crate::net::policy::{DefaultEgress, EgressPolicy, NetworkPolicy};
use crate::store::Store;
use crate::supervisor::client::{SocketSupervisors, SupervisorClient, Supervisors};
use crate::supervisor::config::{SandboxPaths, SupervisorConfig};
use crate::supervisor::ReadyLine;

pub struct Manager {
    pub config: Config,
    pub(super) store: Arc<Store>,
    /// The sandboxes' supervisors, as the orchestration speaks to them.
    pub(super) supervisors: Arc<dyn Supervisors>,
    pub events: EventLog,
    pub metrics: crate::metrics::Metrics,
    pub(super) images: Arc<ImageCache>,
    pub(super) disk: Arc<DiskPool>,
    /// The host's GPUs and who holds them.
    pub(super) gpus: Arc<GpuService>,
    pub(super) records: Mutex<HashMap<String, SandboxRecord>>,
    pub(super) ttl_changed: Notify,
    /// Ids of ready sandboxes of the default image and limits, not yet handed out.
    pub(super) pool: Mutex<VecDeque<String>>,
    pub(super) refilling: AtomicBool,
    /// Notified when a refill task ends.
    pub(super) refill_done: Notify,
    /// Set once the daemon stops: long-lived streams end so that in-flight
    /// requests can finish and the daemon can exit.
    pub(super) stopping: tokio::sync::watch::Sender<bool>,
    /// Each supervisor's egress counters as last read, for metric deltas.
    pub(super) egress_seen: Mutex<HashMap<String, crate::net::proxy::EgressCounters>>,
    /// Every snapshot, with its meta.
    pub(super) snapshots: crate::snapshot::SnapshotIndex,
    /// What the host offers microVMs, found at start.
    pub virtualization: crate::runtime::virt::Virtualization,
}

pub(super) fn default_env() -> Vec<(String, String)> {
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

/// What a cold create is asked to make.
pub(super) struct ColdCreate {
    pub(super) image_name: String,
    pub(super) limits: Limits,
    pub(super) ttl_seconds: i64,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) env: BTreeMap<String, String>,
    /// Made for the warm pool, not for a caller.
    pub(super) pooled: bool,
    pub(super) gpu: Option<GpuRequest>,
    pub(super) idempotency_key: Option<String>,
    /// The egress policy, the daemon's default already applied.
    pub(super) network: NetworkPolicy,
    /// The memory snapshot this sandbox is a fork of.
    pub(super) from_snapshot: Option<String>,
    pub(super) runtime: RuntimeKind,
}

impl Manager {
    /// Validates a policy request (400 naming the bad entry) and returns it
    /// with the daemon's `default_egress` applied when it names none.
    pub(super) fn resolved_network(
        &self,
        req: &NetworkPolicy,
    ) -> Result<NetworkPolicy, SandboxError> {
        EgressPolicy::from_request(req, self.config.default_egress)
            .map_err(|e| SandboxError::bad("invalid_network_policy", e.to_string()))?;
        if req.block_network.is_none() && req.allow_list.is_none() {
            return Ok(NetworkPolicy {
                block_network: Some(self.config.default_egress == DefaultEgress::Block),
                allow_list: None,
            });
        }
        Ok(req.clone())
    }
}

/// A ready sandbox whose supervisor cannot be reached: 409.
pub(super) fn not_running(id: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Conflict {
        code: "sandbox_not_running",
        message: format!("sandbox {id} is not running: {e}"),
    }
}

pub(super) fn new_id() -> String {
    let bytes: [u8; 6] = rand::random();
    format!("sb-{}", hex::encode(bytes))
}

impl Manager {
    pub fn new(config: Config, store: Store, images: ImageCache, disk: DiskPool) -> Arc<Self> {
        let store = Arc::new(store);
        let snapshots = crate::snapshot::SnapshotIndex::load(&disk);
        super::snapshots::sweep_orphan_images(&config.state_dir, &snapshots);
        Arc::new(Self {
            events: EventLog::open(Arc::clone(&store), config.event_retention_seconds),
            metrics: crate::metrics::Metrics::new(),
            gpus: GpuService::new(config.gpu.clone()),
            supervisors: Arc::new(SocketSupervisors::new(config.sandboxes_run_dir())),
            config,
            store,
            images: Arc::new(images),
            disk: Arc::new(disk),
            records: Mutex::new(HashMap::new()),
            ttl_changed: Notify::new(),
            pool: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
            refill_done: Notify::new(),
            stopping: tokio::sync::watch::channel(false).0,
            egress_seen: Mutex::new(HashMap::new()),
            snapshots,
            virtualization: crate::runtime::virt::Virtualization::detect(),
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

    /// Deletes every sandbox (a clean stop with `stop_sandboxes_on_exit`).
    pub async fn delete_all(&self) {
        let ids: Vec<String> = self.records().keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.delete(&id).await {
                tracing::warn!(sandbox = %id, "deleting on exit: {e}");
            }
        }
    }

    pub(super) fn records(&self) -> MutexGuard<'_, HashMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn paths(&self, id: &str) -> SandboxPaths {
        SandboxPaths::new(&self.config.sandboxes_run_dir(), id)
    }

    pub(super) fn persist(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        self.store
            .put(&record.id, record)
            .map_err(SandboxError::internal)
    }

    pub fn capacity(&self) -> super::capacity::Capacity {
        let mut capacity = {
            let records = self.records();
            let all: Vec<&SandboxRecord> = records.values().collect();
            super::capacity::capacity(&self.config, &all)
        };
        let gpus = self.gpus.list();
        let held = gpus.iter().filter(|g| g.held_by.is_some()).count();
        capacity.gpus = super::capacity::Amount::new(gpus.len() as f64, held as f64);
        capacity
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
    pub async fn create(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<SandboxRecord, SandboxError> {
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

    pub(super) async fn create_now(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<SandboxRecord, SandboxError> {
        if let Some(key) = &req.idempotency_key {
            if key.is_empty() || key.len() > 256 {
                return Err(SandboxError::bad(
                    "invalid_idempotency_key",
                    "idempotency_key must be 1 to 256 bytes",
                ));
            }
            let earlier = self
                .records()
                .values()
                .find(|r| r.idempotency_key.as_deref() == Some(key.as_str()))
                .cloned();
            if let Some(earlier) = earlier {
                return match earlier.state {
                    SandboxState::Creating => Err(SandboxError::Conflict {
                        code: "create_in_progress",
                        message: format!(
                            "a create with this idempotency key is still running (sandbox {}); retry shortly",
                            earlier.id
                        ),
                    }),
                    _ => Ok(earlier),
                };
            }
        }
        let gpu = GpuRequest::from_create(req.runtime, req.gpu.as_deref(), req.gpu_count)?;
        let runtime = req.runtime.unwrap_or_default();
        if runtime == RuntimeKind::Vm {
            if let Some(why) = self.vm_unavailable() {
                return Err(SandboxError::bad("runtime_unavailable", why));
            }
        }
        let limits = validated_limits(&req, &self.config)?;
        let ttl_seconds =
            validated_ttl(req.ttl_seconds.unwrap_or(self.config.default_ttl_seconds))?;
        validated_env(&req.env)?;
        validated_labels(&req.labels)?;
        let network = self.resolved_network(&req.network)?;
        if let Some(snapshot) = req.from_snapshot.clone() {
            return self
                .create_fork(&snapshot, req, gpu, ttl_seconds, network)
                .await;
        }
        let image_name = req
            .image
            .clone()
            .unwrap_or_else(|| self.config.default_image.clone());
        // A filesystem snapshot is an image for sandboxes of its own kind:
        // a container's is overlay layers, a microVM's a disk.
        if let Some(snapshot) = self.snapshot_image(&image_name)? {
            match (runtime, snapshot.vm_scratch.is_some()) {
                (RuntimeKind::Vm, false) => {
                    return Err(SandboxError::bad(
                        "invalid_image",
                        format!("{image_name} is a filesystem snapshot of a container; use it with runtime \"container\""),
                    ))
                }
                (RuntimeKind::Container, true) => {
                    return Err(SandboxError::bad(
                        "invalid_image",
                        format!("{image_name} is a filesystem snapshot of a microVM; use it with runtime \"vm\""),
                    ))
                }
                _ => {}
            }
        }
        // The warm pool holds containers.
        if runtime == RuntimeKind::Container {
            if let Some(view) = self
                .claim_pooled(&image_name, &limits, ttl_seconds, &req)
                .await?
            {
                return Ok(view);
            }
        }
        self.create_cold(ColdCreate {
            image_name,
            limits,
            ttl_seconds,
            labels: req.labels,
            env: req.env,
            pooled: false,
            gpu,
            idempotency_key: req.idempotency_key,
            network,
            from_snapshot: None,
            runtime,
        })
        .await
    }

    /// Why a microVM cannot be made here, if it cannot.
    fn vm_unavailable(&self) -> Option<String> {
        use crate::runtime::virt::Virtualization;
        if self.virtualization == Virtualization::None {
            return Some(format!(
                "microVMs cannot run on this host: {}; use runtime \"container\"",
                self.virtualization.explain()
            ));
        }
        let vm = &self.config.vm;
        let Some(kernel) = &vm.kernel else {
            return Some(format!(
                "no guest kernel is configured: set vm_kernel in the daemon's configuration ({}); use runtime \"container\" meanwhile",
                self.virtualization.explain()
            ));
        };
        if !kernel.is_file() {
            return Some(format!(
                "the guest kernel {} (vm_kernel) does not exist; build it with scripts/build-guest-kernel.sh or fix vm_kernel",
                kernel.display()
            ));
        }
        if !vm.vmm_path.is_file() {
            return Some(format!(
                "the VMM binary {} (vmm_path) does not exist; build it with `cargo build --release -p vmm` or fix vmm_path",
                vm.vmm_path.display()
            ));
        }
        None
    }

    /// Where the agent disks of microVMs are kept, under the image cache.
    const VM_AGENT_DISKS: &str = "vm-agent";

    /// The VM a microVM sandbox boots: its image as an ext4 file (made on
    /// first use), its size from the sandbox's limits.
    async fn vm_spec(
        &self,
        record: &SandboxRecord,
        image: &crate::image::Image,
    ) -> Result<crate::runtime::microvm::VmSpec, SandboxError> {
        let vm = &self.config.vm;
        let kernel = vm.kernel.clone().ok_or_else(|| {
            SandboxError::bad(
                "runtime_unavailable",
                "no guest kernel is configured (vm_kernel)",
            )
        })?;
        let rootfs = image.rootfs.clone();
        let shift = self.config.id_map_base;
        let agent = self.config.agent_path.clone();
        let agent_dir = self.config.images_dir.join(Self::VM_AGENT_DISKS);
        let (base_disk, agent_disk) = tokio::task::spawn_blocking(move || {
            Ok::<_, crate::image::ext4::Ext4Error>((
                crate::image::ext4::ensure_ext4(&rootfs, shift)?,
                crate::image::ext4::ensure_agent_disk(&agent, &agent_dir)?,
            ))
        })
        .await
        .map_err(SandboxError::internal)?
        .map_err(SandboxError::internal)?;
        // The agent runs as the guest's init; the seed is mixed into the
        // guest kernel's RNG before anything else runs.
        let seed: [u8; 32] = rand::random();
        let cmdline = format!(
            "console=ttyS0 quiet root=/dev/vdc ro rootfstype=ext4 init={} panic=-1 reboot=k \
             {}=1 {}={} {}",
            sandbox_proto::VM_AGENT_INIT,
            sandbox_proto::AGENT_VM_ENV,
            sandbox_proto::AGENT_RNG_SEED_ENV,
            hex::encode(seed),
            vm.cmdline
        );
        Ok(crate::runtime::microvm::VmSpec {
            vmm_path: vm.vmm_path.clone(),
            kernel,
            cmdline: cmdline.trim_end().to_string(),
            // Whole vCPUs; the cgroup's CPU quota holds a fractional limit.
            vcpus: record.limits.cpu.ceil().clamp(1.0, 254.0) as u8,
            mem_mib: record.limits.memory_mib,
            overhead_bytes: vm.memory_overhead_mib << 20,
            base_disk,
            agent_disk,
            scratch_bytes: record.limits.disk_mib << 20,
            restore: None,
            scratch_from: None,
            uid: record
                .vm_uid
                .ok_or_else(|| SandboxError::internal("a microVM record without its uid"))?,
        })
    }

    pub(super) async fn create_cold(
        self: &Arc<Self>,
        create: ColdCreate,
    ) -> Result<SandboxRecord, SandboxError> {
        let ColdCreate {
            image_name,
            limits,
            ttl_seconds,
            labels,
            env,
            pooled,
            gpu,
            idempotency_key,
            network,
            from_snapshot,
            runtime,
        } = create;
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
            // The lowest uid above the containers' id range that no other
            // microVM holds.
            let vm_uid = (runtime == RuntimeKind::Vm).then(|| {
                let used: std::collections::HashSet<u32> =
                    records.values().filter_map(|r| r.vm_uid).collect();
                let base = self.config.id_map_base.saturating_add(ID_MAP_SIZE);
                (base..u32::MAX).find(|u| !used.contains(u)).unwrap_or(base)
            });
            let record = SandboxRecord {
                id: id.clone(),
                state: SandboxState::Creating,
                runtime,
                image: image_name.clone(),
                image_digest: String::new(),
                limits: limits.clone(),
                ttl_seconds,
                expires_at_ms: expiry(ttl_seconds),
                created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                labels,
                env,
                cgroups_path: format!("{}/{id}", self.config.cgroup_parent.trim_end_matches('/')),
                supervisor_pid: 0,
                oom_kills: 0,
                failure: None,
                pooled,
                supervisor_events_seen: 0,
                gpus,
                usage: Default::default(),
                idempotency_key,
                network,
                base_snapshot: from_snapshot,
                vm_uid,
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

    pub(super) async fn start(
        &self,
        mut record: SandboxRecord,
        image_name: &str,
    ) -> Result<SandboxRecord, SandboxError> {
        let begun = std::time::Instant::now();
        let mut lap = std::time::Instant::now();
        let mut phase = |name: &str| {
            self.metrics
                .observe_phase(name, lap.elapsed().as_secs_f64());
            lap = std::time::Instant::now();
        };
        self.persist(&record)?;
        let fork = record
            .base_snapshot
            .as_deref()
            .and_then(|b| self.snapshots.get(b))
            .filter(|m| m.memory.is_some());
        let mut restore = None;
        let mut vm_restore = None;
        // A microVM's filesystem snapshot used as its image: its disk.
        let mut vm_scratch = None;
        let (image, image_layers) = match fork {
            Some(snapshot) if snapshot.memory.as_ref().is_some_and(|m| m.vm.is_some()) => {
                // The VMM checks its own snapshot files before it maps them.
                if let Some(memory) = &snapshot.memory {
                    vm_restore = memory
                        .vm
                        .as_ref()
                        .map(|vm| crate::runtime::microvm::VmRestore {
                            dir: memory.images_dir.clone(),
                            scratch: vm.scratch.clone(),
                            next_proc: memory.next_proc,
                        });
                }
                let image = crate::image::Image {
                    name: snapshot.image.clone(),
                    digest: snapshot.image_digest.clone(),
                    rootfs: snapshot.base_rootfs.clone(),
                };
                (image, Vec::new())
            }
            Some(snapshot) => {
                let memory = snapshot.memory.clone().ok_or_else(|| {
                    SandboxError::internal("a memory snapshot without its checkpoint")
                })?;
                let (dir, sums) = (memory.images_dir.clone(), memory.sha256.clone());
                tokio::task::spawn_blocking(move || {
                    crate::snapshot::integrity::verify(&dir, &sums)
                })
                .await
                .map_err(SandboxError::internal)?
                .map_err(|e| SandboxError::Conflict {
                    code: "snapshot_corrupted",
                    message: e.to_string(),
                })?;
                phase("verify");
                restore = Some(crate::runtime::criu::RestoreSpec {
                    criu: self.config.criu_path.clone(),
                    images_dir: memory.images_dir,
                    checkpoint: memory.checkpoint,
                    next_proc: memory.next_proc,
                    processes: memory.processes,
                });
                let image = crate::image::Image {
                    name: snapshot.image.clone(),
                    digest: snapshot.image_digest.clone(),
                    rootfs: snapshot.base_rootfs.clone(),
                };
                (image, snapshot.layers.clone())
            }
            None => match self.snapshot_image(image_name)? {
                Some(snapshot) => {
                    record.base_snapshot = Some(snapshot.id.clone());
                    self.persist(&record)?;
                    vm_scratch = snapshot.vm_scratch.clone();
                    let image = crate::image::Image {
                        name: snapshot.id.clone(),
                        digest: snapshot.image_digest.clone(),
                        rootfs: snapshot.base_rootfs.clone(),
                    };
                    (image, snapshot.layers.clone())
                }
                None => {
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
                    (image, Vec::new())
                }
            },
        };
        record.image_digest = image.digest.clone();
        let vm = if record.runtime == RuntimeKind::Vm {
            let mut spec = self.vm_spec(&record, &image).await?;
            spec.restore = vm_restore;
            spec.scratch_from = vm_scratch;
            Some(spec)
        } else {
            None
        };
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
        let supervisor_config = SupervisorConfig {
            id: record.id.clone(),
            hostname: record.id.clone(),
            image_rootfs: image.rootfs.clone(),
            image_layers,
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
            network: record.network.clone(),
            upstream: self.config.upstream.clone(),
            egress_limits: self.config.egress_limits,
            restore,
            vm,
        };
        let json = serde_json::to_vec(&supervisor_config).map_err(SandboxError::internal)?;
        std::fs::write(paths.config(), json).map_err(SandboxError::internal)?;

        let (supervisor_pid, ready) = self.spawn_supervisor(&paths).await?;
        record.supervisor_pid = supervisor_pid;
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
        self.records().insert(record.id.clone(), record.clone());
        Ok(record)
    }

    /// Starts `sandboxd supervise DIR` in its own session and waits for its ready line.
    pub(super) async fn spawn_supervisor(
        &self,
        paths: &SandboxPaths,
    ) -> Result<(i32, ReadyLine), SandboxError> {
        // The running binary itself, even if an upgrade replaced the file:
        // a supervisor speaks the protocol of the daemon that started it.
        let exe = std::path::PathBuf::from("/proc/self/exe");
        let log = std::fs::File::create(paths.log()).map_err(SandboxError::internal)?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("supervise")
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

    pub(super) async fn remove_everything(&self, record: &SandboxRecord) {
        let paths = self.paths(&record.id);
        let problems = teardown(&record.id, &record.cgroups_path, &paths, &self.disk).await;
        if problems.is_empty() {
            self.records().remove(&record.id);
            let _ = self.store.remove(&record.id);
            self.gpus.release(&record.id);
            self.metrics.sandbox_gone(&record.id);
            if record.base_snapshot.is_some() {
                self.collect_snapshots();
            }
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
    pub(super) fn record(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        self.records()
            .get(id)
            .filter(|r| !r.pooled)
            .cloned()
            .ok_or_else(|| SandboxError::sandbox_not_found(id))
    }

    /// The sandbox as it is now, with fresh OOM and failure facts from its supervisor.
    pub async fn get(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Ok(record);
        }
        let health = self.supervisors.health(id).await.ok();
        let mut records = self.records();
        let Some(current) = records.get_mut(id) else {
            return Err(SandboxError::sandbox_not_found(id));
        };
        match health {
            Some(h) => {
                current.oom_kills = h.oom_kills;
                current.usage.egress_bytes = h.egress.bytes;
                if let Some(reason) = h.failure {
                    current.state = SandboxState::Failed;
                    current.failure = Some(reason);
                }
            }
            None => {
                current.state = SandboxState::Failed;
                current.failure = Some("the sandbox's supervisor is gone".into());
            }
        }
        let view = current.clone();
        let snapshot = current.clone();
        drop(records);
        if snapshot.state == SandboxState::Failed {
            let _ = self.persist(&snapshot);
            self.events
                .emit(EventKind::Failed, id, None, snapshot.failure.clone());
        }
        Ok(view)
    }

    pub fn list(&self) -> Vec<SandboxRecord> {
        let mut all: Vec<SandboxRecord> = self
            .records()
            .values()
            .filter(|r| !r.pooled)
            .cloned()
            .collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        all
    }

    /// A connection to a ready sandbox's supervisor (409 when it is not ready).
    pub async fn connect(&self, id: &str) -> Result<SupervisorClient, SandboxError> {
        self.ready(id)?;
        SupervisorClient::connect(&self.paths(id).socket())
            .await
            .map_err(|e| not_running(id, e))
    }

    /// A caller's sandbox that is ready (409 when it is not).
    pub(super) fn ready(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
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
        Ok(record)
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

    pub fn set_ttl(&self, id: &str, ttl_seconds: i64) -> Result<SandboxRecord, SandboxError> {
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
        Ok(record)
    }

    /// The host's GPUs and who holds them.
    pub fn gpus(&self) -> Arc<GpuService> {
        Arc::clone(&self.gpus)
    }
}
