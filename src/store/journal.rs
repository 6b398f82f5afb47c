//! The store's write-behind journal: a file beside the database that holds
//! the writes a caller did not wait an fsync for, from the moment they are
//! made until the database has them. An append is a write into the page
//! cache, which outlives the daemon (a SIGKILL, a panic); the next
//! open replays what the database lacks. It does not outlive the machine,
//! and need not: what it holds describes running sandboxes, none of which
//! outlive the machine either.
//!
//! A frame is `[body length u32][crc32 of body u32][body]`, little-endian;
//! a body is `[seq u64][key][value][event count u32]{[cursor u64][event]}`,
//! each byte string as `[length u32][bytes]`. Reading stops at the first
//! frame that is short or fails its checksum: the tail a kill cut off.
//!
//! The journal empties whenever a commit leaves nothing pending. Under
//! load that never comes, so past [`COMPACT_AT`] bytes a commit rewrites
//! it to the entries still pending ([`Journal::compact`]): a new file
//! renamed over the old, so a kill at any point leaves one of the two
//! whole, each a superset of what the database lacks.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Journal size past which a commit that leaves entries pending rewrites
/// it to those entries.
pub(super) const COMPACT_AT: u64 = 4 << 20;

/// One journaled write: a sandbox record and the events announcing its
/// change, as the database will hold them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    /// Orders entries across the journal and the database: the database
    /// notes the last one it took in, so a replay skips what it has.
    pub seq: u64,
    pub key: String,
    pub value: Vec<u8>,
    pub events: Vec<(u64, Vec<u8>)>,
}

pub(super) struct Journal {
    path: PathBuf,
    file: File,
    /// Bytes of whole frames in the file: where a failed append is cut
    /// back to, so no torn frame hides the ones written after it.
    len: u64,
    /// A failed append could not be cut back: a torn frame may sit at the
    /// end, which would hide any frame after it. Appends are refused (the
    /// store commits at once instead) until the journal is emptied.
    torn: bool,
    /// Makes appends fail, as on a full disk.
    #[cfg(test)]
    pub(super) fail_appends: bool,
}

impl Journal {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = open_file(path)?;
        let len = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            len,
            torn: false,
            #[cfg(test)]
            fail_appends: false,
        })
    }

    /// Every whole entry, oldest first.
    pub fn read_all(&mut self) -> std::io::Result<Vec<Entry>> {
        let mut bytes = Vec::new();
        (&self.file).read_to_end(&mut bytes)?;
        let mut entries = Vec::new();
        let mut rest = bytes.as_slice();
        while let Some((entry, after)) = next_frame(rest) {
            entries.push(entry);
            rest = after;
        }
        Ok(entries)
    }

    /// Writes `entry`: it is in the page cache, where a daemon's death
    /// cannot take it, when this returns.
    pub fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
        if self.torn {
            return Err(std::io::Error::other(
                "an earlier append left a torn frame that could not be cut off",
            ));
        }
        let frame = frame(entry);
        #[cfg(test)]
        if self.fail_appends {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        match self.file.write_all(&frame) {
            Ok(()) => {
                self.len += frame.len() as u64;
                Ok(())
            }
            Err(e) => {
                // A disk that filled mid-frame: drop the part written.
                if self.file.set_len(self.len).is_err() {
                    self.torn = true;
                }
                Err(e)
            }
        }
    }

    /// Empties the journal once the database holds all it held.
    pub fn clear(&mut self) -> std::io::Result<()> {
        if self.len > 0 || self.torn {
            self.file.set_len(0)?;
            self.len = 0;
            self.torn = false;
        }
        Ok(())
    }

    /// Bytes of whole frames in the journal.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Replaces the journal with one holding only `pending` (the entries
    /// the database still lacks, oldest first): written to a file beside
    /// it, then renamed over it. On error the old journal stays in use.
    pub fn compact(&mut self, pending: &[Entry]) -> std::io::Result<()> {
        let fresh_path = self.path.with_extension("journal.new");
        let _ = std::fs::remove_file(&fresh_path);
        let mut fresh = open_file(&fresh_path)?;
        let bytes: Vec<u8> = pending.iter().flat_map(frame).collect();
        let written = fresh
            .write_all(&bytes)
            .and_then(|()| std::fs::rename(&fresh_path, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&fresh_path);
            return Err(e);
        }
        self.file = fresh;
        self.len = bytes.len() as u64;
        self.torn = false;
        Ok(())
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> std::io::Result<bool> {
        Ok(self.file.metadata()?.len() == 0)
    }
}

fn open_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
}

fn frame(entry: &Entry) -> Vec<u8> {
    let mut body = Vec::with_capacity(32 + entry.key.len() + entry.value.len());
    body.extend_from_slice(&entry.seq.to_le_bytes());
    put_bytes(&mut body, entry.key.as_bytes());
    put_bytes(&mut body, &entry.value);
    body.extend_from_slice(&(entry.events.len() as u32).to_le_bytes());
    for (cursor, event) in &entry.events {
        body.extend_from_slice(&cursor.to_le_bytes());
        put_bytes(&mut body, event);
    }
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The entry at the start of `bytes` and what follows it, or `None` where
/// no whole, intact frame starts there.
fn next_frame(bytes: &[u8]) -> Option<(Entry, &[u8])> {
    let mut cursor = Cursor(bytes);
    let len = cursor.u32()? as usize;
    let crc = cursor.u32()?;
    let body = cursor.take(len)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    let after = cursor.0;
    let mut body = Cursor(body);
    let seq = body.u64()?;
    let key = String::from_utf8(body.bytes()?.to_vec()).ok()?;
    let value = body.bytes()?.to_vec();
    let count = body.u32()?;
    let mut events = Vec::new();
    for _ in 0..count {
        let cursor = body.u64()?;
        events.push((cursor, body.bytes()?.to_vec()));
    }
    let entry = Entry {
        seq,
        key,
        value,
        events,
    };
    Some((entry, after))
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            key: format!("sb-{seq}"),
            value: b"{\"state\":\"ready\"}".to_vec(),
            events: vec![
                (seq * 10, b"created".to_vec()),
                (seq * 10 + 1, b"ready".to_vec()),
            ],
        }
    }

    #[test]
    fn entries_read_back_in_order_and_clear_empties() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut journal = Journal::open(&dir.path().join("j")).expect("open");
        journal.append(&entry(1)).expect("append");
        journal.append(&entry(2)).expect("append");
        let mut reopened = Journal::open(&dir.path().join("j")).expect("reopen");
        assert_eq!(reopened.read_all().expect("read"), vec![entry(1), entry(2)]);
        reopened.clear().expect("clear");
        assert!(reopened.is_empty().expect("len"));
        // Appends after a clear start at the beginning again.
        reopened.append(&entry(3)).expect("append");
        let mut again = Journal::open(&dir.path().join("j")).expect("reopen");
        assert_eq!(again.read_all().expect("read"), vec![entry(3)]);
    }

    #[test]
    fn a_compacted_journal_holds_only_the_pending_entries_and_takes_appends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.journal");
        let mut journal = Journal::open(&path).expect("open");
        for seq in 1..=5 {
            journal.append(&entry(seq)).expect("append");
        }
        let before = journal.len();
        journal.compact(&[entry(4), entry(5)]).expect("compact");
        assert!(journal.len() < before);
        assert_eq!(journal.len(), std::fs::metadata(&path).expect("len").len());
        journal.append(&entry(6)).expect("append after");
        let mut reopened = Journal::open(&path).expect("reopen");
        assert_eq!(
            reopened.read_all().expect("read"),
            vec![entry(4), entry(5), entry(6)]
        );
        assert!(
            !path.with_extension("journal.new").exists(),
            "the fresh file was renamed over the journal"
        );
    }

    #[test]
    fn a_cut_or_damaged_tail_is_dropped_and_what_precedes_it_kept() {
        let whole = frame(&entry(1));
        let second = frame(&entry(2));
        for cut in [1, 7, second.len() / 2, second.len() - 1] {
            let mut bytes = whole.clone();
            bytes.extend_from_slice(&second[..cut]);
            let (first, rest) = next_frame(&bytes).expect("the whole frame");
            assert_eq!(first, entry(1));
            assert!(next_frame(rest).is_none(), "a frame cut at {cut} was read");
        }
        let mut flipped = second.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(next_frame(&flipped).is_none(), "a damaged frame was read");
        assert_eq!(next_frame(&second).map(|(e, _)| e), Some(entry(2)));
    }
}
