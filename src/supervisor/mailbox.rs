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
//! The file holds one message, posted once: the encoded claim at
//! [`BODY_AT`], its length in the 8 bytes before that, and last the
//! one-byte mark at 0 that says the rest is there. The supervisor reads
//! the mark, then the rest, and truncates the file to nothing, so the
//! secrets in it do not outlive the take.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use super::protocol::HandOver;

/// Where the encoded claim starts; the bytes before hold the mark and the
/// length.
const BODY_AT: u64 = 16;
const LENGTH_AT: u64 = 8;
const POSTED: u8 = 1;
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
    #[error("a pool claim cannot be encoded: {0}")]
    Encode(String),
    #[error(
        "the claim in the mailbox cannot be read ({0}); the daemon and supervisor builds differ"
    )]
    Malformed(String),
}

/// The supervisor's end: made by it, handed to the daemon as a descriptor.
pub struct Mailbox {
    file: File,
    /// Set once the claim was taken (or found malformed): later requests
    /// do not read the file again.
    taken: Mutex<bool>,
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
            taken: Mutex::new(false),
        })
    }

    /// A descriptor of the same file for the daemon.
    pub fn share(&self) -> Result<OwnedFd, MailboxError> {
        Ok(self.file.try_clone()?.into())
    }

    /// The claim posted since the last call, once; `None` while there is
    /// none. Holds its lock while reading, so two requests arriving
    /// together do not both apply it.
    pub fn take(&self) -> Result<Option<HandOver>, MailboxError> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if *taken {
            return Ok(None);
        }
        let mut mark = [0u8; 1];
        if self.file.read_at(&mut mark, 0)? == 0 || mark[0] != POSTED {
            return Ok(None);
        }
        *taken = true;
        let mut length = [0u8; 8];
        self.file.read_exact_at(&mut length, LENGTH_AT)?;
        let length = usize::try_from(u64::from_le_bytes(length))
            .ok()
            .filter(|n| *n <= MAX_CLAIM)
            .ok_or_else(|| MailboxError::Malformed("a length past the limit".into()))?;
        let mut body = zeroize::Zeroizing::new(vec![0u8; length]);
        self.file.read_exact_at(&mut body, BODY_AT)?;
        // The secrets leave the shared file now, whatever the decode says.
        self.file.set_len(0)?;
        postcard::from_bytes(&body)
            .map(Some)
            .map_err(|e| MailboxError::Malformed(e.to_string()))
    }
}

/// The daemon's end, for one pooled sandbox.
#[derive(Debug)]
pub struct Postbox {
    file: File,
}

impl Postbox {
    pub fn new(fd: OwnedFd) -> Self {
        Self {
            file: File::from(fd),
        }
    }

    /// Posts `claim`, which the supervisor takes before its next request.
    /// Consumes the postbox: a mailbox carries one claim.
    pub fn post(self, claim: &HandOver) -> Result<(), MailboxError> {
        let mut mark = [0u8; 1];
        if self.file.read_at(&mut mark, 0)? != 0 {
            return Err(MailboxError::AlreadyPosted);
        }
        // The supervisor protocol's encoding, without a frame around it.
        let body = zeroize::Zeroizing::new(
            postcard::to_allocvec(claim).map_err(|e| MailboxError::Encode(e.to_string()))?,
        );
        if body.len() > MAX_CLAIM {
            return Err(MailboxError::TooLarge(body.len()));
        }
        let mut head = [0u8; BODY_AT as usize];
        head[LENGTH_AT as usize..].copy_from_slice(&(body.len() as u64).to_le_bytes());
        self.file.write_all_at(&head, 0)?;
        self.file.write_all_at(&body, BODY_AT)?;
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
        }
    }

    #[test]
    fn a_posted_claim_is_taken_once_and_leaves_the_file() {
        let mailbox = Mailbox::create().unwrap();
        assert!(mailbox.take().unwrap().is_none(), "nothing posted yet");
        Postbox::new(mailbox.share().unwrap())
            .post(&claim())
            .unwrap();
        assert_eq!(mailbox.take().unwrap(), Some(claim()));
        assert!(mailbox.take().unwrap().is_none(), "taken once");
        assert_eq!(mailbox.file.metadata().unwrap().len(), 0);
    }

    #[test]
    fn a_second_post_is_refused() {
        let mailbox = Mailbox::create().unwrap();
        Postbox::new(mailbox.share().unwrap())
            .post(&claim())
            .unwrap();
        let again = Postbox::new(mailbox.share().unwrap()).post(&claim());
        assert!(
            matches!(again, Err(MailboxError::AlreadyPosted)),
            "{again:?}"
        );
    }

    #[test]
    fn a_claim_past_the_limit_is_refused_and_nothing_is_posted() {
        let mailbox = Mailbox::create().unwrap();
        let mut big = claim();
        big.env = Some(vec![("BIG".into(), "x".repeat(MAX_CLAIM))]);
        let posted = Postbox::new(mailbox.share().unwrap()).post(&big);
        assert!(
            matches!(posted, Err(MailboxError::TooLarge(_))),
            "{posted:?}"
        );
        assert!(mailbox.take().unwrap().is_none());
    }

    #[test]
    fn a_malformed_claim_is_an_error_and_is_not_read_again() {
        let mailbox = Mailbox::create().unwrap();
        let postbox = Postbox::new(mailbox.share().unwrap());
        postbox
            .file
            .write_all_at(&3u64.to_le_bytes(), LENGTH_AT)
            .unwrap();
        postbox.file.write_all_at(&[0xff; 3], BODY_AT).unwrap();
        postbox.file.write_all_at(&[POSTED], 0).unwrap();
        let taken = mailbox.take();
        assert!(
            matches!(taken, Err(MailboxError::Malformed(_))),
            "{taken:?}"
        );
        assert!(mailbox.take().unwrap().is_none());
        assert_eq!(mailbox.file.metadata().unwrap().len(), 0);
    }
}
