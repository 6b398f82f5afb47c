//! The last step of a create: the supervisor's config (`shim.json`), the
//! supervisor process (`sandboxd supervise DIR`, in its own session) and
//! its ready line.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::super::{Manager, SandboxError, SandboxRecord};
use super::pipeline::Grant;
use super::root::Root;
use crate::model::{ID_MAP_SIZE, PYTHON_ARGV};
use crate::runtime::paths::SandboxPaths;
use crate::runtime::sandbox::{RuntimeSpec, SandboxSpec};
use crate::supervisor::config::{SupervisorConfig, WarmInterpreter};
use crate::supervisor::ReadyLine;

impl Manager {
    /// Writes the supervisor's config, starts it, and returns its ready
    /// line once it says the sandbox is ready (an error when it could not
    /// make it).
    pub(super) async fn launch(
        &self,
        record: &mut SandboxRecord,
        root: Root,
        layer_dir: PathBuf,
        grant: Grant,
        vm: Option<crate::runtime::sandbox::VmSpec>,
    ) -> Result<ReadyLine, SandboxError> {
        let paths = self.paths(&record.id);
        // A pod's sandbox joins CNI's namespace: a slot's would go unused.
        let netns_ready = record.join_netns.is_none() && self.adopt_net_slot(&paths.dir);
        if !netns_ready {
            std::fs::create_dir_all(&paths.dir).map_err(SandboxError::internal)?;
        }
        // A pooled container waits for its claim: Python run-code after the
        // claim then forks an interpreter started now.
        let warm_python = (record.pooled
            && self.config.pool_warm_python
            && vm.is_none()
            && root.restore.is_none())
        .then(|| {
            let (uid, gid) = record.process_user.unwrap_or((0, 0));
            WarmInterpreter {
                argv: PYTHON_ARGV.iter().map(|s| s.to_string()).collect(),
                uid,
                gid,
            }
        });
        let supervisor_config = SupervisorConfig {
            spec: SandboxSpec {
                id: record.id.clone(),
                hostname: record.hostname.clone().unwrap_or_else(|| record.id.clone()),
                default_cwd: root.image.defaults.working_dir.clone(),
                image_rootfs: root.image.rootfs,
                image_layers: root.layers,
                layer_dir,
                agent_path: self.config.agent_path.clone(),
                cgroups_path: record.cgroups_path.clone(),
                cpu: record.limits.cpu,
                cpu_shares: record.limits.cpu_shares,
                memory_bytes: record.limits.memory_mib * 1024 * 1024,
                pids: record.limits.pids as i64,
                id_map_base: self.config.id_map_base,
                id_map_size: ID_MAP_SIZE,
                shm_bytes: self.config.shm_mib * 1024 * 1024,
                nofile: self.config.nofile,
                env: grant.env,
                ready_timeout_ms: self.config.ready_timeout_seconds * 1000,
                devices: grant.devices,
                // A fork takes its snapshot's runtime, so at most one is set;
                // were both, the microVM would win, as the supervisor chose before.
                kind: match (root.restore, vm) {
                    (_, Some(vm)) => RuntimeSpec::Vm(vm),
                    (Some(restore), None) => RuntimeSpec::ContainerRestore(restore),
                    (None, None) => RuntimeSpec::Container,
                },
                netns_ready,
                host_owned_image: root.host_owned,
                joined_netns: record.join_netns.clone(),
                volumes: record.volumes.clone(),
            },
            output_buffer_bytes: (self.config.output_buffer_kib * 1024) as usize,
            network: record.network.clone(),
            upstream: self.config.upstream.clone(),
            egress_limits: self.config.egress_limits,
            warm_interpreter: warm_python,
        };
        let json = serde_json::to_vec(&supervisor_config).map_err(SandboxError::internal)?;
        std::fs::write(paths.config(), json).map_err(SandboxError::internal)?;

        let (supervisor_pid, ready) = self.spawn_supervisor(&paths).await?;
        record.supervisor_pid = supervisor_pid;
        if !ready.ok {
            let why = ready
                .error
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            // A code only for what the caller can fix; the rest is ours.
            return Err(match ready.error_code.as_deref() {
                Some("invalid_volume") => SandboxError::bad("invalid_volume", why),
                _ => SandboxError::internal(format!("the sandbox could not be started: {why}")),
            });
        }
        record.init_pid = ready.init_pid;
        Ok(ready)
    }

    /// Starts the supervisor of `paths` (a standby handed the sandbox, or
    /// `sandboxd supervise DIR` spawned for it) and waits for its ready line.
    pub(in crate::sandbox) async fn spawn_supervisor(
        &self,
        paths: &SandboxPaths,
    ) -> Result<(i32, ReadyLine), SandboxError> {
        let (pid, stdout) = match self.hand_to_standby(paths).await {
            Some(handed) => handed,
            None => {
                let log = std::fs::File::create(paths.log()).map_err(SandboxError::internal)?;
                let mut command = supervisor_command();
                command
                    .arg("supervise")
                    .arg(&paths.dir)
                    .env(
                        crate::supervisor::SPAWNED_AT_ENV,
                        crate::supervisor::monotonic_ns().to_string(),
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(log);
                let mut child = command.spawn().map_err(SandboxError::internal)?;
                let pid = child.id().map(|p| p as i32).unwrap_or(0);
                let stdout = child
                    .stdout
                    .take()
                    .ok_or_else(|| SandboxError::internal("supervisor has no stdout"))?;
                // The supervisor lives on; tokio reaps it if it ever exits
                // while we run.
                drop(child);
                (pid, stdout)
            }
        };
        let mut line = String::new();
        let deadline = Duration::from_secs(self.config.ready_timeout_seconds + 5);
        let read =
            tokio::time::timeout(deadline, BufReader::new(stdout).read_line(&mut line)).await;
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
}

/// `sandboxd` as a supervisor: the running binary itself, even if an
/// upgrade replaced the file (a supervisor speaks the protocol of the
/// daemon that started it), with a clean environment. It puts itself in a
/// session of its own, to outlive the daemon
/// ([`crate::supervisor::start_as_supervisor`]): with no code to run
/// between fork and exec, the spawn is a `posix_spawn` that copies none of
/// the daemon's memory.
pub(in crate::sandbox) fn supervisor_command() -> tokio::process::Command {
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
    command
}
