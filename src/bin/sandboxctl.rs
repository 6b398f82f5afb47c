//! `sandboxctl`: the operator/scheduler command line, a thin client of sandboxd's
//! `/v1` HTTP+JSON API over its Unix socket. This file owns the command-line shape
//! and what each command does; `sandboxctl/` holds the HTTP client (client.rs),
//! the parsers of human units (units.rs) and output handling (output.rs).
//!
//! Exit codes: 0 ok, 1 an error (printed as `error: <message>`), 2 a usage error
//! (clap); `exec` and `run-code` end with the process's own code instead
//! (128+N for signal N, 124 for a timeout).

// A crate root looks for modules beside itself, so the folder is named here.
#[path = "sandboxctl/client.rs"]
mod client;
#[path = "sandboxctl/output.rs"]
mod output;
#[path = "sandboxctl/units.rs"]
mod units;

// The wire types are the daemon's own, so the two cannot drift; `crate::types`
// names them for the modules under `sandboxctl/`.
use sandboxd::api::types;
use sandboxd::sandbox::SnapshotView;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use client::{enc_query, enc_seg, ApiError, Client};
use output::{Action, LineSplitter, Stream, StreamState};
use types::{
    CreateSandbox, FileInfo, FileList, GpuList, Health, Process, ProcessList, Sandbox, SandboxList,
    SendSignal, SetTtl, StartProcess,
};

/// Times in a row the output stream may break (daemon restart, dropped
/// connection) before `exec` gives up following it.
const MAX_RECONNECTS: u32 = 8;

/// Size of one `POST .../stdin` when forwarding our stdin.
const STDIN_CHUNK: usize = 64 << 10;

#[derive(Parser)]
#[command(
    name = "sandboxctl",
    version,
    about = "Control sandboxd, the sandbox daemon, over its Unix socket"
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
    /// Print the daemon's raw JSON answers (NDJSON events for exec/run-code).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a sandbox; prints its id once it is ready.
    Create(CreateArgs),
    /// Run a command in a sandbox, streaming its output; exits with its exit code.
    Exec(ExecArgs),
    /// Run a file of code (or - for stdin) in a sandbox; exits like exec.
    RunCode(RunCodeArgs),
    /// List sandboxes.
    Ls,
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
    /// Remove built images no recipe names any more (and forced-rebuild
    /// leftovers) that no sandbox or snapshot stacks on.
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
    /// Lifetime: seconds, 30s/5m/2h, or none.
    #[arg(long, value_parser = units::parse_ttl, allow_hyphen_values = true)]
    ttl: Option<i64>,
    /// Environment for every process, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = units::parse_kv)]
    env: Vec<(String, String)>,
    /// A label, KEY=VALUE (repeatable).
    #[arg(long = "label", short = 'l', value_parser = units::parse_kv)]
    labels: Vec<(String, String)>,
    /// GPU model (H200, "A100 80GB", ...) or `any`; containers only.
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
    let c = Client::new(&cli.socket);
    let json = cli.json;
    match cli.cmd {
        Cmd::Create(a) => create(&c, json, a).await,
        Cmd::Exec(a) => {
            let mut req = process_request(a.opts);
            req.argv = Some(a.command);
            req.stdin = a.interactive;
            exec(&c, json, &a.id, req, a.interactive).await
        }
        Cmd::RunCode(a) => {
            let code = read_code(&a.file).await?;
            let language = a.language.or_else(|| language_of(&a.file));
            let mut req = process_request(a.opts);
            req.code = Some(code);
            req.language = language;
            exec(&c, json, &a.id, req, false).await
        }
        Cmd::Ls => ls(&c, json).await,
        Cmd::Gpus => gpus(&c, json).await,
        Cmd::Inspect { id } => {
            let (v, raw): (serde_json::Value, Bytes) =
                c.json(Method::GET, &sandbox_uri(&id), None::<&()>).await?;
            if json {
                print_raw(&raw)?;
            } else {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(0)
        }
        Cmd::Network {
            id,
            block,
            open,
            allow,
        } => {
            let body = sandboxd::net::policy::NetworkPolicy {
                block_network: (block || open).then_some(block),
                allow_list: (!allow.is_empty()).then_some(allow),
            };
            let (sb, raw): (Sandbox, Bytes) = c
                .json(
                    Method::PATCH,
                    &format!("{}/network", sandbox_uri(&id)),
                    Some(&body),
                )
                .await?;
            if json {
                print_raw(&raw)?;
            } else if let Some(view) = sb.network {
                println!("{}", serde_json::to_string(&view)?);
            }
            Ok(0)
        }
        Cmd::Ttl { id, ttl } => {
            let body = SetTtl { ttl_seconds: ttl };
            let (sb, raw): (Sandbox, Bytes) = c
                .json(
                    Method::PUT,
                    &format!("{}/ttl", sandbox_uri(&id)),
                    Some(&body),
                )
                .await?;
            if json {
                print_raw(&raw)?;
            } else {
                println!("{}", sb.expires_at.as_deref().unwrap_or("none"));
            }
            Ok(0)
        }
        Cmd::Rm { ids } => {
            let mut code = 0;
            for id in ids {
                match c.call(Method::DELETE, &sandbox_uri(&id), None::<&()>).await {
                    Ok(()) => println!("{id}"),
                    Err(e) => {
                        eprintln!("error: {id}: {e:#}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
        Cmd::Ps { id } => ps(&c, json, &id).await,
        Cmd::Kill {
            id,
            process,
            signal,
        } => {
            let base = format!("{}/processes/{process}", sandbox_uri(&id));
            match signal {
                Some(s) => {
                    // A number goes as a number, anything else as a name the daemon parses.
                    let signal = match s.parse::<i64>() {
                        Ok(n) => serde_json::Value::from(n),
                        Err(_) => serde_json::Value::from(s),
                    };
                    let body = SendSignal { signal };
                    c.call(Method::POST, &format!("{base}/signal"), Some(&body))
                        .await?
                }
                None => {
                    c.call(Method::POST, &format!("{base}/kill"), None::<&()>)
                        .await?
                }
            }
            Ok(0)
        }
        Cmd::Upload {
            id,
            local,
            remote,
            mode,
        } => upload(&c, json, &id, &local, &remote, mode).await,
        Cmd::Download { id, remote, local } => download(&c, &id, &remote, &local).await,
        Cmd::Files { id, path } => {
            let uri = format!("{}/files/list?path={}", sandbox_uri(&id), enc_query(&path));
            let (list, raw): (FileList, Bytes) = c.json(Method::GET, &uri, None::<&()>).await?;
            if json {
                print_raw(&raw)?;
            } else {
                let rows: Vec<Vec<String>> = list.entries.iter().map(output::file_row).collect();
                print_out(&output::table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows))?;
            }
            Ok(0)
        }
        Cmd::Stat { id, path } => {
            let uri = format!("{}/files/stat?path={}", sandbox_uri(&id), enc_query(&path));
            let (info, raw): (FileInfo, Bytes) = c.json(Method::GET, &uri, None::<&()>).await?;
            if json {
                print_raw(&raw)?;
            } else {
                let rows = vec![output::file_row(&info)];
                print_out(&output::table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows))?;
            }
            Ok(0)
        }
        Cmd::Mkdir { id, path, parents } => {
            let uri = format!(
                "{}/files/mkdir?path={}&parents={parents}",
                sandbox_uri(&id),
                enc_query(&path)
            );
            let (_, raw): (FileInfo, Bytes) = c.json(Method::POST, &uri, None::<&()>).await?;
            if json {
                print_raw(&raw)?;
            }
            Ok(0)
        }
        Cmd::RmFile {
            id,
            path,
            recursive,
        } => {
            let uri = format!(
                "{}/files?path={}&recursive={recursive}",
                sandbox_uri(&id),
                enc_query(&path)
            );
            c.call(Method::DELETE, &uri, None::<&()>).await?;
            Ok(0)
        }
        Cmd::Snapshot { id, filesystem } => {
            let kind = if filesystem { "filesystem" } else { "memory" };
            let body = serde_json::json!({ "kind": kind });
            let (snap, raw): (SnapshotView, Bytes) = c
                .json(
                    Method::POST,
                    &format!("{}/snapshots", sandbox_uri(&id)),
                    Some(&body),
                )
                .await?;
            if json {
                print_raw(&raw)?;
            } else {
                println!("{}", snap.id);
            }
            Ok(0)
        }
        Cmd::Snapshots => snapshots(&c, json).await,
        Cmd::Images => images(&c, json).await,
        Cmd::ImagePrune => {
            let (report, raw): (PruneReport, Bytes) = c
                .json(Method::POST, "/v1/images/prune", None::<&()>)
                .await?;
            if json {
                print_raw(&raw)?;
            } else {
                for entry in &report.removed {
                    println!("{entry}");
                }
                eprintln!(
                    "{} removed, {} freed",
                    report.removed.len(),
                    output::fmt_mib(report.freed_bytes >> 20)
                );
            }
            Ok(0)
        }
        Cmd::RmSnapshot { ids } => {
            let mut code = 0;
            for id in ids {
                let uri = format!("/v1/snapshots/{}", enc_seg(&id));
                match c.call(Method::DELETE, &uri, None::<&()>).await {
                    Ok(()) => println!("{id}"),
                    Err(e) => {
                        eprintln!("error: {id}: {e:#}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
        Cmd::Health => {
            let (h, raw): (Health, Bytes) = c.json(Method::GET, "/v1/health", None::<&()>).await?;
            if json {
                print_raw(&raw)?;
            } else {
                println!(
                    "{} (sandboxd {}, {} sandboxes)",
                    h.status, h.version, h.sandboxes
                );
            }
            Ok(if h.status == "ok" { 0 } else { 1 })
        }
    }
}

fn sandbox_uri(id: &str) -> String {
    format!("/v1/sandboxes/{}", enc_seg(id))
}

/// Writes the daemon's JSON answer as it came, newline-terminated.
fn print_raw(raw: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(raw)?;
    if raw.last() != Some(&b'\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn print_out(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

async fn create(c: &Client, json: bool, a: CreateArgs) -> Result<i32> {
    let req = CreateSandbox {
        image: a.image,
        runtime: if a.vm { Some("vm".into()) } else { a.runtime },
        cpu: a.cpu,
        memory_mib: a.memory,
        disk_mib: a.disk,
        pids: a.pids,
        ttl_seconds: a.ttl,
        env: a.env.into_iter().collect(),
        labels: a.labels.into_iter().collect(),
        gpu: a.gpu,
        gpu_count: a.gpu_count,
        idempotency_key: a.idempotency_key,
        block_network: None,
        allow_list: None,
        from_snapshot: a.from_snapshot,
    };
    let (sb, raw): (Sandbox, Bytes) = c.json(Method::POST, "/v1/sandboxes", Some(&req)).await?;
    if json {
        print_raw(&raw)?;
    } else {
        println!("{}", sb.id);
    }
    Ok(0)
}

async fn ls(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (SandboxList, Bytes) =
        c.json(Method::GET, "/v1/sandboxes", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let rows: Vec<Vec<String>> = list
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                serde_json::to_value(s.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                s.image.clone(),
                output::fmt_cpu(s.limits.cpu),
                output::fmt_mib(s.limits.memory_mib),
                output::ttl_left(s.ttl_seconds, s.expires_at.as_deref(), now),
            ]
        })
        .collect();
    print_out(&output::table(
        &["ID", "STATE", "IMAGE", "CPU", "MEMORY", "TTL-LEFT"],
        &rows,
    ))?;
    Ok(0)
}

#[derive(serde::Deserialize)]
struct PruneReport {
    removed: Vec<String>,
    freed_bytes: u64,
}

#[derive(serde::Deserialize)]
struct ImageRow {
    name: String,
    digest: String,
    built: bool,
    size_bytes: Option<u64>,
}

#[derive(serde::Deserialize)]
struct ImageList {
    images: Vec<ImageRow>,
}

async fn images(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (ImageList, Bytes) = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .images
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                if i.built { "yes" } else { "no" }.to_string(),
                i.size_bytes
                    .map(|b| output::fmt_mib(b >> 20))
                    .unwrap_or_else(|| "-".into()),
                i.digest.chars().take(19).collect(),
            ]
        })
        .collect();
    print_out(&output::table(&["NAME", "BUILT", "SIZE", "DIGEST"], &rows))?;
    Ok(0)
}

#[derive(serde::Deserialize)]
struct SnapshotList {
    snapshots: Vec<SnapshotView>,
}

async fn snapshots(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (SnapshotList, Bytes) =
        c.json(Method::GET, "/v1/snapshots", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .snapshots
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                serde_json::to_value(s.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                s.sandbox.clone(),
                s.image.clone(),
                output::fmt_mib(s.size_bytes >> 20),
                s.created_at.clone(),
            ]
        })
        .collect();
    print_out(&output::table(
        &["ID", "KIND", "SANDBOX", "IMAGE", "SIZE", "CREATED"],
        &rows,
    ))?;
    Ok(0)
}

async fn gpus(c: &Client, json: bool) -> Result<i32> {
    let (list, raw): (GpuList, Bytes) = c.json(Method::GET, "/v1/gpus", None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.name.clone(),
                output::fmt_mib(g.memory_mib),
                g.pci_bus_id.clone(),
                g.uuid.clone(),
                g.held_by.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_out(&output::table(
        &["INDEX", "NAME", "MEMORY", "BUS-ID", "UUID", "HELD-BY"],
        &rows,
    ))?;
    Ok(0)
}

async fn ps(c: &Client, json: bool, id: &str) -> Result<i32> {
    let uri = format!("{}/processes", sandbox_uri(id));
    let (list, raw): (ProcessList, Bytes) = c.json(Method::GET, &uri, None::<&()>).await?;
    if json {
        print_raw(&raw)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .processes
        .iter()
        .map(|p| {
            let exit = if p.timed_out {
                "timeout".to_string()
            } else if p.oom_killed {
                "oom".to_string()
            } else {
                match (p.exit_code, p.signal) {
                    (Some(code), _) => code.to_string(),
                    (None, Some(sig)) => format!("signal {sig}"),
                    (None, None) => "-".to_string(),
                }
            };
            let state = serde_json::to_value(p.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            vec![
                p.id.to_string(),
                p.pid.to_string(),
                state,
                exit,
                p.argv.join(" "),
            ]
        })
        .collect();
    print_out(&output::table(
        &["ID", "PID", "STATE", "EXIT", "COMMAND"],
        &rows,
    ))?;
    Ok(0)
}

fn process_request(o: ProcessOpts) -> StartProcess {
    let (uid, gid) = match o.user {
        Some((u, g)) => (Some(u), g),
        None => (None, None),
    };
    StartProcess {
        env: o.env.into_iter().collect::<BTreeMap<_, _>>(),
        cwd: o.cwd,
        uid,
        gid,
        timeout_seconds: o.timeout,
        ..StartProcess::default()
    }
}

/// The language of a code file, guessed from its extension.
fn language_of(file: &Path) -> Option<String> {
    let lang = match file.extension()?.to_str()? {
        "py" => "python",
        "sh" => "sh",
        "bash" => "bash",
        "js" | "mjs" | "cjs" => "node",
        _ => return None,
    };
    Some(lang.to_string())
}

async fn read_code(file: &Path) -> Result<String> {
    let bytes = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut buf)
            .await
            .context("reading code from stdin")?;
        buf
    } else {
        tokio::fs::read(file)
            .await
            .with_context(|| format!("reading {}", file.display()))?
    };
    String::from_utf8(bytes).map_err(|_| anyhow!("the code is not UTF-8 text"))
}

/// Starts a process, forwards stdin if asked, follows its output to our
/// stdout/stderr and returns the exit code to end with. Ctrl-C sends SIGINT to
/// the process; a second Ctrl-C kills its tree.
async fn exec(
    c: &Client,
    json: bool,
    id: &str,
    req: StartProcess,
    interactive: bool,
) -> Result<i32> {
    let uri = format!("{}/processes", sandbox_uri(id));
    let (started, _): (Process, Bytes) = c.json(Method::POST, &uri, Some(&req)).await?;
    let base = format!("{uri}/{}", started.id);

    let stdin_task = interactive.then(|| tokio::spawn(forward_stdin(c.clone(), base.clone())));

    let follow = follow_output(c, &base, json);
    tokio::pin!(follow);
    let mut interrupts = 0u32;
    let mut can_listen = true;
    let process = loop {
        tokio::select! {
            res = &mut follow => break res?,
            sig = tokio::signal::ctrl_c(), if can_listen => {
                if sig.is_err() {
                    can_listen = false;
                    continue;
                }
                interrupts += 1;
                let (route, body, note) = if interrupts == 1 {
                    (
                        "signal",
                        Some(SendSignal { signal: serde_json::Value::from("INT") }),
                        "sending SIGINT (Ctrl-C again kills the process tree)",
                    )
                } else {
                    ("kill", None, "killing the process tree")
                };
                eprintln!("sandboxctl: {note}");
                let (c2, u) = (c.clone(), format!("{base}/{route}"));
                tokio::spawn(async move {
                    if let Err(e) = c2.call(Method::POST, &u, body.as_ref()).await {
                        eprintln!("sandboxctl: {e:#}");
                    }
                });
            }
        }
    };
    if let Some(t) = stdin_task {
        t.abort();
    }
    let (code, note) = output::exit_code_of(&process);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    Ok(code)
}

/// Copies our stdin to the process, one POST per read so that interactive input
/// goes through at once, then closes the process's stdin at EOF.
async fn forward_stdin(c: Client, base: String) {
    let uri = format!("{base}/stdin");
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        let n = match stdin.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                eprintln!("sandboxctl: reading stdin: {e}");
                0
            }
        };
        if n == 0 {
            break;
        }
        let body = client::full(Bytes::copy_from_slice(&buf[..n]));
        if let Err(e) = c
            .send_ok(
                Method::POST,
                &uri,
                body,
                Some("application/octet-stream"),
                None,
            )
            .await
        {
            stdin_error(&e);
            return;
        }
    }
    if let Err(e) = c.call(Method::DELETE, &uri, None::<&()>).await {
        stdin_error(&e);
    }
}

/// Reports a failed stdin write, except that the process already ended (409):
/// then its exit is what matters and the output stream will report it.
fn stdin_error(e: &anyhow::Error) {
    let ended = e
        .downcast_ref::<ApiError>()
        .is_some_and(|a| a.status == StatusCode::CONFLICT);
    if !ended {
        eprintln!("sandboxctl: stdin: {e:#}");
    }
}

/// Why one attempt at following the output stream stopped.
enum StreamEnd {
    Exit(Process),
    /// The connection ended or broke; worth reconnecting.
    Broken(anyhow::Error),
}

/// Follows a process's output until its exit event, reconnecting from the
/// offsets already written when the stream breaks (a daemon restart keeps the
/// process and its buffered output).
async fn follow_output(c: &Client, base: &str, json: bool) -> Result<Process> {
    let mut st = StreamState::default();
    let mut failures = 0u32;
    loop {
        let uri = format!(
            "{base}/output?stdout_offset={}&stderr_offset={}",
            st.stdout_next, st.stderr_next
        );
        let mut progressed = false;
        match stream_once(c, &uri, &mut st, json, &mut progressed).await? {
            StreamEnd::Exit(p) => return Ok(p),
            StreamEnd::Broken(e) => {
                if progressed {
                    failures = 0;
                }
                failures += 1;
                if failures > MAX_RECONNECTS {
                    return Err(e.context("lost the process's output stream"));
                }
                tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
            }
        }
    }
}

/// One connection's worth of the output stream. Errors that a reconnect cannot
/// fix (the daemon refused, a malformed event, our stdout closed) are `Err`.
async fn stream_once(
    c: &Client,
    uri: &str,
    st: &mut StreamState,
    json: bool,
    progressed: &mut bool,
) -> Result<StreamEnd> {
    let resp = match c.send(Method::GET, uri, client::empty(), None, None).await {
        Ok(r) => r,
        Err(e) => return Ok(StreamEnd::Broken(e)),
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let body = client::read_all(resp.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        return Err(ApiError::from_body(status, &body).into());
    }
    let mut body = resp.into_body();
    let mut lines = LineSplitter::default();
    while let Some(chunk) = client::next_chunk(&mut body).await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return Ok(StreamEnd::Broken(e.into())),
        };
        for line in lines.push(&chunk)? {
            let action = st.handle_line(&line)?;
            *progressed = true;
            if json && !matches!(action, Action::Nothing) {
                let mut out = std::io::stdout().lock();
                out.write_all(&line)?;
                out.write_all(b"\n")?;
                out.flush()?;
            }
            match action {
                Action::Exit(p) => return Ok(StreamEnd::Exit(*p)),
                Action::Write(stream, bytes) if !json => write_stream(stream, &bytes)?,
                Action::Note(note) if !json => eprintln!("{note}"),
                _ => {}
            }
        }
    }
    let why = if lines.has_partial() {
        "the output stream broke off mid-line"
    } else {
        "the output stream ended before the process's exit"
    };
    Ok(StreamEnd::Broken(anyhow!(why)))
}

/// Writes and flushes at once, so stdout and stderr interleave as the process
/// wrote them.
fn write_stream(stream: Stream, bytes: &[u8]) -> Result<()> {
    match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()?;
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes)?;
            err.flush()?;
        }
    }
    Ok(())
}

async fn upload(
    c: &Client,
    json: bool,
    id: &str,
    local: &Path,
    remote: &str,
    mode: Option<u32>,
) -> Result<i32> {
    let (body, len, mode) = if local.as_os_str() == "-" {
        (
            client::reader_body(tokio::io::stdin()),
            None,
            mode.unwrap_or(0o644),
        )
    } else {
        let f = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("opening {}", local.display()))?;
        let meta = f
            .metadata()
            .await
            .with_context(|| format!("reading {}", local.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", local.display());
        }
        // Known length: the daemon can refuse an oversized upload before it
        // arrives, and hyper checks we send exactly that many bytes.
        (
            client::reader_body(f),
            Some(meta.len()),
            mode.unwrap_or(meta.permissions().mode() & 0o777),
        )
    };
    let uri = format!(
        "{}/files?path={}&mode={mode}",
        sandbox_uri(id),
        enc_query(remote)
    );
    let resp = c
        .send_ok(
            Method::PUT,
            &uri,
            body,
            Some("application/octet-stream"),
            len,
        )
        .await?;
    let raw = client::read_all(resp.into_body(), 1 << 20).await?;
    if json {
        print_raw(&raw)?;
    }
    Ok(0)
}

async fn download(c: &Client, id: &str, remote: &str, local: &Path) -> Result<i32> {
    let uri = format!("{}/files?path={}", sandbox_uri(id), enc_query(remote));
    // Ask first, create the local file after: a 404 must not leave an empty file.
    let resp = c
        .send_ok(Method::GET, &uri, client::empty(), None, None)
        .await?;
    let mut body = resp.into_body();
    if local.as_os_str() == "-" {
        while let Some(chunk) = client::next_chunk(&mut body).await {
            write_stream(
                Stream::Stdout,
                &chunk.context("reading the file from sandboxd")?,
            )?;
        }
        return Ok(0);
    }
    // Like cp: into a directory means under the remote file's name.
    let target = if local.is_dir() {
        let name = Path::new(remote)
            .file_name()
            .ok_or_else(|| anyhow!("{remote:?} has no file name to put in {}", local.display()))?;
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let mut f = tokio::fs::File::create(&target)
        .await
        .with_context(|| format!("creating {}", target.display()))?;
    let copied: Result<()> = async {
        while let Some(chunk) = client::next_chunk(&mut body).await {
            let chunk = chunk.context("reading the file from sandboxd")?;
            f.write_all(&chunk)
                .await
                .with_context(|| format!("writing {}", target.display()))?;
        }
        f.flush().await?;
        Ok(())
    }
    .await;
    if let Err(e) = copied {
        // A partial file would look like a good one; remove it.
        drop(f);
        let _ = tokio::fs::remove_file(&target).await;
        return Err(e);
    }
    Ok(0)
}
