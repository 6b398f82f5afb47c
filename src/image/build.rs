//! Runs one recipe script into a directory, logging its output and stopping it when
//! it runs too long. Knows nothing about the cache layout.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Environment variables passed through from the daemon: a build may need a proxy.
const PASS_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

pub(crate) enum Outcome {
    Exited(ExitStatus),
    TimedOut,
}

/// Runs `bash <script> <dest>` in `cwd` with a clean environment, output to `log`.
/// The script gets its own process group so a timeout kills all it started.
pub(crate) fn run_recipe(
    script: &Path,
    dest: &Path,
    cwd: &Path,
    log: &File,
    timeout: Duration,
) -> std::io::Result<Outcome> {
    let mut cmd = Command::new("/bin/bash");
    cmd.arg(script)
        .arg(dest)
        .current_dir(cwd)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .process_group(0);
    for key in PASS_ENV {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome::Exited(status));
        }
        if Instant::now() >= deadline {
            let pgid = i32::try_from(child.id()).map(Pid::from_raw);
            if let Ok(pgid) = pgid {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = writeln!(
                &*log,
                "sandboxd: build stopped after {} s",
                timeout.as_secs()
            );
            return Ok(Outcome::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
