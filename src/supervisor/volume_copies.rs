//! A microVM's copies of host volumes (`runtime::guest_volumes` reads
//! them, the agent writes them), and how a read-only one follows the host.
//!
//! The kubelet changes read-only volumes in place while their pod runs: it
//! updates a ConfigMap's or a Secret's files and rotates a service
//! account's token (a new timestamped directory, then its `..data` link
//! swapped), and a process must read the new files as it would on the
//! host. So every directory of a read-only copy is watched (inotify) from
//! before its first read; after a change, once the host's directory has
//! been quiet for [`QUIET`] (the kubelet's swap is several steps), the
//! volume is read again, written beside the copy and swapped into it by
//! the agent (`RequestBody::ReplaceVolume`), which keeps the copy's
//! directories, the ones bound into roots. A writable volume (an emptyDir)
//! is the guest's own once copied and is not followed, nor is one whose
//! top is a file, as the kubelet updates no `subPath` mount.
//!
//! A sandbox's followers share one inotify instance (a host allows each
//! user 128 by default, the kubelet's and containerd's among them), whose
//! events are routed to them by watch.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use sandbox_proto::{ErrorKind, Reply, RequestBody, VolumeEntry};
use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::link::AgentLink;
use super::processes::{err, link_failure, unexpected_guest_reply, AGENT_DEADLINE};
use super::protocol::{SupervisorError, SupervisorErrorKind};
use crate::model::HostVolume;
use crate::runtime::guest_volumes::{self, GuestVolumeError};

/// How long the host's directory must be still after a change before the
/// volume is read again.
const QUIET: Duration = Duration::from_millis(25);
/// The longest a change waits for that stillness: a volume rewritten
/// without pause is copied as it is then, and again after.
const MOST_SETTLING: Duration = Duration::from_secs(1);
/// A change heard within this of the last copy's end means the volume
/// keeps changing: the next copy waits [`BUSY_GAP_FIRST`] after the last,
/// doubling up to [`BUSY_GAP_MOST`], so a file rewritten all the time
/// costs the guest a copy every few seconds, not one per change.
const BUSY_WITHIN: Duration = Duration::from_secs(1);
const BUSY_GAP_FIRST: Duration = Duration::from_millis(100);
const BUSY_GAP_MOST: Duration = Duration::from_secs(5);
/// After a failed update (a full scratch disk, an agent too slow), the
/// next try comes after this, doubling up to [`RETRY_MOST`], or at the
/// next change.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MOST: Duration = Duration::from_secs(60);

/// What a change of a watched directory is: anything that adds, removes,
/// renames or writes an entry in it, or changes its owner or mode.
const WATCHED: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// A sandbox's copies that follow the host, by key.
#[derive(Default)]
pub(super) struct Following {
    watches: Mutex<Option<Arc<Watches>>>,
    followers: Mutex<HashMap<String, Follower>>,
    /// Held by an update from its read to its swap, and by
    /// [`Self::add_entries`]: an update read before the host had what is
    /// added would remove it again.
    updating: Arc<tokio::sync::Mutex<()>>,
}

/// A copy made, with what follows it once started.
pub(super) struct Copied {
    follow: Option<PendingFollow>,
}

struct PendingFollow {
    key: String,
    volume: HostVolume,
    watches: Arc<Watches>,
    changed: Arc<Notify>,
    updating: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for PendingFollow {
    /// Never started, or its follower ended: nothing routes to it.
    fn drop(&mut self) {
        self.watches.forget(&self.key);
    }
}

/// Keeps one copy following its host volume. Dropped, it stops at its
/// next wait for a change; [`Following::stop`] waits for that.
struct Follower {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        // Never an abort: one in the middle of a request would leave half
        // a frame on the link, or a replacement the agent still makes.
        self.stop.send_replace(true);
    }
}

/// The one inotify instance of a sandbox's followers, and which follower
/// each watch is for.
struct Watches {
    inotify: Arc<Inotify>,
    routes: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    by_watch: HashMap<WatchDescriptor, BTreeSet<String>>,
    changed: HashMap<String, Arc<Notify>>,
}

impl Following {
    /// Copies host `volume` into the guest as its copy `key`, in as many
    /// `WriteVolume` requests as it takes. A read-only directory comes
    /// back with what follows it ([`Self::start`]); a copy the host cannot
    /// watch is good all the same and only logged.
    pub(super) async fn copy(
        &self,
        link: &AgentLink,
        key: &str,
        volume: &HostVolume,
    ) -> Result<Copied, SupervisorError> {
        // Made before the read, so that no change after it goes unheard;
        // dropped (and so forgotten) unless the copy follows.
        let pending = if volume.read_only {
            self.watches().map(|watches| {
                let changed = Arc::new(Notify::new());
                watches
                    .routes()
                    .changed
                    .insert(key.to_owned(), Arc::clone(&changed));
                PendingFollow {
                    key: key.to_owned(),
                    volume: volume.clone(),
                    watches,
                    changed,
                    updating: Arc::clone(&self.updating),
                }
            })
        } else {
            None
        };
        let batches = read(
            volume,
            key,
            pending.as_ref().map(|p| Arc::clone(&p.watches)),
        )
        .await?;
        let top_is_dir = matches!(
            batches.first().and_then(|b| b.first()),
            Some(VolumeEntry::Dir { path, .. }) if path.is_empty()
        );
        write(link, key, volume, batches).await?;
        Ok(Copied {
            follow: pending.filter(|_| top_is_dir),
        })
    }

    /// Adds `entries` (within one request) to the guest's copy `key`, which
    /// keeps what it holds: the directories on the way to host `volume`, a
    /// part of the copy.
    pub(super) async fn add_entries(
        &self,
        link: &AgentLink,
        key: &str,
        volume: &HostVolume,
        entries: Vec<VolumeEntry>,
    ) -> Result<(), SupervisorError> {
        let _updating = self.updating.lock().await;
        write_request(link, key, false, volume, entries).await
    }

    /// Starts following `copied`, if it follows at all.
    pub(super) fn start(&self, link: &Arc<AgentLink>, copied: Copied) {
        let Some(pending) = copied.follow else {
            return;
        };
        let (stop, stopped) = watch::channel(false);
        let key = pending.key.clone();
        let task = tokio::spawn(follow(Arc::clone(link), pending, stopped));
        let replaced = self
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Follower { stop, task });
        drop(replaced);
    }

    /// Whether copy `key` follows its host volume.
    pub(super) fn follows(&self, key: &str) -> bool {
        self.followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .is_some_and(|f| !f.task.is_finished())
    }

    /// Stops copy `key` following its host volume, and waits until no
    /// update of it is under way: a root binds it writable, so what the
    /// guest writes there is the guest's.
    pub(super) async fn stop(&self, key: &str) {
        let follower = self
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        let Some(mut follower) = follower else {
            return;
        };
        follower.stop.send_replace(true);
        let _ = (&mut follower.task).await;
        tracing::info!(
            key,
            "a root binds this volume's copy writable: it no longer follows the host's changes"
        );
    }

    /// The sandbox's inotify instance, made and its events routed on first
    /// use; `None` (logged) where the host has none to give.
    fn watches(&self) -> Option<Arc<Watches>> {
        let mut made = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(watches) = made.as_ref() {
            return Some(Arc::clone(watches));
        }
        let watches = match Watches::start() {
            Ok(watches) => watches,
            Err(e) => {
                tracing::warn!(
                    "the host cannot watch this sandbox's read-only volumes ({e}; \
                     fs.inotify.max_user_instances?): their copies in the microVM will not \
                     follow the host's changes"
                );
                return None;
            }
        };
        *made = Some(Arc::clone(&watches));
        Some(watches)
    }
}

impl Watches {
    fn start() -> std::io::Result<Arc<Self>> {
        let inotify = Arc::new(Inotify::init(
            InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC,
        )?);
        // SAFETY: the inotify descriptor lives as long as any `Arc` of it,
        // one of which the AsyncFd owns until it is dropped, and `Events`
        // always reports that same descriptor.
        let events = unsafe {
            AsyncFd::register_with_interest(
                Events(Arc::clone(&inotify)),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(std::io::Error::from)?;
        let watches = Arc::new(Self {
            inotify,
            routes: Mutex::default(),
        });
        tokio::spawn(route(Arc::downgrade(&watches), events));
        Ok(watches)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches directory `dir` (a `/proc/self/fd` path) for copy `key`.
    /// The routes stay locked across the watch's making, so an event of
    /// it is routed no sooner than it is known.
    fn watch(&self, key: &str, dir: &str) -> std::io::Result<()> {
        let mut routes = self.routes();
        let added = self.inotify.add_watch(dir, WATCHED)?;
        routes
            .by_watch
            .entry(added)
            .or_default()
            .insert(key.to_owned());
        Ok(())
    }

    /// Routes nothing more to copy `key`, and drops the watches no other
    /// copy needs (each counts against the host's `max_user_watches`).
    fn forget(&self, key: &str) {
        let mut routes = self.routes();
        routes.changed.remove(key);
        let mut unneeded = Vec::new();
        routes.by_watch.retain(|watch, keys| {
            keys.remove(key);
            if keys.is_empty() {
                unneeded.push(*watch);
            }
            !keys.is_empty()
        });
        for watch in unneeded {
            // Gone already where its directory was removed.
            let _ = self.inotify.rm_watch(watch);
        }
    }
}

/// The inotify instance the router waits on (tokio wants `AsRawFd`).
struct Events(Arc<Inotify>);

impl AsRawFd for Events {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Tells each follower of a change in a directory it watches, until the
/// sandbox's followers are all gone.
async fn route(watches: std::sync::Weak<Watches>, events: AsyncFd<Events>) {
    loop {
        let read = loop {
            let Ok(mut ready) = events.readable().await else {
                return;
            };
            match ready.try_io(|e| e.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(read) => break read,
                Err(_would_block) => continue,
            }
        };
        let Some(watches) = watches.upgrade() else {
            return;
        };
        let Ok(events) = read else {
            tracing::warn!(
                "reading the volumes' inotify events failed: their copies stop following the host"
            );
            return;
        };
        let mut routes = watches.routes();
        for event in events {
            if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                // Lost events: every copy may have changed.
                routes.changed.values().for_each(|c| c.notify_one());
                continue;
            }
            let keys = if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                // The directory is gone, and its watch with it.
                routes.by_watch.remove(&event.wd).unwrap_or_default()
            } else {
                routes.by_watch.get(&event.wd).cloned().unwrap_or_default()
            };
            for key in keys {
                if let Some(changed) = routes.changed.get(&key) {
                    changed.notify_one();
                }
            }
        }
    }
}

/// Copies the volume again after each change, until stopped, or until the
/// link or the host's volume is gone, or the guest refuses for good.
async fn follow(link: Arc<AgentLink>, pending: PendingFollow, mut stopped: watch::Receiver<bool>) {
    let PendingFollow {
        key,
        volume,
        watches,
        changed,
        updating,
    } = &pending;
    let staging = format!("{key}.next");
    let mut retry: Option<Duration> = None;
    let mut gap = Duration::ZERO;
    let mut last_end: Option<Instant> = None;
    loop {
        let heard = tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => None,
            heard = settled_change(changed, retry) => Some(heard),
        };
        let Some(heard) = heard else {
            break;
        };
        if let Some(last_end) = last_end {
            // A change heard soon after the last copy: the volume keeps
            // changing, and is copied once per a growing `gap`.
            gap = if heard.saturating_duration_since(last_end) < BUSY_WITHIN {
                (gap * 2).clamp(BUSY_GAP_FIRST, BUSY_GAP_MOST)
            } else {
                Duration::ZERO
            };
            let stop = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => true,
                _ = tokio::time::sleep_until(last_end + gap) => false,
            };
            if stop {
                break;
            }
        }
        let updated = {
            let _updating = updating.lock().await;
            // Stopped while another copy's update held the lock.
            if *stopped.borrow() {
                break;
            }
            match read(volume, key, Some(Arc::clone(watches))).await {
                Ok(batches) => update(&link, key, &staging, volume, batches).await,
                // A pod's volume goes with the pod: nothing left to follow.
                Err(_) if !volume.source.exists() => break,
                Err(e) => Err(e),
            }
        };
        last_end = Some(Instant::now());
        match updated {
            Ok(()) => {
                retry = None;
                tracing::info!(
                    volume = %volume.destination,
                    "the host's volume changed; its copy in the microVM is up to date"
                );
            }
            Err(e) if e.kind == SupervisorErrorKind::AgentGone => break,
            Err(e) if e.kind == SupervisorErrorKind::Conflict => {
                tracing::info!(volume = %volume.destination, "{}", e.message);
                break;
            }
            Err(e) => {
                let next = retry.map_or(RETRY_FIRST, |r| (r * 2).min(RETRY_MOST));
                retry = Some(next);
                tracing::warn!(
                    volume = %volume.destination,
                    "the host's volume changed, and its copy in the microVM stays as it was \
                     (trying again in {next:?}, or at the next change): {}",
                    e.message
                );
            }
        }
    }
}

/// Writes `batches` as staging copy `staging` and swaps it into copy `key`.
async fn update(
    link: &AgentLink,
    key: &str,
    staging: &str,
    volume: &HostVolume,
    batches: Vec<Vec<VolumeEntry>>,
) -> Result<(), SupervisorError> {
    write(link, staging, volume, batches).await?;
    replace(link, key, staging).await
}

/// Waits for a change of the volume (or for `retry`, when a try failed),
/// then for the host to be still for [`QUIET`], at most
/// [`MOST_SETTLING`]; when the change was first heard.
async fn settled_change(changed: &Notify, retry: Option<Duration>) -> Instant {
    match retry {
        Some(after) => {
            let _ = tokio::time::timeout(after, changed.notified()).await;
        }
        None => changed.notified().await,
    }
    let heard = Instant::now();
    let settled_by = heard + MOST_SETTLING;
    loop {
        let quiet_by = (Instant::now() + QUIET).min(settled_by);
        if tokio::time::timeout_at(quiet_by, changed.notified())
            .await
            .is_err()
            || Instant::now() >= settled_by
        {
            return heard;
        }
    }
}

/// The volume's tree as requests' worth of entries, its directories
/// watched for copy `key` when `watches` is given.
async fn read(
    volume: &HostVolume,
    key: &str,
    watches: Option<Arc<Watches>>,
) -> Result<Vec<Vec<VolumeEntry>>, SupervisorError> {
    let (read, key) = (volume.clone(), key.to_owned());
    let read = tokio::task::spawn_blocking(move || match &watches {
        Some(watches) => {
            guest_volumes::read_batches_watching(&read, &mut |dir| watches.watch(&key, dir))
                .map(|watched| (watched.batches, watched.unwatched))
        }
        None => guest_volumes::read_batches(&read).map(|batches| (batches, 0)),
    })
    .await
    .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
    let (batches, unwatched) = read.map_err(|e: GuestVolumeError| {
        let kind = if e.is_callers() {
            SupervisorErrorKind::InvalidInput
        } else {
            SupervisorErrorKind::Internal
        };
        err(kind, e.to_string())
    })?;
    if unwatched > 0 {
        tracing::warn!(
            volume = %volume.destination,
            "{unwatched} of the volume's directories cannot be watched (the host's \
             fs.inotify.max_user_watches?): changes there will not reach the microVM"
        );
    }
    Ok(batches)
}

/// Writes `batches` into the guest's copy `key`, afresh.
async fn write(
    link: &AgentLink,
    key: &str,
    volume: &HostVolume,
    batches: Vec<Vec<VolumeEntry>>,
) -> Result<(), SupervisorError> {
    for (index, entries) in batches.into_iter().enumerate() {
        write_request(link, key, index == 0, volume, entries).await?;
    }
    Ok(())
}

async fn write_request(
    link: &AgentLink,
    key: &str,
    fresh: bool,
    volume: &HostVolume,
    entries: Vec<VolumeEntry>,
) -> Result<(), SupervisorError> {
    let written = link
        .call(
            RequestBody::WriteVolume {
                key: key.to_owned(),
                fresh,
                entries,
            },
            &[],
            AGENT_DEADLINE,
        )
        .await
        .map_err(link_failure)?;
    match written {
        Reply::Ok => Ok(()),
        Reply::Error(e) => {
            let what = format!("copying volume {} into the guest", volume.destination);
            Err(guest_volume_refused(&what, e))
        }
        other => Err(unexpected_guest_reply("a volume's copy", other)),
    }
}

/// Swaps staging copy `from` into copy `key`.
async fn replace(link: &AgentLink, key: &str, from: &str) -> Result<(), SupervisorError> {
    let replaced = link
        .call(
            RequestBody::ReplaceVolume {
                key: key.to_owned(),
                from: from.to_owned(),
            },
            &[],
            AGENT_DEADLINE,
        )
        .await
        .map_err(link_failure)?;
    match replaced {
        Reply::Ok => Ok(()),
        // Bound writable since: the copy is the guest's now.
        Reply::Error(e) if e.kind == ErrorKind::PermissionDenied => {
            Err(err(SupervisorErrorKind::Conflict, e.message))
        }
        Reply::Error(e) => Err(guest_volume_refused(
            "bringing a volume's copy up to date",
            e,
        )),
        other => Err(unexpected_guest_reply("a volume's replacement", other)),
    }
}

/// The agent's refusal to copy or bind a volume: a guest whose scratch disk
/// is full, or an image with no place for the volume, is the caller's to
/// fix; the rest is ours.
pub(super) fn guest_volume_refused(what: &str, e: sandbox_proto::AgentError) -> SupervisorError {
    let kind = match e.kind {
        ErrorKind::NoSpace | ErrorKind::InvalidInput => SupervisorErrorKind::InvalidInput,
        _ => SupervisorErrorKind::Internal,
    };
    err(kind, format!("{what}: {}", e.message))
}

/// A follower against a fake agent on a socketpair, the host's volume a
/// temporary directory changed as the kubelet changes one.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use sandbox_proto::{AgentError, Request};

    use super::*;
    use crate::supervisor::processes::tests::{linked_fake_agent, FakeAgent};

    fn projected(top: &Path, stamp: &str, token: &str) {
        let dir = top.join(stamp);
        std::fs::create_dir(&dir).expect("timestamped dir");
        std::fs::write(dir.join("token"), token).expect("token");
        std::os::unix::fs::symlink(stamp, top.join("..data_tmp")).expect("link");
        std::fs::rename(top.join("..data_tmp"), top.join("..data")).expect("swap");
    }

    fn volume(source: &Path, read_only: bool) -> HostVolume {
        HostVolume {
            source: source.to_owned(),
            destination: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            read_only,
        }
    }

    /// The token's data in a `WriteVolume`, and its key.
    fn written(request: &Request) -> (String, Option<String>) {
        match &request.body {
            RequestBody::WriteVolume { key, entries, .. } => {
                let token = entries.iter().find_map(|e| match e {
                    VolumeEntry::File { path, data, .. } if path.ends_with("/token") => {
                        Some(String::from_utf8_lossy(data).into_owned())
                    }
                    _ => None,
                });
                (key.clone(), token)
            }
            other => panic!("expected a WriteVolume, got {other:?}"),
        }
    }

    async fn answer_copy(agent: &mut FakeAgent, key: &str) -> Option<String> {
        let request = agent.request().await;
        let (written_key, token) = written(&request);
        assert_eq!(written_key, key);
        agent.reply(request.id, Reply::Ok).await;
        token
    }

    #[tokio::test]
    async fn a_read_only_copy_follows_the_kubelets_swap_retries_a_refusal_and_stops() {
        let (link, _events, mut agent) = linked_fake_agent().await;
        let host = tempfile::tempdir().expect("volume");
        std::os::unix::fs::symlink("..data/token", host.path().join("token")).expect("link");
        projected(host.path(), "..a", "old");
        let following = Following::default();
        let volume = volume(host.path(), true);
        let (copied, token) = tokio::join!(following.copy(&link, "vol-1", &volume), async {
            answer_copy(&mut agent, "vol-1").await
        });
        let copied = copied.expect("copied");
        assert_eq!(token.as_deref(), Some("old"));
        assert!(copied.follow.is_some(), "a read-only directory follows");
        following.start(&link, copied);

        // The kubelet's rotation: a new directory, `..data` swapped, the
        // old one removed. The agent refuses the first try (a full disk).
        projected(host.path(), "..b", "new");
        std::fs::remove_dir_all(host.path().join("..a")).expect("old dir");
        let refused = agent.request().await;
        assert_eq!(written(&refused).0, "vol-1.next");
        let full = AgentError::new(ErrorKind::NoSpace, "no space left on the scratch disk");
        agent.reply(refused.id, Reply::Error(full)).await;
        // Tried again with no further change, then swapped in.
        assert_eq!(
            answer_copy(&mut agent, "vol-1.next").await.as_deref(),
            Some("new")
        );
        let swap = agent.request().await;
        assert_eq!(
            swap.body,
            RequestBody::ReplaceVolume {
                key: "vol-1".into(),
                from: "vol-1.next".into()
            }
        );
        agent.reply(swap.id, Reply::Ok).await;

        // Stopped, it is gone, and routes nothing more.
        let watches = following.watches().expect("watches");
        let routed = |key: &str| {
            let routes = watches.routes();
            (
                routes.changed.contains_key(key),
                routes.by_watch.values().any(|keys| keys.contains(key)),
            )
        };
        assert_eq!(routed("vol-1"), (true, true), "routed while it follows");
        following.stop("vol-1").await;
        assert_eq!(routed("vol-1"), (false, false));
    }

    #[tokio::test]
    async fn a_writable_copy_is_the_guests_and_does_not_follow() {
        let (link, _events, mut agent) = linked_fake_agent().await;
        let host = tempfile::tempdir().expect("volume");
        std::fs::write(host.path().join("f"), "x").expect("file");
        let following = Following::default();
        let writable = volume(host.path(), false);
        let (copied, _) = tokio::join!(following.copy(&link, "vol-2", &writable), async {
            answer_copy(&mut agent, "vol-2").await
        });
        assert!(copied.expect("copied").follow.is_none());
        let watches = following.watches().expect("watches");
        assert!(!watches.routes().changed.contains_key("vol-2"));
        // The positive control: the same directory read-only follows.
        let read_only = volume(host.path(), true);
        let (copied, _) = tokio::join!(following.copy(&link, "vol-3", &read_only), async {
            answer_copy(&mut agent, "vol-3").await
        });
        assert!(copied.expect("copied").follow.is_some());
    }
}
