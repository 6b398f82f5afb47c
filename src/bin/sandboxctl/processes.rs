//! The process commands: exec and run-code (start a process, forward our
//! stdin, follow its output across reconnects, end with its exit code), ps
//! and kill.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use hyper::{Method, StatusCode};
use sandboxd::api::types::{Process, ProcessList, SendSignal, StartProcess};
use tokio::io::AsyncReadExt;

use crate::client::{self, sandbox_uri, ApiError, Client};
use crate::output::{self, print_out, print_raw, write_stream, Action, LineSplitter, StreamState};

/// Times in a row the output stream may break (daemon restart, dropped
/// connection) before `exec` gives up following it.
const MAX_RECONNECTS: u32 = 8;

/// Size of one `POST .../stdin` when forwarding our stdin.
const STDIN_CHUNK: usize = 64 << 10;

/// Runs a file of code (`-`: our stdin); the language is `language`, else
/// guessed from the file's extension.
pub async fn run_code(
    c: &Client,
    json: bool,
    id: &str,
    mut req: StartProcess,
    file: &Path,
    language: Option<String>,
) -> Result<i32> {
    let code = read_code(file).await?;
    req.code = Some(code);
    req.language = language.or_else(|| language_of(file));
    exec(c, json, id, req, false).await
}

pub async fn ps(c: &Client, json: bool, id: &str) -> Result<i32> {
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

/// Kills a process's tree, or sends it one signal.
pub async fn kill(c: &Client, id: &str, process: u64, signal: Option<String>) -> Result<i32> {
    let base = format!("{}/processes/{process}", sandbox_uri(id));
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
pub async fn exec(
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
