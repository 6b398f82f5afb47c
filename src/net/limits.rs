//! Per-sandbox egress caps: open connections, DNS queries per second and
//! bandwidth. Every sandbox has its own proxy, but the proxies share the
//! host's CPUs and uplink; the caps keep one sandbox that floods from taking
//! more than its share. Owns the token bucket both rate caps use.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The caps one sandbox's proxy enforces (the daemon's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLimits {
    /// Connections open through the proxy at once; more are refused.
    pub max_connections: usize,
    /// DNS queries answered per second (a burst of one second's worth is
    /// allowed); more get REFUSED at once.
    pub dns_qps: u32,
    /// Bytes per second in each direction, over all the sandbox's
    /// connections together; 0 for no cap.
    pub bandwidth_bytes_per_sec: u64,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_connections: 256,
            dns_qps: 100,
            bandwidth_bytes_per_sec: 125_000_000,
        }
    }
}

/// A token bucket: `rate` tokens a second, holding at most `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64) -> Self {
        TokenBucket {
            rate,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                refilled: Instant::now(),
            }),
        }
    }

    /// Takes `n` tokens if there are that many.
    pub fn try_take(&self, n: f64) -> bool {
        self.try_take_at(n, Instant::now())
    }

    fn try_take_at(&self, n: f64, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut state, now);
        if state.tokens >= n {
            state.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, going into debt if there are fewer; returns how
    /// long the caller must wait for the debt to be repaid. Debt (rather
    /// than refusing) lets a chunk larger than the burst through at the
    /// average rate.
    pub fn take(&self, n: f64) -> Duration {
        self.take_at(n, Instant::now())
    }

    fn take_at(&self, n: f64, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut state, now);
        state.tokens -= n;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.tokens / self.rate)
        }
    }

    fn refill(&self, state: &mut BucketState, now: Instant) {
        let elapsed = now.saturating_duration_since(state.refilled).as_secs_f64();
        state.tokens = (state.tokens + elapsed * self.rate).min(self.burst);
        state.refilled = now;
    }
}

/// One direction's bandwidth cap, shared by all of a sandbox's connections.
#[derive(Debug)]
pub struct Bandwidth {
    bucket: Option<TokenBucket>,
}

impl Bandwidth {
    /// `bytes_per_sec` 0 means no cap.
    pub fn new(bytes_per_sec: u64) -> Self {
        let bucket = (bytes_per_sec > 0).then(|| {
            let rate = bytes_per_sec as f64;
            // A tenth of a second's worth: short bursts pass untouched.
            TokenBucket::new(rate, (rate / 10.0).max(64.0 * 1024.0))
        });
        Bandwidth { bucket }
    }

    pub fn is_unlimited(&self) -> bool {
        self.bucket.is_none()
    }

    /// The most bytes to carry in one step: at most a burst when capped, so
    /// pausing after each step keeps the average within one burst of the
    /// cap.
    pub fn step(&self, max: usize) -> usize {
        match &self.bucket {
            Some(bucket) => max.min(bucket.burst as usize).max(1),
            None => max,
        }
    }

    /// Accounts `bytes` just carried; returns how long to pause before the
    /// next read so the average stays under the cap.
    pub fn charge(&self, bytes: usize) -> Duration {
        match &self.bucket {
            Some(bucket) => bucket.take(bytes as f64),
            None => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let bucket = TokenBucket::new(10.0, 10.0);
        let start = Instant::now();
        for _ in 0..10 {
            assert!(bucket.try_take_at(1.0, start));
        }
        assert!(!bucket.try_take_at(1.0, start));
        // A tenth of a second later, one more token has come in.
        assert!(bucket.try_take_at(1.0, start + Duration::from_millis(100)));
        assert!(!bucket.try_take_at(1.0, start + Duration::from_millis(100)));
    }

    #[test]
    fn bucket_never_holds_more_than_the_burst() {
        let bucket = TokenBucket::new(10.0, 5.0);
        let later = Instant::now() + Duration::from_secs(60);
        for _ in 0..5 {
            assert!(bucket.try_take_at(1.0, later));
        }
        assert!(!bucket.try_take_at(1.0, later));
    }

    #[test]
    fn debt_is_repaid_at_the_rate() {
        let bucket = TokenBucket::new(1000.0, 100.0);
        let start = Instant::now();
        assert_eq!(bucket.take_at(100.0, start), Duration::ZERO);
        let wait = bucket.take_at(500.0, start);
        assert!(
            (wait.as_secs_f64() - 0.5).abs() < 1e-6,
            "500 bytes of debt at 1000/s is half a second, got {wait:?}"
        );
    }

    #[test]
    fn a_capped_step_is_at_most_a_burst() {
        assert_eq!(Bandwidth::new(10_000_000).step(1 << 20), 1_000_000);
        assert_eq!(Bandwidth::new(1).step(1 << 20), 64 * 1024);
        assert_eq!(Bandwidth::new(0).step(1 << 20), 1 << 20);
    }

    #[test]
    fn no_cap_never_waits() {
        let bw = Bandwidth::new(0);
        assert_eq!(bw.charge(usize::MAX / 2), Duration::ZERO);
    }
}
