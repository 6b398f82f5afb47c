//! The CPU priority of work made ahead of creates (network slots, standby
//! supervisors): [`BACKGROUND_NICENESS`] below the priority the daemon
//! runs at, whatever that is, so the host's CPUs go to creates and their
//! processes first, and an operator who starts the daemon lower (a unit's
//! `Nice=`) keeps all of it, sandboxes' supervisors included, that low.
//!
//! Nice values are per thread on Linux: these change the calling thread's.

/// How far below the daemon's priority made-ahead work runs.
pub const BACKGROUND_NICENESS: libc::c_int = 10;

/// The highest nice value (the lowest priority) the kernel takes.
const LOWEST: libc::c_int = 19;

/// The calling thread's nice value; 0 if it cannot be read.
pub fn current() -> libc::c_int {
    // getpriority(2) may return -1 as a value: errno tells.
    // SAFETY: __errno_location points at this thread's errno.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority on the calling thread (who 0), plain ints.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    // SAFETY: as above.
    if nice == -1 && unsafe { *libc::__errno_location() } != 0 {
        return 0;
    }
    nice
}

/// Sets the calling thread's nice value. Raising the priority again (a
/// lower value) needs CAP_SYS_NICE, which the daemon has as root.
pub fn set(nice: libc::c_int) {
    // SAFETY: setpriority(2) on the calling thread (who 0), plain ints.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
}

/// The nice value of made-ahead work under a thread at `base`.
pub fn lowered(base: libc::c_int) -> libc::c_int {
    base.saturating_add(BACKGROUND_NICENESS).min(LOWEST)
}

/// The priority this process was started at (the daemon's; a
/// supervisor's, which is the daemon's), read the first time it is asked
/// for: on a thread nothing here has lowered yet, as every lowering asks
/// first. Fixed from then on, so a thread whose return failed (no
/// CAP_SYS_NICE) is not lowered again from where it was left.
pub fn base() -> libc::c_int {
    static BASE: std::sync::OnceLock<libc::c_int> = std::sync::OnceLock::new();
    *BASE.get_or_init(current)
}

/// Runs the calling thread at the made-ahead priority until dropped, then
/// at the process's [`base`].
pub struct BackgroundThread(());

impl BackgroundThread {
    pub fn enter() -> Self {
        set(lowered(base()));
        BackgroundThread(())
    }
}

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        // Back to the base for the next task of this pooled thread.
        set(base());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ahead_work_runs_below_its_base_within_the_kernels_range() {
        assert_eq!(lowered(0), 10);
        assert_eq!(lowered(5), 15);
        assert_eq!(lowered(12), 19);
        assert_eq!(lowered(-5), 5);
    }

    #[test]
    fn a_background_thread_goes_back_to_the_process_base() {
        std::thread::spawn(|| {
            let base = base();
            set(base);
            assert_eq!(
                current(),
                base,
                "the positive control: the thread's own value"
            );
            {
                let _lowered = BackgroundThread::enter();
                assert_eq!(current(), lowered(base));
                // Not lowered twice when entered again.
                let _again = BackgroundThread::enter();
                assert_eq!(current(), lowered(base));
            }
            // Back up needs CAP_SYS_NICE; without it the thread stays lower.
            let back = current();
            assert!(back == base || back == lowered(base), "{back}");
            if sandboxd_test_support::running_as_root() {
                assert_eq!(back, base);
            }
        })
        .join()
        .expect("thread");
    }
}
