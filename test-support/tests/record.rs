//! `skip!` as a test meets it: the marker on stderr, the skip log, and the
//! failure under `SANDBOXD_TEST_REQUIRE=all`. Each case re-runs this binary
//! on one child test with the environment under test, since the variables
//! are read by the skipping test itself.

use std::process::{Command, Output};

use sandboxd_test_support::{skip, Reason};

/// Child: skips for a reason no list entry allows.
#[test]
fn child_skips_for_want_of_root() {
    if std::env::var_os("TEST_SUPPORT_CHILD").is_none() {
        return; // only meaningful when a parent below runs it
    }
    skip!(Reason::NotRoot, "needs root to {}", "mount");
}

/// Child: a skip the list allows (a `gpu::*` test on a host whose NVIDIA
/// driver owns the device major), made from a thread named as libtest would
/// name that test.
#[test]
fn child_skips_as_an_allowed_gpu_test() {
    if std::env::var_os("TEST_SUPPORT_CHILD").is_none() {
        return;
    }
    std::thread::Builder::new()
        .name("a_gpu_sandbox_sees_its_gpu".into())
        .spawn(|| sandboxd_test_support::record("gpu", Reason::GpuDriverPresent, "nvidia loaded"))
        .expect("thread")
        .join()
        .expect("an allowed skip does not panic");
}

fn child(test: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("TEST_SUPPORT_CHILD", "1")
        .env_remove("SANDBOXD_TEST_REQUIRE")
        .env_remove("SANDBOXD_TEST_SKIP_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the child test")
}

#[test]
fn a_skip_prints_the_marker_and_appends_it_to_the_log() {
    let dir = tempfile_dir();
    let log = dir.join("skips");
    let out = child(
        "child_skips_for_want_of_root",
        &[("SANDBOXD_TEST_SKIP_LOG", log.to_str().expect("utf-8 path"))],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = "SANDBOXD-SKIP record::child_skips_for_want_of_root not-root: needs root to mount";
    assert!(stderr.contains(line), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&log).expect("skip log"),
        format!("{line}\n")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_require_all_a_skip_fails_and_is_not_logged_as_a_skip() {
    let dir = tempfile_dir();
    let log = dir.join("skips");
    let out = child(
        "child_skips_for_want_of_root",
        &[
            ("SANDBOXD_TEST_REQUIRE", "all"),
            ("SANDBOXD_TEST_SKIP_LOG", log.to_str().expect("utf-8 path")),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 failed"), "{stdout}");
    assert!(stderr.contains("SANDBOXD_TEST_REQUIRE=all"), "{stderr}");
    assert!(!log.exists(), "a failed test was also counted as a skip");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_require_all_a_listed_skip_still_passes() {
    let out = child(
        "child_skips_as_an_allowed_gpu_test",
        &[("SANDBOXD_TEST_REQUIRE", "all")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "SANDBOXD-SKIP gpu::a_gpu_sandbox_sees_its_gpu gpu-driver-present: nvidia loaded"
        ),
        "{stderr}"
    );
}

#[test]
fn an_unknown_require_value_fails_rather_than_passing_vacuously() {
    let out = child(
        "child_skips_for_want_of_root",
        &[("SANDBOXD_TEST_REQUIRE", "everything")],
    );
    assert!(!out.status.success());
}

/// A fresh folder for one case (no tempfile dependency in this crate).
fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sandboxd-test-support-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
