//! What the CLI shows: the NDJSON output stream of a process turned into writes
//! to our stdout/stderr (split into lines, decoded, de-duplicated across
//! reconnects), the exit code a finished process maps to, and the tables and
//! human forms (sizes, TTL left) of list commands; and the few writers that put
//! what is shown on our stdout/stderr. All but those writers are pure functions,
//! so they test without a daemon.

use std::io::Write;

use anyhow::{bail, Context, Result};
use base64::Engine;
use sandboxd::api::types::{FileInfo, OutputEvent, Process};

/// Longest NDJSON line accepted. The daemon's chunks are far smaller; the bound
/// only stops a broken stream from growing the buffer without end.
pub const MAX_LINE: usize = 16 << 20;

/// Splits a byte stream into `\n`-terminated lines, whatever the chunk borders.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    /// Adds a chunk and returns the lines it completed (without the newline;
    /// a trailing `\r` is dropped too, and blank lines are skipped).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            self.buf.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            let mut line = std::mem::take(&mut self.buf);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push(line);
            }
        }
        if self.buf.len() + rest.len() > MAX_LINE {
            bail!("output stream line longer than {MAX_LINE} bytes");
        }
        self.buf.extend_from_slice(rest);
        Ok(lines)
    }

    /// Whether bytes of an unfinished line are waiting.
    pub fn has_partial(&self) -> bool {
        !self.buf.iter().all(u8::is_ascii_whitespace)
    }
}

/// Which of our streams a piece of process output goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What to do with one event of the output stream.
#[derive(Debug)]
pub enum Action {
    Write(Stream, Vec<u8>),
    Note(String),
    Exit(Box<Process>),
    Nothing,
}

/// Byte offsets of each stream already written out. A reconnect asks the daemon
/// to resume from them; anything the daemon repeats below them is skipped, so no
/// byte is written twice.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamState {
    pub stdout_next: u64,
    pub stderr_next: u64,
}

impl StreamState {
    /// Parses one NDJSON line and decides what it means.
    pub fn handle_line(&mut self, line: &[u8]) -> Result<Action> {
        let ev: OutputEvent = serde_json::from_slice(line).with_context(|| {
            let shown: String = String::from_utf8_lossy(line).chars().take(120).collect();
            format!("bad line in the output stream: {shown}")
        })?;
        self.handle(ev)
    }

    pub fn handle(&mut self, ev: OutputEvent) -> Result<Action> {
        let (stream, offset, data) = match ev {
            OutputEvent::Stdout { offset, data } => (Stream::Stdout, offset, data),
            OutputEvent::Stderr { offset, data } => (Stream::Stderr, offset, data),
            OutputEvent::Dropped { stream, bytes } => {
                return Ok(Action::Note(format!(
                    "sandboxctl: {bytes} bytes of {stream} were dropped (the daemon's output buffer overflowed)"
                )))
            }
            OutputEvent::Exit { process } => return Ok(Action::Exit(Box::new(process))),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .context("the output stream carried invalid base64")?;
        let next = match stream {
            Stream::Stdout => &mut self.stdout_next,
            Stream::Stderr => &mut self.stderr_next,
        };
        let end = offset.saturating_add(bytes.len() as u64);
        if end <= *next {
            // Already written before a reconnect.
            return Ok(Action::Nothing);
        }
        // `offset > next` is a gap the daemon reports with a `dropped` event;
        // `offset < next` overlaps what we wrote, so only the new tail goes out.
        let skip = next.saturating_sub(offset) as usize;
        *next = end;
        Ok(Action::Write(stream, bytes[skip..].to_vec()))
    }
}

/// The exit code `sandboxctl` ends with for a finished process, and a note for
/// stderr when the end needs explaining. Follows the shell: 124 for a timeout
/// (as timeout(1)), 128+N for a signal.
pub fn exit_code_of(p: &Process) -> (i32, Option<String>) {
    if p.timed_out {
        return (
            124,
            Some(format!(
                "sandboxctl: process {} timed out; its process tree was killed",
                p.id
            )),
        );
    }
    let code = match (p.exit_code, p.signal) {
        (Some(c), _) => c & 0xff,
        (None, Some(s)) => 128 + (s & 0x7f),
        (None, None) => 255,
    };
    if p.oom_killed {
        return (
            code,
            Some(format!(
                "sandboxctl: process {} was killed by the OOM killer (the sandbox's memory limit)",
                p.id
            )),
        );
    }
    if p.exit_code.is_none() && p.signal.is_none() {
        return (
            code,
            Some(format!(
                "sandboxctl: process {} ended without an exit code",
                p.id
            )),
        );
    }
    (code, None)
}

/// A MiB count in the largest binary unit that shows it exactly.
pub fn fmt_mib(mib: u64) -> String {
    // Whole TiB / GiB counts: the low 20 / 10 bits of a MiB count are zero.
    if mib != 0 && mib.trailing_zeros() >= 20 {
        format!("{}Ti", mib >> 20)
    } else if mib != 0 && mib.trailing_zeros() >= 10 {
        format!("{}Gi", mib >> 10)
    } else {
        format!("{mib}Mi")
    }
}

/// CPU cores without a needless `.0`.
pub fn fmt_cpu(cpu: f64) -> String {
    let s = format!("{cpu:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Seconds as `1h02m`, `5m30s` or `45s`.
pub fn fmt_secs(secs: i64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// The TTL-LEFT column: `none`, `expired`, a duration, or `?` when the daemon's
/// timestamp cannot be read.
pub fn ttl_left(ttl_seconds: i64, expires_at: Option<&str>, now_unix: i64) -> String {
    if ttl_seconds < 0 {
        return "none".into();
    }
    let Some(exp) = expires_at else {
        return "none".into();
    };
    match parse_rfc3339(exp) {
        Some(t) if t > now_unix => fmt_secs(t - now_unix),
        Some(_) => "expired".into(),
        None => "?".into(),
    }
}

/// Parses an RFC 3339 timestamp (`2024-05-01T12:00:00Z`, fractions and `±hh:mm`
/// offsets allowed) to Unix seconds, fractions dropped. Small on purpose: the CLI
/// needs it for one column and nothing else.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = rest.get(1..)?;
            let (oh, om) = o.split_once(':')?;
            if oh.len() != 2 || om.len() != 2 {
                return None;
            }
            let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
            sign * (oh * 3600 + om * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86400 + hour * 3600 + min * 60 + sec - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's method).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 back to a (year, month, day), the inverse of
/// [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Unix seconds as `YYYY-MM-DD HH:MM` in UTC (the sandbox's clock is UTC too).
pub fn fmt_unix_time(t: i64) -> String {
    let (y, mo, d) = civil_from_days(t.div_euclid(86400));
    let secs = t.rem_euclid(86400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        (secs % 3600) / 60
    )
}

/// `ls -l` style permissions: a type letter and `rwx` triples.
pub fn fmt_mode(kind: &str, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        "dir" => 'd',
        "symlink" => 'l',
        "file" => '-',
        _ => '?',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// One row of a file listing: MODE SIZE MODIFIED NAME (dirs end in `/`,
/// symlinks show their target).
pub fn file_row(f: &FileInfo) -> Vec<String> {
    let mut name = f.name.clone();
    if f.kind == "dir" && !name.ends_with('/') {
        name.push('/');
    }
    if let Some(t) = &f.link_target {
        name.push_str(" -> ");
        name.push_str(t);
    }
    vec![
        fmt_mode(&f.kind, f.mode),
        f.size.to_string(),
        fmt_unix_time(f.mtime),
        name,
    ]
}

/// Lays out rows under a header in left-aligned columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut l = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            l.push_str(cell);
            if i + 1 < n {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count());
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// Writes the daemon's JSON answer as it came, newline-terminated.
pub fn print_raw(raw: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(raw)?;
    if raw.last() != Some(&b'\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

pub fn print_out(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes and flushes at once, so stdout and stderr interleave as the process
/// wrote them.
pub fn write_stream(stream: Stream, bytes: &[u8]) -> Result<()> {
    match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()?;
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes)?;
            err.flush()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd::api::types::ProcessState;

    fn written(a: Action) -> Option<(Stream, Vec<u8>)> {
        match a {
            Action::Write(s, b) => Some((s, b)),
            _ => None,
        }
    }

    fn process(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool, oom: bool) -> Process {
        Process {
            id: 7,
            sandbox_id: "sb".into(),
            argv: vec!["true".into()],
            state: ProcessState::Exited,
            pid: 12,
            exit_code,
            signal,
            timed_out,
            oom_killed: oom,
            dropped_bytes: 0,
            started_at: "2024-05-01T12:00:00Z".into(),
            ended_at: Some("2024-05-01T12:00:01Z".into()),
        }
    }

    #[test]
    fn lines_split_across_chunks() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"{\"a\":").unwrap().is_empty());
        assert!(s.has_partial());
        assert_eq!(s.push(b"1}\n{\"b\"").unwrap(), vec![b"{\"a\":1}".to_vec()]);
        assert_eq!(
            s.push(b":2}\r\n\n  \n{\"c\":3}\n").unwrap(),
            vec![b"{\"b\":2}".to_vec(), b"{\"c\":3}".to_vec()]
        );
        assert!(!s.has_partial());
    }

    #[test]
    fn overlong_lines_are_refused() {
        let mut s = LineSplitter::default();
        let big = vec![b'x'; MAX_LINE];
        assert!(s.push(&big).is_ok());
        assert!(s.push(b"y").is_err());
    }

    #[test]
    fn events_decode_to_writes_notes_and_exit() {
        let mut st = StreamState::default();
        // "hi\n" and "oops"
        let a = st
            .handle_line(br#"{"type":"stdout","offset":0,"data":"aGkK"}"#)
            .unwrap();
        assert_eq!(written(a), Some((Stream::Stdout, b"hi\n".to_vec())));
        let a = st
            .handle_line(br#"{"type":"stderr","offset":0,"data":"b29wcw=="}"#)
            .unwrap();
        assert_eq!(written(a), Some((Stream::Stderr, b"oops".to_vec())));
        assert_eq!((st.stdout_next, st.stderr_next), (3, 4));

        let a = st
            .handle_line(br#"{"type":"dropped","stream":"stdout","bytes":10}"#)
            .unwrap();
        assert!(matches!(a, Action::Note(n) if n.contains("10 bytes of stdout")));

        let exit =
            serde_json::json!({"type": "exit", "process": process(Some(3), None, false, false)});
        let a = st.handle_line(exit.to_string().as_bytes()).unwrap();
        match a {
            Action::Exit(p) => assert_eq!(p.exit_code, Some(3)),
            other => panic!("expected exit, got {other:?}"),
        }
    }

    #[test]
    fn replayed_output_after_a_reconnect_is_not_written_twice() {
        let mut st = StreamState::default();
        // "abcdef" written, then the daemon resends from offset 3 ("defgh").
        st.handle_line(br#"{"type":"stdout","offset":0,"data":"YWJjZGVm"}"#)
            .unwrap();
        let a = st
            .handle_line(br#"{"type":"stdout","offset":3,"data":"ZGVmZ2g="}"#)
            .unwrap();
        assert_eq!(written(a), Some((Stream::Stdout, b"gh".to_vec())));
        let a = st
            .handle_line(br#"{"type":"stdout","offset":0,"data":"YWJj"}"#)
            .unwrap();
        assert!(matches!(a, Action::Nothing));
        // A gap (dropped bytes) moves the offset forward.
        let a = st
            .handle_line(br#"{"type":"stdout","offset":100,"data":"eA=="}"#)
            .unwrap();
        assert_eq!(written(a), Some((Stream::Stdout, b"x".to_vec())));
        assert_eq!(st.stdout_next, 101);
    }

    #[test]
    fn malformed_lines_are_errors() {
        let mut st = StreamState::default();
        assert!(st.handle_line(b"not json").is_err());
        assert!(st.handle_line(br#"{"type":"bogus"}"#).is_err());
        assert!(st
            .handle_line(br#"{"type":"stdout","offset":0,"data":"!!"}"#)
            .is_err());
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(
            exit_code_of(&process(Some(0), None, false, false)),
            (0, None)
        );
        assert_eq!(exit_code_of(&process(Some(3), None, false, false)).0, 3);
        assert_eq!(
            exit_code_of(&process(Some(256 + 4), None, false, false)).0,
            4
        );
        assert_eq!(exit_code_of(&process(None, Some(9), false, false)).0, 137);
        let (c, note) = exit_code_of(&process(None, Some(9), true, false));
        assert_eq!(c, 124);
        assert!(note.unwrap().contains("timed out"));
        let (c, note) = exit_code_of(&process(None, Some(9), false, true));
        assert_eq!(c, 137);
        assert!(note.unwrap().contains("OOM"));
        assert_eq!(exit_code_of(&process(None, None, false, false)).0, 255);
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(
            parse_rfc3339("2024-05-01T12:00:00.123456789Z"),
            Some(1_714_564_800)
        );
        assert_eq!(
            parse_rfc3339("2024-05-01T14:00:00+02:00"),
            Some(1_714_564_800)
        );
        assert_eq!(
            parse_rfc3339("2024-05-01T11:30:00-00:30"),
            Some(1_714_564_800)
        );
        for bad in [
            "",
            "2024-05-01",
            "2024-13-01T00:00:00Z",
            "2024-05-01T00:00:00",
            "2024-05-01T00:00:00.Z",
            "2024-05-01T00:00:00+0200",
            "2024-05-01T0a:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn human_columns() {
        assert_eq!(fmt_mib(512), "512Mi");
        assert_eq!(fmt_mib(2048), "2Gi");
        assert_eq!(fmt_mib(1536), "1536Mi");
        assert_eq!(fmt_mib(0), "0Mi");
        assert_eq!(fmt_cpu(1.0), "1");
        assert_eq!(fmt_cpu(0.5), "0.5");
        assert_eq!(fmt_secs(45), "45s");
        assert_eq!(fmt_secs(330), "5m30s");
        assert_eq!(fmt_secs(3720), "1h02m");
        let now = 1_714_564_800;
        assert_eq!(ttl_left(-1, None, now), "none");
        assert_eq!(ttl_left(600, Some("2024-05-01T12:10:00Z"), now), "10m00s");
        assert_eq!(ttl_left(600, Some("2024-05-01T11:59:00Z"), now), "expired");
        assert_eq!(ttl_left(600, Some("garbage"), now), "?");
    }

    #[test]
    fn file_columns() {
        assert_eq!(fmt_unix_time(0), "1970-01-01 00:00");
        assert_eq!(fmt_unix_time(1_714_564_800 + 61), "2024-05-01 12:01");
        assert_eq!(fmt_unix_time(951_868_800 - 86400), "2000-02-29 00:00");
        for t in [-86400 * 365, 0, 951_868_800, 4_102_444_800] {
            let (y, m, d) = civil_from_days(t / 86400);
            assert_eq!(days_from_civil(y, m, d) * 86400, t);
        }
        assert_eq!(fmt_mode("dir", 0o755), "drwxr-xr-x");
        assert_eq!(fmt_mode("file", 0o640), "-rw-r-----");
        assert_eq!(fmt_mode("symlink", 0o777), "lrwxrwxrwx");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["ID", "STATE"],
            &[
                vec!["a".into(), "ready".into()],
                vec!["longer-id".into(), "creating".into()],
            ],
        );
        assert_eq!(
            t,
            "ID         STATE\na          ready\nlonger-id  creating\n"
        );
    }
}
