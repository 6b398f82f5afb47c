//! Daemon configuration: a TOML file whose every field a command-line flag can
//! override, merged over built-in defaults that work on a fresh machine.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::RuntimeKind;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config field `{field}` is invalid: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl From<crate::gpu::InvalidGpuConfig> for ConfigError {
    fn from(e: crate::gpu::InvalidGpuConfig) -> Self {
        ConfigError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

/// Every field is optional so the same struct serves as the TOML file and as
/// the flags that override it (`--socket`, `--state-dir`, ...).
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ConfigOverrides {
    /// Unix socket the API listens on.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Group that may use the socket (mode 0660); empty keeps root's group.
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Persistent state: the store, the image cache, the disk pool.
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// Runtime state: per-sandbox mounts, namespaces and supervisor sockets.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Image cache (default: `<state_dir>/images`); several daemons may share one.
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// Mount point of the btrfs pool of writable layers (default:
    /// `<state_dir>/disk`); its sparse backing file is `<dir>.btrfs`.
    #[arg(long)]
    pub disk_pool_dir: Option<PathBuf>,
    /// Statically linked sandbox-agent binary; found next to sandboxd by default.
    #[arg(long)]
    pub agent_path: Option<PathBuf>,
    /// Extra folders of image recipes (`<name>.sh`) beside the built-in ones.
    #[arg(long)]
    pub image_recipe_dirs: Option<Vec<PathBuf>>,
    #[arg(long)]
    pub default_image: Option<String>,
    #[arg(long, allow_negative_numbers = true)]
    pub default_ttl_seconds: Option<i64>,
    #[arg(long)]
    pub default_cpu: Option<f64>,
    #[arg(long)]
    pub default_memory_mib: Option<u64>,
    #[arg(long)]
    pub default_disk_mib: Option<u64>,
    #[arg(long)]
    pub default_pids: Option<u64>,
    /// Largest CPU request one sandbox may make, in cores (default: all host cores).
    #[arg(long)]
    pub max_cpu: Option<f64>,
    /// Largest memory request one sandbox may make (default: host memory).
    #[arg(long)]
    pub max_memory_mib: Option<u64>,
    #[arg(long)]
    pub max_disk_mib: Option<u64>,
    #[arg(long)]
    pub max_pids: Option<u64>,
    /// Sandboxes this host runs at once; more get a 503.
    #[arg(long)]
    pub max_sandboxes: Option<usize>,
    /// Size of each sandbox's /dev/shm.
    #[arg(long)]
    pub shm_mib: Option<u64>,
    /// RLIMIT_NOFILE inside sandboxes.
    #[arg(long)]
    pub nofile: Option<u64>,
    /// GPU discovery, and the test-only fake inventory: TOML table `[gpu]`,
    /// flags `--gpu-*`.
    #[serde(default)]
    #[command(flatten)]
    pub gpu: crate::gpu::GpuConfigOverrides,
    /// Size of the sparse btrfs pool that holds the sandboxes' writable layers.
    #[arg(long)]
    pub disk_pool_gib: Option<u64>,
    /// First host uid/gid of the range sandbox ids 0..65535 map to.
    #[arg(long)]
    pub id_map_base: Option<u32>,
    /// Output kept per process for readers who attach late (stdout+stderr).
    #[arg(long)]
    pub output_buffer_kib: Option<u64>,
    /// Largest file upload accepted.
    #[arg(long)]
    pub max_upload_mib: Option<u64>,
    /// Ready sandboxes of the default image kept warm; a create of that
    /// image whose limits fit the default ones takes one instead of
    /// starting cold, whatever its egress policy, secrets, env, TTL and
    /// labels.
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// Container network namespaces (interfaces and rules included) kept
    /// made ahead of creates, so none is made on a create's critical path
    /// (default 8; 0 makes each in its create).
    #[arg(long)]
    pub net_slots: Option<usize>,
    /// Supervisor processes kept started ahead of creates (exec'd and in
    /// their cgroup), handed a sandbox each (default 4; 0 spawns one per
    /// create).
    #[arg(long)]
    pub standby_supervisors: Option<usize>,
    /// Warm pools of other images, as `IMAGE=SIZE` (comma-separated), the
    /// image spelled as creates name it (e.g. `busybox=2`).
    #[arg(long, value_delimiter = ',')]
    pub pools: Option<Vec<String>>,
    /// Ready microVMs of the default image kept warm (needs `vm_kernel`); a
    /// `runtime: "vm"` create of that image takes one when its memory and
    /// disk are the default ones and its CPU fits the default vCPUs.
    #[arg(long)]
    pub vm_pool_size: Option<usize>,
    /// Warm microVM pools of other images, as `IMAGE=SIZE` (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub vm_pools: Option<Vec<String>>,
    /// Pooled container sandboxes keep a Python interpreter started
    /// (default true): their Python run-code runs in a fork of it rather
    /// than a fresh interpreter wherever the fork runs as a fresh one
    /// would (the same user and start-up environment). It holds a few MiB
    /// of the sandbox's memory and one of its pids.
    #[arg(long)]
    pub pool_warm_python: Option<bool>,
    /// CPU cores this host admits as sandbox limits in total (default: host
    /// cores times `cpu_overcommit`).
    #[arg(long)]
    pub capacity_cpu: Option<f64>,
    /// Ratio of admitted CPU limits to host cores (default 16: limits are CFS
    /// ceilings, not reservations, and sandboxes are
    /// mostly idle between commands).
    #[arg(long)]
    pub cpu_overcommit: Option<f64>,
    /// Memory this host admits as sandbox limits in total (default: host
    /// memory less 1 GiB for the host, times `memory_overcommit`).
    #[arg(long)]
    pub capacity_memory_mib: Option<u64>,
    /// Ratio of admitted memory limits to memory (default 1: no overcommit).
    #[arg(long)]
    pub memory_overcommit: Option<f64>,
    /// Disk limits admitted in total (default: the disk pool's size times
    /// `disk_overcommit`).
    #[arg(long)]
    pub capacity_disk_mib: Option<u64>,
    /// Ratio of admitted disk limits to the pool's size (default 8: limits
    /// are ceilings, and writable layers are thin and rarely full).
    #[arg(long)]
    pub disk_overcommit: Option<f64>,
    /// Cgroup under which sandboxes (`<parent>/<id>`) and their supervisors
    /// (`<parent>/supervisors`) live, in every hierarchy. Give each daemon on
    /// a host its own: a daemon removes groups under it that no record owns.
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// Remount the host's cgroup2 with `favordynmods` at start (default
    /// true), so the cgroup move in every create does not wait out an RCU
    /// grace period; forks and exits host-wide pay a memory barrier
    /// instead. false leaves the mount as it is.
    #[arg(long)]
    pub cgroup_favor_dynmods: Option<bool>,
    /// Also serve `/metrics` over TCP on this address (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Also serve the API over TLS on this TCP address (e.g. 0.0.0.0:8443),
    /// to holders of a token in `api_tokens_file`. Off by default.
    #[arg(long)]
    pub api_listen: Option<std::net::SocketAddr>,
    /// PEM certificate (chain) of the remote API. Default: a self-signed
    /// one made on first start in the state dir, whose fingerprint
    /// `sandboxd --print-fingerprint` prints.
    #[arg(long)]
    pub api_tls_cert: Option<PathBuf>,
    /// PEM private key of `api_tls_cert` (mode 0600).
    #[arg(long)]
    pub api_tls_key: Option<PathBuf>,
    /// The remote API's bearer tokens: `NAME sha256:HEX` lines, mode 0600,
    /// made by `sandboxd token create NAME`, re-read on SIGHUP. Default:
    /// `<state_dir>/api-tokens`.
    #[arg(long, global = true)]
    pub api_tokens_file: Option<PathBuf>,
    /// Serve preview URLs (exposed sandbox ports) on these addresses
    /// (`ip:port`, comma-separated). Off by default.
    #[arg(long, value_delimiter = ',')]
    pub ingress_listen: Option<Vec<std::net::SocketAddr>>,
    /// The wildcard domain of host-name routing: `<id>-<port>.<domain>`.
    /// Without it only the path form `/<id>/<port>/` routes.
    #[arg(long)]
    pub ingress_domain: Option<String>,
    /// PEM certificate (chain) the ingress serves TLS with (ALPN h2 and
    /// http/1.1); without it the ingress is cleartext (HTTP/1.1 and h2c).
    #[arg(long)]
    pub ingress_tls_cert: Option<PathBuf>,
    /// PEM private key of `ingress_tls_cert`.
    #[arg(long)]
    pub ingress_tls_key: Option<PathBuf>,
    /// Connections one sandbox may have open through the ingress at once.
    #[arg(long)]
    pub ingress_max_connections: Option<usize>,
    /// Host ports given to raw TCP exposures: `FIRST-LAST`, opened on the
    /// IP addresses of `ingress_listen`. Off by default.
    #[arg(long)]
    pub ingress_tcp_ports: Option<String>,
    /// The `Host` an app behind the ingress sees: `original` (default) or
    /// `localhost` (`localhost:<port>`).
    #[arg(long)]
    pub ingress_host_header: Option<String>,
    /// The URL clients reach the ingress at (`https://preview.example.com`,
    /// or with a port), when it is not the first listener: a proxy or load
    /// balancer in front. Path URLs use its host; every URL its scheme and
    /// port.
    #[arg(long)]
    pub ingress_public_url: Option<String>,
    /// `text` (journald-friendly, no colours off a terminal) or `json`.
    #[arg(long)]
    pub log_format: Option<String>,
    /// End every sandbox on a clean stop (default: they keep running and
    /// the next daemon adopts them).
    #[arg(long)]
    pub stop_sandboxes_on_exit: Option<bool>,
    /// How long the event log (`GET /v1/events`) keeps events.
    #[arg(long)]
    pub event_retention_seconds: Option<u64>,
    /// Seconds a create may take to become ready before it fails.
    #[arg(long)]
    pub ready_timeout_seconds: Option<u64>,
    /// Egress of a sandbox whose create names no policy: `block` (default)
    /// or `open` (public internet; the deny list still holds).
    #[arg(long, value_parser = parse_default_egress)]
    pub default_egress: Option<crate::net::policy::DefaultEgress>,
    /// Network namespace the egress proxies dial from: a name made by `ip
    /// netns add` or a path to a namespace file (default: the host's).
    #[arg(long)]
    pub upstream_netns: Option<String>,
    /// Name servers the egress proxies resolve allowed names with
    /// (`ip:port`, comma-separated; default: the upstream namespace's
    /// resolv.conf).
    #[arg(long, value_delimiter = ',')]
    pub upstream_dns: Option<Vec<std::net::SocketAddr>>,
    /// Registries (`host[:port]`) pulled from over plain HTTP instead of
    /// HTTPS (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub insecure_registries: Option<Vec<String>>,
    /// Registries (`host[:port]`) the egress deny list does not apply to
    /// when pulling, for a registry on a private network or loopback
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub private_registries: Option<Vec<String>>,
    /// The only registries (`host[:port]`, `docker.io` for Docker Hub)
    /// images may be pulled from (comma-separated; default: any).
    #[arg(long, value_delimiter = ',')]
    pub allowed_registries: Option<Vec<String>>,
    /// Registry credentials: a 0600 JSON file in the `auths` form of
    /// Docker's config.json.
    #[arg(long)]
    pub registry_auth_file: Option<PathBuf>,
    /// The PEP 503 index image builds install `python_packages` from
    /// (default: PyPI); a build sandbox may reach its host and nothing
    /// else of pip's.
    #[arg(long)]
    pub pip_index_url: Option<String>,
    /// `sources.list` lines image builds install `system_packages` from,
    /// instead of the base image's own (e.g. a local mirror); a build
    /// sandbox may reach their hosts.
    #[arg(long)]
    pub apt_sources: Option<Vec<String>>,
    /// PEM files of CAs the egress proxies also trust when they verify an
    /// intercepted host's certificate (brokered secrets), beside the
    /// system's roots (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub egress_extra_ca: Option<Vec<PathBuf>>,
    /// Connections one sandbox may hold open through its proxy.
    #[arg(long)]
    pub egress_max_connections: Option<usize>,
    /// DNS queries one sandbox may make per second; more get REFUSED.
    #[arg(long)]
    pub egress_dns_qps: Option<u32>,
    /// Egress bandwidth per sandbox and direction, in Mbit/s (0: no cap).
    #[arg(long)]
    pub egress_bandwidth_mbit: Option<u64>,
    /// The CRIU binary memory snapshots use (4.2 or newer; default: the
    /// first of /usr/local/sbin/criu, /usr/sbin/criu).
    #[arg(long)]
    pub criu_path: Option<PathBuf>,
    /// The guest kernel microVM sandboxes boot (`runtime: "vm"`). Without
    /// one, creating a microVM is refused. On a kvm_pvm host it must be a
    /// PVM-enabled kernel.
    #[arg(long)]
    pub vm_kernel: Option<PathBuf>,
    /// The `vmm` binary (default: beside sandboxd, else
    /// /usr/local/lib/sandboxd/vmm).
    #[arg(long)]
    pub vmm_path: Option<PathBuf>,
    /// Words appended to every microVM's kernel command line.
    #[arg(long)]
    pub vm_cmdline: Option<String>,
    /// Memory a microVM's cgroup allows beyond its guest RAM, for the VMM
    /// itself (page tables, device buffers, the binary), in MiB.
    #[arg(long)]
    pub vm_memory_overhead_mib: Option<u64>,
    /// Fork microVM creates from boot templates (default true): after a
    /// create boots an image at a size for the first time, the daemon boots
    /// one more while idle and keeps a memory snapshot of it, and later
    /// creates of that image and size restore it instead of booting.
    #[arg(long)]
    pub vm_boot_templates: Option<bool>,
}

fn parse_default_egress(s: &str) -> Result<crate::net::policy::DefaultEgress, String> {
    match s {
        "block" => Ok(crate::net::policy::DefaultEgress::Block),
        "open" => Ok(crate::net::policy::DefaultEgress::Open),
        other => Err(format!("expected block or open, got {other:?}")),
    }
}

/// Where `scripts/install-criu.sh` puts CRIU, else Debian's.
fn default_criu_path() -> PathBuf {
    ["/usr/local/sbin/criu", "/usr/sbin/criu"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/local/sbin/criu"))
}

/// The merged, validated configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub socket_group: Option<String>,
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub images_dir: PathBuf,
    pub disk_pool_dir: PathBuf,
    pub agent_path: PathBuf,
    pub image_recipe_dirs: Vec<PathBuf>,
    pub default_image: String,
    pub default_ttl_seconds: i64,
    pub default_cpu: f64,
    pub default_memory_mib: u64,
    pub default_disk_mib: u64,
    pub default_pids: u64,
    pub max_cpu: f64,
    pub max_memory_mib: u64,
    pub max_disk_mib: u64,
    pub max_pids: u64,
    pub max_sandboxes: usize,
    pub shm_mib: u64,
    pub nofile: u64,
    pub gpu: crate::gpu::GpuConfig,
    pub disk_pool_gib: u64,
    pub id_map_base: u32,
    pub output_buffer_kib: u64,
    pub max_upload_mib: u64,
    pub ready_timeout_seconds: u64,
    /// The warm pools: containers of the default image (`pool_size`) and of
    /// `pools`, then microVMs (`vm_pool_size`, `vm_pools`).
    pub warm_pools: Vec<WarmPoolSize>,
    /// Pooled containers keep a warm Python interpreter (`pool_warm_python`).
    pub pool_warm_python: bool,
    pub net_slots: usize,
    pub standby_supervisors: usize,
    pub event_retention_seconds: u64,
    pub capacity_cpu: f64,
    pub capacity_memory_mib: u64,
    pub capacity_disk_mib: u64,
    pub metrics_address: Option<std::net::SocketAddr>,
    pub remote_api: RemoteApiSettings,
    pub ingress: IngressSettings,
    /// Pulling images from OCI registries.
    pub registry: crate::image::oci::RegistrySettings,
    /// Where image builds fetch packages from.
    pub package_sources: crate::image::built::PackageSources,
    pub cgroup_parent: String,
    pub cgroup_favor_dynmods: bool,
    pub log_format: LogFormat,
    pub stop_sandboxes_on_exit: bool,
    pub default_egress: crate::net::policy::DefaultEgress,
    pub upstream: crate::net::upstream::UpstreamConfig,
    pub egress_limits: crate::net::limits::EgressLimits,
    pub criu_path: PathBuf,
    pub vm: VmSettings,
}

/// How microVM sandboxes are made.
#[derive(Debug, Clone)]
pub struct VmSettings {
    pub kernel: Option<PathBuf>,
    pub vmm_path: PathBuf,
    pub cmdline: String,
    pub memory_overhead_mib: u64,
    /// Creates fork from boot templates (`vm_boot_templates`).
    pub boot_templates: bool,
}

/// The optional TCP + TLS listener of the API and its tokens.
#[derive(Debug, Clone)]
pub struct RemoteApiSettings {
    pub listen: Option<std::net::SocketAddr>,
    /// Certificate and key files; `None`: the self-signed pair in the
    /// state dir.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub tokens_file: PathBuf,
}

/// The preview-URL listener (`ingress_*`); off while `listen` is empty.
#[derive(Debug, Clone)]
pub struct IngressSettings {
    pub listen: Vec<std::net::SocketAddr>,
    /// Lower-cased, without a leading or trailing dot.
    pub domain: Option<String>,
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub max_connections: usize,
    /// Host ports for raw TCP exposures, both ends included.
    pub tcp_ports: Option<(u16, u16)>,
    pub host_header: IngressHostHeader,
    /// Where clients reach the ingress, when set (`ingress_public_url`).
    pub public_url: Option<PublicUrl>,
}

/// The scheme, host and port clients reach the ingress at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    pub https: bool,
    pub host: String,
    pub port: Option<u16>,
}

impl PublicUrl {
    fn parse(text: &str) -> Option<PublicUrl> {
        let uri: hyper::Uri = text.parse().ok()?;
        let https = match uri.scheme_str()? {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let authority = uri.authority()?;
        let path_is_root = matches!(uri.path(), "" | "/") && uri.query().is_none();
        (path_is_root && !authority.as_str().contains('@')).then(|| PublicUrl {
            https,
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }
}

impl IngressSettings {
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }
}

/// The `Host` header an app behind the ingress sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressHostHeader {
    /// What the client sent.
    Original,
    /// `localhost:<port>`, for development servers that check it.
    Localhost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

pub use crate::model::ID_MAP_SIZE;

impl Config {
    /// Reads `file` (when given) and applies `flags` over it.
    pub fn load(file: Option<&Path>, flags: ConfigOverrides) -> Result<Self, ConfigError> {
        let from_file = match file {
            Some(path) => parse_file(path)?,
            None => ConfigOverrides::default(),
        };
        Self::merge(flags, from_file)
    }

    fn merge(flags: ConfigOverrides, file: ConfigOverrides) -> Result<Self, ConfigError> {
        macro_rules! pick {
            ($field:ident, $default:expr) => {
                flags
                    .$field
                    .clone()
                    .or(file.$field.clone())
                    .unwrap_or_else(|| $default)
            };
        }
        let default_image = pick!(default_image, "python".to_string());
        let host_cpus = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        // Sandboxes' specs, supervisors and mounts need absolute paths: a
        // relative flag is taken from the daemon's working directory.
        let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        let state_dir = absolute(pick!(state_dir, PathBuf::from("/var/lib/sandboxd")));
        let api_tokens_file = absolute(pick!(api_tokens_file, state_dir.join("api-tokens")));
        let config = Config {
            socket: absolute(pick!(socket, PathBuf::from("/run/sandboxd/sandboxd.sock"))),
            socket_group: flags
                .socket_group
                .clone()
                .or(file.socket_group.clone())
                .filter(|g| !g.is_empty()),
            run_dir: absolute(pick!(run_dir, PathBuf::from("/run/sandboxd"))),
            images_dir: absolute(pick!(images_dir, state_dir.join("images"))),
            disk_pool_dir: absolute(pick!(disk_pool_dir, state_dir.join("disk"))),
            state_dir,
            agent_path: absolute(pick!(agent_path, default_agent_path())),
            image_recipe_dirs: pick!(image_recipe_dirs, Vec::new()),
            default_image: default_image.clone(),
            default_ttl_seconds: pick!(default_ttl_seconds, 600),
            default_cpu: pick!(default_cpu, 1.0_f64.min(host_cpus)),
            default_memory_mib: pick!(default_memory_mib, 512),
            default_disk_mib: pick!(default_disk_mib, 10 * 1024),
            default_pids: pick!(default_pids, 1024),
            max_cpu: pick!(max_cpu, host_cpus),
            max_memory_mib: pick!(max_memory_mib, host_memory_mib()),
            max_disk_mib: pick!(max_disk_mib, 100 * 1024),
            max_pids: pick!(max_pids, 32768),
            max_sandboxes: pick!(max_sandboxes, 256),
            shm_mib: pick!(shm_mib, 1024),
            nofile: pick!(nofile, 65536),
            gpu: crate::gpu::GpuConfig::merge(&flags.gpu, &file.gpu)?,
            disk_pool_gib: pick!(disk_pool_gib, 64),
            id_map_base: pick!(id_map_base, 100_000),
            output_buffer_kib: pick!(output_buffer_kib, 4096),
            max_upload_mib: pick!(max_upload_mib, 1024),
            ready_timeout_seconds: pick!(ready_timeout_seconds, 30),
            net_slots: pick!(net_slots, 8),
            standby_supervisors: pick!(standby_supervisors, 4),
            warm_pools: [
                warm_pools(
                    RuntimeKind::Container,
                    &default_image,
                    pick!(pool_size, 0),
                    &pick!(pools, Vec::new()),
                )?,
                warm_pools(
                    RuntimeKind::Vm,
                    &default_image,
                    pick!(vm_pool_size, 0),
                    &pick!(vm_pools, Vec::new()),
                )?,
            ]
            .concat(),
            pool_warm_python: pick!(pool_warm_python, true),
            default_egress: pick!(default_egress, Default::default()),
            upstream: crate::net::upstream::UpstreamConfig {
                netns: flags
                    .upstream_netns
                    .clone()
                    .or(file.upstream_netns.clone())
                    .filter(|n| !n.is_empty())
                    .map(|n| crate::net::upstream::netns_path(&n)),
                dns: pick!(upstream_dns, Vec::new()),
                extra_ca: pick!(egress_extra_ca, Vec::new())
                    .into_iter()
                    .map(absolute)
                    .collect(),
            },
            criu_path: pick!(criu_path, default_criu_path()),
            vm: VmSettings {
                kernel: flags
                    .vm_kernel
                    .clone()
                    .or(file.vm_kernel.clone())
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(absolute),
                // The VMM starts in the VM's run directory: a relative
                // path would be resolved there.
                vmm_path: std::path::absolute(pick!(vmm_path, default_vmm_path()))
                    .unwrap_or_else(|_| default_vmm_path()),
                cmdline: pick!(vm_cmdline, String::new()),
                memory_overhead_mib: pick!(vm_memory_overhead_mib, 32),
                boot_templates: pick!(vm_boot_templates, true),
            },
            egress_limits: {
                let defaults = crate::net::limits::EgressLimits::default();
                crate::net::limits::EgressLimits {
                    max_connections: pick!(egress_max_connections, defaults.max_connections),
                    dns_qps: pick!(egress_dns_qps, defaults.dns_qps),
                    bandwidth_bytes_per_sec: pick!(
                        egress_bandwidth_mbit,
                        defaults.bandwidth_bytes_per_sec / 125_000
                    )
                    .saturating_mul(125_000),
                }
            },
            event_retention_seconds: pick!(event_retention_seconds, 24 * 3600),
            metrics_address: flags.metrics_address.or(file.metrics_address),
            remote_api: RemoteApiSettings {
                listen: flags.api_listen.or(file.api_listen),
                tls_files: cert_and_key(
                    flags.api_tls_cert.clone().or(file.api_tls_cert.clone()),
                    flags.api_tls_key.clone().or(file.api_tls_key.clone()),
                    "api_tls_cert",
                    "api_tls_cert and api_tls_key go together: name both, or neither for a self-signed certificate",
                )?
                .map(|(cert, key)| (absolute(cert), absolute(key))),
                tokens_file: api_tokens_file,
            },
            registry: crate::image::oci::RegistrySettings {
                insecure: pick!(insecure_registries, Vec::new())
                    .into_iter()
                    .map(|r| r.to_ascii_lowercase())
                    .collect(),
                private: pick!(private_registries, Vec::new())
                    .into_iter()
                    .map(|r| r.to_ascii_lowercase())
                    .collect(),
                allowed: pick!(allowed_registries, Vec::new())
                    .into_iter()
                    .map(|r| r.to_ascii_lowercase())
                    .collect(),
                auth_file: flags
                    .registry_auth_file
                    .clone()
                    .or(file.registry_auth_file.clone())
                    .map(absolute),
            },
            package_sources: package_sources(
                pick!(
                    pip_index_url,
                    crate::image::built::sources::PYPI_INDEX.to_string()
                ),
                pick!(apt_sources, Vec::new()),
            )?,
            ingress: IngressSettings {
                listen: pick!(ingress_listen, Vec::new()),
                domain: flags
                    .ingress_domain
                    .clone()
                    .or(file.ingress_domain.clone())
                    .map(|d| d.trim_matches('.').to_ascii_lowercase())
                    .filter(|d| !d.is_empty()),
                tls_files: cert_and_key(
                    flags.ingress_tls_cert.clone().or(file.ingress_tls_cert.clone()),
                    flags.ingress_tls_key.clone().or(file.ingress_tls_key.clone()),
                    "ingress_tls_cert",
                    "ingress_tls_cert and ingress_tls_key go together: name both, or neither for cleartext",
                )?
                .map(|(cert, key)| (absolute(cert), absolute(key))),
                max_connections: pick!(ingress_max_connections, 256),
                tcp_ports: match flags.ingress_tcp_ports.clone().or(file.ingress_tcp_ports.clone()) {
                    None => None,
                    Some(range) if range.is_empty() => None,
                    Some(range) => Some(parse_port_range(&range).ok_or_else(|| {
                        ConfigError::Invalid {
                            field: "ingress_tcp_ports",
                            message: format!(
                                "{range:?} is not a range FIRST-LAST of ports 1..65535 with FIRST <= LAST"
                            ),
                        }
                    })?),
                },
                public_url: match flags
                    .ingress_public_url
                    .clone()
                    .or(file.ingress_public_url.clone())
                    .filter(|u| !u.is_empty())
                {
                    None => None,
                    Some(url) => Some(PublicUrl::parse(&url).ok_or_else(|| ConfigError::Invalid {
                        field: "ingress_public_url",
                        message: format!(
                            "{url:?} is not an http:// or https:// URL with a host and no path (e.g. https://preview.example.com)"
                        ),
                    })?),
                },
                host_header: match pick!(ingress_host_header, "original".to_string()).as_str() {
                    "original" => IngressHostHeader::Original,
                    "localhost" => IngressHostHeader::Localhost,
                    other => {
                        return Err(ConfigError::Invalid {
                            field: "ingress_host_header",
                            message: format!("must be \"original\" or \"localhost\", got {other:?}"),
                        })
                    }
                },
            },
            cgroup_parent: pick!(cgroup_parent, "/sandboxd".to_string()),
            cgroup_favor_dynmods: pick!(cgroup_favor_dynmods, true),
            log_format: match pick!(log_format, "text".to_string()).as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(ConfigError::Invalid {
                        field: "log_format",
                        message: format!("must be \"text\" or \"json\", got {other:?}"),
                    })
                }
            },
            stop_sandboxes_on_exit: pick!(stop_sandboxes_on_exit, false),
            capacity_cpu: pick!(capacity_cpu, host_cpus * pick!(cpu_overcommit, 16.0)),
            capacity_memory_mib: pick!(
                capacity_memory_mib,
                (host_memory_mib().saturating_sub(1024) as f64 * pick!(memory_overcommit, 1.0))
                    as u64
            ),
            capacity_disk_mib: pick!(
                capacity_disk_mib,
                (pick!(disk_pool_gib, 64) as f64 * 1024.0 * pick!(disk_overcommit, 8.0)) as u64
            ),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, message: &str| ConfigError::Invalid {
            field,
            message: message.to_string(),
        };
        if !(self.default_cpu > 0.0 && self.default_cpu <= self.max_cpu) {
            return Err(invalid(
                "default_cpu",
                "must be above 0 and at most max_cpu",
            ));
        }
        if self.default_memory_mib < 16 || self.default_memory_mib > self.max_memory_mib {
            return Err(invalid(
                "default_memory_mib",
                "must be at least 16 and at most max_memory_mib",
            ));
        }
        if self.default_disk_mib == 0 || self.default_disk_mib > self.max_disk_mib {
            return Err(invalid(
                "default_disk_mib",
                "must be above 0 and at most max_disk_mib",
            ));
        }
        if self.default_pids < 8 || self.default_pids > self.max_pids {
            return Err(invalid(
                "default_pids",
                "must be at least 8 and at most max_pids",
            ));
        }
        if self.default_ttl_seconds == 0 || self.default_ttl_seconds < -1 {
            return Err(invalid(
                "default_ttl_seconds",
                "must be a positive number of seconds, or -1 for none",
            ));
        }
        if self.egress_limits.max_connections == 0 || self.egress_limits.dns_qps == 0 {
            return Err(invalid(
                "egress_max_connections",
                "egress_max_connections and egress_dns_qps must be above 0 (block_network is how a sandbox gets no egress)",
            ));
        }
        if let Some(netns) = &self.upstream.netns {
            if !netns.exists() {
                return Err(invalid(
                    "upstream_netns",
                    &format!(
                        "{} does not exist; create the namespace (ip netns add NAME) or leave upstream_netns unset to dial from the host's",
                        netns.display()
                    ),
                ));
            }
        }
        for ca in &self.upstream.extra_ca {
            crate::net::intercept::tls::upstream_roots(std::slice::from_ref(ca)).map_err(|e| {
                invalid(
                    "egress_extra_ca",
                    &format!("{e}; name PEM files of CA certificates"),
                )
            })?;
        }
        if self.id_map_base == 0 || self.id_map_base.checked_add(ID_MAP_SIZE).is_none() {
            return Err(invalid(
                "id_map_base",
                "must be a non-zero uid with 65536 ids free above it",
            ));
        }
        if self.output_buffer_kib < 64 {
            return Err(invalid("output_buffer_kib", "must be at least 64"));
        }
        if self.capacity_cpu.is_nan()
            || self.capacity_cpu <= 0.0
            || self.capacity_memory_mib == 0
            || self.capacity_disk_mib == 0
        {
            return Err(invalid(
                "capacity_cpu",
                "host capacity (capacity_cpu, capacity_memory_mib, capacity_disk_mib and the overcommit ratios) must be above 0",
            ));
        }
        let parent = self.cgroup_parent.trim_matches('/');
        if !self.cgroup_parent.starts_with('/')
            || parent.is_empty()
            || parent
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == ".." || p.starts_with("sb-"))
        {
            return Err(invalid(
                "cgroup_parent",
                "must be an absolute cgroup path like /sandboxd, without . or .. parts",
            ));
        }
        if self.warm_pools.iter().map(|p| p.size).sum::<usize>() > self.max_sandboxes {
            return Err(invalid(
                "pools",
                "the warm pools (pool_size, pools, vm_pool_size and vm_pools) hold more than max_sandboxes together",
            ));
        }
        if self.vm.kernel.is_none() && self.warm_pools.iter().any(|p| p.runtime == RuntimeKind::Vm)
        {
            return Err(invalid(
                "vm_pools",
                "warm microVM pools (vm_pool_size, vm_pools) need a guest kernel: set vm_kernel",
            ));
        }
        if self.max_sandboxes == 0 {
            return Err(invalid("max_sandboxes", "must be at least 1"));
        }
        if self.ingress.max_connections == 0 {
            return Err(invalid("ingress_max_connections", "must be at least 1"));
        }
        if let Some(domain) = &self.ingress.domain {
            let is_name = matches!(
                crate::net::host::parse_host(domain),
                Ok(crate::net::host::HostPort {
                    host: crate::net::host::HostSpec::Name(_),
                    port: None,
                })
            );
            if !is_name {
                return Err(invalid(
                    "ingress_domain",
                    "must be a DNS name like sandboxes.example.com (no scheme, port or IP)",
                ));
            }
        }
        if !self.ingress.enabled()
            && (self.ingress.domain.is_some()
                || self.ingress.tls_files.is_some()
                || self.ingress.tcp_ports.is_some()
                || self.ingress.public_url.is_some())
        {
            return Err(invalid(
                "ingress_listen",
                "the other ingress_* keys need ingress_listen: name the addresses the ingress listens on",
            ));
        }
        Ok(())
    }

    pub fn store_path(&self) -> PathBuf {
        self.state_dir.join("state.redb")
    }

    pub fn lock_path(&self) -> PathBuf {
        self.state_dir.join("sandboxd.lock")
    }

    pub fn disk_pool_image(&self) -> PathBuf {
        self.disk_pool_dir.with_extension("btrfs")
    }

    pub fn sandboxes_run_dir(&self) -> PathBuf {
        self.run_dir.join("sandboxes")
    }
}

/// A certificate and its key, named both or neither.
fn cert_and_key(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    field: &'static str,
    together: &str,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        _ => Err(ConfigError::Invalid {
            field,
            message: together.into(),
        }),
    }
}

/// One warm pool: `size` ready sandboxes of `image`, containers or microVMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPoolSize {
    pub runtime: RuntimeKind,
    pub image: String,
    pub size: usize,
}

/// The pools of one runtime: `pool_size` of the default image, then each
/// `IMAGE=SIZE` of `entries`; an image named twice is an error (which size
/// would it be?).
fn warm_pools(
    runtime: RuntimeKind,
    default_image: &str,
    pool_size: usize,
    entries: &[String],
) -> Result<Vec<WarmPoolSize>, ConfigError> {
    let (size_field, entries_field) = match runtime {
        RuntimeKind::Container => ("pool_size", "pools"),
        RuntimeKind::Vm => ("vm_pool_size", "vm_pools"),
    };
    let mut pools = Vec::new();
    if pool_size > 0 {
        pools.push(WarmPoolSize {
            runtime,
            image: default_image.to_string(),
            size: pool_size,
        });
    }
    for entry in entries {
        let parsed = entry
            .rsplit_once('=')
            .and_then(|(image, size)| Some((image.trim(), size.trim().parse::<usize>().ok()?)))
            .filter(|(image, size)| !image.is_empty() && *size > 0);
        let Some((image, size)) = parsed else {
            return Err(ConfigError::Invalid {
                field: entries_field,
                message: format!("{entry:?} is not IMAGE=SIZE with a size of at least 1"),
            });
        };
        if pools.iter().any(|p| p.image == image) {
            return Err(ConfigError::Invalid {
                field: entries_field,
                message: format!(
                    "{image} has two warm pools ({entries_field}, or {size_field} for the default image); give it one"
                ),
            });
        }
        pools.push(WarmPoolSize {
            runtime,
            image: image.to_string(),
            size,
        });
    }
    Ok(pools)
}

/// `FIRST-LAST`, both in 1..=65535, FIRST <= LAST.
fn parse_port_range(range: &str) -> Option<(u16, u16)> {
    let (first, last) = range.split_once('-')?;
    let first: u16 = first.trim().parse().ok()?;
    let last: u16 = last.trim().parse().ok()?;
    (first >= 1 && first <= last).then_some((first, last))
}

fn parse_file(path: &Path) -> Result<ConfigOverrides, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The `vmm` beside the daemon (a development build or an install that
/// keeps them together), else the installed location.
fn default_vmm_path() -> PathBuf {
    let installed = PathBuf::from("/usr/local/lib/sandboxd/vmm");
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("vmm")))
        .filter(|p| p.is_file())
        .unwrap_or(installed)
}

/// The first statically linked agent among: the development build of the
/// same target folder (built with an explicit target, so it sits under
/// `x86_64-unknown-linux-gnu/release`), beside the daemon, and the
/// installed location.
fn default_agent_path() -> PathBuf {
    let installed = PathBuf::from("/usr/local/lib/sandboxd/sandbox-agent");
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/local/bin/sandboxd"));
    let Some(dir) = exe.parent() else {
        return installed;
    };
    let mut candidates = Vec::new();
    if let Some(target) = dir.parent() {
        candidates.push(target.join("x86_64-unknown-linux-gnu/release/sandbox-agent"));
    }
    candidates.push(dir.join("sandbox-agent"));
    candidates.push(installed.clone());
    candidates
        .into_iter()
        .find(|c| crate::runtime::agent_binary::check(c).is_ok())
        .unwrap_or(installed)
}

fn host_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map(|kib| kib / 1024)
        .unwrap_or(1024)
}

/// The package sources, each checked to be something a build can reach.
fn package_sources(
    pip_index_url: String,
    apt_sources: Vec<String>,
) -> Result<crate::image::built::PackageSources, ConfigError> {
    use crate::image::built::sources::{apt_hosts, url_host};
    if url_host(&pip_index_url).is_none() {
        return Err(ConfigError::Invalid {
            field: "pip_index_url",
            message: format!("{pip_index_url:?} is not an http:// or https:// URL"),
        });
    }
    if let Some(line) = apt_sources.iter().find(|l| apt_hosts(l).is_empty()) {
        return Err(ConfigError::Invalid {
            field: "apt_sources",
            message: format!("{line:?} names no http:// or https:// mirror"),
        });
    }
    Ok(crate::image::built::PackageSources {
        pip_index_url,
        apt_sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_defaults_fill_the_rest() {
        let file = ConfigOverrides {
            socket: Some("/tmp/file.sock".into()),
            default_ttl_seconds: Some(60),
            ..Default::default()
        };
        let flags = ConfigOverrides {
            socket: Some("/tmp/flag.sock".into()),
            ..Default::default()
        };
        let config = Config::merge(flags, file).expect("valid");
        assert_eq!(config.socket, PathBuf::from("/tmp/flag.sock"));
        assert_eq!(config.default_ttl_seconds, 60);
        assert_eq!(config.state_dir, PathBuf::from("/var/lib/sandboxd"));
    }

    #[test]
    fn relative_paths_are_taken_from_the_working_directory() {
        let flags = ConfigOverrides {
            state_dir: Some("d/state".into()),
            run_dir: Some("d/run".into()),
            ..Default::default()
        };
        let config = Config::merge(flags, ConfigOverrides::default()).expect("valid");
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(config.state_dir, cwd.join("d/state"));
        assert_eq!(config.run_dir, cwd.join("d/run"));
        assert_eq!(config.images_dir, cwd.join("d/state/images"));
        assert_eq!(
            config.remote_api.tokens_file,
            cwd.join("d/state/api-tokens")
        );
    }

    #[test]
    fn unknown_field_in_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "sokcet = \"/x\"\n").expect("write");
        let err = Config::load(Some(&path), ConfigOverrides::default()).expect_err("typo");
        assert!(err.to_string().contains("sokcet"), "{err}");
    }

    #[test]
    fn warm_pools_are_the_default_images_then_each_named_one() {
        let flags = ConfigOverrides {
            pool_size: Some(2),
            pools: Some(vec![
                "busybox=3".into(),
                "registry.local:5000/app:1=1".into(),
            ]),
            ..Default::default()
        };
        let config = Config::merge(flags, ConfigOverrides::default()).expect("valid");
        let pools: Vec<(&str, usize)> = config
            .warm_pools
            .iter()
            .map(|p| (p.image.as_str(), p.size))
            .collect();
        assert_eq!(
            pools,
            [
                ("python", 2),
                ("busybox", 3),
                ("registry.local:5000/app:1", 1)
            ]
        );
        assert!(config
            .warm_pools
            .iter()
            .all(|p| p.runtime == RuntimeKind::Container));
        for (bad, why) in [
            ("busybox", "IMAGE=SIZE"),
            ("busybox=0", "at least 1"),
            ("=2", "IMAGE=SIZE"),
            ("python=1", "two warm pools"),
        ] {
            let flags = ConfigOverrides {
                pool_size: Some(1),
                pools: Some(vec![bad.into()]),
                ..Default::default()
            };
            let err = Config::merge(flags, ConfigOverrides::default()).expect_err(bad);
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
        let flags = ConfigOverrides {
            max_sandboxes: Some(3),
            pool_size: Some(2),
            pools: Some(vec!["busybox=2".into()]),
            ..Default::default()
        };
        let err = Config::merge(flags, ConfigOverrides::default()).expect_err("too many");
        assert!(err.to_string().contains("max_sandboxes"), "{err}");
    }

    #[test]
    fn microvm_pools_are_their_own_and_need_a_guest_kernel() {
        // The same image may have a pool of each runtime.
        let flags = ConfigOverrides {
            pool_size: Some(1),
            vm_pool_size: Some(2),
            vm_pools: Some(vec!["busybox=1".into()]),
            vm_kernel: Some("/boot/guest".into()),
            ..Default::default()
        };
        let config = Config::merge(flags, ConfigOverrides::default()).expect("valid");
        let pools: Vec<(RuntimeKind, &str, usize)> = config
            .warm_pools
            .iter()
            .map(|p| (p.runtime, p.image.as_str(), p.size))
            .collect();
        assert_eq!(
            pools,
            [
                (RuntimeKind::Container, "python", 1),
                (RuntimeKind::Vm, "python", 2),
                (RuntimeKind::Vm, "busybox", 1),
            ]
        );
        let twice = ConfigOverrides {
            vm_pool_size: Some(1),
            vm_pools: Some(vec!["python=1".into()]),
            vm_kernel: Some("/boot/guest".into()),
            ..Default::default()
        };
        let err = Config::merge(twice, ConfigOverrides::default()).expect_err("twice");
        assert!(err.to_string().contains("vm_pools"), "{err}");
        let no_kernel = ConfigOverrides {
            vm_pool_size: Some(1),
            ..Default::default()
        };
        let err = Config::merge(no_kernel, ConfigOverrides::default()).expect_err("no kernel");
        assert!(err.to_string().contains("vm_kernel"), "{err}");
    }

    #[test]
    fn impossible_defaults_are_refused() {
        let flags = ConfigOverrides {
            default_ttl_seconds: Some(0),
            ..Default::default()
        };
        let err = Config::merge(flags, ConfigOverrides::default()).expect_err("ttl 0");
        assert!(err.to_string().contains("default_ttl_seconds"));
    }

    #[test]
    fn the_ingress_reads_its_keys_and_refuses_what_cannot_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "ingress_listen = [\"127.0.0.1:8080\", \"[::1]:8080\"]\n\
             ingress_domain = \"Sandboxes.Example.COM.\"\n\
             ingress_tcp_ports = \"31000-31099\"\n\
             ingress_host_header = \"localhost\"\n",
        )
        .expect("write");
        let config = Config::load(Some(&path), ConfigOverrides::default()).expect("valid");
        assert_eq!(config.ingress.listen.len(), 2);
        assert_eq!(
            config.ingress.domain.as_deref(),
            Some("sandboxes.example.com")
        );
        assert_eq!(config.ingress.tcp_ports, Some((31000, 31099)));
        assert_eq!(config.ingress.host_header, IngressHostHeader::Localhost);
        assert_eq!(config.ingress.max_connections, 256);
        assert_eq!(
            PublicUrl::parse("https://Preview.Example.com:8443"),
            Some(PublicUrl {
                https: true,
                host: "preview.example.com".into(),
                port: Some(8443)
            })
        );
        for bad in [
            "preview.example.com",
            "ftp://x",
            "https://x/path",
            "https://u@x",
        ] {
            assert_eq!(PublicUrl::parse(bad), None, "{bad}");
        }
        let off =
            Config::merge(ConfigOverrides::default(), ConfigOverrides::default()).expect("valid");
        assert!(!off.ingress.enabled(), "off unless ingress_listen is set");
        for (flags, field) in [
            (
                ConfigOverrides {
                    ingress_domain: Some("x.test".into()),
                    ..Default::default()
                },
                "ingress_listen",
            ),
            (
                ConfigOverrides {
                    ingress_listen: Some(vec!["127.0.0.1:1".parse().expect("addr")]),
                    ingress_tcp_ports: Some("9-3".into()),
                    ..Default::default()
                },
                "ingress_tcp_ports",
            ),
            (
                ConfigOverrides {
                    ingress_listen: Some(vec!["127.0.0.1:1".parse().expect("addr")]),
                    ingress_domain: Some("10.0.0.1".into()),
                    ..Default::default()
                },
                "ingress_domain",
            ),
            (
                ConfigOverrides {
                    ingress_listen: Some(vec!["127.0.0.1:1".parse().expect("addr")]),
                    ingress_tls_cert: Some("/c.pem".into()),
                    ..Default::default()
                },
                "ingress_tls_cert",
            ),
        ] {
            let err = Config::merge(flags, ConfigOverrides::default()).expect_err(field);
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }
}
