//! How sandboxd's tests say "this cannot run here": one reason enum, one
//! marker line, one skip log, and the one list of skips that are legitimate
//! (`allowed-skips.txt` beside this crate's manifest, compiled in).
//!
//! libtest has no "skipped" outcome: a test that returns early is reported
//! `ok`. So a skip here is made visible three ways:
//! - a marker line `SANDBOXD-SKIP <test> <reason-key>: <message>` on stderr
//!   (libtest shows it for failing tests and with `--nocapture`);
//! - the same line appended to the file named by `SANDBOXD_TEST_SKIP_LOG`,
//!   which is how scripts/test.sh counts skips (libtest captures the stderr
//!   of passing tests);
//! - with `SANDBOXD_TEST_REQUIRE=all` (.ci/run sets it) the skip panics, so
//!   the test fails, unless its (test, reason) pair is in the allowed list.
//!
//! Use [`skip!`] in a test body (it returns), or [`note_skip!`] in a helper
//! that then returns its own "cannot run" value. Most skips are for want of
//! root: [`require_root!`] and [`root_or_note!`] are those two for it.

use std::fmt;
use std::io::Write;

/// The skip log scripts/test.sh reads (one marker line per skipped test).
pub const SKIP_LOG_VAR: &str = "SANDBOXD_TEST_SKIP_LOG";
/// `all`: a skip not in the allowed list fails its test.
pub const REQUIRE_VAR: &str = "SANDBOXD_TEST_REQUIRE";
/// The start of every marker line.
pub const MARKER: &str = "SANDBOXD-SKIP";

/// The one list of legitimate skips (see the file's header for its format).
pub const ALLOWED_SKIPS: &str = include_str!("../allowed-skips.txt");

/// Why a test cannot run on this host. Each has a stable key, used in the
/// marker line, the skip log, scripts/test.sh's summary and the allowed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Namespaces, cgroups, mounts, mknod, setns: the test needs root.
    NotRoot,
    /// The static agent (scripts/build-agent.sh) is not built.
    NoAgent,
    /// /dev/kvm is missing or unusable.
    NoKvm,
    /// KVM is there but the CPU has no VMX/SVM (kvm_pvm): a stock Linux
    /// guest would run through the instruction emulator.
    NoHardwareVirt,
    /// A real NVIDIA driver owns the device major the fake-GPU tests need.
    GpuDriverPresent,
    /// nftables (`nft`) is not installed.
    NoNft,
    /// CRIU is older than memory snapshots need.
    OldCriu,
    /// A host tool or package the test uses is not installed (mkfs.ext4,
    /// btrfs-progs, qemu, gcc, systemd-nspawn, a distribution kernel, ...).
    MissingTool,
    /// The running kernel lacks a feature the test needs (btrfs, tun).
    NoKernelSupport,
    /// A build product the test uses is absent (test guest, guest kernel,
    /// systemd rootfs).
    MissingBuild,
    /// A network namespace could not be made.
    NoNetns,
    /// The host has less memory than the test needs.
    LowMemory,
    /// An opt-in test whose input was not given (an environment variable).
    NotConfigured,
}

impl Reason {
    /// Every reason, in the order the summary lists them.
    pub const ALL: [Reason; 13] = [
        Reason::NotRoot,
        Reason::NoAgent,
        Reason::NoKvm,
        Reason::NoHardwareVirt,
        Reason::GpuDriverPresent,
        Reason::NoNft,
        Reason::OldCriu,
        Reason::MissingTool,
        Reason::NoKernelSupport,
        Reason::MissingBuild,
        Reason::NoNetns,
        Reason::LowMemory,
        Reason::NotConfigured,
    ];

    /// The stable key (kebab-case).
    pub const fn key(self) -> &'static str {
        match self {
            Reason::NotRoot => "not-root",
            Reason::NoAgent => "no-agent",
            Reason::NoKvm => "no-kvm",
            Reason::NoHardwareVirt => "no-hardware-virt",
            Reason::GpuDriverPresent => "gpu-driver-present",
            Reason::NoNft => "no-nft",
            Reason::OldCriu => "old-criu",
            Reason::MissingTool => "missing-tool",
            Reason::NoKernelSupport => "no-kernel-support",
            Reason::MissingBuild => "missing-build",
            Reason::NoNetns => "no-netns",
            Reason::LowMemory => "low-memory",
            Reason::NotConfigured => "not-configured",
        }
    }

    /// The reason whose key is `key`.
    pub fn from_key(key: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.key() == key)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A line of the allowed list that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListError {
    #[error("allowed-skips.txt line {line}: expected `REASON  TEST-NAME-PATTERN  why`")]
    Shape { line: usize },
    #[error("allowed-skips.txt line {line}: unknown reason {key:?}")]
    UnknownReason { line: usize, key: String },
}

/// One entry of the allowed list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub reason: Reason,
    pub pattern: String,
    pub why: String,
}

/// Parses the allowed list: `#` comments and blank lines are skipped; every
/// other line has a known reason key, a pattern and a non-empty why.
pub fn parse_allowed(text: &str) -> Result<Vec<Allowed>, ListError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(key), Some(pattern)) = (words.next(), words.next()) else {
            return Err(ListError::Shape { line: i + 1 });
        };
        let why = words.collect::<Vec<_>>().join(" ");
        if why.is_empty() {
            return Err(ListError::Shape { line: i + 1 });
        }
        let reason = Reason::from_key(key).ok_or_else(|| ListError::UnknownReason {
            line: i + 1,
            key: key.to_string(),
        })?;
        out.push(Allowed {
            reason,
            pattern: pattern.to_string(),
            why,
        });
    }
    Ok(out)
}

/// Whether `pattern` (`*` matches any run of characters) matches `name` or
/// any tail of it that starts after a `::`: `gpu::*` matches
/// `gpu::a_gpu_sandbox_sees_its_gpu`, and `tests::foo` matches
/// `sandboxd::net::tests::foo`, so a pattern need not spell the module path.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    if glob(pattern.as_bytes(), name.as_bytes()) {
        return true;
    }
    name.match_indices("::")
        .any(|(at, sep)| glob(pattern.as_bytes(), &name.as_bytes()[at + sep.len()..]))
}

/// `*`-only glob over bytes (test names are ASCII identifiers and `::`).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|at| glob(rest, &text[at..])),
        Some((c, rest)) => text
            .split_first()
            .is_some_and(|(t, tail)| t == c && glob(rest, tail)),
    }
}

/// The list entry that allows skipping `test` for `reason`, if any.
pub fn allowed<'a>(list: &'a [Allowed], test: &str, reason: Reason) -> Option<&'a Allowed> {
    list.iter()
        .find(|a| a.reason == reason && name_matches(&a.pattern, test))
}

/// The running test's name as the marker prints it: the crate (first part of
/// the caller's `module_path!()`) and libtest's thread name, which is the
/// test's path inside that crate. Outside a libtest thread it is the thread
/// name or `<unnamed>`.
pub fn test_name(module_path: &str) -> String {
    let krate = module_path.split("::").next().unwrap_or(module_path);
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    if name == krate || name.starts_with(&format!("{krate}::")) {
        name.to_string()
    } else {
        format!("{krate}::{name}")
    }
}

/// The marker line (no newline); the message is kept on one line.
pub fn marker_line(test: &str, reason: Reason, message: &str) -> String {
    let message = message.replace(['\n', '\r'], " ");
    format!("{MARKER} {test} {}: {message}", reason.key())
}

/// Records that the calling test skips: prints the marker, appends it to the
/// skip log, and panics when `SANDBOXD_TEST_REQUIRE=all` does not allow this
/// skip (reported at the caller). The caller returns right after (see
/// [`skip!`] and [`note_skip!`]).
#[track_caller]
pub fn record(module_path: &str, reason: Reason, message: &str) {
    let test = test_name(module_path);
    let line = marker_line(&test, reason, message);
    let required = match std::env::var(REQUIRE_VAR) {
        Ok(v) if v == "all" => true,
        Ok(v) if v.is_empty() => false,
        Ok(v) => panic!("{REQUIRE_VAR}={v:?}: the only value is `all`"),
        Err(_) => false,
    };
    if required {
        let list = parse_allowed(ALLOWED_SKIPS).unwrap_or_else(|e| panic!("{e}"));
        if allowed(&list, &test, reason).is_none() {
            eprintln!("{line}");
            panic!(
                "{test} skipped ({}: {message}) but {REQUIRE_VAR}=all, and \
                 test-support/allowed-skips.txt does not allow it",
                reason.key()
            );
        }
    }
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR) {
        // One write of the whole line on an O_APPEND file: lines from test
        // threads and test binaries running at once do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            panic!(
                "cannot append to {SKIP_LOG_VAR} {}: {e}",
                path.to_string_lossy()
            );
        }
    }
}

/// Skips the calling test: `skip!(Reason::NotRoot, "needs root to {what}")`
/// records the skip (see [`record`]) and returns from the test.
#[macro_export]
macro_rules! skip {
    ($reason:expr, $($message:tt)+) => {{
        $crate::record(module_path!(), $reason, &format!($($message)+));
        return;
    }};
}

/// Records a skip without returning, for a helper that then returns its own
/// "cannot run here" value (`None`, `false`).
#[macro_export]
macro_rules! note_skip {
    ($reason:expr, $($message:tt)+) => {
        $crate::record(module_path!(), $reason, &format!($($message)+))
    };
}

/// Whether the test runs as root (namespaces, mounts, cgroups need it).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Skips the calling test unless it runs as root:
/// `require_root!("needs root ({what})")`.
#[macro_export]
macro_rules! require_root {
    ($($message:tt)+) => {
        if !$crate::running_as_root() {
            $crate::skip!($crate::Reason::NotRoot, $($message)+);
        }
    };
}

/// Whether the test runs as root, recording a `NotRoot` skip when it does
/// not, for a helper that returns whether its test can run.
#[macro_export]
macro_rules! root_or_note {
    ($($message:tt)+) => {{
        let root = $crate::running_as_root();
        if !root {
            $crate::note_skip!($crate::Reason::NotRoot, $($message)+);
        }
        root
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_list_parses_and_names_only_known_reasons() {
        let list = parse_allowed(ALLOWED_SKIPS).expect("allowed-skips.txt");
        assert!(!list.is_empty());
        for entry in &list {
            assert!(!entry.why.is_empty(), "{entry:?}");
        }
        // The one legitimate skip on a test host, and nothing that would let
        // a run without root, the agent or hardware-style KVM through (the
        // Linux-guest tests run in the nested host: scripts/nested-tests.sh).
        assert!(allowed(
            &list,
            "gpu::a_gpu_sandbox_sees_its_gpu",
            Reason::GpuDriverPresent
        )
        .is_some());
        for reason in [
            Reason::NotRoot,
            Reason::NoAgent,
            Reason::NoKvm,
            Reason::NoHardwareVirt,
        ] {
            assert!(allowed(&list, "gpu::a_gpu_sandbox_sees_its_gpu", reason).is_none());
            assert!(allowed(&list, "linux::anything", reason).is_none());
        }
        assert!(allowed(
            &list,
            "lifecycle::create_then_delete",
            Reason::NoHardwareVirt
        )
        .is_none());
    }

    #[test]
    fn every_reason_has_a_distinct_key_that_round_trips() {
        for reason in Reason::ALL {
            assert_eq!(Reason::from_key(reason.key()), Some(reason));
        }
        let mut keys: Vec<_> = Reason::ALL.iter().map(|r| r.key()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), Reason::ALL.len());
        assert_eq!(Reason::from_key("nope"), None);
    }

    #[test]
    fn bad_list_lines_are_errors() {
        assert_eq!(parse_allowed("no-kvm"), Err(ListError::Shape { line: 1 }));
        assert_eq!(
            parse_allowed("# c\n\nno-kvm vmm::*"),
            Err(ListError::Shape { line: 3 })
        );
        assert_eq!(
            parse_allowed("no-such x why"),
            Err(ListError::UnknownReason {
                line: 1,
                key: "no-such".into()
            })
        );
        let ok = parse_allowed("no-kvm  vmm::*  because  it is").expect("parses");
        assert_eq!(ok[0].why, "because it is");
    }

    #[test]
    fn patterns_match_whole_names_or_tails_after_a_path_separator() {
        assert!(name_matches("gpu::*", "gpu::a_test"));
        assert!(name_matches("*::a_test", "gpu::a_test"));
        assert!(name_matches("a_test", "gpu::a_test"));
        assert!(name_matches(
            "tests::a_test",
            "sandboxd::net::tests::a_test"
        ));
        assert!(name_matches("net::*::a_*", "sandboxd::net::tests::a_test"));
        assert!(!name_matches("a_tes", "gpu::a_test"));
        assert!(!name_matches("pu::a_test", "gpu::a_test"));
        assert!(!name_matches("gpu::*", "gpus::a_test"));
        assert!(!name_matches("linux::*", "sandboxd::linuxish::t"));
    }

    #[test]
    fn the_test_name_is_the_crate_and_libtests_thread_name() {
        let name = test_name(module_path!());
        assert_eq!(
            name,
            "sandboxd_test_support::tests::the_test_name_is_the_crate_and_libtests_thread_name"
        );
        // An integration test crate's module path is its file's name.
        let inner = std::thread::Builder::new()
            .name("a_gpu_sandbox_sees_its_gpu".into())
            .spawn(|| test_name("gpu::common"))
            .expect("thread")
            .join()
            .expect("join");
        assert_eq!(inner, "gpu::a_gpu_sandbox_sees_its_gpu");
    }

    #[test]
    fn the_marker_is_one_line() {
        assert_eq!(
            marker_line("gpu::t", Reason::NoKvm, "no\nkvm"),
            "SANDBOXD-SKIP gpu::t no-kvm: no kvm"
        );
    }
}
