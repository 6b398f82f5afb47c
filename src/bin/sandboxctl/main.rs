//! `sandboxctl`: the operator/scheduler command line, a thin client of sandboxd's
//! `/v1` HTTP+JSON API over its Unix socket. This file owns the command-line shape
//! (flags into request bodies) and hands each command to the module that carries
//! it out, one per kind of thing the API serves: sandboxes.rs, processes.rs,
//! files.rs, snapshots.rs, images.rs, secrets.rs and daemon.rs (health, GPUs). Beside them
//! are the HTTP client (client.rs), the parsers of human units (units.rs) and
//! what the CLI shows (output.rs).
//!
//! Exit codes: 0 ok, 1 an error (printed as `error: <message>`), 2 a usage error
//! (clap); `exec` and `run-code` end with the process's own code instead
//! (128+N for signal N, 124 for a timeout).

mod client;
mod daemon;
mod files;
mod images;
mod output;
mod ports;
mod processes;
mod remote;
mod sandboxes;
mod secrets;
mod snapshots;
mod units;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
// The wire types are the daemon's own, so the two cannot drift.
use sandboxd::api::types::{CreateSandbox, ImageChoice, StartProcess};
use sandboxd::net::policy::NetworkPolicy;

use client::Client;

#[derive(Parser)]
#[command(
    name = "sandboxctl",
    version,
    about = "Control sandboxd, the sandbox daemon, over its Unix socket or its remote API"
)]
struct Cli {
    /// The daemon's API socket.
    #[arg(
        long,
        env = "SANDBOXD_SOCKET",
        default_value = "/run/sandboxd/sandboxd.sock",
        global = true
    )]
    socket: PathBuf,
    /// A remote daemon's API (`https://HOST:PORT`, its `api_listen`)
    /// instead of the socket.
    #[arg(long, env = "SANDBOXD_URL", global = true)]
    url: Option<String>,
    /// File holding the remote API's bearer token (`sandboxd token create`);
    /// the token may also come in SANDBOXD_TOKEN, never in argv.
    #[arg(long, env = "SANDBOXD_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// Accept exactly the daemon's certificate with this SHA-256 (a
    /// self-signed one: `sandboxd --print-fingerprint`) instead of checking
    /// it against CAs.
    #[arg(long, env = "SANDBOXD_TLS_FINGERPRINT", global = true)]
    tls_fingerprint: Option<String>,
    /// A CA to check the remote daemon's certificate with, beside the
    /// system's.
    #[arg(long, env = "SANDBOXD_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// Print the daemon's raw JSON answers (NDJSON events for exec/run-code).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a sandbox; prints its id once it is ready.
    Create(Box<CreateArgs>),
    /// Run a command in a sandbox, streaming its output; exits with its exit code.
    Exec(ExecArgs),
    /// Run a file of code (or - for stdin) in a sandbox; exits like exec.
    RunCode(RunCodeArgs),
    /// List sandboxes.
    Ls,
    /// Brokered secrets: the sandbox sees a placeholder, HTTPS requests to
    /// the secret's hosts carry the value.
    #[command(subcommand)]
    Secret(SecretCmd),
    /// List the host's GPUs and the sandbox holding each.
    Gpus,
    /// Show one sandbox as JSON.
    Inspect {
        #[arg(value_parser = units::parse_id)]
        id: String,
    },
    /// Set a sandbox's TTL, counted from now: seconds, 30s/5m/2h, or none.
    Ttl {
        #[arg(value_parser = units::parse_id)]
        id: String,
        #[arg(value_parser = units::parse_ttl, allow_hyphen_values = true)]
        ttl: i64,
    },
    /// Change a running sandbox's egress policy: --block, --open, or
    /// --allow ENTRY... (hostnames, *.wildcards, IPs, CIDRs).
    Network {
        #[arg(value_parser = units::parse_id)]
        id: String,
        #[arg(long, conflicts_with_all = ["open", "allow"])]
        block: bool,
        #[arg(long, conflicts_with = "allow")]
        open: bool,
        #[arg(long, num_args = 1.., required_unless_present_any = ["block", "open"])]
        allow: Vec<String>,
    },
    /// Expose a port of a sandbox through the ingress (a preview URL);
    /// prints its URLs and token.
    Expose {
        #[arg(value_parser = units::parse_id)]
        id: String,
        port: u32,
        /// No token: anyone who reaches the ingress can use the URL.
        #[arg(long)]
        public: bool,
        /// A raw TCP port (a host port of its own) instead of HTTP.
        #[arg(long)]
        tcp: bool,
    },
    /// List a sandbox's exposed ports; --listening adds what listens in it.
    Ports {
        #[arg(value_parser = units::parse_id)]
        id: String,
        #[arg(long)]
        listening: bool,
    },
    /// Stop exposing a port; open connections through it end.
    Unexpose {
        #[arg(value_parser = units::parse_id)]
        id: String,
        port: u32,
    },
    /// Give an exposed port a new token (printed); the old one stops working.
    PortToken {
        #[arg(value_parser = units::parse_id)]
        id: String,
        port: u32,
    },
    /// Remove sandboxes (everything in them goes).
    Rm {
        #[arg(required = true, value_parser = units::parse_id)]
        ids: Vec<String>,
    },
    /// List the processes of a sandbox.
    Ps {
        #[arg(value_parser = units::parse_id)]
        id: String,
    },
    /// Kill a process and its whole tree, or send it one signal with --signal.
    Kill {
        #[arg(value_parser = units::parse_id)]
        id: String,
        /// The process id the daemon gave (the ID column of `ps`).
        process: u64,
        /// A signal number or name (TERM, SIGINT, 9) to send instead of killing.
        #[arg(long, short)]
        signal: Option<String>,
    },
    /// Copy a local file (or - for stdin) into a sandbox.
    Upload {
        #[arg(value_parser = units::parse_id)]
        id: String,
        local: PathBuf,
        remote: String,
        /// Permission bits in octal; default: the local file's (644 for stdin).
        #[arg(long, value_parser = units::parse_mode)]
        mode: Option<u32>,
    },
    /// Copy a file out of a sandbox to a local path (or - for stdout).
    Download {
        #[arg(value_parser = units::parse_id)]
        id: String,
        remote: String,
        local: PathBuf,
    },
    /// List a directory in a sandbox.
    Files {
        #[arg(value_parser = units::parse_id)]
        id: String,
        path: String,
    },
    /// Show one file's metadata.
    Stat {
        #[arg(value_parser = units::parse_id)]
        id: String,
        path: String,
    },
    /// Make a directory in a sandbox.
    Mkdir {
        #[arg(value_parser = units::parse_id)]
        id: String,
        path: String,
        /// Make missing parents too, and succeed if it exists.
        #[arg(long, short)]
        parents: bool,
    },
    /// Remove a file or directory in a sandbox.
    RmFile {
        #[arg(value_parser = units::parse_id)]
        id: String,
        path: String,
        /// Remove a directory and everything under it.
        #[arg(long, short)]
        recursive: bool,
    },
    /// Snapshot a running sandbox (it keeps running); prints the snapshot
    /// id. By default its processes and memory too, for `create
    /// --from-snapshot SNAP`; `--filesystem` its files only, as an image
    /// that `create --image SNAP` accepts.
    Snapshot {
        #[arg(value_parser = units::parse_id)]
        id: String,
        #[arg(long)]
        filesystem: bool,
    },
    /// List snapshots.
    Snapshots,
    /// List the image cache: each image, whether built, its size.
    Images,
    /// Pull a registry image now (e.g. docker.io/library/python:3.12-slim),
    /// following a moved tag; creates then find it stored.
    ImagePull { image: String },
    /// Build a declarative image from a JSON spec file (- for stdin), e.g.
    /// {"python_version": "3.11", "python_packages": ["pandas"]}, unless
    /// built; the build log streams to stderr.
    ImageBuild { file: PathBuf },
    /// Remove what nothing uses: images built from specs, pulled images
    /// and their layers, recipe images no recipe names any more (and
    /// forced-rebuild leftovers); what a sandbox or snapshot stacks stays.
    ImagePrune,
    /// Delete snapshots; sandboxes made from them keep running.
    RmSnapshot {
        #[arg(required = true, value_parser = units::parse_id)]
        ids: Vec<String>,
    },
    /// Check that the daemon answers; exits 1 unless it says ok.
    Health,
}

#[derive(Args)]
struct CreateArgs {
    /// Retrying with the same key returns the sandbox the first attempt made.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Fork a memory snapshot: start with its processes where they stood.
    #[arg(long, value_parser = units::parse_id)]
    from_snapshot: Option<String>,
    /// A directory on the daemon's host as the root instead of an image,
    /// owned by host ids (repeat to stack more; the first is the top).
    #[arg(long = "host-rootfs", conflicts_with_all = ["image", "from_snapshot"])]
    host_rootfs: Vec<PathBuf>,
    /// Use this network namespace (e.g. /var/run/netns/NAME) instead of
    /// the sandbox's own; its egress rules are added there. Root only.
    #[arg(long, value_name = "NETNS")]
    join_netns: Option<PathBuf>,
    /// Bind a host file or directory into the root: SRC:DST, or
    /// SRC:DST:ro read-only (repeat for more). Root only; containers only.
    #[arg(short = 'v', long = "volume", value_name = "SRC:DST[:ro]", value_parser = units::parse_volume)]
    volumes: Vec<sandboxd::model::HostVolume>,
    /// The sandbox's hostname (default: its id).
    #[arg(long)]
    hostname: Option<String>,
    /// Bind a brokered secret by name (repeat for more).
    #[arg(long = "secret")]
    secrets: Vec<String>,
    /// Expose a port through the ingress once it is ready (repeat for
    /// more); `inspect --json` of the create's answer has the tokens.
    #[arg(long = "port")]
    ports: Vec<u32>,
    /// Image name (default: the daemon's default image).
    #[arg(long)]
    image: Option<String>,
    /// `container` or `vm`.
    #[arg(long, conflicts_with = "vm")]
    runtime: Option<String>,
    /// A microVM: same as --runtime vm.
    #[arg(long)]
    vm: bool,
    /// CPU cores, fractions allowed (0.5) or millicores (500m).
    #[arg(long, value_parser = units::parse_cpu)]
    cpu: Option<f64>,
    /// Memory limit: 512Mi, 2Gi, 1G or bytes.
    #[arg(long, value_parser = units::parse_size_mib)]
    memory: Option<u64>,
    /// Size limit of the writable layer: 10Gi, 500M or bytes.
    #[arg(long, value_parser = units::parse_size_mib)]
    disk: Option<u64>,
    /// Most tasks (processes and threads) at once.
    #[arg(long)]
    pids: Option<u64>,
    /// CPU weight under contention, in cgroup v1 shares (2-262144; 1024
    /// is the default).
    #[arg(long)]
    cpu_shares: Option<u64>,
    /// Lifetime: seconds, 30s/5m/2h, or none.
    #[arg(long, value_parser = units::parse_ttl, allow_hyphen_values = true)]
    ttl: Option<i64>,
    /// Environment for every process, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = units::parse_kv)]
    env: Vec<(String, String)>,
    /// A label, KEY=VALUE (repeatable).
    #[arg(long = "label", short = 'l', value_parser = units::parse_kv)]
    labels: Vec<(String, String)>,
    /// GPU model (H200, RTX4090, A100-80GB, ...) or `any`; containers only.
    #[arg(long)]
    gpu: Option<String>,
    /// Whole GPUs to hold (default 1 with --gpu).
    #[arg(long)]
    gpu_count: Option<u32>,
}

#[derive(Args)]
struct ProcessOpts {
    /// Kill the process tree after this long: seconds or 30s/5m.
    #[arg(long, value_parser = units::parse_timeout)]
    timeout: Option<f64>,
    /// Extra environment, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = units::parse_kv)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w')]
    cwd: Option<String>,
    /// Numeric UID[:GID] to run as (default 0).
    #[arg(long, short = 'u', value_parser = units::parse_user)]
    user: Option<(u32, Option<u32>)>,
}

#[derive(Subcommand)]
enum SecretCmd {
    /// Create a secret; its value is read from stdin, or --from-env VAR.
    Create {
        name: String,
        /// A host the value may be sent to (repeat for more).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Allow *.example.com hosts.
        #[arg(long)]
        allow_wildcards: bool,
        /// Read the value from this environment variable instead of stdin.
        #[arg(long)]
        from_env: Option<String>,
    },
    /// List secrets (never their values).
    Ls,
    /// Give a secret a new value (stdin, or --from-env) and/or new hosts;
    /// bound sandboxes use it from their next request.
    Rotate {
        name: String,
        /// Replace the hosts with these (repeat); without a value source
        /// given, only the hosts change.
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long)]
        allow_wildcards: bool,
        #[arg(long, conflicts_with = "stdin")]
        from_env: Option<String>,
        /// Also read a new value from stdin when --host is given.
        #[arg(long)]
        stdin: bool,
    },
    /// Delete secrets; bound sandboxes send the placeholder from then on.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Args)]
struct ExecArgs {
    #[arg(value_parser = units::parse_id)]
    id: String,
    #[command(flatten)]
    opts: ProcessOpts,
    /// Forward our stdin to the process, then close its stdin at EOF.
    #[arg(long = "interactive", short = 'i')]
    interactive: bool,
    /// The command and its arguments (put them after --).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

#[derive(Args)]
struct RunCodeArgs {
    #[arg(value_parser = units::parse_id)]
    id: String,
    #[command(flatten)]
    opts: ProcessOpts,
    /// python, bash, sh or node; default from the file's extension, else python.
    #[arg(long)]
    language: Option<String>,
    /// The code file, or - to read it from stdin.
    file: PathBuf,
}

impl CreateArgs {
    /// The create request these flags ask for.
    fn request(self) -> CreateSandbox {
        CreateSandbox {
            image: self.image.map(ImageChoice::Named),
            runtime: if self.vm {
                Some("vm".into())
            } else {
                self.runtime
            },
            cpu: self.cpu,
            memory_mib: self.memory,
            disk_mib: self.disk,
            pids: self.pids,
            cpu_shares: self.cpu_shares,
            ttl_seconds: self.ttl,
            env: self.env.into_iter().collect(),
            labels: self.labels.into_iter().collect(),
            gpu: self.gpu,
            gpu_count: self.gpu_count,
            idempotency_key: self.idempotency_key,
            block_network: None,
            allow_list: None,
            from_snapshot: self.from_snapshot,
            secrets: self.secrets,
            ports: self.ports,
            host_rootfs: self
                .host_rootfs
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            join_netns: self.join_netns.map(|p| p.display().to_string()),
            hostname: self.hostname,
            volumes: self.volumes,
        }
    }
}

impl ProcessOpts {
    /// The start request these options ask for; what to run is the caller's
    /// to add.
    fn request(self) -> StartProcess {
        let (uid, gid) = match self.user {
            Some((u, g)) => (Some(u), g),
            None => (None, None),
        };
        StartProcess {
            env: self.env.into_iter().collect::<BTreeMap<_, _>>(),
            cwd: self.cwd,
            uid,
            gid,
            timeout_seconds: self.timeout,
            ..StartProcess::default()
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => report(&e),
    };
    let _ = std::io::stdout().flush();
    // Exit without dropping the runtime: a blocking read of our stdin (exec -i)
    // may still be pending, and the runtime's drop would wait for it.
    std::process::exit(code);
}

/// Prints an error the way the CLI promises and picks the exit code.
fn report(e: &anyhow::Error) -> i32 {
    let broken_pipe = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        // Our reader went away (`| head`): end quietly, as the shell's tools do.
        return 128 + 13;
    }
    eprintln!("error: {e:#}");
    1
}

async fn run(cli: Cli) -> Result<i32> {
    let c = match &cli.url {
        Some(url) => Client::remote(remote::Remote::new(remote::RemoteOptions {
            url,
            token_file: cli.token_file.as_deref(),
            token: std::env::var("SANDBOXD_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
            fingerprint: cli.tls_fingerprint.as_deref(),
            ca_file: cli.ca_file.as_deref(),
        })?),
        None => Client::new(&cli.socket),
    };
    let json = cli.json;
    match cli.cmd {
        Cmd::Create(a) => sandboxes::create(&c, json, a.request()).await,
        Cmd::Exec(a) => {
            let mut req = a.opts.request();
            req.argv = Some(a.command);
            req.stdin = a.interactive;
            processes::exec(&c, json, &a.id, req, a.interactive).await
        }
        Cmd::RunCode(a) => {
            let req = a.opts.request();
            processes::run_code(&c, json, &a.id, req, &a.file, a.language).await
        }
        Cmd::Ls => sandboxes::ls(&c, json).await,
        Cmd::Gpus => daemon::gpus(&c, json).await,
        Cmd::Inspect { id } => sandboxes::inspect(&c, json, &id).await,
        Cmd::Expose {
            id,
            port,
            public,
            tcp,
        } => ports::expose(&c, json, &id, port, public, tcp).await,
        Cmd::Ports { id, listening } => ports::list(&c, json, &id, listening).await,
        Cmd::Unexpose { id, port } => ports::unexpose(&c, &id, port).await,
        Cmd::PortToken { id, port } => ports::rotate_token(&c, json, &id, port).await,
        Cmd::Network {
            id,
            block,
            open,
            allow,
        } => {
            let body = NetworkPolicy {
                block_network: (block || open).then_some(block),
                allow_list: (!allow.is_empty()).then_some(allow),
            };
            sandboxes::network(&c, json, &id, &body).await
        }
        Cmd::Ttl { id, ttl } => sandboxes::ttl(&c, json, &id, ttl).await,
        Cmd::Rm { ids } => sandboxes::rm(&c, &ids).await,
        Cmd::Ps { id } => processes::ps(&c, json, &id).await,
        Cmd::Kill {
            id,
            process,
            signal,
        } => processes::kill(&c, &id, process, signal).await,
        Cmd::Upload {
            id,
            local,
            remote,
            mode,
        } => files::upload(&c, json, &id, &local, &remote, mode).await,
        Cmd::Download { id, remote, local } => files::download(&c, &id, &remote, &local).await,
        Cmd::Files { id, path } => files::list(&c, json, &id, &path).await,
        Cmd::Stat { id, path } => files::stat(&c, json, &id, &path).await,
        Cmd::Mkdir { id, path, parents } => files::mkdir(&c, json, &id, &path, parents).await,
        Cmd::RmFile {
            id,
            path,
            recursive,
        } => files::rm(&c, &id, &path, recursive).await,
        Cmd::Snapshot { id, filesystem } => snapshots::take(&c, json, &id, filesystem).await,
        Cmd::Snapshots => snapshots::list(&c, json).await,
        Cmd::Images => images::list(&c, json).await,
        Cmd::Secret(cmd) => match cmd {
            SecretCmd::Create {
                name,
                hosts,
                allow_wildcards,
                from_env,
            } => {
                secrets::create(
                    &c,
                    json,
                    &name,
                    &hosts,
                    allow_wildcards,
                    from_env.as_deref(),
                )
                .await
            }
            SecretCmd::Ls => secrets::list(&c, json).await,
            SecretCmd::Rotate {
                name,
                hosts,
                allow_wildcards,
                from_env,
                stdin,
            } => {
                secrets::rotate(
                    &c,
                    json,
                    &name,
                    &hosts,
                    allow_wildcards,
                    from_env.as_deref(),
                    stdin,
                )
                .await
            }
            SecretCmd::Rm { names } => secrets::rm(&c, &names).await,
        },
        Cmd::ImagePull { image } => images::pull(&c, &image, json).await,
        Cmd::ImageBuild { file } => images::build(&c, &file, json).await,
        Cmd::ImagePrune => images::prune(&c, json).await,
        Cmd::RmSnapshot { ids } => snapshots::rm(&c, &ids).await,
        Cmd::Health => daemon::health(&c, json).await,
    }
}
