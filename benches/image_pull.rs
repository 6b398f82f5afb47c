//! Pulling an image from a registry, and running it. The built-in python
//! image's root is split into three gzip layers (about 190 MB unpacked)
//! and pushed to a loopback docker-registry. In one run:
//!
//! * pull + unpack: sandboxd's `POST /v1/images` (a fresh daemon and empty
//!   image store each time, so every layer is fetched) beside `skopeo copy`
//!   to an OCI layout + `umoci unpack` of the same image;
//! * create -> ready: sandboxd from the pulled image beside sandboxd from
//!   the built-in python image.
//!
//!     sudo cargo bench --bench image_pull     # BENCH_RUNS=5 by default
//!
//! Prints medians and writes the raw samples to `benches/results/image_pull.json`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/oci.rs"]
mod oci;
mod peers;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::Daemon;
use hyper::StatusCode;
use oci::{blob, config, Blob, Layout, Registry};
use peers::{median, private_mount_namespace, python_rootfs};
use serde_json::{json, Value};

/// The image cache's owner shift: tar entries carry the unshifted ids.
const SHIFT: u32 = 100_000;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// A gzip layer of the tree under `root`: what lies under one of
/// `include` (relative prefixes; `""` is everything) and under none of
/// `exclude`, with the directories above an included prefix; and its
/// diff id (the digest of the uncompressed tar, which umoci checks).
fn layer_of(root: &Path, include: &[&str], exclude: &[&str]) -> (Blob, String) {
    let under =
        |rel: &Path, prefixes: &[&str]| prefixes.iter().any(|p| p.is_empty() || rel.starts_with(p));
    let above = |rel: &Path| include.iter().any(|p| Path::new(p).starts_with(rel));
    let mut builder = tar::Builder::new(Vec::new());
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kept = under(&rel, include) && !under(&rel, exclude);
        let wanted = kept || (meta.is_dir() && above(&rel));
        if !wanted {
            continue;
        }
        if !rel.as_os_str().is_empty() {
            append(&mut builder, &path, &rel, &meta);
        }
        if meta.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .expect("list")
                .flatten()
                .map(|e| rel.join(e.file_name()))
                .collect();
            names.sort();
            stack.extend(names.into_iter().rev());
        }
    }
    let tar = builder.into_inner().expect("tar");
    let diff_id = blob(tar.clone()).digest;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).expect("gzip");
    (blob(gz.finish().expect("gzip")), diff_id)
}

fn append(builder: &mut tar::Builder<Vec<u8>>, path: &Path, rel: &Path, meta: &std::fs::Metadata) {
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    header.set_uid(u64::from(meta.uid().saturating_sub(SHIFT)));
    header.set_gid(u64::from(meta.gid().saturating_sub(SHIFT)));
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(path).expect("readlink");
        header.set_size(0);
        builder
            .append_link(&mut header, rel, target)
            .expect("append link");
    } else if ft.is_file() {
        let file = std::fs::File::open(path).expect("open");
        builder
            .append_data(&mut header, rel, file)
            .expect("append file");
    } else if ft.is_dir() {
        header.set_size(0);
        builder
            .append_data(&mut header, rel, std::io::empty())
            .expect("append dir");
    }
}

/// The python image's root as three layers in an OCI layout, pushed.
fn push_python(registry: &Registry, rootfs: &Path, work: &Path) -> (String, u64) {
    let started = Instant::now();
    let layers = [
        layer_of(rootfs, &[""], &["usr"]),
        layer_of(rootfs, &["usr"], &["usr/lib"]),
        layer_of(rootfs, &["usr/lib"], &[]),
    ];
    let compressed: u64 = layers.iter().map(|(l, _)| l.bytes.len() as u64).sum();
    eprintln!(
        "three layers, {} MB compressed, made in {:.1} s",
        compressed / 1_000_000,
        started.elapsed().as_secs_f64()
    );
    let refs: Vec<&Blob> = layers.iter().map(|(l, _)| l).collect();
    let mut layout = Layout::new(work.join("layout"));
    let path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let mut image_config = config("amd64", &[path], "/", &refs);
    let diff_ids: Vec<&String> = layers.iter().map(|(_, d)| d).collect();
    image_config["rootfs"]["diff_ids"] = json!(diff_ids);
    let manifest = layout.manifest(&refs, image_config);
    layout.tag("v1", manifest);
    registry.push(&layout.dir, "v1", "bench/python");
    (format!("{}/bench/python:v1", registry.host()), compressed)
}

fn daemon_for(registry: &Registry, images: &Path) -> Daemon {
    let host = registry.host();
    let images = images.display().to_string();
    Daemon::start_with(&[
        "--images-dir",
        &images,
        "--insecure-registries",
        &host,
        "--private-registries",
        &host,
    ])
}

/// `POST /v1/images` into an empty store, `runs` times.
async fn sandboxd_pulls(registry: &Registry, reference: &str, runs: usize) -> Vec<f64> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let images = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let daemon = daemon_for(registry, images.path());
        let begun = Instant::now();
        let (status, body) = daemon.ready_image(json!(reference)).await;
        samples.push(ms(begun));
        assert_eq!(status, StatusCode::OK, "{body}");
        eprintln!("sandboxd pull {:.0} ms", ms(begun));
    }
    samples
}

/// `skopeo copy` to a fresh layout, then `umoci unpack`, `runs` times.
fn skopeo_umoci(reference: &str, runs: usize) -> Vec<f64> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let layout = format!("{}:v1", dir.path().join("layout").display());
        let bundle = dir.path().join("bundle");
        let begun = Instant::now();
        let copied = Command::new("skopeo")
            .args(["copy", "--quiet", "--src-tls-verify=false"])
            .arg(format!("docker://{reference}"))
            .arg(format!("oci:{layout}"))
            .status()
            .expect("skopeo");
        assert!(copied.success());
        let unpacked = Command::new("umoci")
            .args(["unpack", "--image", &layout])
            .arg(&bundle)
            .status()
            .expect("umoci");
        assert!(unpacked.success());
        samples.push(ms(begun));
        eprintln!("skopeo + umoci {:.0} ms", ms(begun));
    }
    samples
}

/// Create -> ready of `image`, `runs` times (each deleted after).
async fn creates(daemon: &Daemon, image: &str, runs: usize) -> Vec<f64> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let begun = Instant::now();
        let id = daemon.create(json!({ "image": image })).await;
        samples.push(ms(begun));
        daemon.delete(&id).await;
    }
    samples
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("image pull benchmark skipped: {why}");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs = peers::bench_runs(5);
    private_mount_namespace();
    let rootfs = python_rootfs(common::DAEMON);
    let registry = Registry::start();
    let work = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let (reference, compressed) = push_python(&registry, &rootfs, work.path());
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    // Alternate the two, so neither gets the warmer page cache throughout.
    let mut pulls = Vec::new();
    let mut peer = Vec::new();
    for _ in 0..runs {
        pulls.extend(runtime.block_on(sandboxd_pulls(&registry, &reference, 1)));
        peer.extend(skopeo_umoci(&reference, 1));
    }

    // Create -> ready: the pulled image (stored in a store of its own,
    // beside the built-in python image's cache).
    let images = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let (pulled_ready, builtin_ready) = runtime.block_on(async {
        let pulling = daemon_for(&registry, images.path());
        let (status, body) = pulling.ready_image(json!(reference)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let pulled = creates(&pulling, &reference, runs * 4).await;
        drop(pulling);
        let builtin = Daemon::start();
        let builtin_ready = creates(&builtin, "python", runs * 4).await;
        (pulled, builtin_ready)
    });

    let ratio = median(&pulls) / median(&peer);
    let medians = json!({
        "sandboxd_pull_ms": median(&pulls),
        "skopeo_copy_umoci_unpack_ms": median(&peer),
        "pull_ratio": ratio,
        "create_ready_pulled_ms": median(&pulled_ready),
        "create_ready_builtin_ms": median(&builtin_ready),
    });
    println!(
        "pull + unpack of a 3-layer image, {} MB compressed ({runs} runs, medians in ms)",
        compressed / 1_000_000
    );
    println!("  sandboxd POST /v1/images      {:8.0}", median(&pulls));
    println!("  skopeo copy + umoci unpack    {:8.0}", median(&peer));
    println!("  ratio                         {ratio:8.2}");
    println!("create -> ready ({} runs, medians in ms)", runs * 4);
    println!(
        "  from the pulled image         {:8.1}",
        median(&pulled_ready)
    );
    println!(
        "  from the built-in python      {:8.1}",
        median(&builtin_ready)
    );
    let raw: Value = json!({
        "runs": runs,
        "unit": "ms",
        "compressed_bytes": compressed,
        "sandboxd_pull": pulls,
        "skopeo_copy_umoci_unpack": peer,
        "create_ready_pulled": pulled_ready,
        "create_ready_builtin": builtin_ready,
        "medians": medians,
    });
    peers::write_results("image_pull", &raw);
}
