//! The claim mailbox: a memfd a pooled sandbox's supervisor shares with
//! the daemon, into which the daemon posts a pool claim's [`HandOver`]
//! without waking the supervisor. The supervisor takes it before it acts
//! on its next request, and every way into a sandbox is a request (a
//! pooled sandbox runs none of the caller's code until one starts it), so
//! the claim is in force before anything can see it.
//!
//! Why not the `HandOver` request: on an idle host each wake of another
//! process costs 0.1-0.3 ms, so a claim's round trip to the supervisor
//! cost more than the rest of the claim.
//!
//! The file holds one claim, posted once: the encoded claim at
//! [`BODY_AT`], its length in the 8 bytes before that, and last the
//! one-byte mark at 0 that says the rest is there. The supervisor reads
//! the mark, then the rest, overwrites all of it with zeros (the secrets
//! in it do not outlive the take) and leaves the mark [`TAKEN`], so no
//! second claim can be posted.

use std::fs::File;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use super::protocol::HandOver;

/// Where the encoded claim starts; the bytes before hold the mark and the
/// length.
const BODY_AT: u64 = 16;
const LENGTH_AT: u64 = 8;
const POSTED: u8 = 1;
const TAKEN: u8 = 2;
/// The largest claim a mailbox carries (a claim with many secrets' leaves
/// is a few KiB each); a larger one goes as a `HandOver` request.
pub const MAX_CLAIM: usize = 1 << 20;

/// Why a claim could not be posted or taken.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    #[error("the claim mailbox: {0}")]
    Io(#[from] std::io::Error),
    #[error("a pool claim of {0} bytes is larger than the mailbox takes ({MAX_CLAIM})")]
    TooLarge(usize),
    #[error("a claim was already posted to this sandbox's mailbox")]
    AlreadyPosted,
    #[error("the sandbox's supervisor has exited")]
    SupervisorGone,
    #[error("a pool claim cannot be encoded: {0}")]
    Encode(String),
    #[error("the claim in the mailbox cannot be read: {0}")]
    Malformed(String),
    #[error("the pool claim could not be put in force: {0}")]
    NotApplied(String),
}

/// The supervisor's end: made by it, handed to the daemon as a descriptor.
pub struct Mailbox {
    file: File,
    /// Held while a claim is taken and applied (which may wait on a
    /// blocking thread), so two requests arriving together do not both
    /// apply it, nor one act before it is in force.
    taking: tokio::sync::Mutex<()>,
    settled: AtomicBool,
}

impl Mailbox {
    pub fn create() -> Result<Self, MailboxError> {
        let fd = nix::sys::memfd::memfd_create(
            c"sandboxd-claim",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        Ok(Self {
            file: File::from(fd),
            taking: tokio::sync::Mutex::new(()),
            settled: AtomicBool::new(false),
        })
    }

    /// A descriptor of the same file for the daemon.
    pub fn share(&self) -> Result<OwnedFd, MailboxError> {
        Ok(self.file.try_clone()?.into())
    }

    /// Takes a posted claim, once, and puts it in force with `apply`; a
    /// claim that cannot be read or applied goes to `fail` instead (a
    /// panic in `apply` too). Both run under the lock, so no request acts
    /// before the claim is in force or the sandbox has failed. Nothing
    /// while none is posted. The claim is scrubbed from the file whatever
    /// becomes of it.
    pub async fn take_with<Applied>(
        &self,
        apply: impl FnOnce(HandOver) -> Applied,
        fail: impl FnOnce(String),
    ) where
        Applied: Future<Output = Result<(), String>>,
    {
        // Set once the claim is settled: a request after that reads
        // nothing, and takes no lock.
        if self.settled.load(Ordering::Acquire) {
            return;
        }
        let _taking = self.taking.lock().await;
        if self.settled.load(Ordering::Acquire) {
            return;
        }
        let mut mark = [0u8; 1];
        let posted = self.file.read_at(&mut mark, 0);
        if matches!(posted, Ok(n) if n == 0 || mark[0] != POSTED) {
            return;
        }
        // From here the sandbox fails unless the claim is put in force.
        let settling = Settling {
            fail: Some(fail),
            settled: &self.settled,
        };
        if let Err(e) = posted {
            return settling.failed(MailboxError::from(e));
        }
        let read = self.read_claim();
        if let Err(e) = scrub(&self.file, TAKEN) {
            return settling.failed(MailboxError::from(e));
        }
        let applied = match read {
            Ok(claim) => apply(claim).await.map_err(MailboxError::NotApplied),
            Err(e) => Err(e),
        };
        match applied {
            Ok(()) => settling.done(),
            Err(e) => settling.failed(e),
        }
    }

    /// Whether a claim was ever posted here, in whole or in part (taken
    /// or not): the file is empty until a post's first write. Unreadable
    /// counts as posted.
    pub fn posted_to(&self) -> bool {
        self.settled.load(Ordering::Acquire) || self.file.metadata().map_or(true, |m| m.len() > 0)
    }

    fn read_claim(&self) -> Result<HandOver, MailboxError> {
        let mut length = [0u8; 8];
        self.file.read_exact_at(&mut length, LENGTH_AT)?;
        let length = usize::try_from(u64::from_le_bytes(length))
            .ok()
            .filter(|n| *n <= MAX_CLAIM)
            .ok_or_else(|| MailboxError::Malformed("its length is past the limit".into()))?;
        let mut body = zeroize::Zeroizing::new(vec![0u8; length]);
        self.file.read_exact_at(&mut body, BODY_AT)?;
        postcard::from_bytes(&body).map_err(|e| MailboxError::Malformed(e.to_string()))
    }
}

/// A claim being settled: it fails the sandbox unless [`Self::done`] is
/// called (a panic on the way included), and marks the mailbox settled
/// either way.
struct Settling<'a, F: FnOnce(String)> {
    fail: Option<F>,
    settled: &'a AtomicBool,
}

impl<F: FnOnce(String)> Settling<'_, F> {
    fn done(mut self) {
        self.fail = None;
    }

    fn failed(mut self, why: MailboxError) {
        if let Some(fail) = self.fail.take() {
            fail(why.to_string());
        }
    }
}

impl<F: FnOnce(String)> Drop for Settling<'_, F> {
    fn drop(&mut self) {
        if let Some(fail) = self.fail.take() {
            fail("the pool claim was taken but not put in force".into());
        }
        self.settled.store(true, Ordering::Release);
    }
}

/// Overwrites the whole file with zeros and leaves `mark` alone in it.
fn scrub(file: &File, mark: u8) -> std::io::Result<()> {
    let size = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
    file.write_all_at(&vec![0u8; size], 0)?;
    file.set_len(1)?;
    file.write_all_at(&[mark], 0)
}

/// The daemon's end, for one pooled sandbox.
#[derive(Debug)]
pub struct Postbox {
    file: File,
    /// The supervisor's pidfd: a post to a supervisor that has exited
    /// would be taken by nobody.
    supervisor: OwnedFd,
}

impl Postbox {
    pub fn new(mailbox: OwnedFd, supervisor: OwnedFd) -> Self {
        Self {
            file: File::from(mailbox),
            supervisor,
        }
    }

    /// Posts `claim`, which the supervisor takes before its next request.
    /// Consumes the postbox: a mailbox carries one claim. A post that
    /// fails leaves no mark and no claim behind.
    pub fn post(self, claim: &HandOver) -> Result<(), MailboxError> {
        if crate::pidfd::has_exited(&self.supervisor) {
            return Err(MailboxError::SupervisorGone);
        }
        if self.file.metadata()?.len() != 0 {
            return Err(MailboxError::AlreadyPosted);
        }
        // The supervisor protocol's encoding, without a frame around it.
        let body = zeroize::Zeroizing::new(
            postcard::to_allocvec(claim).map_err(|e| MailboxError::Encode(e.to_string()))?,
        );
        if body.len() > MAX_CLAIM {
            return Err(MailboxError::TooLarge(body.len()));
        }
        let written = self.write(&body);
        if written.is_err() {
            // Best effort: the error above is what the caller must hear.
            let _ = scrub(&self.file, 0).and_then(|()| self.file.set_len(0));
        }
        written
    }

    fn write(&self, body: &[u8]) -> Result<(), MailboxError> {
        let mut head = [0u8; BODY_AT as usize];
        head[LENGTH_AT as usize..].copy_from_slice(&(body.len() as u64).to_le_bytes());
        self.file.write_all_at(&head, 0)?;
        self.file.write_all_at(body, BODY_AT)?;
        // Last, in a write of its own: a reader that sees the mark sees
        // everything written before it.
        self.file.write_all_at(&[POSTED], 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::protocol::PolicyFields;

    fn claim() -> HandOver {
        HandOver {
            policy: Some(PolicyFields {
                block_network: Some(false),
                allow_list: Some(vec!["pypi.org".into()]),
            }),
            secrets: None,
            env: Some(vec![("GREETING".into(), "hi".into())]),
            guest_pids: None,
            ceilings: None,
            disk_quota_bytes: None,
            trust_bundle_append: None,
        }
    }

    fn postbox(mailbox: &Mailbox) -> Postbox {
        let me = crate::pidfd::open(std::process::id() as i32).unwrap();
        Postbox::new(mailbox.share().unwrap(), me)
    }

    /// What `mailbox` hands its applier, or the failure it reports.
    fn taken(mailbox: &Mailbox) -> Result<Option<HandOver>, String> {
        let (mut got, mut failed) = (None, None);
        futures::executor::block_on(mailbox.take_with(
            |claim| {
                got = Some(claim);
                std::future::ready(Ok(()))
            },
            |why| failed = Some(why),
        ));
        failed.map_or(Ok(got), Err)
    }

    #[test]
    fn a_posted_claim_is_taken_once_and_scrubbed() {
        let mailbox = Mailbox::create().unwrap();
        assert!(taken(&mailbox).unwrap().is_none(), "nothing posted yet");
        postbox(&mailbox).post(&claim()).unwrap();
        assert_eq!(taken(&mailbox).unwrap(), Some(claim()));
        assert!(taken(&mailbox).unwrap().is_none(), "taken once");
        let mut left = Vec::new();
        std::io::Read::read_to_end(&mut &mailbox.file, &mut left).unwrap();
        assert_eq!(left, [TAKEN], "nothing of the claim stays");
        // A taken mailbox takes no other claim.
        let again = postbox(&mailbox).post(&claim());
        assert!(
            matches!(again, Err(MailboxError::AlreadyPosted)),
            "{again:?}"
        );
    }

    #[test]
    fn a_second_post_is_refused() {
        let mailbox = Mailbox::create().unwrap();
        postbox(&mailbox).post(&claim()).unwrap();
        let again = postbox(&mailbox).post(&claim());
        assert!(
            matches!(again, Err(MailboxError::AlreadyPosted)),
            "{again:?}"
        );
        assert_eq!(taken(&mailbox).unwrap(), Some(claim()));
    }

    #[test]
    fn a_claim_past_the_limit_is_refused_and_nothing_is_posted() {
        let mailbox = Mailbox::create().unwrap();
        let mut big = claim();
        big.env = Some(vec![("BIG".into(), "x".repeat(MAX_CLAIM))]);
        let posted = postbox(&mailbox).post(&big);
        assert!(
            matches!(posted, Err(MailboxError::TooLarge(_))),
            "{posted:?}"
        );
        assert!(taken(&mailbox).unwrap().is_none());
        postbox(&mailbox).post(&claim()).unwrap();
    }

    #[test]
    fn nothing_is_posted_to_a_supervisor_that_exited() {
        let mailbox = Mailbox::create().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = crate::pidfd::open(child.id() as i32).unwrap();
        child.wait().unwrap();
        let posted = Postbox::new(mailbox.share().unwrap(), gone).post(&claim());
        assert!(
            matches!(posted, Err(MailboxError::SupervisorGone)),
            "{posted:?}"
        );
        assert_eq!(mailbox.file.metadata().unwrap().len(), 0);
    }

    #[test]
    fn a_malformed_unapplied_or_panicking_claim_fails_once_and_is_scrubbed() {
        let mailbox = Mailbox::create().unwrap();
        let writer = postbox(&mailbox);
        writer
            .file
            .write_all_at(&3u64.to_le_bytes(), LENGTH_AT)
            .unwrap();
        writer.file.write_all_at(&[0xff; 3], BODY_AT).unwrap();
        writer.file.write_all_at(&[POSTED], 0).unwrap();
        let failed = taken(&mailbox).unwrap_err();
        assert!(failed.contains("cannot be read"), "{failed}");
        assert_eq!(taken(&mailbox), Ok(None), "failed once");
        assert_eq!(mailbox.file.metadata().unwrap().len(), 1);

        let mailbox = Mailbox::create().unwrap();
        postbox(&mailbox).post(&claim()).unwrap();
        let mut failed = None;
        futures::executor::block_on(mailbox.take_with(
            |_| std::future::ready(Err("no proxy".into())),
            |why| failed = Some(why),
        ));
        assert!(failed.is_some_and(|why| why.contains("no proxy")));
        assert_eq!(taken(&mailbox), Ok(None));

        let mailbox = Mailbox::create().unwrap();
        postbox(&mailbox).post(&claim()).unwrap();
        let failed = std::cell::RefCell::new(None);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            futures::executor::block_on(mailbox.take_with(
                |_| async { panic!("in apply") },
                |why| *failed.borrow_mut() = Some(why),
            ))
        }));
        assert!(panicked.is_err());
        assert!(failed
            .into_inner()
            .is_some_and(|why| why.contains("not put in force")));
        assert_eq!(taken(&mailbox), Ok(None));
    }
}
