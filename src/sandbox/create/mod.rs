//! The create path. `create` admits a request (idempotency, validation, a
//! fork, a pooled sandbox or a cold create); `create_cold` admits it against
//! capacity, holds its GPUs and records it; [`pipeline`] then makes it in
//! named steps: resolve its root, make its writable layer, grant its
//! devices, launch its supervisor. Any failure removes everything made so
//! far.

pub(super) mod idempotency;
mod launch;
pub(super) use launch::supervisor_command;
mod pipeline;
mod root;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use idempotency::Admission;

use super::boot_templates::FromTemplate;
use super::events::EventKind;
use super::made_ahead::CreateInFlight;
use super::record::{expiry, SandboxRecord};
use super::validate::{validated_env, validated_labels, validated_limits, validated_ttl};
use super::warm_pool::PoolClaim;
use super::{Manager, SandboxError};
use crate::gpu::GpuRequest;
use crate::model::{CreateRequest, Limits, RuntimeKind, SandboxState, ID_MAP_SIZE};
use crate::net::policy::NetworkPolicy;

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

/// The environment every process of `record` starts with: the defaults,
/// then the image config's, then its GPUs', then the bound secrets'
/// placeholders and trust bundle, then the caller's.
pub(in crate::sandbox) fn start_env(
    image: &crate::image::ImageDefaults,
    gpu_env: Vec<(String, String)>,
    record: &SandboxRecord,
) -> Vec<(String, String)> {
    let mut env = default_env();
    env.extend(image.env.iter().cloned());
    env.extend(gpu_env);
    env.extend(crate::secrets::binding_env(&record.secrets));
    env.extend(record.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
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
    /// The sandbox's id, chosen before (a create that builds its image
    /// first reports the build under it).
    pub(super) id: String,
    pub(super) image_name: String,
    pub(super) limits: Limits,
    pub(super) ttl_seconds: i64,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) env: BTreeMap<String, String>,
    /// Made for the warm pool, not for a caller.
    pub(super) pooled: bool,
    pub(super) gpu: Option<GpuRequest>,
    pub(super) idempotency_key: Option<String>,
    /// The digest of the keyed request, kept with the key in the record.
    pub(super) request_digest: Option<String>,
    /// The egress policy, the daemon's default already applied.
    pub(super) network: NetworkPolicy,
    /// The memory snapshot this sandbox is a fork of.
    pub(super) from_snapshot: Option<String>,
    pub(super) runtime: RuntimeKind,
    /// The brokered secrets it binds.
    pub(super) secrets: Vec<crate::secrets::SecretBinding>,
    /// Host directories as its root instead of an image.
    pub(super) host_rootfs: Vec<std::path::PathBuf>,
    /// A CRI pod's network namespace to use instead of its own.
    pub(super) join_netns: Option<std::path::PathBuf>,
    /// The hostname the create named.
    pub(super) hostname: Option<String>,
    /// Host files and directories bound into its root.
    pub(super) volumes: Vec<crate::model::HostVolume>,
}

/// What the admission of a create decided, beyond the request itself.
pub(super) struct Admitted {
    /// The digest of the keyed request, kept with the key in the record.
    pub(super) request_digest: Option<String>,
    pub(super) gpu: Option<GpuRequest>,
    pub(super) ttl_seconds: i64,
    /// The egress policy, the daemon's default already applied.
    pub(super) network: NetworkPolicy,
    /// The brokered secrets asked for, with fresh placeholders.
    pub(super) secrets: Vec<crate::secrets::SecretBinding>,
}

pub(in crate::sandbox) fn new_id() -> String {
    let bytes: [u8; 6] = rand::random();
    format!("sb-{}", hex::encode(bytes))
}

impl Manager {
    /// Creates a sandbox and returns once it is ready; on any failure nothing
    /// of it is left behind. The work runs in its own task: when the caller
    /// goes away (the client disconnected and the
    /// request future was dropped) a sandbox made anyway is removed, so an
    /// abandoned create leaves nothing behind.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<SandboxRecord, SandboxError> {
        let (record, _answered) = self.create_answering(req).await?;
        Ok(record)
    }

    /// [`Manager::create`] for a caller that sends the answer on: the
    /// guard it returns is dropped once the answer is sent
    /// ([`super::Answered`]).
    async fn create_answering(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<(SandboxRecord, super::Answered), SandboxError> {
        let abandoned = Arc::new(AtomicBool::new(false));
        let guard = AbandonOnDrop(Some(Arc::clone(&abandoned)));
        let this = Arc::clone(self);
        let in_flight = CreateInFlight::new(self);
        let task = tokio::spawn(async move {
            let _in_flight = in_flight;
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
            // Made here, so a caller gone before it takes the result drops
            // it with the task's output, and the watch starts.
            result.map(|record| {
                let answered = this.answering(&record.id);
                (record, answered)
            })
        });
        let result = task.await.map_err(SandboxError::internal);
        guard.disarm();
        result?
    }

    /// [`Manager::create`], then the ports it asks for (and a fork's
    /// source exposed) exposed, with their fresh tokens. A port that
    /// cannot be exposed fails the create, and the sandbox is removed. A
    /// retried keyed create finds its ports exposed already: their tokens
    /// are rotated, so the answer that reaches the caller carries working
    /// ones (a token only the lost first answer held stops working).
    pub async fn create_exposed(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<(SandboxRecord, Vec<super::PortGrant>, super::Answered), SandboxError> {
        let mut wanted = req.ports.clone();
        if let Some(meta) = req
            .from_snapshot
            .as_deref()
            .and_then(|s| self.snapshots.visible(s))
        {
            for exposed in meta.memory.iter().flat_map(|m| &m.ports) {
                let inherited = crate::model::PortRequest {
                    port: u32::from(exposed.port),
                    auth: exposed.auth,
                    protocol: exposed.protocol,
                };
                if wanted.iter().any(|w| w.port == inherited.port) {
                    continue;
                }
                // A daemon whose ingress no longer serves it forks without it.
                match self.check_port_request(&inherited) {
                    Ok(_) => wanted.push(inherited),
                    Err(e) => tracing::warn!(
                        snapshot = %meta.id,
                        port = exposed.port,
                        "the fork does not expose its source's port: {e}"
                    ),
                }
            }
        }
        let (record, answered) = self.create_answering(req).await?;
        if wanted.is_empty() {
            return Ok((record, Vec::new(), answered));
        }
        match self.expose_on_create(&record, &wanted).await {
            Ok(grants) => {
                let record = self.record(&record.id).unwrap_or(record);
                Ok((record, grants, answered))
            }
            Err(e) => {
                tracing::warn!(sandbox = %record.id, "removing a sandbox whose ports could not be exposed: {e}");
                if let Err(left) = self.delete(&record.id).await {
                    tracing::warn!(sandbox = %record.id, "removing it: {left}");
                }
                Err(e)
            }
        }
    }

    /// A create with an idempotency key is decided by [`idempotency`] first:
    /// the key's live sandbox (made by the same body), its failed create's
    /// error again, or a 409 (`create_in_progress` while it runs,
    /// `idempotency_key_reused` for another body). Otherwise it creates,
    /// holding the key until done.
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
            let digest = req.digest();
            let admission = self.idempotency.admit(
                key,
                &digest,
                || {
                    self.records()
                        .values()
                        .find(|r| r.idempotency_key.as_deref() == Some(key.as_str()))
                        .cloned()
                },
                Instant::now(),
            );
            let claim = match admission {
                Admission::Answer(answer) => return *answer,
                Admission::Create(claim) => claim,
            };
            let result = self.create_admitted(req, Some(digest)).await;
            claim.finish(&result, Instant::now());
            return result;
        }
        self.create_admitted(req, None).await
    }

    /// A create whose idempotency key, if any, is held for it;
    /// `request_digest` is the keyed request's, kept with the key.
    async fn create_admitted(
        self: &Arc<Self>,
        req: CreateRequest,
        request_digest: Option<String>,
    ) -> Result<SandboxRecord, SandboxError> {
        super::validate::validated_host_rootfs(&req)?;
        super::validate::validated_join_netns(&req)?;
        super::validate::validated_hostname(&req)?;
        super::validate::validated_create_volumes(&req)?;
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
        let mut ports_seen = Vec::new();
        for port in &req.ports {
            let checked = self
                .check_port_request(port)
                .map_err(|e| e.of_field("ports"))?;
            if ports_seen.contains(&checked) {
                return Err(SandboxError::bad_field(
                    "invalid_port",
                    "ports",
                    format!("ports lists {checked} twice"),
                ));
            }
            ports_seen.push(checked);
        }
        super::validate::validated_volumes_beside_secrets(&req.volumes, !req.secrets.is_empty())?;
        let secrets = self.secrets.bind(&req.secrets)?;
        if let Some(clash) = secrets.iter().find(|b| req.env.contains_key(&b.name)) {
            return Err(SandboxError::bad(
                "invalid_env",
                format!(
                    "env: {} is also a bound secret (its placeholder goes there); drop it from env or from secrets",
                    clash.name
                ),
            ));
        }
        if let Some(snapshot) = req.from_snapshot.clone() {
            return self
                .create_fork(
                    &snapshot,
                    req,
                    Admitted {
                        request_digest,
                        gpu,
                        ttl_seconds,
                        network,
                        secrets,
                    },
                )
                .await;
        }
        let mut id = new_id();
        let image_name = match &req.image_spec {
            Some(spec) => self.built_image_name(&id, spec).await?,
            None if !req.host_rootfs.is_empty() => crate::model::HOST_ROOTFS_IMAGE.to_string(),
            None => req
                .image
                .clone()
                .unwrap_or_else(|| self.config.default_image.clone()),
        };
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
        // The warm pools hold containers and microVMs of images; then
        // microVMs fork from their image's boot template.
        let claim = PoolClaim {
            runtime,
            image: &image_name,
            limits: &limits,
            ttl_seconds,
            req: &req,
            request_digest: request_digest.as_deref(),
            network: &network,
            secrets: &secrets,
            gpu: gpu.is_some(),
        };
        let of_an_image = req.host_rootfs.is_empty()
            && req.join_netns.is_none()
            && req.hostname.is_none()
            && req.volumes.is_empty();
        if of_an_image {
            if let Some(view) = self.claim_pooled(&claim).await? {
                return Ok(view);
            }
        }
        let mut template_wanted = None;
        if runtime == RuntimeKind::Vm && of_an_image && gpu.is_none() {
            match self.create_from_boot_template(&id, &claim).await? {
                FromTemplate::Forked(record) => return Ok(*record),
                FromTemplate::Boot(wanted) => template_wanted = wanted,
                // Its failure was told under the id: the boot is another.
                FromTemplate::Failed => id = new_id(),
            }
        }
        let record = self
            .create_cold(ColdCreate {
                id,
                image_name,
                limits,
                ttl_seconds,
                labels: req.labels,
                env: req.env,
                pooled: false,
                gpu,
                request_digest,
                idempotency_key: req.idempotency_key,
                network,
                from_snapshot: None,
                runtime,
                secrets,
                host_rootfs: req.host_rootfs,
                join_netns: req.join_netns,
                hostname: req.hostname,
                volumes: req.volumes,
            })
            .await?;
        // The first boot of its image and size: the next is a fork.
        if let Some(wanted) = template_wanted {
            self.want_boot_template(wanted);
        }
        Ok(record)
    }

    /// The name of `spec`'s built image, built first when needed; a build
    /// (or the wait for another create's) is told in sandbox `id`'s
    /// events, and a failed one fails the create there.
    async fn built_image_name(
        self: &Arc<Self>,
        id: &str,
        spec: &crate::image::built::ImageSpec,
    ) -> Result<String, SandboxError> {
        let waited = std::sync::atomic::AtomicBool::new(false);
        let on_wait = |digest: &str| {
            waited.store(true, Ordering::Relaxed);
            self.events
                .emit(EventKind::ImageBuilding, id, None, Some(digest.to_string()));
        };
        match self.build_image(spec, &on_wait, None).await {
            Ok(image) => {
                if waited.load(Ordering::Relaxed) {
                    self.events
                        .emit(EventKind::ImageBuilt, id, None, Some(image.digest.clone()));
                }
                Ok(image.name)
            }
            Err(e) => {
                if waited.load(Ordering::Relaxed) {
                    self.events
                        .emit(EventKind::Failed, id, None, Some(e.to_string()));
                }
                Err(e)
            }
        }
    }

    /// Why a microVM cannot be made here, if it cannot.
    pub(in crate::sandbox) fn vm_unavailable(&self) -> Option<String> {
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

    pub(super) async fn create_cold(
        self: &Arc<Self>,
        create: ColdCreate,
    ) -> Result<SandboxRecord, SandboxError> {
        let ColdCreate {
            id,
            image_name,
            limits,
            ttl_seconds,
            labels,
            env,
            pooled,
            gpu,
            idempotency_key,
            request_digest,
            network,
            from_snapshot,
            runtime,
            secrets,
            host_rootfs,
            join_netns,
            hostname,
            volumes,
        } = create;
        // A caller's create takes the room of pooled sandboxes when it
        // needs it: the pools never keep real work off the host.
        if !pooled {
            loop {
                let short = {
                    let records = self.records();
                    let all: Vec<&SandboxRecord> = records.values().collect();
                    super::capacity::admit(&self.config, &all, &limits).is_err()
                };
                if !(short && self.evict_pooled().await) {
                    break;
                }
            }
        }
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
                init_pid: 0,
                oom_kills: 0,
                failure: None,
                pooled,
                claiming: false,
                supervisor_events_seen: 0,
                gpus,
                usage: Default::default(),
                idempotency_key,
                request_digest,
                network,
                base_snapshot: from_snapshot,
                vm_uid,
                secrets,
                ports: Vec::new(),
                process_user: None,
                foreign_supervisor: false,
                host_rootfs,
                join_netns,
                hostname,
                volumes,
            };
            records.insert(id.clone(), record.clone());
            record
        };
        // `start` announces the create and its readiness with the record's
        // writes.
        match self.start(record, &image_name).await {
            Ok(view) => {
                self.ttl_changed.notify_one();
                if !pooled {
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
}
