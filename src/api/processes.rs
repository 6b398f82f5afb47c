//! Process routes: start (argv or run-code), inspect, stream output, stdin,
//! signals, kill and wait. All of it goes through the sandbox's supervisor.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;

use super::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;

use super::error::{parse_json, ApiError, ApiResult};
use super::types::{OutputEvent, ProcessList, SendSignal, StartProcess};
use crate::runtime::seccomp_filter::process_program;
use crate::sandbox::{sandbox_path, Manager, SandboxError};
use crate::supervisor::client::Attached;
use crate::supervisor::output::OutputItem;
use crate::supervisor::processes::Supervisor;
use crate::supervisor::protocol::SpawnSpec;
use sandbox_proto::confinement::{ProcessConfinement, CAPABILITIES};

const MAX_ARGV_BYTES: usize = 1 << 20;
const MAX_TIMEOUT_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

fn interpreter(language: &str) -> ApiResult<Vec<String>> {
    let argv = crate::model::interpreter_argv(language).ok_or_else(|| {
        ApiError::bad(
            "invalid_language",
            format!("language {language:?} is not supported; use python, bash, sh or node"),
        )
    })?;
    Ok(argv.iter().map(|s| s.to_string()).collect())
}

/// The process `request` asks for; `default_user` (uid, gid) is the
/// sandbox's when it names no uid, `seccomp_filter` its compiled
/// [`StartProcess::seccomp`].
fn spawn_spec(
    request: StartProcess,
    default_user: (u32, u32),
    seccomp_filter: Option<Vec<u8>>,
) -> ApiResult<SpawnSpec> {
    let (argv, code) = match (request.argv, request.code) {
        (Some(argv), None) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(ApiError::bad("invalid_argv", "argv must name a program"));
            }
            (argv, None)
        }
        (None, Some(code)) => {
            let language = request.language.as_deref().unwrap_or("python");
            (interpreter(language)?, Some(code.into_bytes()))
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "invalid_request",
                "give argv or code, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::bad(
                "invalid_request",
                "give argv (a command) or code (with a language)",
            ))
        }
    };
    let size: usize =
        argv.iter().map(String::len).sum::<usize>() + code.as_ref().map_or(0, Vec::len);
    if size > MAX_ARGV_BYTES || argv.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad(
            "invalid_argv",
            format!(
                "argv and code together must be under {MAX_ARGV_BYTES} bytes, without NUL in argv"
            ),
        ));
    }
    crate::sandbox::validated_env(&request.env)?;
    let cwd = request.cwd.as_deref().map(sandbox_path).transpose()?;
    let timeout_ms = match request.timeout_seconds {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECONDS => {
            Some((t * 1000.0).ceil() as u64)
        }
        Some(t) => {
            return Err(ApiError::bad(
                "invalid_timeout",
                format!(
                    "timeout_seconds must be above 0 and at most {MAX_TIMEOUT_SECONDS}, got {t}"
                ),
            ))
        }
    };
    let pty = match request.pty {
        Some(p) if p.rows == 0 || p.cols == 0 => {
            return Err(ApiError::bad(
                "invalid_pty",
                "pty rows and cols must be above 0",
            ))
        }
        Some(p) => Some(sandbox_proto::PtySize {
            rows: p.rows,
            cols: p.cols,
        }),
        None => None,
    };
    if let Some(root) = &request.root {
        crate::sandbox::validated_root_name(root)?;
        if code.is_some() {
            return Err(ApiError::bad(
                "invalid_request",
                "code runs in the sandbox's root; to run in a container root, give argv",
            ));
        }
    }
    let (uid, gid) = match (request.uid, request.gid) {
        (Some(uid), gid) => (uid, gid.unwrap_or(uid)),
        (None, gid) => (default_user.0, gid.unwrap_or(default_user.1)),
    };
    if request.groups.len() > MAX_GROUPS {
        return Err(ApiError::bad(
            "invalid_groups",
            format!("at most {MAX_GROUPS} supplementary groups"),
        ));
    }
    if code.is_some() && !request.groups.is_empty() {
        return Err(ApiError::bad(
            "invalid_request",
            "run-code takes no supplementary groups; give argv",
        ));
    }
    let confinement = ProcessConfinement {
        capabilities: request
            .capabilities
            .as_deref()
            .map(capability_mask)
            .transpose()?,
        seccomp_filter,
        oom_score_adj: request.oom_score_adj.map(oom_score_adj).transpose()?,
    };
    Ok(SpawnSpec {
        argv,
        code,
        env: request.env.into_iter().collect(),
        cwd,
        uid,
        gid,
        stdin: request.stdin,
        pty,
        timeout_ms,
        root: request.root,
        groups: request.groups,
        confinement,
    })
}

/// The capabilities `names` keep, a bit per number.
fn capability_mask(names: &[String]) -> ApiResult<u64> {
    names.iter().try_fold(
        0u64,
        |mask, name| match sandbox_proto::confinement::capability_number(name) {
            Some(number) => Ok(mask | 1u64 << number),
            None => Err(ApiError::bad(
                "invalid_capabilities",
                format!(
                    "{name:?} is not a capability sandboxd grants; a process may keep some of {}",
                    CAPABILITIES.join(", ")
                ),
            )),
        },
    )
}

/// Sandbox processes start at 0, whatever the daemon's own score; a lower
/// one would shield untrusted code from the OOM killer.
fn oom_score_adj(score: i32) -> ApiResult<i16> {
    match i16::try_from(score) {
        Ok(score @ 0..=1000) => Ok(score),
        _ => Err(ApiError::bad(
            "invalid_oom_score_adj",
            format!("oom_score_adj must be 0 to 1000 (a sandbox's processes cannot go below 0), got {score}"),
        )),
    }
}

/// The program a process's own seccomp profile (the OCI runtime spec's
/// `linux.seccomp`) compiles to, which its agent loads.
async fn compile_seccomp(profile: serde_json::Value) -> ApiResult<Vec<u8>> {
    let compiled = tokio::task::spawn_blocking(move || process_program(&profile))
        .await
        .map_err(|e| {
            ApiError(SandboxError::internal(format!(
                "compiling the seccomp profile: {e}"
            )))
        })?
        .map_err(|e| ApiError::bad("invalid_seccomp", e.to_string()))?;
    Ok(compiled.to_vec())
}

/// Most supplementary groups a process may be given (Kubernetes' merges
/// of `/etc/group` and a pod's `supplementalGroups` stay well under).
const MAX_GROUPS: usize = 64;

pub async fn start(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let default_user = manager.process_user(&id)?;
    let mut request = parse_json::<StartProcess>(&body)?;
    let seccomp_filter = match request.seccomp.take() {
        Some(profile) => Some(compile_seccomp(profile).await?),
        None => None,
    };
    let spec = spawn_spec(request, default_user, seccomp_filter)?;
    let process = manager.connect(&id).await?.spawn(spec).await?;
    manager.metrics.process_started();
    Ok((StatusCode::CREATED, Json(process)))
}

pub async fn list(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let processes = manager.connect(&id).await?.list().await?;
    Ok(Json(ProcessList { processes }))
}

pub async fn get(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(manager.connect(&id).await?.get(proc).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    #[serde(default)]
    stdout_offset: u64,
    #[serde(default)]
    stderr_offset: u64,
}

fn ndjson(event: &OutputEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// Streams the output as NDJSON from the given offsets until the exit.
pub async fn output(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
    Query(query): Query<OutputQuery>,
) -> ApiResult<Response> {
    // An unknown process is a 404 at once. The stream itself starts without
    // waiting for the first output: a client that attaches before it writes
    // the stdin that makes the output would otherwise never get the headers.
    // The supervisor answers a connection's requests in order, so the
    // lookup and the attach share one.
    let mut supervisor = manager.connect(&id).await?;
    supervisor.get(proc).await?;
    let output = supervisor
        .attach(proc, query.stdout_offset, query.stderr_offset)
        .await?;
    let stream = futures::stream::unfold(Some(output), move |output| {
        let manager = Arc::clone(&manager);
        async move {
            let mut output = output?;
            // A stopping daemon ends the stream; the client resumes from its offsets.
            let item = tokio::select! {
                item = output.next() => item.ok().flatten()?,
                _ = manager.stopped() => return None,
            };
            let b64 = base64::engine::general_purpose::STANDARD;
            let (event, done) = match item {
                Attached::Output(OutputItem::Data {
                    stream,
                    offset,
                    data,
                }) => {
                    let data = b64.encode(data);
                    let event = match stream {
                        sandbox_proto::Stream::Stdout => OutputEvent::Stdout { offset, data },
                        sandbox_proto::Stream::Stderr => OutputEvent::Stderr { offset, data },
                    };
                    (event, false)
                }
                Attached::Output(OutputItem::Dropped { stream, bytes }) => (
                    OutputEvent::Dropped {
                        stream: Supervisor::stream_name(stream).into(),
                        bytes,
                    },
                    false,
                ),
                Attached::Exited(process) => (OutputEvent::Exit { process }, true),
            };
            let next = if done { None } else { Some(output) };
            Some((Ok::<Bytes, std::io::Error>(ndjson(&event)), next))
        }
    });
    Ok((
        [("content-type", "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

pub async fn write_stdin(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    for chunk in body.chunks(sandbox_proto::MAX_CHUNK) {
        manager
            .connect(&id)
            .await?
            .write_stdin(proc, chunk.to_vec())
            .await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

pub async fn close_stdin(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
) -> ApiResult<StatusCode> {
    manager.connect(&id).await?.close_stdin(proc).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn parse_signal(value: &serde_json::Value) -> ApiResult<i32> {
    let bad = || {
        ApiError::bad(
            "invalid_signal",
            format!("signal {value} is not a signal number or name like \"TERM\""),
        )
    };
    let signal = match value {
        serde_json::Value::Number(n) => {
            // JSON has one number type: 15.0 is the integer 15.
            let n = n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .ok_or_else(bad)?;
            nix::sys::signal::Signal::try_from(i32::try_from(n).map_err(|_| bad())?)
                .map_err(|_| bad())?
        }
        serde_json::Value::String(s) => {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            nix::sys::signal::Signal::from_str(&name).map_err(|_| bad())?
        }
        _ => return Err(bad()),
    };
    Ok(signal as i32)
}

pub async fn signal(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let request: SendSignal = parse_json(&body)?;
    let signal = parse_signal(&request.signal)?;
    manager.connect(&id).await?.signal(proc, signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST .../processes/{proc}/resize`: a new window size for its terminal.
pub async fn resize(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let size: super::types::PtySize = parse_json(&body)?;
    if size.rows == 0 || size.cols == 0 {
        return Err(ApiError::bad(
            "invalid_pty",
            "pty rows and cols must be above 0",
        ));
    }
    let size = sandbox_proto::PtySize {
        rows: size.rows,
        cols: size.cols,
    };
    manager.connect(&id).await?.resize(proc, size).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn kill(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
) -> ApiResult<StatusCode> {
    manager.connect(&id).await?.kill(proc).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn wait(
    State(manager): State<Arc<Manager>>,
    Path((id, proc)): Path<(String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let seconds: f64 = match query.get("timeout_seconds") {
        Some(s) => s
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 0.0 && *t <= 3600.0)
            .ok_or_else(|| {
                ApiError::bad(
                    "invalid_timeout",
                    "timeout_seconds must be between 0 and 3600",
                )
            })?,
        None => 30.0,
    };
    let timeout = Duration::from_secs_f64(seconds);
    // A stopping daemon answers as at the timeout (the process as it is
    // now): a long wait must not hold its stop for the grace period.
    let mut supervisor = manager.connect(&id).await?;
    tokio::select! {
        waited = supervisor.wait(proc, timeout) => Ok(Json(waited?)),
        // A fresh connection: the first still has the wait's answer due.
        _ = manager.stopped() => Ok(Json(manager.connect(&id).await?.get(proc).await?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn_spec_as_root(request: StartProcess) -> ApiResult<SpawnSpec> {
        spawn_spec(request, (0, 0), None)
    }

    #[test]
    fn the_image_user_applies_unless_a_uid_is_named() {
        let request = |uid, gid| StartProcess {
            argv: Some(vec!["id".into()]),
            uid,
            gid,
            ..StartProcess::default()
        };
        let ids = |r| {
            let spec = spawn_spec(r, (1000, 50), None)
                .map_err(|e| e.0)
                .expect("spec");
            (spec.uid, spec.gid)
        };
        assert_eq!(ids(request(None, None)), (1000, 50));
        assert_eq!(ids(request(Some(0), None)), (0, 0));
        assert_eq!(ids(request(Some(7), Some(8))), (7, 8));
        assert_eq!(ids(request(None, Some(9))), (1000, 9));
    }

    #[test]
    fn signals_by_number_and_name() {
        assert_eq!(parse_signal(&serde_json::json!(15)).ok(), Some(15));
        assert_eq!(parse_signal(&serde_json::json!("term")).ok(), Some(15));
        assert_eq!(parse_signal(&serde_json::json!("SIGKILL")).ok(), Some(9));
        assert!(parse_signal(&serde_json::json!("NOPE")).is_err());
        assert!(parse_signal(&serde_json::json!(9999)).is_err());
    }

    #[test]
    fn code_becomes_an_interpreter_and_both_forms_are_refused() {
        let spec = spawn_spec_as_root(StartProcess {
            code: Some("print(1)".into()),
            ..Default::default()
        })
        .map_err(|e| e.0)
        .expect("valid");
        assert_eq!(spec.argv, vec!["python3", "-u"]);
        assert!(spawn_spec_as_root(StartProcess {
            argv: Some(vec!["true".into()]),
            code: Some("x".into()),
            ..Default::default()
        })
        .is_err());
    }
}
