//! The shim's events to containerd, delivered across a containerd restart.
//!
//! The `containerd-shim` crate's publisher holds the one ttrpc connection
//! to containerd it made when the shim started. A restarted containerd
//! listens on a new socket, so every later event failed on the old
//! connection (EPIPE) and was lost: a task that ended after containerd
//! restarted was never reported, and CRI marks a container exited on that
//! event. A failed delivery now connects again and retries the same event
//! until it is delivered or [`GIVE_UP_AFTER`] passed (containerd down that
//! long). Deliveries hold one lock, so events keep their order.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::ttrpc::context;
use containerd_shim::publisher::RemotePublisher;

/// The variable containerd names its ttrpc address in for its shims (the
/// crate reads it at start and does not export its name).
const TTRPC_ADDRESS: &str = "TTRPC_ADDRESS";

/// How long an event is retried while containerd cannot take it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// The first and the longest wait between two tries.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// How long one delivery may take: a containerd that accepted the
/// connection but hangs must not hold every later event for good.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Publisher {
    connection: Mutex<RemotePublisher>,
}

impl Publisher {
    pub fn new(connected: RemotePublisher) -> Self {
        Self {
            connection: Mutex::new(connected),
        }
    }

    /// Delivers `event` under `topic` in containerd's `namespace`, blocking
    /// while containerd restarts; logs it as lost after [`GIVE_UP_AFTER`].
    pub fn publish(&self, topic: &str, namespace: &str, event: Box<dyn MessageDyn>) {
        let mut connection = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        let since = Instant::now();
        let mut wait = RETRY_FIRST;
        loop {
            let timeout = i64::try_from(DELIVERY_TIMEOUT.as_nanos()).unwrap_or(i64::MAX);
            let sent = connection.publish(
                context::with_timeout(timeout),
                topic,
                namespace,
                event.clone_box(),
            );
            let Err(e) = sent else {
                return;
            };
            if since.elapsed() >= GIVE_UP_AFTER {
                log::error!("publishing {topic}: {e}; containerd took no event for {GIVE_UP_AFTER:?}, so this one is lost");
                return;
            }
            log::warn!("publishing {topic}: {e}; connecting to containerd again");
            std::thread::sleep(wait);
            wait = (wait * 2).min(RETRY_MOST);
            if let Some(fresh) = reconnect() {
                *connection = fresh;
            }
        }
    }
}

/// A new connection to containerd's ttrpc socket, if it answers.
fn reconnect() -> Option<RemotePublisher> {
    let address = match std::env::var(TTRPC_ADDRESS) {
        Ok(address) => address,
        Err(e) => {
            log::warn!("{TTRPC_ADDRESS}: {e}; containerd's address is unknown");
            return None;
        }
    };
    match RemotePublisher::new(&address) {
        Ok(fresh) => Some(fresh),
        Err(e) => {
            log::warn!("connecting to containerd at {address}: {e}");
            None
        }
    }
}
