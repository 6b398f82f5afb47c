//! The per-sandbox supervisor (`sandboxd supervise DIR`), as containerd's shims:
//! it creates the sandbox, holds the agent link and the processes' output,
//! enforces process timeouts, and serves the daemon on `shim.sock`. It runs
//! in its own session, so sandboxes and their processes outlive a daemon
//! restart; the daemon finds it again through the socket.

pub mod client;
pub mod config;
pub mod dial;
mod guest_volume_places;
pub mod link;
pub mod mailbox;
pub mod output;
pub mod processes;
pub mod protocol;
pub mod server;
pub mod standby;
mod volume_copies;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, Notify};

use crate::runtime::cgroups::{Layout, SandboxCgroups};
use crate::runtime::oom_score::ScoreStart;
use crate::runtime::paths::SandboxPaths;
use crate::runtime::sandbox::{AgentStart, Started};
use config::SupervisorConfig;
use link::AgentLink;
use processes::Supervisor;

/// The one line the supervisor prints on stdout once the sandbox is ready
/// (or could not be made); the daemon's create waits for it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReadyLine {
    pub ok: bool,
    pub init_pid: i32,
    pub error: Option<String>,
    /// Microseconds spent in each phase of the start, in order.
    #[serde(default)]
    pub phases_us: Vec<(String, u64)>,
    /// CLOCK_MONOTONIC (ns) when the line was written, so the daemon can
    /// time its way back.
    #[serde(default)]
    pub ready_at_ns: u64,
    /// The API error code of a failure the caller can fix (`invalid_volume`);
    /// `None` for the host's own (a 500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

/// The environment variable the daemon puts its CLOCK_MONOTONIC (ns) in
/// when it spawns a supervisor, so the supervisor can time its own start.
pub const SPAWNED_AT_ENV: &str = "SANDBOXD_SPAWNED_AT_NS";

/// Nanoseconds of CLOCK_MONOTONIC: one clock for every process of the host.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Where a supervisor's start goes, phase by phase (the daemon's create
/// phase metrics): from the daemon's spawn to its ready line.
struct StartClock {
    phases: Vec<(String, u64)>,
    lap: std::time::Instant,
}

impl StartClock {
    /// Starts with `exec`: from the daemon's spawn (its timestamp in
    /// [`SPAWNED_AT_ENV`]) to now, the process's exec and startup.
    fn since_spawn() -> Self {
        Self::since(
            std::env::var(SPAWNED_AT_ENV)
                .ok()
                .and_then(|v| v.parse::<u64>().ok()),
        )
    }

    /// Starts with `exec`, from the daemon's handoff at `handed_ns`
    /// (CLOCK_MONOTONIC) to now.
    fn since(handed_ns: Option<u64>) -> Self {
        let mut phases = Vec::new();
        if let Some(handed) = handed_ns {
            phases.push(("exec".into(), monotonic_ns().saturating_sub(handed) / 1000));
        }
        StartClock {
            phases,
            lap: std::time::Instant::now(),
        }
    }

    /// Time since the daemon's handoff, as far as the phases tell.
    fn elapsed(&self) -> Duration {
        let laps: u64 = self.phases.iter().map(|(_, us)| us).sum();
        Duration::from_micros(laps) + self.lap.elapsed()
    }

    fn lap(&mut self, name: &str) {
        self.phases
            .push((name.into(), self.lap.elapsed().as_micros() as u64));
        self.lap = std::time::Instant::now();
    }

    /// Phases measured elsewhere (the runtime's), ending now.
    fn add(&mut self, measured: &[(&'static str, Duration)]) {
        self.phases.extend(
            measured
                .iter()
                .map(|(name, d)| (name.to_string(), d.as_micros() as u64)),
        );
        self.lap = std::time::Instant::now();
    }
}

fn report(line: &ReadyLine) {
    let mut out = std::io::stdout().lock();
    if let Ok(json) = serde_json::to_string(line) {
        let _ = writeln!(out, "{json}");
    }
    let _ = out.flush();
    drop(out);
    // Later writes must not reach the daemon's pipe.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 of a valid descriptor onto stdout.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1) };
    }
}

/// A microVM task's volumes: the guest cannot see the host's files, so each
/// is copied into it (as a microVM pod container's are) and bound into the
/// VM's root before the sandbox is ready. The copies come back to be
/// followed once the supervisor runs.
async fn bind_guest_task_volumes(
    link: &AgentLink,
    volumes: &[crate::model::HostVolume],
) -> Result<Vec<volume_copies::Copied>, protocol::SupervisorError> {
    let mut bound = Vec::with_capacity(volumes.len());
    let mut copies = Vec::with_capacity(volumes.len());
    let following = volume_copies::Following::default();
    for (index, volume) in volumes.iter().enumerate() {
        // Keys of their own: a pod container's copies are `vol-N`.
        let key = format!("task-vol-{}", index + 1);
        copies.push(following.copy(link, &key, volume).await?);
        bound.push(sandbox_proto::GuestVolume {
            key,
            destination: volume.destination.clone(),
            read_only: volume.read_only,
            within: String::new(),
        });
    }
    let reply = link
        .call(
            sandbox_proto::RequestBody::BindVolumes { volumes: bound },
            &[],
            processes::AGENT_DEADLINE,
        )
        .await
        .map_err(|e| {
            protocol::SupervisorError::new(
                protocol::SupervisorErrorKind::Internal,
                format!("binding the volumes in the guest: {e}"),
            )
        })?;
    match reply {
        sandbox_proto::Reply::Ok => Ok(copies),
        sandbox_proto::Reply::Error(e) => Err(volume_copies::guest_volume_refused(
            "binding the volumes in the guest",
            e,
        )),
        other => Err(protocol::SupervisorError::new(
            protocol::SupervisorErrorKind::Internal,
            format!("the guest agent answered the volumes' bind with {other:?}"),
        )),
    }
}

/// How long a microVM fork's guest may take to confirm its fresh seed.
const RESEED_REPLY_WITHIN: Duration = Duration::from_secs(600);

fn fail(line: String, config: &SupervisorConfig, paths: &SandboxPaths) -> i32 {
    fail_with(line, None, config, paths)
}

/// [`fail`], telling the daemon the caller's `code` when it is theirs to fix.
fn fail_with(
    line: String,
    code: Option<&'static str>,
    config: &SupervisorConfig,
    paths: &SandboxPaths,
) -> i32 {
    let spec = &config.spec;
    tracing::error!(sandbox = %spec.id, "{line}");
    for problem in crate::runtime::destroy_sandbox(&spec.id, &spec.cgroups_path, paths) {
        tracing::warn!(sandbox = %spec.id, "cleanup after a failed create: {problem}");
    }
    report(&ReadyLine {
        ok: false,
        init_pid: 0,
        error: Some(line),
        phases_us: Vec::new(),
        ready_at_ns: monotonic_ns(),
        error_code: code.map(str::to_string),
    });
    1
}

/// What a supervisor does as it starts, which the daemon's spawn leaves to
/// it: a session of its own (nothing sent to the daemon's process group or
/// session, a terminal's hangup or interrupt, reaches it), and for a standby a
/// lower CPU priority than creates until its handoff. The daemon runs no
/// code in the child between fork and exec, which lets the spawn be a
/// `posix_spawn` (a vfork-style clone sharing the daemon's memory until the
/// exec) instead of a fork: a fork copied the page tables of the whole
/// multi-threaded daemon for each supervisor, and every daemon thread then
/// took copy-on-write faults, about 8 % of the CPU samples of a burst of
/// 100 creates.
pub fn start_as_supervisor(standby: bool) {
    if let Err(e) = nix::unistd::setsid() {
        tracing::warn!("a supervisor could not start a session of its own, so a signal to the daemon's process group may reach it: {e}");
    }
    if standby {
        // Before any other thread exists: they inherit it. The base read
        // here is the daemon's, which the handoff goes back to
        // ([`standby::run_standby`]).
        use crate::background_priority::{base, lowered, set};
        set(lowered(base()));
    }
}

/// Gives all of a supervisor's threads one malloc arena. glibc gives each
/// thread that allocates an arena of its own and keeps it after the
/// thread ends: the container's start thread (`runtime::mount_ns`) left
/// about 210 KiB more PSS in every idle sandbox that way. A supervisor's
/// few threads seldom allocate at once. Call it before any other thread
/// exists.
pub fn share_one_malloc_arena() {
    // SAFETY: mallopt takes two integers and changes only the allocator's
    // tuning; no other thread exists yet to be allocating.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

/// Runs the supervisor of the sandbox whose run directory is `dir`.
/// Returns the process exit code.
pub fn run(dir: &Path) -> i32 {
    if let Some(sandboxes_dir) = dir.parent() {
        crate::runtime::seccomp_shared::read_from(sandboxes_dir);
    }
    start(dir, StartClock::since_spawn(), true)
}

/// The supervisor's whole life once it knows its run directory; a standby
/// (`standby.rs`) joined the supervisors' cgroup before.
fn start(dir: &Path, mut clock: StartClock, join_group: bool) -> i32 {
    let paths = SandboxPaths {
        dir: dir.to_path_buf(),
    };
    let config: SupervisorConfig = match std::fs::read(paths.config())
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            report(&ReadyLine {
                ok: false,
                init_pid: 0,
                error: Some(format!("reading {}: {e}", paths.config().display())),
                phases_us: Vec::new(),
                ready_at_ns: monotonic_ns(),
                error_code: None,
            });
            return 1;
        }
    };
    // The sandbox's group is `<cgroup_parent>/<id>`; supervisors live
    // beside the sandboxes, in `<cgroup_parent>/supervisors`.
    let parent = std::path::Path::new(&config.spec.cgroups_path)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/sandboxd".into());
    if join_group {
        if let Err(e) = crate::runtime::cgroups::join_supervisors_group(&parent) {
            tracing::warn!(sandbox = %config.spec.id, "leaving the daemon's cgroup: {e}");
        }
    }
    // Orphans of the runtime's helper processes come to us, not to PID 1.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    // Before anything of the sandbox is forked from here.
    match crate::runtime::oom_score::start_sandbox_score() {
        Ok(ScoreStart::Kept | ScoreStart::Raised { .. }) => {}
        Ok(ScoreStart::RaisedAboveTheFloor { from }) => tracing::warn!(
            sandbox = %config.spec.id,
            "the sandbox starts at OOM score 0, but without CAP_SYS_RESOURCE its processes may lower theirs back to the daemon's {from}"
        ),
        Err(e) => {
            let message =
                format!("setting the sandbox's OOM score (it would inherit the daemon's): {e}");
            return fail_with(message, None, &config, &paths);
        }
    }
    clock.lap("config");
    let started = match crate::runtime::start(&config.spec, &paths) {
        Ok(s) => s,
        Err(e) => return fail_with(e.to_string(), e.callers_code(), &config, &paths),
    };
    clock.add(&started.phases);
    // From here the supervisor may hold brokered secrets' values. Not
    // before: a container's init, forked from here, must still own its
    // /proc files inside its user namespace while the runtime sets it up.
    if let Err(e) = crate::secrets::make_undumpable() {
        return fail(e.to_string(), &config, &paths);
    }
    let (init_tx, init_rx) = oneshot::channel();
    let init_pid = started.init_pid;
    let sandbox = config.spec.id.clone();
    std::thread::spawn(move || {
        crate::runtime::children::reap_children(
            init_pid,
            |status| {
                let _ = init_tx.send(status);
            },
            |pid, status| tracing::debug!(sandbox = %sandbox, pid, "reaped an orphan: {status}"),
        )
    });
    // The proxy's runtime runs on this thread: from here on it lives in the
    // upstream namespace, so every upstream socket is made there. The
    // addresses of both namespaces are the supervisor's own, refused like
    // loopback.
    let mut own_addrs = own_addresses(&config.spec.id);
    if let Err(e) = config.upstream.enter() {
        return fail(e.to_string(), &config, &paths);
    }
    if config.upstream.netns.is_some() {
        own_addrs.extend(own_addresses(&config.spec.id));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("starting the runtime: {e}"), &config, &paths),
    };
    runtime.block_on(serve(config, paths, started, init_rx, own_addrs, clock))
}

/// The interface addresses of the calling thread's network namespace.
fn own_addresses(sandbox: &str) -> Vec<std::net::IpAddr> {
    crate::net::deny::host_interface_addresses().unwrap_or_else(|e| {
        tracing::warn!(sandbox = %sandbox, "listing the host's addresses: {e}");
        Vec::new()
    })
}

async fn serve(
    config: SupervisorConfig,
    paths: SandboxPaths,
    started: Started,
    init_rx: oneshot::Receiver<String>,
    own_addrs: Vec<std::net::IpAddr>,
    mut clock: StartClock,
) -> i32 {
    let policy = match crate::net::policy::EgressPolicy::from_request(
        &config.network,
        crate::net::policy::DefaultEgress::Block,
    ) {
        Ok(p) => p,
        Err(e) => return fail(format!("the egress policy: {e}"), &config, &paths),
    };
    let resolver = config.upstream.resolver().map_err(|e| {
        tracing::warn!(sandbox = %config.spec.id, "no upstream resolver, allowed names will not resolve: {e}");
        e.to_string()
    });
    let egress = match crate::net::proxy::Egress::new(
        &config.spec.id,
        policy,
        config.egress_limits,
        resolver,
        own_addrs,
        crate::net::intercept::Interceptor::new(&config.upstream.extra_ca),
    ) {
        Ok(e) => e,
        Err(e) => return fail(e.to_string(), &config, &paths),
    };
    if let Err(e) = egress.spawn(started.egress) {
        return fail(format!("serving egress: {e}"), &config, &paths);
    }
    let deadline = Duration::from_millis(config.spec.ready_timeout_ms);
    clock.lap("egress");
    // Made while the agent starts (its exec and hello take longer), as it
    // does not need the agent. A container's apps listen in this
    // namespace; a microVM's guest is reached through the tap in it. (The
    // API socket waits for the ready line: a daemon tearing a failed or
    // timed-out create down finds no socket to wait on.)
    let dialer = dial::Dialer::start(&paths.netns())
        .map_err(|e| {
            tracing::warn!(sandbox = %config.spec.id, "no ingress into the sandbox: {e}");
        })
        .ok();
    clock.lap("serve");
    let agent_start = config.spec.kind.agent_start();
    let hello = (agent_start != AgentStart::Restored).then_some(deadline);
    let (link, events) = match AgentLink::establish(started.link, hello).await {
        Ok(l) => l,
        Err(e) => return fail(e.to_string(), &config, &paths),
    };
    let mut pending_seed = None;
    if agent_start == AgentStart::RestoredVm {
        // A microVM fork's guest left the snapshot with the source's RNG
        // state and wall time: fresh ones go first on the link. The agent
        // reads its link in order and takes them before it reads anything
        // else, so whatever the caller asks of the fork finds them in
        // force, and the fork is ready without waiting for the reply (a
        // round trip through a just-restored guest). Ingress, which
        // reaches the guest's servers without the link, and snapshots
        // wait for the reply; a refusal fails the sandbox, and an agent
        // that could not take them refuses to start any process.
        let seed: [u8; 32] = rand::random();
        let unix_time_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        // Its reply may come late (the guest paused for a disk copy right
        // after ready): callers wait on it within their own budgets.
        let sent = link
            .send(
                sandbox_proto::RequestBody::Reseed {
                    seed: seed.to_vec(),
                    unix_time_ns,
                },
                deadline.max(RESEED_REPLY_WITHIN),
            )
            .await;
        let reply = match sent {
            Ok(reply) => reply,
            Err(e) => {
                return fail(
                    format!("sending the fork's agent a fresh RNG seed and clock: {e}"),
                    &config,
                    &paths,
                )
            }
        };
        pending_seed = Some(reply);
    }
    if agent_start == AgentStart::Restored {
        // A restored agent sends no Hello: it must answer instead, saying
        // which protocol its build speaks (the snapshot's may be older).
        let asked = link
            .call(sandbox_proto::RequestBody::Health, &[], deadline)
            .await;
        let spoken = match asked {
            Ok(sandbox_proto::Reply::Health { version }) => link
                .set_agent_version(version)
                .map_err(|e| format!("answered health: {e}")),
            Ok(other) => Err(format!("answered health with {other:?}")),
            Err(e) => Err(format!("does not answer: {e}")),
        };
        if let Err(e) = spoken {
            return fail(format!("the restored agent {e}"), &config, &paths);
        }
    }
    clock.lap("agent");
    let mut task_volume_copies = Vec::new();
    if config.spec.kind.process_control() == crate::runtime::sandbox::ProcessControl::GuestAgent
        && !config.spec.volumes.is_empty()
    {
        // Within what is left of the daemon's wait for the ready line.
        let left = deadline.saturating_sub(clock.elapsed());
        let bound =
            tokio::time::timeout(left, bind_guest_task_volumes(&link, &config.spec.volumes))
                .await
                .unwrap_or_else(|_| {
                    Err(protocol::SupervisorError::new(
                        protocol::SupervisorErrorKind::InvalidInput,
                        format!(
                        "copying the volumes into the guest did not finish within the sandbox's \
                         ready timeout ({deadline:?}): give smaller volumes, or a longer \
                         ready_timeout_seconds"
                    ),
                    ))
                });
        match bound {
            Ok(copies) => task_volume_copies = copies,
            Err(e) => {
                let code = (e.kind == protocol::SupervisorErrorKind::InvalidInput)
                    .then_some("invalid_volume");
                return fail_with(e.message, code, &config, &paths);
            }
        }
        clock.lap("volumes");
    }
    if let Some(warm) = &config.warm_interpreter {
        // Ready only once it is: a claim may run code at once. An image
        // without the interpreter is ready all the same.
        let started = link
            .call(
                sandbox_proto::RequestBody::WarmInterpreter {
                    argv: warm.argv.clone(),
                    env: processes::process_env(&config.spec.env, &[]),
                    uid: warm.uid,
                    gid: warm.gid,
                },
                &[],
                deadline,
            )
            .await;
        match started {
            Ok(sandbox_proto::Reply::Ok) => {}
            Ok(other) => {
                tracing::info!(sandbox = %config.spec.id, "no warm interpreter: {other:?}")
            }
            Err(e) => tracing::info!(sandbox = %config.spec.id, "no warm interpreter: {e}"),
        }
        clock.lap("warm");
    }
    let _ = std::fs::remove_file(paths.socket());
    let listener = match UnixListener::bind(paths.socket()) {
        Ok(l) => l,
        Err(e) => {
            return fail(
                format!("binding {}: {e}", paths.socket().display()),
                &config,
                &paths,
            )
        }
    };
    let _ = std::fs::set_permissions(paths.socket(), std::fs::Permissions::from_mode(0o600));
    let cgroups = SandboxCgroups::new(Layout::detect(), &config.spec.cgroups_path);
    let supervisor = Supervisor::new(config, paths, started.init_pid, link, cgroups);
    supervisor.follow_volumes(task_volume_copies);
    let _ = supervisor.egress.set(egress);
    if let Some(reply) = pending_seed {
        supervisor.fresh_seed.send_replace(false);
        let watcher = Arc::clone(&supervisor);
        tokio::spawn(async move {
            match reply.await {
                Ok(sandbox_proto::Reply::Ok) => {
                    watcher.fresh_seed.send_replace(true);
                }
                // Deleted before the guest answered: nothing to tell.
                Err(link::LinkError::Closed(_)) => {}
                // No answer yet is no refusal: ingress and snapshots keep
                // waiting on it, each within its own budget.
                Err(e @ link::LinkError::Timeout(_)) => tracing::warn!(
                    sandbox = %watcher.config.spec.id,
                    "the fork's agent has not confirmed its fresh RNG seed and clock: {e}"
                ),
                other => watcher.fail(format!(
                    "the fork's agent did not take a fresh RNG seed and clock, and starts no process: {other:?}"
                )),
            }
        });
    }
    if let Some(dialer) = dialer {
        let _ = supervisor.dialer.set(dialer);
    }
    tokio::spawn(Arc::clone(&supervisor).consume_events(events));
    let watcher = Arc::clone(&supervisor);
    tokio::spawn(async move {
        watcher.init_ended(init_rx.await.ok());
    });
    clock.lap("finish");
    report(&ReadyLine {
        ok: true,
        init_pid: started.init_pid,
        error: None,
        phases_us: clock.phases,
        ready_at_ns: monotonic_ns(),
        error_code: None,
    });
    let shutdown = Arc::new(Notify::new());
    // Returns after a Shutdown request has torn the sandbox down.
    server::serve(listener, supervisor, shutdown).await;
    0
}
