//! A supervisor's children: the reaper, and the children code spawns and
//! waits for itself. A supervisor is a subreaper, so orphans of the
//! sandbox's runtime helpers come to it, and it must reap every child it
//! does not wait for. A reaper that took whatever exited
//! (`waitpid(-1)`) would race with code waiting for its own child: the
//! loser gets ECHILD. Std's `Command::spawn` is such code, unseen: when
//! the exec or a `pre_exec` hook fails in a forked child, it reaps the
//! child itself and panics on ECHILD. So the reaper looks at an exited
//! child first without reaping it, and leaves alone the ones a spawn in
//! flight, a [`spawn_own`] caller or an [`OwnFork`]'s will reap.

use std::collections::HashMap;
use std::io;
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

#[derive(Default)]
struct Owned {
    /// Spawns under way: a child of one may exit (a failed exec) before
    /// its pid is known, and std reaps it then.
    spawning: usize,
    /// Children whose spawner reaps them, with how many handles hold
    /// each pid: a pid reaped and reused while the older handle lives
    /// stays owned until both are dropped.
    pids: HashMap<i32, usize>,
}

#[derive(Default)]
struct Registry {
    owned: Mutex<Owned>,
    released: Condvar,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn lock(registry: &Registry) -> MutexGuard<'_, Owned> {
    registry.owned.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fork (a spawn's, or a raw one) of a child its caller waits for,
/// made while this is held: [`Self::parent`] with the child's pid in the
/// parent, [`Self::child`] in a raw fork's child. Counted as under way
/// until dropped, panicked or not (a count left up would stop the reaper
/// for good); then the child it made is owned.
pub struct OwnFork {
    pid: Option<i32>,
}

impl OwnFork {
    pub fn start() -> Self {
        lock(registry()).spawning += 1;
        Self { pid: None }
    }

    /// The child's pid, owned until the handle is dropped.
    pub fn parent(mut self, pid: i32) -> OwnedPid {
        self.pid = Some(pid);
        OwnedPid(pid)
    }

    /// Forgets the fork untouched: the registry's lock may have been held
    /// by a thread the child does not have.
    pub fn child(self) {
        std::mem::forget(self);
    }
}

impl Drop for OwnFork {
    fn drop(&mut self) {
        let registry = registry();
        let mut owned = lock(registry);
        owned.spawning -= 1;
        if let Some(pid) = self.pid {
            *owned.pids.entry(pid).or_insert(0) += 1;
        }
        drop(owned);
        registry.released.notify_all();
    }
}

/// Holds a child's pid as owned until dropped.
#[derive(Debug)]
pub struct OwnedPid(i32);

impl Drop for OwnedPid {
    fn drop(&mut self) {
        let registry = registry();
        let mut owned = lock(registry);
        if let Some(count) = owned.pids.get_mut(&self.0) {
            *count -= 1;
            if *count == 0 {
                owned.pids.remove(&self.0);
            }
        }
        drop(owned);
        registry.released.notify_all();
    }
}

/// A child [`spawn_own`] made: the reaper leaves it to this handle until
/// the handle is dropped (waited for or not).
#[derive(Debug)]
pub struct OwnChild {
    child: Child,
    _owned: OwnedPid,
}

impl Deref for OwnChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for OwnChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

/// Spawns `command` as a child its caller waits for, safe beside a
/// running [`reap_children`]. Wait for the child, or drop it, soon after
/// it may have exited: until then the reaper reaps nothing else, the
/// init's end included.
pub fn spawn_own(command: &mut Command) -> io::Result<OwnChild> {
    let fork = OwnFork::start();
    let child = command.spawn()?;
    let owned = fork.parent(child.id() as i32);
    Ok(OwnChild {
        child,
        _owned: owned,
    })
}

/// How a wait status reads in a message.
fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with code {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("killed by signal {signal} ({name})"),
            Err(_) => format!("killed by signal {signal}"),
        }
    } else {
        format!("ended with wait status {status:#x}")
    }
}

/// The pid of a child that has exited, left a zombie; `None` once there
/// is no child left. Blocks until one exits.
fn next_exited() -> Option<i32> {
    loop {
        // SAFETY: siginfo_t is plain data, for which all zeroes is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into `info`, which outlives the call.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            // SAFETY: waitid filled in a SIGCHLD siginfo, whose pid it is.
            return Some(unsafe { info.si_pid() });
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return None,
        }
    }
}

/// Reaps every child no spawner waits for, until none is left: tells
/// `init_ended` how `init_pid` ended, and `orphan_ended` how each other
/// one did (its pid and status). Runs on a thread of its own.
pub fn reap_children(
    init_pid: i32,
    init_ended: impl FnOnce(String),
    mut orphan_ended: impl FnMut(i32, String),
) {
    let registry = registry();
    let mut init_ended = Some(init_ended);
    while let Some(pid) = next_exited() {
        let mut owned = lock(registry);
        while owned.spawning > 0 || owned.pids.contains_key(&pid) {
            owned = registry
                .released
                .wait(owned)
                .unwrap_or_else(|p| p.into_inner());
        }
        // Still under the lock, so no spawn starts meanwhile: its child
        // could take the pid if its owner (or std, after a failed exec)
        // has reaped it since.
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes the status into a local; WNOHANG never
        // blocks, so the lock is held for one system call.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        drop(owned);
        if reaped != pid {
            // Reaped by its owner already (ECHILD), or a new child by now.
            continue;
        }
        match init_ended.take_if(|_| pid == init_pid) {
            Some(tell) => tell(describe(status)),
            None => orphan_ended(pid, describe(status)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    use std::sync::mpsc;

    const PROBE_ENV: &str = "SANDBOXD_REAPER_PROBE";
    /// A bound on the reaper's reports, so a stuck reaper fails the probe
    /// instead of hanging it.
    const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

    /// The reaper takes every exited child of its process, so it runs in a
    /// process of its own: this test binary, re-run for `reaper_probe`
    /// alone.
    #[test]
    fn spawns_beside_the_reaper_keep_their_own_statuses() {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = Command::new(exe)
            .args([
                "runtime::children::tests::reaper_probe",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PROBE_ENV, "1")
            .output()
            .expect("running the probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "probe failed:\n{stdout}\n{stderr}");
        for line in [
            "PROBE failed_execs=200",
            "PROBE own_exit_codes=7",
            "PROBE orphan_reaped",
            "PROBE init_ended",
        ] {
            assert!(stdout.contains(line), "no {line:?} in:\n{stdout}\n{stderr}");
        }
    }

    /// Run by the test above in a process of its own: a reaper beside
    /// spawns whose exec fails (std reaps those itself, and panicked on
    /// ECHILD when a reaper took them first), children waited for by
    /// their spawner, and a child nobody waits for.
    #[test]
    #[allow(
        clippy::zombie_processes,
        reason = "the reaper under test reaps what the probe does not wait for"
    )]
    fn reaper_probe() {
        if std::env::var_os(PROBE_ENV).is_none() {
            // Outside the re-run this is the test above's subject, not a
            // test: it would reap the other tests' children.
            return;
        }
        let mut init = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawning cat as the init");
        let init_pid = init.id() as i32;
        let mut init_stdin = init.stdin.take().expect("cat's stdin");
        let (init_tx, init_rx) = mpsc::channel();
        let (orphan_tx, orphan_rx) = mpsc::channel();
        std::thread::spawn(move || {
            reap_children(
                init_pid,
                move |status| {
                    let _ = init_tx.send(status);
                },
                move |pid, _| {
                    let _ = orphan_tx.send(pid);
                },
            )
        });

        let mut failed_execs = 0;
        for _ in 0..200 {
            let mut command = Command::new("/nonexistent/sandboxd-probe");
            // A hook makes std fork and exec rather than posix_spawn, as
            // criu's `setns` does: only then does std reap a failed child
            // itself.
            // SAFETY: the hook does nothing, which is async-signal-safe.
            unsafe { command.pre_exec(|| Ok(())) };
            let spawned = spawn_own(&mut command);
            assert_eq!(
                spawned.map(|_| ()).map_err(|e| e.kind()),
                Err(io::ErrorKind::NotFound)
            );
            failed_execs += 1;
        }
        println!("PROBE failed_execs={failed_execs}");

        let mut codes = HashSet::new();
        for _ in 0..50 {
            let mut child =
                spawn_own(Command::new("sh").args(["-c", "exit 7"])).expect("spawning sh");
            codes.insert(child.wait().expect("waiting for my own child").code());
        }
        assert_eq!(codes, HashSet::from([Some(7)]));
        println!("PROBE own_exit_codes=7");

        let orphan = Command::new("true").spawn().expect("spawning true");
        let orphan_pid = orphan.id() as i32;
        drop(orphan);
        assert_eq!(orphan_rx.recv_timeout(WAIT), Ok(orphan_pid));
        println!("PROBE orphan_reaped");

        init_stdin.flush().expect("flushing");
        drop(init_stdin);
        let status = init_rx.recv_timeout(WAIT).expect("the init's status");
        assert_eq!(status, "exited with code 0");
        println!("PROBE init_ended");
    }

    #[test]
    fn an_own_child_is_owned_until_its_handle_is_dropped() {
        let registry = registry();
        let mut child = spawn_own(&mut Command::new("true")).expect("spawning true");
        let pid = child.id() as i32;
        assert_eq!(lock(registry).pids.get(&pid), Some(&1));
        assert!(child.wait().expect("waiting for true").success());
        drop(child);
        assert_eq!(lock(registry).pids.get(&pid), None);
    }

    #[test]
    fn a_reused_pid_stays_owned_until_every_handle_is_dropped() {
        let first = OwnFork::start().parent(-5);
        let second = OwnFork::start().parent(-5);
        drop(first);
        assert_eq!(lock(registry()).pids.get(&-5), Some(&1));
        drop(second);
        assert_eq!(lock(registry()).pids.get(&-5), None);
    }

    #[test]
    fn statuses_read_as_words() {
        assert_eq!(describe(3 << 8), "exited with code 3");
        assert_eq!(describe(9), "killed by signal 9 (SIGKILL)");
        assert_eq!(describe(40), "killed by signal 40");
    }
}
