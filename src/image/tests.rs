//! Tests of the image cache. Builds need root (ownership shift); those tests print
//! why they skip when not root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_test_support::{note_skip, Reason};

use super::recipe::digest_of;
use super::*;

fn is_root() -> bool {
    sandboxd_test_support::root_or_note!(
        "needs root to shift file ownership (run the tests as root)"
    )
}

fn extra_dir(recipes: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in recipes {
        std::fs::write(d.path().join(format!("{name}.sh")), text).unwrap();
    }
    d
}

fn cache_with(recipes: &[(&str, &str)]) -> (tempfile::TempDir, tempfile::TempDir, ImageCache) {
    let images = tempfile::tempdir().unwrap();
    let extra = extra_dir(recipes);
    let cache = ImageCache::open(
        images.path().to_path_buf(),
        vec![extra.path().to_path_buf()],
    )
    .unwrap();
    (images, extra, cache)
}

#[test]
fn names_are_validated() {
    let long_ok = "a".repeat(64);
    for ok in [
        "python",
        "a",
        "0",
        "py3.11",
        "x_y-z",
        "busybox",
        long_ok.as_str(),
    ] {
        assert!(validate_name(ok).is_ok(), "{ok:?} should be valid");
    }
    let long_bad = "a".repeat(65);
    for bad in [
        "",
        "Python",
        ".x",
        "-x",
        "_x",
        "a/b",
        "..",
        "../etc",
        "a b",
        "a\0b",
        "é",
        long_bad.as_str(),
    ] {
        let err = validate_name(bad).unwrap_err();
        assert!(matches!(err, ImageError::InvalidName { .. }), "{bad:?}");
        assert!(err.is_client_error());
    }
}

#[test]
fn digests_are_stable() {
    // Pinned: if this changes, every cache on every host rebuilds. Bump FORMAT_VERSION
    // on purpose, then update the value here.
    assert_eq!(
        digest_of("echo hi\n"),
        "sha256:02a082963c4dd4ffeaa9c40ba3f8b77c1ddf0d12d0b6e9a59fde3a8cc3230769"
    );
    assert_eq!(digest_of("a"), digest_of("a"));
    assert_ne!(digest_of("a"), digest_of("a "));
    let images = tempfile::tempdir().unwrap();
    let c1 = ImageCache::open(images.path().to_path_buf(), vec![]).unwrap();
    let c2 = ImageCache::open(images.path().to_path_buf(), vec![]).unwrap();
    assert_eq!(c1.list(), c2.list());
    let bb = c1.list().into_iter().find(|i| i.name == "busybox").unwrap();
    assert_eq!(
        bb.digest,
        digest_of(include_str!("../../rootfs/images/busybox.sh"))
    );
    assert_eq!(bb.source, "builtin");
}

#[test]
fn unknown_image_fails_fast_and_names_known_ones() {
    let images = tempfile::tempdir().unwrap();
    let cache = ImageCache::open(images.path().to_path_buf(), vec![]).unwrap();
    let t = Instant::now();
    let err = cache.resolve("nope").unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(50));
    assert!(err.is_client_error());
    let msg = err.to_string();
    assert!(matches!(err, ImageError::Unknown { .. }), "{msg}");
    assert!(msg.contains("busybox") && msg.contains("python"), "{msg}");
    assert!(matches!(
        cache.resolve("../x"),
        Err(ImageError::InvalidName { .. })
    ));
    assert!(matches!(
        cache.build("nope", true),
        Err(ImageError::Unknown { .. })
    ));
    // Nothing may be created for a name that does not exist.
    let leftovers: Vec<_> = std::fs::read_dir(cache.dir()).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn extra_dirs_add_and_override_recipes() {
    let (_i, extra, cache) = cache_with(&[
        ("busybox", "echo mine\n"),
        ("tiny", "true\n"),
        ("Bad-Name", "true\n"),
    ]);
    let list = cache.list();
    let names: Vec<_> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["busybox", "python", "tiny"]);
    let bb = &list[0];
    assert_eq!(bb.digest, digest_of("echo mine\n"));
    assert_eq!(
        bb.source,
        extra.path().join("busybox.sh").display().to_string()
    );
    assert!(!bb.built && bb.size_bytes.is_none());

    let missing = ImageCache::open(
        _i.path().to_path_buf(),
        vec![PathBuf::from("/nonexistent/recipes")],
    );
    let msg = missing.unwrap_err().to_string();
    assert!(msg.contains("/nonexistent/recipes"), "{msg}");
}

#[test]
fn builtin_busybox_builds_shifted() {
    if !is_root() {
        return;
    }
    let images = tempfile::tempdir().unwrap();
    let cache = ImageCache::open(images.path().to_path_buf(), vec![]).unwrap();
    let t = Instant::now();
    let img = cache.resolve("busybox").unwrap();
    eprintln!("busybox image built in {:?}", t.elapsed());
    assert_eq!(
        img.rootfs,
        cache
            .dir()
            .join(format!("{}/rootfs", img.digest.replace(':', "-")))
    );

    let meta = |p: &str| std::fs::symlink_metadata(img.rootfs.join(p)).unwrap();
    for p in [
        "",
        "bin",
        "bin/busybox",
        "bin/sh",
        "etc/passwd",
        "tmp",
        "root",
    ] {
        let m = meta(p);
        assert_eq!((m.uid(), m.gid()), (ID_OFFSET, ID_OFFSET), "{p:?}");
    }
    assert!(meta("bin/sh").file_type().is_symlink());
    assert_eq!(meta("tmp").permissions().mode() & 0o7777, 0o1777);
    for d in ["proc", "sys", "dev", "etc"] {
        assert!(meta(d).is_dir(), "{d}");
    }
    let passwd = std::fs::read_to_string(img.rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.starts_with("root:x:0:0:"));
    assert!(images.path().join("logs/busybox.log").is_file());

    // The hot path: no build, just a stat.
    let t = Instant::now();
    for _ in 0..1000 {
        assert_eq!(cache.resolve("busybox").unwrap(), img);
    }
    let per = t.elapsed() / 1000;
    eprintln!("resolve of a built image: {per:?}");
    assert!(per < Duration::from_millis(1), "{per:?}");

    let info = cache
        .list()
        .into_iter()
        .find(|i| i.name == "busybox")
        .unwrap();
    assert!(info.built);
    assert!(info.size_bytes.unwrap_or(0) > 1 << 20, "{info:?}");
}

#[test]
fn concurrent_resolves_build_once() {
    if !is_root() {
        return;
    }
    let counter = tempfile::NamedTempFile::new().unwrap();
    let recipe = format!(
        "set -e\necho run >> {}\nsleep 0.3\nmkdir -p \"$1/bin\"\necho hi > \"$1/bin/x\"\n",
        counter.path().display()
    );
    let images = tempfile::tempdir().unwrap();
    let extra = extra_dir(&[("tiny", &recipe)]);
    let dirs = Arc::new((images.path().to_path_buf(), extra.path().to_path_buf()));
    // Separate caches stand in for separate daemons sharing the directory.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let dirs = Arc::clone(&dirs);
            std::thread::spawn(move || {
                let cache = ImageCache::open(dirs.0.clone(), vec![dirs.1.clone()]).unwrap();
                cache.resolve("tiny").unwrap()
            })
        })
        .collect();
    let results: Vec<Image> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    let runs = std::fs::read_to_string(counter.path()).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "recipe ran {} times",
        runs.lines().count()
    );
    let x = std::fs::metadata(results[0].rootfs.join("bin/x")).unwrap();
    assert_eq!(x.uid(), ID_OFFSET);
}

#[test]
fn failed_build_reports_log_and_leaves_nothing() {
    if !is_root() {
        return;
    }
    let (_i, _e, cache) = cache_with(&[("broken", "echo about to fail\nexit 3\n")]);
    let err = cache.resolve("broken").unwrap_err();
    let ImageError::BuildFailed { log, .. } = &err else {
        panic!("{err}");
    };
    assert!(err.to_string().contains(&log.display().to_string()));
    assert!(std::fs::read_to_string(log)
        .unwrap()
        .contains("about to fail"));
    let ddir = cache
        .dir()
        .join(digest_of("echo about to fail\nexit 3\n").replace(':', "-"));
    let names: Vec<String> = std::fs::read_dir(&ddir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with("rootfs")), "{names:?}");
}

#[test]
fn slow_build_times_out() {
    if !is_root() {
        return;
    }
    let images = tempfile::tempdir().unwrap();
    let extra = extra_dir(&[("slow", "sleep 30 &\nwait\n")]);
    let cache = ImageCache::open(
        images.path().to_path_buf(),
        vec![extra.path().to_path_buf()],
    )
    .unwrap()
    .with_build_timeout(Duration::from_millis(300));
    let t = Instant::now();
    let err = cache.resolve("slow").unwrap_err();
    assert!(matches!(err, ImageError::BuildTimeout { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn out_of_range_owner_is_refused() {
    if !is_root() {
        return;
    }
    let (_i, _e, cache) = cache_with(&[("badids", "touch \"$1/f\"\nchown 70000:0 \"$1/f\"\n")]);
    let err = cache.resolve("badids").unwrap_err();
    assert!(matches!(err, ImageError::Shift { .. }), "{err}");
    assert!(err.to_string().contains("70000"), "{err}");
}

#[test]
fn shift_keeps_setid_caps_links_and_host_files() {
    if !is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let host_target = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(r.join("suid"), b"x").unwrap();
    std::fs::set_permissions(r.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(r.join("a"), b"x").unwrap();
    std::fs::hard_link(r.join("a"), r.join("b")).unwrap();
    std::os::unix::fs::symlink(host_target.path(), r.join("link")).unwrap();
    std::os::unix::fs::lchown(r.join("a"), Some(5), Some(6)).unwrap();
    let with_caps = Path::new("/usr/sbin/setcap").exists()
        && std::process::Command::new("/usr/sbin/setcap")
            .arg("cap_net_raw+ep")
            .arg(r.join("suid"))
            .status()
            .is_ok_and(|s| s.success());

    let stats = shift::shift_tree(r).unwrap();
    assert_eq!(stats.entries, 4, "root dir, suid, one of a/b, link");

    let m = |p: &str| std::fs::symlink_metadata(r.join(p)).unwrap();
    assert_eq!(m("suid").permissions().mode() & 0o7777, 0o4755);
    assert_eq!((m("a").uid(), m("a").gid()), (ID_OFFSET + 5, ID_OFFSET + 6));
    assert_eq!(m("b").uid(), ID_OFFSET + 5, "hard link shifted twice");
    assert_eq!(m("link").uid(), ID_OFFSET);
    let target = std::fs::metadata(host_target.path()).unwrap();
    assert_eq!(target.uid(), 0, "symlink was followed out of the tree");
    if with_caps {
        let out = std::process::Command::new("/usr/sbin/getcap")
            .arg(r.join("suid"))
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("cap_net_raw"));
    } else {
        // The rest of the test ran; the skip still counts, since the test
        // then proves less than its name.
        note_skip!(
            Reason::MissingTool,
            "file capability part skipped: setcap unavailable"
        );
    }
}

#[test]
fn forced_rebuild_swaps_and_keeps_old_tree() {
    if !is_root() {
        return;
    }
    let (_i, _e, cache) = cache_with(&[("tiny", "date +%s%N > \"$1/stamp\"\n")]);
    let first = cache.resolve("tiny").unwrap();
    let before = std::fs::read_to_string(first.rootfs.join("stamp")).unwrap();
    let second = cache.build("tiny", true).unwrap();
    assert_eq!(first, second);
    let after = std::fs::read_to_string(second.rootfs.join("stamp")).unwrap();
    assert_ne!(before, after);
    let trash: Vec<_> = std::fs::read_dir(cache.dir().join("trash"))
        .unwrap()
        .collect();
    assert_eq!(trash.len(), 1);
    // Unforced build of a built image is a no-op.
    cache.build("tiny", false).unwrap();
    assert_eq!(
        std::fs::read_to_string(second.rootfs.join("stamp")).unwrap(),
        after
    );
}
