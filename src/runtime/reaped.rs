//! Exit statuses of children that a process-wide reaper took. A supervisor
//! reaps every child (it is a subreaper, so orphans of the sandbox's runtime
//! helpers come to it), which races with any code waiting for a child of
//! its own: whoever waits second gets ECHILD. The reaper records what it
//! reaped here, and such code looks its child up instead.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How many recent statuses are kept; orphans beyond that are forgotten.
const KEPT: usize = 256;

/// How a reaped child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub pid: i32,
    /// The exit code, when it exited rather than died of a signal.
    pub code: Option<i32>,
    pub description: String,
}

#[derive(Default)]
struct Registry {
    ended: Mutex<VecDeque<Ended>>,
    changed: Condvar,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Called by the reaper for every child it reaps.
pub fn record(ended: Ended) {
    let registry = registry();
    let mut list = registry.ended.lock().unwrap_or_else(|p| p.into_inner());
    list.push_back(ended);
    while list.len() > KEPT {
        list.pop_front();
    }
    registry.changed.notify_all();
}

/// Waits up to `timeout` for the reaper to report `pid`, and takes it.
pub fn take(pid: i32, timeout: Duration) -> Option<Ended> {
    let registry = registry();
    let deadline = Instant::now() + timeout;
    let mut list = registry.ended.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(at) = list.iter().position(|e| e.pid == pid) {
            return list.remove(at);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        list = registry
            .changed
            .wait_timeout(list, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_status_is_taken_once() {
        record(Ended {
            pid: -7,
            code: Some(3),
            description: "exited 3".into(),
        });
        assert_eq!(take(-7, Duration::ZERO).map(|e| e.code), Some(Some(3)));
        assert_eq!(take(-7, Duration::from_millis(10)), None);
    }

    #[test]
    fn a_waiter_wakes_when_the_status_arrives() {
        let waiter = std::thread::spawn(|| take(-8, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        record(Ended {
            pid: -8,
            code: None,
            description: "killed".into(),
        });
        assert_eq!(waiter.join().unwrap().map(|e| e.pid), Some(-8));
    }
}
