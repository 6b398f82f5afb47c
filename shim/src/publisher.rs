//! The shim's events to containerd, delivered across a containerd restart.
//!
//! The `containerd-shim` crate's publisher holds the one ttrpc connection
//! to containerd it made when the shim started. A restarted containerd
//! listens on a new socket, so every later event failed on the old
//! connection (EPIPE) and was lost: a task that ended after containerd
//! restarted was never reported, and CRI marks a container exited on that
//! event.
//!
//! Events now go through a queue to one thread of their own, which
//! delivers them in order. A delivery that fails for the connection's sake
//! connects again and retries the same event until it is delivered or
//! [`GIVE_UP_AFTER`] has passed since it was queued. Nobody who publishes
//! waits for it: containerd, starting again, deletes the shims whose tasks
//! ended before it serves its event socket, and a Delete that waited for
//! that socket would hold containerd's start up (as Go's runc shim does
//! with its queue). [`Publisher::flush`] lets the shim's exit wait for what
//! is queued.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::ttrpc::{self, context};
use containerd_shim::publisher::RemotePublisher;

/// The variable containerd names its ttrpc address in for its shims (the
/// crate reads it at start and does not export its name).
const TTRPC_ADDRESS: &str = "TTRPC_ADDRESS";

/// How long an event is retried, from when it was queued, while
/// containerd cannot take it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// The first and the longest wait between two tries.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// How long one delivery may take: a containerd that accepted the
/// connection but hangs must not hold every later event for good. A
/// delivery that timed out may have arrived; its retry then delivers it
/// twice, which containerd's subscribers take as the same event.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

enum Queued {
    Event {
        topic: String,
        namespace: String,
        event: Box<dyn MessageDyn>,
        at: Instant,
    },
    /// Answered once everything queued before it is delivered or given up.
    Flush(mpsc::Sender<()>),
}

pub struct Publisher {
    queue: mpsc::Sender<Queued>,
}

impl Publisher {
    /// Starts the delivering thread on `connected`, containerd's connection
    /// as the shim found it at start.
    pub fn start(connected: RemotePublisher) -> Self {
        let (queue, queued) = mpsc::channel();
        let started = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || deliver(connected, queued));
        if let Err(e) = started {
            // Every publish then logs its event as lost.
            log::error!("starting the thread that publishes events: {e}");
        }
        Self { queue }
    }

    /// Queues `event` under `topic` in containerd's `namespace`.
    pub fn publish(&self, topic: &str, namespace: &str, event: Box<dyn MessageDyn>) {
        let queued = Queued::Event {
            topic: topic.to_string(),
            namespace: namespace.to_string(),
            event,
            at: Instant::now(),
        };
        if self.queue.send(queued).is_err() {
            log::error!("publishing {topic}: the events thread is gone; the event is lost");
        }
    }

    /// Waits, at most `wait`, until what was published before is
    /// delivered or given up; false when the wait ran out.
    pub fn flush(&self, wait: Duration) -> bool {
        let (done, flushed) = mpsc::channel();
        self.queue.send(Queued::Flush(done)).is_ok() && flushed.recv_timeout(wait).is_ok()
    }
}

/// Delivers what is queued, in order, until every [`Publisher`] is gone.
fn deliver(mut connection: RemotePublisher, queued: mpsc::Receiver<Queued>) {
    for item in queued {
        match item {
            Queued::Flush(done) => {
                let _ = done.send(());
            }
            Queued::Event {
                topic,
                namespace,
                event,
                at,
            } => deliver_one(&mut connection, &topic, &namespace, &*event, at),
        }
    }
}

fn deliver_one(
    connection: &mut RemotePublisher,
    topic: &str,
    namespace: &str,
    event: &dyn MessageDyn,
    queued_at: Instant,
) {
    let timeout = i64::try_from(DELIVERY_TIMEOUT.as_nanos()).unwrap_or(i64::MAX);
    let mut wait = RETRY_FIRST;
    loop {
        let sent = connection.publish(
            context::with_timeout(timeout),
            topic,
            namespace,
            event.clone_box(),
        );
        let Err(e) = sent else {
            return;
        };
        if let containerd_shim::Error::Ttrpc(ttrpc::Error::RpcStatus(status)) = &e {
            // containerd answered: it refused the event itself.
            log::error!("publishing {topic}: containerd refused it: {status:?}");
            return;
        }
        if queued_at.elapsed() >= GIVE_UP_AFTER {
            log::error!(
                "publishing {topic}: {e}; containerd took no event for {GIVE_UP_AFTER:?}, so this one is lost"
            );
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
