//! What images cost and when they were last used: byte counts of trees,
//! and a marker file whose mtime is an image's last use.

use std::fs;
use std::path::Path;
use std::time::SystemTime;

/// Bytes of the regular files under `dir` (not following links).
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

/// Notes a use now: `marker`'s mtime (made when missing).
pub fn touch(marker: &Path) {
    let touched = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(marker)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(path = %marker.display(), "noting an image's use: {e}");
    }
}

/// The last use `marker` records (RFC 3339), if any.
pub fn last_use(marker: &Path) -> Option<String> {
    let time = fs::metadata(marker).and_then(|m| m.modified()).ok()?;
    Some(humantime::format_rfc3339_seconds(time).to_string())
}
