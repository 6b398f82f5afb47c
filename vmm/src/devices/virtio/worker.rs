//! The thread that runs an active device: an epoll loop over the device's
//! queue eventfds, any descriptors of its own (the vsock backend's sockets),
//! and a stop eventfd. The handler (the device's running state) is moved into
//! the thread and handed back when the worker stops, so a running device
//! needs no lock of its own and a stopped one can be inspected or restarted.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// Token of the stop eventfd.
const STOP_TOKEN: u64 = u64::MAX;
/// Tokens below this are queue indices; handler descriptors use tokens at or
/// above it.
pub const HANDLER_TOKEN_BASE: u64 = 1 << 32;

/// Errors starting or stopping a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// An eventfd or the epoll instance could not be created or set up.
    #[error("cannot set up the {device} worker's epoll/eventfds: {source}")]
    Setup {
        /// The device.
        device: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The thread could not be started.
    #[error("cannot start the {device} worker thread: {source}")]
    Spawn {
        /// The device.
        device: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The thread panicked (a vmm bug); the device's running state is lost.
    #[error("the {0} worker thread panicked; this is a vmm bug")]
    Panicked(&'static str),
}

/// A device's running state, driven by its worker thread.
pub trait WorkerHandler: Send + 'static {
    /// Descriptors to watch besides the queue eventfds, each with a token at
    /// or above [`HANDLER_TOKEN_BASE`]. Level-triggered, readable.
    fn extra_fds(&self) -> Vec<(RawFd, u64)> {
        Vec::new()
    }
    /// Queue `index` was notified (its eventfd is already drained).
    fn queue_notified(&mut self, index: usize);
    /// A descriptor from [`extra_fds`](Self::extra_fds) is ready.
    fn fd_ready(&mut self, _token: u64) {}
    /// How long the worker may sleep before [`tick`](Self::tick) must run;
    /// `None` sleeps until an event.
    fn next_timeout(&self) -> Option<Duration> {
        None
    }
    /// Runs when [`next_timeout`](Self::next_timeout) has passed.
    fn tick(&mut self) {}
}

/// A running worker thread. Dropping it stops and joins the thread.
pub struct Worker<H: WorkerHandler> {
    device: &'static str,
    stop: EventFd,
    handle: Option<JoinHandle<H>>,
}

impl<H: WorkerHandler> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("device", &self.device)
            .field("running", &self.handle.is_some())
            .finish()
    }
}

impl<H: WorkerHandler> Worker<H> {
    /// Starts a thread named `vmm-<device>` running `handler`, woken by
    /// `queue_evts` (one per queue, the same eventfds the transport and KVM
    /// signal; they are duplicated, not consumed).
    pub fn spawn(
        device: &'static str,
        handler: H,
        queue_evts: &[EventFd],
    ) -> Result<Self, WorkerError> {
        let setup = |source| WorkerError::Setup { device, source };
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(setup)?;
        let epoll = Epoll::new().map_err(setup)?;
        let add = |fd: RawFd, token: u64| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        add(stop.as_raw_fd(), STOP_TOKEN).map_err(setup)?;
        let mut evts = Vec::with_capacity(queue_evts.len());
        for (index, evt) in queue_evts.iter().enumerate() {
            let evt = evt.try_clone().map_err(setup)?;
            add(evt.as_raw_fd(), index as u64).map_err(setup)?;
            evts.push(evt);
        }
        for (fd, token) in handler.extra_fds() {
            add(fd, token).map_err(setup)?;
        }
        let thread_stop = stop.try_clone().map_err(setup)?;
        let handle = thread::Builder::new()
            .name(format!("vmm-{device}"))
            .spawn(move || run(device, handler, &epoll, &evts, &thread_stop))
            .map_err(|source| WorkerError::Spawn { device, source })?;
        Ok(Worker {
            device,
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and returns the handler, for saving or restarting.
    pub fn stop(mut self) -> Result<H, WorkerError> {
        self.stop_and_join()
            .unwrap_or(Err(WorkerError::Panicked(self.device)))
    }

    fn stop_and_join(&mut self) -> Option<Result<H, WorkerError>> {
        let handle = self.handle.take()?;
        // A failed write (the counter cannot overflow at 1 per stop) would
        // leave the thread running; join would then hang, so treat it as the
        // loop's own failure and let the loop's epoll error path end it.
        let _ = self.stop.write(1);
        Some(
            handle
                .join()
                .map_err(|_| WorkerError::Panicked(self.device)),
        )
    }
}

/// A device's worker: running, parked by a pause with its handler (the
/// device's running state) kept, or neither. Every device holds one, so
/// activation, pause, resume and reset work alike for all of them.
#[derive(Debug)]
pub struct WorkerSlot<H: WorkerHandler> {
    device: &'static str,
    running: Option<Worker<H>>,
    paused: Option<H>,
}

impl<H: WorkerHandler> WorkerSlot<H> {
    /// An empty slot for the device named `device` (its threads' name).
    pub fn new(device: &'static str) -> Self {
        WorkerSlot {
            device,
            running: None,
            paused: None,
        }
    }

    /// Whether a worker thread runs (a paused one does not).
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Starts a worker running `handler`, woken by `queue_evts`.
    pub fn start(&mut self, handler: H, queue_evts: &[EventFd]) -> Result<(), WorkerError> {
        self.running = Some(Worker::spawn(self.device, handler, queue_evts)?);
        Ok(())
    }

    /// Stops a running worker between two batches and keeps its handler.
    pub fn pause(&mut self) -> Result<(), WorkerError> {
        if let Some(worker) = self.running.take() {
            self.paused = Some(worker.stop()?);
        }
        Ok(())
    }

    /// Restarts a worker stopped by [`pause`](Self::pause) with the same
    /// handler.
    pub fn resume(&mut self, queue_evts: &[EventFd]) -> Result<(), WorkerError> {
        if let Some(handler) = self.paused.take() {
            self.start(handler, queue_evts)?;
        }
        Ok(())
    }

    /// Runs `change` on the handler between two batches: a running worker is
    /// stopped for it and restarted after, a paused one stays paused. A
    /// slot with neither (not started, or its thread panicked) runs nothing.
    pub fn with_handler(
        &mut self,
        queue_evts: &[EventFd],
        change: impl FnOnce(&mut H),
    ) -> Result<(), WorkerError> {
        if let Some(handler) = self.paused.as_mut() {
            change(handler);
        } else if let Some(worker) = self.running.take() {
            let mut handler = worker.stop()?;
            change(&mut handler);
            self.start(handler, queue_evts)?;
        }
        Ok(())
    }

    /// Stops the worker, running or paused, and gives its handler back; a
    /// worker that panicked took its handler with it (`None`).
    pub fn stop(&mut self) -> Option<H> {
        let paused = self.paused.take();
        let stopped = self.running.take().and_then(|worker| worker.stop().ok());
        paused.or(stopped)
    }
}

impl<H: WorkerHandler> Drop for Worker<H> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

fn run<H: WorkerHandler>(
    device: &'static str,
    mut handler: H,
    epoll: &Epoll,
    evts: &[EventFd],
    stop: &EventFd,
) -> H {
    let mut events = vec![EpollEvent::default(); 32];
    loop {
        let timeout = handler.next_timeout().map_or(-1, |d| {
            // Round up so a deadline 0.4 ms away does not spin at 0 ms.
            i32::try_from(d.as_millis().saturating_add(1)).unwrap_or(i32::MAX)
        });
        let n = match epoll.wait(timeout, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Cannot happen with a valid epoll fd and buffer; stop the
                // device rather than spin.
                eprintln!("vmm: {device} worker: epoll_wait failed, device stopped: {e}");
                return handler;
            }
        };
        if n == 0 {
            handler.tick();
            continue;
        }
        for event in &events[..n] {
            match event.data() {
                STOP_TOKEN => {
                    let _ = stop.read();
                    return handler;
                }
                token if token < HANDLER_TOKEN_BASE => {
                    let index = token as usize;
                    if let Some(evt) = evts.get(index) {
                        // Drain the counter; several notifies fold into one
                        // pass over the queue, which processes all of it.
                        let _ = evt.read();
                        handler.queue_notified(index);
                    }
                }
                token => handler.fd_ready(token),
            }
        }
        if handler.next_timeout() == Some(Duration::ZERO) {
            handler.tick();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    struct Recorder(mpsc::Sender<usize>, u32);

    impl WorkerHandler for Recorder {
        fn queue_notified(&mut self, index: usize) {
            self.1 += 1;
            let _ = self.0.send(index);
        }
    }

    #[test]
    fn notifications_reach_the_handler_and_stop_returns_it() {
        let evts = [
            EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
            EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        ];
        let (tx, rx) = mpsc::channel();
        let worker = Worker::spawn("test", Recorder(tx, 0), &evts).expect("spawn");
        evts[1].write(1).expect("notify");
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        evts[0].write(1).expect("notify");
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
        let handler = worker.stop().expect("stop");
        assert_eq!(handler.1, 2);
    }
}
