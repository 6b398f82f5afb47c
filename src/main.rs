//! `sandboxd`: the daemon, its per-sandbox supervisor (`sandboxd supervise DIR`),
//! and operator commands (`sandboxd image build NAME`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use nix::fcntl::{Flock, FlockArg};

use sandboxd::config::{Config, ConfigOverrides, LogFormat};
use sandboxd::disk::DiskPool;
use sandboxd::image::ImageCache;
use sandboxd::sandbox::Manager;
use sandboxd::store::Store;

#[derive(Parser)]
#[command(
    name = "sandboxd",
    // The supervisor protocol too: an upgrade across a change of it leaves
    // the sandboxes of the older supervisors failed to the new daemon.
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        ", supervisor protocol ",
        sandboxd::supervisor_protocol_version!()
    ),
    about = "Runs untrusted code in throwaway sandboxes"
)]
struct Cli {
    /// TOML config file; flags override its fields.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Validate the configuration, print what is wrong, and exit.
    #[arg(long)]
    check_config: bool,
    /// Print the SHA-256 fingerprint of the remote API's TLS certificate
    /// (making the self-signed one if there is none yet), for clients to
    /// pin, and exit.
    #[arg(long)]
    print_fingerprint: bool,
    #[command(flatten)]
    overrides: ConfigOverrides,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (the default).
    Run,
    /// Supervise one sandbox (started by the daemon, not by hand).
    /// Supervisors started by earlier builds run as `sandboxd shim DIR`.
    #[command(hide = true, alias = "shim")]
    Supervise {
        dir: PathBuf,
        /// Start ahead of any sandbox and wait on stdin for one; `dir` is
        /// then the directory of the sandboxes' run directories.
        #[arg(long)]
        standby: bool,
        /// The daemon's cgroup parent (a standby joins its supervisors' group).
        #[arg(long, default_value = "/sandboxd")]
        cgroup_parent: String,
    },
    /// Manage the image cache.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Manage the remote API's bearer tokens (`api_tokens_file`).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build (or rebuild with --force) an image from its recipe.
    Build {
        names: Vec<String>,
        #[arg(long)]
        force: bool,
    },
    /// List known images and whether they are built.
    List,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Add a token for the remote API and print it (the one time it is
    /// shown; the file keeps its hash). SIGHUP makes a running daemon
    /// accept it.
    Create { name: String },
    /// List the names of the tokens.
    Ls,
    /// Revoke a token (SIGHUP makes a running daemon refuse it).
    Rm { name: String },
}

fn main() {
    let cli = Cli::parse();
    // Looked at once per process, and here, in the host's mount
    // namespace: a thread that entered a sandbox's first would see its
    // cgroup mount instead.
    sandboxd::runtime::cgroups::Layout::detect();
    if let Some(Command::Supervise {
        dir,
        standby,
        cgroup_parent,
    }) = &cli.command
    {
        sandboxd::supervisor::share_one_malloc_arena();
        let format = match std::env::var("SANDBOXD_LOG_FORMAT").as_deref() {
            Ok("json") => LogFormat::Json,
            _ => LogFormat::Text,
        };
        init_logging(format);
        sandboxd::supervisor::start_as_supervisor(*standby);
        std::process::exit(if *standby {
            sandboxd::supervisor::standby::run_standby(dir, cgroup_parent)
        } else {
            sandboxd::supervisor::run(dir)
        });
    }
    if let Err(e) = real_main(cli) {
        eprintln!("sandboxd: {e:#}");
        std::process::exit(1);
    }
}

/// Structured logs on stderr: plain text without colours when stderr is not
/// a terminal (journald adds its own metadata), or one JSON object a line.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref(), cli.overrides)?;
    init_logging(config.log_format);
    if cli.check_config {
        sandboxd::runtime::agent_binary::check(&config.agent_path)?;
        println!("configuration is valid");
        return Ok(());
    }
    if cli.print_fingerprint {
        let identity =
            sandboxd::api::remote::Identity::load_or_make(&config.remote_api, &config.state_dir)?;
        println!("{}", identity.fingerprint());
        return Ok(());
    }
    match cli.command {
        Some(Command::Image { command }) => image_command(&config, command),
        Some(Command::Token { command }) => token_command(&config, command),
        Some(Command::Supervise { .. }) => unreachable_supervise(),
        Some(Command::Run) | None => run_daemon(config),
    }
}

fn unreachable_supervise() -> anyhow::Result<()> {
    bail!("the supervise subcommand is handled before the daemon starts")
}

fn image_command(config: &Config, command: ImageCommand) -> anyhow::Result<()> {
    let images = ImageCache::open(config.images_dir.clone(), config.image_recipe_dirs.clone())?;
    match command {
        ImageCommand::Build { names, force } => {
            if names.is_empty() {
                bail!("name the images to build, e.g. `sandboxd image build python busybox`");
            }
            for name in names {
                let image = images.build(&name, force)?;
                println!("{} {} {}", image.name, image.digest, image.rootfs.display());
            }
        }
        ImageCommand::List => {
            for info in images.list() {
                println!("{info:?}");
            }
        }
    }
    Ok(())
}

fn token_command(config: &Config, command: TokenCommand) -> anyhow::Result<()> {
    use sandboxd::api::remote::tokens;
    let path = &config.remote_api.tokens_file;
    match command {
        TokenCommand::Create { name } => {
            let token = tokens::create(path, &name)?;
            println!("{token}");
            eprintln!(
                "token {name:?} added to {}; send SIGHUP to a running sandboxd (systemctl reload sandboxd) to accept it",
                path.display()
            );
        }
        TokenCommand::Ls => {
            for name in tokens::TokenSet::load(path)?.names() {
                println!("{name}");
            }
        }
        TokenCommand::Rm { name } => {
            tokens::remove(path, &name)?;
            eprintln!(
                "token {name:?} removed from {}; send SIGHUP to a running sandboxd (systemctl reload sandboxd) to refuse it",
                path.display()
            );
        }
    }
    Ok(())
}

fn lock_state_dir(config: &Config) -> anyhow::Result<Flock<std::fs::File>> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating {}", config.state_dir.display()))?;
    let path = config.lock_path();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // A daemon killed while it started a process leaves that child, between
    // its fork and its exec, holding this lock for a moment: wait that out
    // before calling the state dir taken.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut file = file;
    let locked = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                file = back;
                std::thread::sleep(Duration::from_millis(20));
            }
            result => break result,
        }
    };
    match locked {
        Ok(lock) => {
            let _ = std::fs::write(&path, format!("{}\n", std::process::id()));
            Ok(lock)
        }
        Err((_, errno)) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another sandboxd (pid {}) already uses state dir {} ({errno}); stop it or give this one another --state-dir",
                holder.trim(),
                config.state_dir.display()
            )
        }
    }
}

/// A host that refuses only costs creates time, so it is a warning.
fn favor_cgroup_dynmods() {
    use sandboxd::runtime::cgroup_dynmods::{favor_dynamic_modifications, DynmodsOutcome};
    match favor_dynamic_modifications() {
        Ok(DynmodsOutcome::TurnedOn { mount_point }) => tracing::info!(
            "remounted {} with favordynmods: moving a sandbox into its cgroups no longer waits for an RCU grace period (cgroup_favor_dynmods = false leaves the mount alone)",
            mount_point.display()
        ),
        Ok(DynmodsOutcome::AlreadyOn) => {}
        Ok(DynmodsOutcome::NoCgroup2) => tracing::info!(
            "no cgroup2 mount to give favordynmods: each create may wait for an RCU grace period; boot with cgroup_favordynmods=true to avoid it"
        ),
        Err(e) => tracing::warn!("{e}"),
    }
}

fn run_daemon(config: Config) -> anyhow::Result<()> {
    let _lock = lock_state_dir(&config)?;
    // The daemon holds brokered secrets' values: no core dump, and no
    // ptrace but by a process with CAP_SYS_PTRACE.
    sandboxd::secrets::make_undumpable()?;
    sandboxd::runtime::agent_binary::check(&config.agent_path)?;
    if config.cgroup_favor_dynmods {
        favor_cgroup_dynmods();
    }
    // Checked before anything is opened, so a refusal leaves nothing behind.
    let remote = match config.remote_api.listen {
        Some(listen) => Some(sandboxd::api::remote::PreparedRemoteApi::prepare(
            &config.remote_api,
            listen,
            &config.state_dir,
        )?),
        None => None,
    };
    let ingress = sandboxd::ingress::PreparedIngress::prepare(&config.ingress)?;
    std::fs::create_dir_all(config.sandboxes_run_dir())
        .with_context(|| format!("creating {}", config.run_dir.display()))?;
    // Every create would fail later with a bare "failed to prepare rootfs".
    sandboxd::runtime::traverse::check_daemon_paths(
        &config.sandboxes_run_dir(),
        &config.agent_path,
        config.id_map_base,
    )?;
    if let Err(e) = sandboxd::runtime::seccomp_shared::share(&config.sandboxes_run_dir()) {
        tracing::warn!("{e}; each supervisor compiles the sandbox seccomp profile itself");
    }
    let store = Store::open(&config.store_path())?;
    let images = ImageCache::open(config.images_dir.clone(), config.image_recipe_dirs.clone())?;
    let disk = DiskPool::open(
        &config.disk_pool_dir,
        &config.disk_pool_image(),
        config.disk_pool_gib * 1024 * 1024 * 1024,
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let manager = Manager::new(config.clone(), store, images, disk);
        manager.recover().await?;
        manager.start_background();
        let listener = match activated_socket()? {
            Some(listener) => {
                tracing::info!("using the socket systemd passed in");
                listener
            }
            None => sandboxd::api::server::listen(&config.socket, config.socket_group.as_deref())?,
        };
        let app = sandboxd::api::server::router(std::sync::Arc::clone(&manager));
        match remote {
            Some(remote) => {
                let stopping = std::sync::Arc::clone(&manager);
                let remote = remote.serve(app.clone(), async move { stopping.stopped().await })?;
                tracing::info!(
                    address = %remote.address,
                    fingerprint = %remote.fingerprint,
                    tokens = %remote.tokens.path().display(),
                    "serving the API over TLS to token holders"
                );
            }
            // SIGHUP's default would end the daemon; it only reloads.
            None => ignore_hangups(),
        }
        if let Some(ingress) = ingress {
            for address in ingress.serve(std::sync::Arc::clone(&manager))? {
                tracing::info!(%address, domain = ?config.ingress.domain, "serving preview URLs");
            }
        }
        spawn_watchdog();
        let shutdown = shutdown_signal();
        tracing::info!(socket = %config.socket.display(), "sandboxd ready");
        notify_systemd("READY=1");
        if let Some(address) = config.metrics_address {
            let tcp = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("binding metrics_address {address}"))?;
            let metrics = sandboxd::api::server::metrics_router(std::sync::Arc::clone(&manager));
            tokio::spawn(async move { axum::serve(tcp, metrics).await });
            tracing::info!(%address, "serving /metrics over TCP");
        }
        let stopping = std::sync::Arc::clone(&manager);
        let app = app.into_make_service_with_connect_info::<sandboxd::api::server::LocalPeer>();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown.await;
            notify_systemd("STOPPING=1");
            tracing::info!("stopping: no new requests; in-flight ones may finish");
            stopping.begin_stop();
        });
        // Streams end at once on stop; anything else gets a bounded grace.
        let grace = Duration::from_secs(config.ready_timeout_seconds + 5);
        // Served from a worker thread, not this one (the runtime's
        // `block_on`): each connection's task then starts on the worker
        // that accepted it, with no wake-up of another thread in between.
        let mut server = tokio::spawn(std::future::IntoFuture::into_future(server));
        tokio::select! {
            served = &mut server => served.context("the API server panicked")?.context("serving the API")?,
            _ = async { manager.stopped().await; tokio::time::sleep(grace).await } => {
                tracing::warn!("requests still open after {grace:?}; exiting anyway");
                // The accept loop ended with the shutdown signal; this
                // ends only its wait for the connections, whose own
                // tasks run on until the runtime drops, as before.
                server.abort();
            }
        }
        manager.drain_pool().await;
        manager.drain_net_slots();
        manager.drain_standbys();
        if !config.stop_sandboxes_on_exit {
            tracing::info!("sandboxd stopped; sandboxes keep running under their supervisors");
            return Ok(());
        }
        tracing::info!("stop_sandboxes_on_exit is set: tearing down every sandbox");
        let left = manager.delete_all().await;
        if !left.is_empty() {
            bail!(
                "stopped, but {} sandbox(es) are not fully torn down: {}; the warnings above say why; the next sandboxd retries their teardown and lists what is left, to DELETE",
                left.len(),
                left.join(", ")
            );
        }
        tracing::info!("sandboxd stopped; every sandbox was torn down");
        Ok(())
    })
}

/// Registers the handlers of SIGTERM and SIGINT now (before READY=1, so a
/// stop sent right after it is a clean stop, not the default action's
/// death in the middle of whatever runs) and resolves when one arrives.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = signals else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

fn ignore_hangups() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: nothing to reload (api_listen is not set)");
        }
    });
}

/// The listening socket systemd passed (socket activation), if it passed one
/// to this process.
fn activated_socket() -> anyhow::Result<Option<tokio::net::UnixListener>> {
    use std::os::fd::FromRawFd;
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if !ours || count < 1 {
        return Ok(None);
    }
    // Not for our children: supervisors must not think they were activated.
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    // SAFETY: LISTEN_PID names this process, so systemd passed fd 3 to it and
    // nothing else in the process owns it.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(3) };
    nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&listener),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .context("marking the activated socket close-on-exec")?;
    listener.set_nonblocking(true).context("activated socket")?;
    Ok(Some(
        tokio::net::UnixListener::from_std(listener).context("activated socket")?,
    ))
}

/// Pings systemd's watchdog at half its interval while the runtime is alive.
fn spawn_watchdog() {
    let Some(usec) = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|u| u.parse::<u64>().ok())
    else {
        return;
    };
    let period = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        loop {
            every.tick().await;
            notify_systemd("WATCHDOG=1");
        }
    });
}

/// sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET.
fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let _ = socket.send_to(state.as_bytes(), PathBuf::from(path));
}
