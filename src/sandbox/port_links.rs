//! What is open through the ingress, per sandbox and port: the count held
//! against `ingress_max_connections`, the bytes carried, and a cancellation
//! token per exposed port that unexpose and teardown fire, so every open
//! connection through it ends at once. Raw TCP listeners the manager bound
//! wait here until the ingress serves them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct SandboxLinks {
    open: usize,
    bytes: Arc<AtomicU64>,
    ports: HashMap<u16, CancellationToken>,
}

/// A raw TCP exposure's listener, bound by the manager, not yet served.
pub struct TcpExposure {
    pub sandbox: String,
    pub port: u16,
    pub listener: std::net::TcpListener,
    /// Fired when the port is unexposed or the sandbox goes.
    pub closed: CancellationToken,
}

#[derive(Default)]
pub struct PortLinks {
    sandboxes: Mutex<HashMap<String, SandboxLinks>>,
    pending_tcp: Mutex<Vec<TcpExposure>>,
    tcp_added: Notify,
}

/// Why a link was not opened.
#[derive(Debug, PartialEq, Eq)]
pub struct AtCapacity(pub usize);

/// One open connection (or request in flight) through the ingress.
pub struct LinkGuard {
    links: Arc<PortLinks>,
    sandbox: String,
    bytes: Arc<AtomicU64>,
    /// Fired when the port is unexposed or the sandbox goes.
    pub closed: CancellationToken,
}

impl LinkGuard {
    /// The sandbox's byte counter, which bodies and streams add to.
    pub fn byte_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.bytes)
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if let Some(s) = self.links.lock().get_mut(&self.sandbox) {
            s.open = s.open.saturating_sub(1);
        }
    }
}

impl PortLinks {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, SandboxLinks>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a link to `port` of `sandbox`, unless `max` are open already.
    pub fn open(
        self: &Arc<Self>,
        sandbox: &str,
        port: u16,
        max: usize,
    ) -> Result<LinkGuard, AtCapacity> {
        let mut all = self.lock();
        let links = all.entry(sandbox.to_string()).or_default();
        if links.open >= max {
            return Err(AtCapacity(max));
        }
        links.open += 1;
        let closed = links.ports.entry(port).or_default().clone();
        Ok(LinkGuard {
            links: Arc::clone(self),
            sandbox: sandbox.to_string(),
            bytes: Arc::clone(&links.bytes),
            closed,
        })
    }

    /// The token fired when `port` of `sandbox` stops being exposed.
    pub fn port_closed(&self, sandbox: &str, port: u16) -> CancellationToken {
        self.lock()
            .entry(sandbox.to_string())
            .or_default()
            .ports
            .entry(port)
            .or_default()
            .clone()
    }

    /// Ends every connection through `port` of `sandbox`.
    pub fn close_port(&self, sandbox: &str, port: u16) {
        if let Some(token) = self
            .lock()
            .get_mut(sandbox)
            .and_then(|s| s.ports.remove(&port))
        {
            token.cancel();
        }
    }

    /// Ends every connection into `sandbox` (it failed), keeping its count.
    pub fn close_sandbox_links(&self, sandbox: &str) {
        if let Some(links) = self.lock().get_mut(sandbox) {
            for (_, token) in links.ports.drain() {
                token.cancel();
            }
        }
    }

    /// Ends every connection into `sandbox` and forgets it; returns the
    /// bytes it carried.
    pub fn close_sandbox(&self, sandbox: &str) -> u64 {
        match self.lock().remove(sandbox) {
            Some(links) => {
                for token in links.ports.values() {
                    token.cancel();
                }
                links.bytes.load(Ordering::Relaxed)
            }
            None => 0,
        }
    }

    /// Starts `sandbox`'s count where its record left it (a restart).
    pub fn seed_bytes(&self, sandbox: &str, bytes: u64) {
        let mut all = self.lock();
        let links = all.entry(sandbox.to_string()).or_default();
        links.bytes.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Bytes carried into and out of `sandbox`.
    pub fn bytes(&self, sandbox: &str) -> u64 {
        self.lock()
            .get(sandbox)
            .map(|s| s.bytes.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Hands a bound raw TCP listener of `port` of `sandbox` to the ingress.
    pub fn add_tcp(&self, sandbox: &str, port: u16, listener: std::net::TcpListener) {
        let exposure = TcpExposure {
            sandbox: sandbox.to_string(),
            port,
            listener,
            closed: self.port_closed(sandbox, port),
        };
        self.pending_tcp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(exposure);
        self.tcp_added.notify_one();
    }

    /// The raw TCP listeners bound since the last call; waits for one.
    pub async fn next_tcp(&self) -> Vec<TcpExposure> {
        loop {
            let taken =
                std::mem::take(&mut *self.pending_tcp.lock().unwrap_or_else(|p| p.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
            self.tcp_added.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_open_links_and_frees_them_on_drop() {
        let links = Arc::new(PortLinks::default());
        let a = links.open("sb-a", 80, 2).expect("first");
        let _b = links.open("sb-a", 81, 2).expect("second");
        assert_eq!(links.open("sb-a", 80, 2).err(), Some(AtCapacity(2)));
        assert!(
            links.open("sb-b", 80, 2).is_ok(),
            "another sandbox has its own cap"
        );
        drop(a);
        assert!(links.open("sb-a", 80, 2).is_ok());
    }

    #[test]
    fn closing_a_port_fires_its_links_only_and_a_new_exposure_starts_afresh() {
        let links = Arc::new(PortLinks::default());
        let web = links.open("sb-a", 80, 8).expect("web");
        let other = links.open("sb-a", 81, 8).expect("other");
        links.close_port("sb-a", 80);
        assert!(web.closed.is_cancelled());
        assert!(!other.closed.is_cancelled());
        let again = links.open("sb-a", 80, 8).expect("re-exposed");
        assert!(!again.closed.is_cancelled());
        web.byte_counter().fetch_add(10, Ordering::Relaxed);
        assert_eq!(links.close_sandbox("sb-a"), 10);
        assert!(other.closed.is_cancelled() && again.closed.is_cancelled());
    }
}
