//! Disk pool tests on a real loop-mounted btrfs. They need root and btrfs-progs and
//! print why they skip otherwise.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandboxd_test_support::{note_skip, Reason};

use super::*;

const MIB: u64 = 1 << 20;

fn can_run() -> bool {
    if !sandboxd_test_support::root_or_note!(
        "needs root to mount a btrfs pool (run the tests as root)"
    ) {
        return false;
    }
    let have = |bin: &str| {
        std::process::Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("mkfs.btrfs") || !have("btrfs") {
        note_skip!(
            Reason::MissingTool,
            "btrfs-progs not installed (apt-get install btrfs-progs)"
        );
        return false;
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("btrfs")) {
        note_skip!(Reason::NoKernelSupport, "this kernel has no btrfs");
        return false;
    }
    true
}

/// A pool in a temp dir that is unmounted however the test ends.
struct TestPool {
    pool: Option<DiskPool>,
    mnt: PathBuf,
    _tmp: tempfile::TempDir,
}

impl TestPool {
    fn new(size: u64) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("pool");
        let pool = DiskPool::open(&mnt, &tmp.path().join("pool.img"), size).unwrap();
        TestPool {
            pool: Some(pool),
            mnt,
            _tmp: tmp,
        }
    }
    fn pool(&self) -> &DiskPool {
        self.pool.as_ref().unwrap()
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if let Some(p) = self.pool.take() {
            if p.unmount().is_err() {
                let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*p))
}

#[test]
fn ids_are_validated() {
    let long_ok = "a".repeat(128);
    for ok in ["sb-1", "A.b_c", "0", long_ok.as_str()] {
        assert!(validate_id(ok).is_ok(), "{ok:?}");
    }
    let long_bad = "a".repeat(129);
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "../x",
        "a b",
        "a\0",
        long_bad.as_str(),
    ] {
        assert!(
            matches!(validate_id(bad), Err(DiskError::InvalidId { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn layer_quota_is_enforced_and_cleanup_is_complete() {
    if !can_run() {
        return;
    }
    let tp = TestPool::new(512 * MIB);
    let pool = tp.pool();
    let limit = 32 * MIB;
    let layer = pool
        .create_layer("sb-quota", limit, 100_000, 100_000)
        .unwrap();
    assert_eq!(layer, pool.layer_path("sb-quota").unwrap());
    assert!(matches!(
        pool.create_layer("sb-quota", limit, 0, 0),
        Err(DiskError::Exists { .. })
    ));
    assert!(matches!(
        pool.create_layer("../x", limit, 0, 0),
        Err(DiskError::InvalidId { .. })
    ));
    for p in [layer.clone(), layer.join("upper"), layer.join("work")] {
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (100_000, 100_000), "{}", p.display());
    }
    assert_eq!(pool.list_layers().unwrap(), ["sb-quota"]);

    let (written, err) = fill(&layer.join("upper/blob"));
    let errno = err.raw_os_error();
    eprintln!(
        "wrote {} MiB into a {} MiB layer, then: {err}",
        written / MIB,
        limit / MIB
    );
    assert!(
        errno == Some(libc::EDQUOT) || errno == Some(libc::ENOSPC),
        "expected EDQUOT or ENOSPC, got {err}"
    );
    assert!(
        written <= limit + 4 * MIB,
        "wrote {written} bytes past a {limit}-byte limit"
    );
    assert!(written >= limit / 2, "stopped early at {written} bytes");

    pool.remove_layer("sb-quota").unwrap();
    pool.remove_layer("sb-quota").unwrap();
    assert!(!layer.exists());
    assert!(pool.list_layers().unwrap().is_empty());

    let mnt = tp.mnt.clone();
    drop(tp);
    assert!(!mounted(&mnt), "pool still mounted");
}

/// Appends 1 MiB chunks until a write or the final sync fails.
fn fill(path: &Path) -> (u64, std::io::Error) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => return (written, std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Ok(n) => written += n as u64,
            Err(e) => return (written, e),
        }
        if written > 256 * MIB {
            match f.sync_all() {
                Ok(()) => panic!("wrote {written} bytes without hitting the limit"),
                Err(e) => return (written, e),
            }
        }
    }
}

#[test]
fn open_is_idempotent_and_layers_survive_remount() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("pool");
    let img = tmp.path().join("pool.img");
    let p1 = DiskPool::open(&mnt, &img, 256 * MIB).unwrap();
    p1.create_layer("keep", 8 * MIB, 0, 0).unwrap();
    // A second open (daemon restart) finds the mount and uses it.
    let p2 = DiskPool::open(&mnt, &img, 256 * MIB).unwrap();
    assert_eq!(p2.list_layers().unwrap(), ["keep"]);
    drop(p2);
    p1.unmount().unwrap();
    assert!(!mounted(&mnt));
    // A reboot: the image file is mounted again, not reformatted.
    let p3 = DiskPool::open(&mnt, &img, 256 * MIB).unwrap();
    assert_eq!(p3.list_layers().unwrap(), ["keep"]);
    p3.remove_layer("keep").unwrap();
    p3.unmount().unwrap();
    assert!(!mounted(&mnt));
}

#[test]
fn create_and_remove_are_fast() {
    if !can_run() {
        return;
    }
    let tp = TestPool::new(512 * MIB);
    let pool = tp.pool();
    let mut times: Vec<Duration> = (0..50)
        .map(|i| {
            let id = format!("bench-{i}");
            let t = Instant::now();
            pool.create_layer(&id, 10 << 30, 100_000, 100_000).unwrap();
            pool.remove_layer(&id).unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    eprintln!(
        "create_layer+remove_layer: median {:?}, min {:?}, max {:?} (50 runs)",
        times[25], times[0], times[49]
    );
    assert!(pool.list_layers().unwrap().is_empty());
}
