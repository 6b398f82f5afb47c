//! Building declarative images (`image: {"python_packages": [...], ...}`).
//! A build runs in a build sandbox made like any other (user namespace,
//! seccomp, limits) from the spec's base, whose egress allow list holds
//! only the configured package sources; its steps run as processes there,
//! and what they wrote is kept as a read-only btrfs snapshot of its layer:
//! one more overlay lower over the base, no copy. One build per content
//! address at a time; a failed build leaves nothing and its error carries
//! the tail of its log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::error::SandboxError;
use super::manager::Manager;
use super::record::SandboxRecord;
use crate::disk::DiskPool;
use crate::image::built::steps::Step;
use crate::image::built::{self, BuiltImage, BuiltStore, ImageSpec, PackageSources};
use crate::image::{Layered, Progress, ProgressSink};
use crate::model::CreateRequest;
use crate::net::policy::NetworkPolicy;
use crate::runtime::cgroups::{Layout, SandboxCgroups};
use crate::supervisor::client::Attached;
use crate::supervisor::output::OutputItem;
use crate::supervisor::protocol::SpawnSpec;

/// A whole build (all steps) may run this long.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The label that marks a build sandbox, with the build's address.
pub const BUILD_LABEL: &str = "sandboxd.io/image-build";
/// Log lines a failed build's error carries.
const TAIL_LINES: usize = 20;
const TAIL_BYTES: usize = 4096;

/// The daemon's built images and the builds under way.
pub struct Builds {
    pub(super) store: BuiltStore,
    sources: PackageSources,
    /// The build of each address under way, and its result for those
    /// that waited on it.
    flights: Mutex<HashMap<String, Arc<BuildFlight>>>,
}

impl Builds {
    /// The built images in `disk`'s pool; leftovers of interrupted builds
    /// are removed.
    pub fn open(disk: &DiskPool, sources: PackageSources) -> Self {
        let store = BuiltStore::new(disk.dir().join("built"));
        if let Err(e) = std::fs::create_dir_all(store.dir()) {
            tracing::warn!(dir = %store.dir().display(), "cannot make the built images' directory: {e}");
        }
        for partial in store.partials() {
            if let Err(e) = disk.remove_kept(&partial) {
                tracing::warn!(dir = %partial.display(), "removing an interrupted build: {e}");
            }
        }
        Builds {
            store,
            sources,
            flights: Mutex::new(HashMap::new()),
        }
    }
}

type BuildFlight = tokio::sync::OnceCell<Result<BuiltImage, SandboxError>>;

/// What a build needs besides the manager.
struct BuildJob {
    hex: String,
    spec: ImageSpec,
    base_name: String,
    base_digest: String,
    steps: Vec<Step>,
    hosts: Vec<String>,
}

impl Manager {
    /// The built image of `spec`, building it first when needed.
    /// `on_wait` is told the image's digest when the caller must wait for
    /// a build (its own or another create's); `progress` gets the log of a
    /// build this call runs.
    pub async fn build_image(
        self: &Arc<Self>,
        spec: &ImageSpec,
        on_wait: &(dyn Fn(&str) + Send + Sync),
        progress: Option<ProgressSink>,
    ) -> Result<BuiltImage, SandboxError> {
        let invalid = |e: built::SpecError| {
            SandboxError::bad_field("invalid_image_spec", "image", e.to_string())
        };
        let plan = spec.plan(&self.config.default_image).map_err(invalid)?;
        let base = self.resolve_image(&plan.base).await?;
        let layered = Layered::of(&base);
        let (checked, apt_text) = {
            let (plan, base_name) = (plan.clone(), plan.base.clone());
            tokio::task::spawn_blocking(move || {
                let checked = built::check_base(&plan, &base_name, &layered);
                (checked, layered.apt_sources())
            })
            .await
            .map_err(SandboxError::internal)?
        };
        let python_installed = checked.map_err(invalid)?;
        let sources = &self.builds.sources;
        let hex = plan.address(&base.digest, sources);
        if let Some(image) = self.builds.store.get(&hex) {
            return Ok(image);
        }
        let flight = {
            let mut flights = self
                .builds
                .flights
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            Arc::clone(flights.entry(hex.clone()).or_default())
        };
        on_wait(&format!("sha256:{hex}"));
        // Whoever comes first builds; the others wait for the same result,
        // a failure included (a failing spec is not built ten times).
        let result = flight
            .get_or_init(|| async {
                if let Some(image) = self.builds.store.get(&hex) {
                    return Ok(image);
                }
                let mut hosts = Vec::new();
                if !plan.python_packages.is_empty() {
                    hosts.extend(sources.pip_hosts());
                }
                if plan.uses_apt(python_installed) {
                    let apt = if sources.apt_sources.is_empty() {
                        apt_text
                    } else {
                        sources.apt_sources.join("\n")
                    };
                    hosts.extend(built::sources::apt_hosts(&apt));
                }
                // Each host once, in the order first named (pip's, then apt's).
                let mut seen = std::collections::HashSet::new();
                hosts.retain(|h| seen.insert(h.clone()));
                let job = BuildJob {
                    steps: built::steps::steps(&plan, sources, python_installed),
                    hex: hex.clone(),
                    spec: spec.clone(),
                    base_name: plan.base.clone(),
                    base_digest: base.digest.clone(),
                    hosts,
                };
                self.run_build(job, progress).await
            })
            .await
            .clone();
        if let Ok(mut flights) = self.builds.flights.lock() {
            if flights.get(&hex).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
                flights.remove(&hex);
            }
        }
        result
    }

    /// The image a `built-<hex>` name stands for, over its base.
    pub(super) fn built_image(&self, hex: &str) -> Result<crate::image::Image, SandboxError> {
        let gone = || {
            SandboxError::NotFound {
            code: "image_not_found",
            message: format!(
                "the built image built-{hex} is gone (pruned, or its base was); create with its spec again to rebuild it"
            ),
        }
        };
        let image = self.builds.store.get(hex).ok_or_else(gone)?;
        let base = self
            .image_by_digest(&image.base, &image.base_digest)
            .ok_or_else(gone)?;
        self.builds.store.touch(hex);
        Ok(image.image(&self.builds.store, &base))
    }

    /// Every built image.
    pub fn built_images(&self) -> Vec<BuiltImage> {
        self.builds.store.list()
    }

    /// Boxed, with its `Send` said outright: a create may build and a
    /// build creates, so the compiler cannot infer it through the cycle.
    fn run_build(
        self: &Arc<Self>,
        job: BuildJob,
        progress: Option<ProgressSink>,
    ) -> Pin<Box<dyn Future<Output = Result<BuiltImage, SandboxError>> + Send + '_>> {
        Box::pin(self.run_build_now(job, progress))
    }

    async fn run_build_now(
        self: &Arc<Self>,
        job: BuildJob,
        progress: Option<ProgressSink>,
    ) -> Result<BuiltImage, SandboxError> {
        let started = Instant::now();
        let partial = self.builds.store.partial_dir(&job.hex);
        let disk = Arc::clone(&self.disk);
        let made = partial.clone();
        tokio::task::spawn_blocking(move || {
            disk.remove_kept(&made).map_err(SandboxError::internal)?;
            std::fs::create_dir_all(&made).map_err(SandboxError::internal)
        })
        .await
        .map_err(SandboxError::internal)??;
        let request = CreateRequest {
            image: Some(job.base_name.clone()),
            network: if job.hosts.is_empty() {
                NetworkPolicy {
                    block_network: Some(true),
                    allow_list: None,
                }
            } else {
                NetworkPolicy {
                    block_network: None,
                    allow_list: Some(job.hosts.clone()),
                }
            },
            labels: BTreeMap::from([(BUILD_LABEL.to_string(), job.hex.clone())]),
            ttl_seconds: Some(BUILD_TIMEOUT.as_secs() as i64 + 300),
            ..CreateRequest::default()
        };
        tracing::info!(image = %job.hex, base = %job.base_name, hosts = ?job.hosts, "building an image");
        let record = match self.create(request).await {
            Ok(record) => record,
            Err(e) => {
                self.discard_partial(&partial).await;
                return Err(e);
            }
        };
        let log_path = partial.join("build.log");
        let ran = self
            .run_steps(&record, &job.steps, &log_path, progress)
            .await;
        let kept = match ran {
            Ok(()) => self.keep_build(&record, &partial).await,
            Err(e) => Err(e),
        };
        if let Err(e) = self.delete(&record.id).await {
            tracing::warn!(sandbox = %record.id, "removing a build sandbox: {e}");
        }
        let size_bytes = match kept {
            Ok(size) => size,
            Err(e) => {
                self.discard_partial(&partial).await;
                return Err(e);
            }
        };
        let image = BuiltImage {
            digest: format!("sha256:{}", job.hex),
            name: built::store::name_of(&job.hex),
            spec: job.spec,
            base: job.base_name,
            base_digest: job.base_digest,
            size_bytes,
            build_seconds: started.elapsed().as_secs_f64(),
            built_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            last_used_at: None,
        };
        if let Err(e) = self.builds.store.commit(&partial, &image) {
            self.discard_partial(&partial).await;
            return Err(SandboxError::internal(format!(
                "recording a built image: {e}"
            )));
        }
        tracing::info!(image = %image.digest, seconds = image.build_seconds, size_bytes, "image built");
        Ok(image)
    }

    /// Runs `steps` in the build sandbox in order, logging their output to
    /// `log_path`; the first that fails ends the build.
    async fn run_steps(
        &self,
        record: &SandboxRecord,
        steps: &[Step],
        log_path: &std::path::Path,
        progress: Option<ProgressSink>,
    ) -> Result<(), SandboxError> {
        let deadline = Instant::now() + BUILD_TIMEOUT;
        let mut log = BuildLog::create(log_path, progress)?;
        for step in steps {
            log.write(format!("$ {}\n", step.title).as_bytes());
            let left = deadline.saturating_duration_since(Instant::now());
            let spec = SpawnSpec {
                groups: Vec::new(),
                confinement: Default::default(),
                argv: step.argv.clone(),
                code: None,
                env: step.env.clone(),
                cwd: step.cwd.clone(),
                uid: 0,
                gid: 0,
                stdin: false,
                pty: None,
                timeout_ms: Some(left.as_millis().max(1) as u64),
                root: None,
            };
            let process = self.connect(&record.id).await?.spawn(spec).await?;
            let mut output = self
                .connect(&record.id)
                .await?
                .attach(process.id, 0, 0)
                .await?;
            let mut ended = None;
            while let Some(item) = output.next().await? {
                match item {
                    Attached::Output(OutputItem::Data { data, .. }) => log.write(&data),
                    Attached::Output(OutputItem::Dropped { bytes, .. }) => {
                        log.write(format!("[{bytes} bytes of output lost]\n").as_bytes())
                    }
                    Attached::Exited(process) => {
                        ended = Some(process);
                        break;
                    }
                }
            }
            let Some(process) = ended else {
                return Err(SandboxError::internal(format!(
                    "the build sandbox {} stopped during {:?}",
                    record.id, step.title
                )));
            };
            if process.exit_code != Some(0) {
                let how = if process.timed_out {
                    format!("ran past the build's {} s", BUILD_TIMEOUT.as_secs())
                } else if process.oom_killed {
                    "ran out of memory".to_string()
                } else if let Some(signal) = process.signal {
                    format!("was killed by signal {signal}")
                } else {
                    format!("exited with {}", process.exit_code.unwrap_or(-1))
                };
                return Err(SandboxError::Unprocessable {
                    code: "image_build_failed",
                    message: format!(
                        "the image build failed: {:?} {how}. Last lines of its log:\n{}",
                        step.title,
                        log.tail()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Keeps the build sandbox's layer in `partial` (frozen meanwhile, so
    /// nothing a step left running writes half a file into it). Returns
    /// the bytes the build wrote.
    async fn keep_build(
        &self,
        record: &SandboxRecord,
        partial: &std::path::Path,
    ) -> Result<u64, SandboxError> {
        let cgroups = SandboxCgroups::new(Layout::detect(), &record.cgroups_path);
        let (disk, id, dir) = (
            Arc::clone(&self.disk),
            record.id.clone(),
            partial.to_path_buf(),
        );
        tokio::task::spawn_blocking(move || {
            cgroups.freeze().map_err(SandboxError::internal)?;
            let kept = disk.keep_layer(&id, &dir);
            if let Err(e) = cgroups.thaw() {
                tracing::error!(sandbox = %id, "thawing a build sandbox: {e}");
            }
            let layer = kept.map_err(SandboxError::internal)?;
            Ok(crate::image::tree_bytes(&layer.join("upper")))
        })
        .await
        .map_err(SandboxError::internal)?
    }

    async fn discard_partial(&self, partial: &std::path::Path) {
        let (disk, dir) = (Arc::clone(&self.disk), partial.to_path_buf());
        let removed = tokio::task::spawn_blocking(move || disk.remove_kept(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(dir = %partial.display(), "removing a failed build: {e}");
        }
    }
}

/// A build's log: written to its file, sent to whoever follows it, and
/// its last lines kept for the error of a failed build.
struct BuildLog {
    file: std::fs::File,
    progress: Option<ProgressSink>,
    tail: VecDeque<u8>,
}

impl BuildLog {
    fn create(
        path: &std::path::Path,
        progress: Option<ProgressSink>,
    ) -> Result<Self, SandboxError> {
        let file = std::fs::File::create(path).map_err(SandboxError::internal)?;
        Ok(BuildLog {
            file,
            progress,
            tail: VecDeque::new(),
        })
    }

    fn write(&mut self, data: &[u8]) {
        if let Err(e) = self.file.write_all(data) {
            tracing::debug!("writing a build log: {e}");
        }
        crate::image::report(
            self.progress.as_ref(),
            Progress::Log {
                data: String::from_utf8_lossy(data).into_owned(),
            },
        );
        self.tail.extend(data);
        let excess = self.tail.len().saturating_sub(TAIL_BYTES);
        self.tail.drain(..excess);
    }

    fn tail(&self) -> String {
        let bytes: Vec<u8> = self.tail.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}
