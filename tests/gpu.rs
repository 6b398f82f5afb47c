//! GPU sandboxes through the real daemon on a host without a GPU: a fake
//! inventory (`--gpu-fake`) over fake device nodes made with mknod (the
//! nvidia major 195 and a uvm major), so the real kernel enforces each
//! sandbox's device cgroup. Opening a node the cgroup allows reaches the
//! (missing) driver and fails with ENXIO; one it refuses fails with EPERM.
//! Also: exclusive allocation under concurrent creates, release on every
//! path, `GET /v1/gpus`, and the 400s.

mod common;

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

const UUID0: &str = "GPU-00000000-0000-4000-8000-000000000000";
const UUID1: &str = "GPU-11111111-1111-4111-8111-111111111111";
const NVIDIA_MAJOR: u32 = 195;

/// Fake device nodes, a /proc/devices naming their majors, and a fake
/// driver folder (`libcuda.so.1`, an `nvidia-smi` script).
struct FakeGpus {
    dir: tempfile::TempDir,
}

impl FakeGpus {
    /// `None` (with the reason printed) where the test cannot mean anything:
    /// a real NVIDIA driver owns major 195 here.
    fn new() -> Option<Self> {
        let devices = std::fs::read_to_string("/proc/devices").expect("/proc/devices");
        let taken = char_majors(&devices);
        if taken.contains(&NVIDIA_MAJOR) {
            common::note_skip!(
                common::Reason::GpuDriverPresent,
                "an NVIDIA driver is loaded; run tests/gpu/check.sh instead"
            );
            return None;
        }
        // The real uvm major when the module is loaded, else one from the
        // range set aside for local use that nothing registered.
        let uvm = devices
            .lines()
            .find(|l| l.trim_end().ends_with(" nvidia-uvm"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .or_else(|| (234..=239).find(|m| !taken.contains(m)))
            .expect("a free character major in 234..=239");
        let dir = tempfile::Builder::new()
            .prefix("sandboxd-gpu-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        // The sandbox's root (an unprivileged host uid) resolves the bind
        // sources itself.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let fake = FakeGpus { dir };
        std::fs::create_dir(fake.dev()).expect("dev dir");
        std::fs::create_dir(fake.driver()).expect("driver dir");
        for (name, major, minor) in [
            ("nvidia0", NVIDIA_MAJOR, 0),
            ("nvidia1", NVIDIA_MAJOR, 1),
            ("nvidiactl", NVIDIA_MAJOR, 255),
            ("nvidia-uvm", uvm, 0),
            ("nvidia-uvm-tools", uvm, 1),
        ] {
            mknod(&fake.dev().join(name), major, minor);
        }
        std::fs::write(
            fake.proc_devices(),
            format!(
                "Character devices:\n  1 mem\n{NVIDIA_MAJOR} nvidia-frontend\n{uvm} nvidia-uvm\n\nBlock devices:\n  7 loop\n"
            ),
        )
        .expect("proc devices");
        std::fs::write(fake.driver().join("libcuda.so.1"), b"not really libcuda\n").expect("lib");
        let smi = fake.driver().join("nvidia-smi");
        std::fs::write(
            &smi,
            "#!/bin/sh\necho \"fake nvidia-smi sees $NVIDIA_VISIBLE_DEVICES\"\n",
        )
        .expect("smi");
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Some(fake)
    }

    fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }
    fn driver(&self) -> PathBuf {
        self.dir.path().join("driver")
    }
    fn proc_devices(&self) -> PathBuf {
        self.dir.path().join("devices")
    }

    /// Daemon flags for two fake H200s on these nodes.
    fn flags(&self) -> Vec<String> {
        vec![
            "--gpu-fake".into(),
            format!(
                "0:NVIDIA H200:{UUID0}:0:143771:00000000:3B:00.0,1:NVIDIA H200:{UUID1}:1:143771:00000000:5C:00.0"
            ),
            "--gpu-dev-dir".into(),
            self.dev().display().to_string(),
            "--gpu-proc-devices".into(),
            self.proc_devices().display().to_string(),
            "--gpu-driver-dirs".into(),
            self.driver().display().to_string(),
        ]
    }

    fn daemon(&self, extra: &[&str]) -> Daemon {
        let mut flags = self.flags();
        flags.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        Daemon::start_with(&refs)
    }
}

fn char_majors(proc_devices: &str) -> Vec<u32> {
    proc_devices
        .split("Block devices:")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

fn mknod(path: &Path, major: u32, minor: u32) {
    use nix::sys::stat::{makedev, Mode, SFlag};
    nix::sys::stat::mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(major.into(), minor.into()),
    )
    .expect("mknod");
    // mknod applied the umask.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
}

/// What `open(path, O_RDWR)` in the sandbox gives: "OK" or the errno name.
async fn open_result(d: &Daemon, id: &str, path: &str) -> String {
    let code = "import errno, os, sys\n\
        try:\n    os.close(os.open(sys.argv[1], os.O_RDWR)); print('OK')\n\
        except OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))\n";
    let run = d.exec(id, &["python3", "-c", code, path]).await;
    if run.exit_code() != Some(0) {
        let shim_log = d.run_dir().join("sandboxes").join(id).join("shim.log");
        panic!(
            "probe of {path} in {id} failed: {}\n{:?}\nsupervisor log:\n{}\ndaemon log:\n{}",
            run.err(),
            run.process,
            std::fs::read_to_string(shim_log).unwrap_or_default(),
            d.log()
        );
    }
    run.out().trim().to_string()
}

async fn gpus(d: &Daemon) -> Vec<Value> {
    let (status, body) = d.call(Method::GET, "/v1/gpus", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["gpus"].as_array().cloned().expect("gpus array")
}

/// `held_by` of each GPU in index order.
async fn holders(d: &Daemon) -> Vec<Option<String>> {
    gpus(d)
        .await
        .iter()
        .map(|g| g["held_by"].as_str().map(String::from))
        .collect()
}

async fn create_raw(d: &Daemon, body: Value) -> (StatusCode, Value) {
    d.call(Method::POST, "/v1/sandboxes", Some(body)).await
}

/// A host process inside sandbox `id` (its agent), from the sandbox's cgroup.
fn sandbox_pid(id: &str) -> i32 {
    let procs = common::cgroup::sandbox_dir("pids", id).join("cgroup.procs");
    let text =
        std::fs::read_to_string(&procs).unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    text.lines()
        .find_map(|l| l.trim().parse().ok())
        .expect("a process in the sandbox")
}

/// Puts the host node `node` over `target` (an existing file) inside the
/// running sandbox `id`, the way nothing in sandboxd would: a mount of the
/// host's device filesystem, so only the device cgroup stands between the
/// sandbox and the node.
fn inject_node(id: &str, node: &Path, target: &str) {
    let pid = sandbox_pid(id);
    let node = CString::new(node.as_os_str().as_encoded_bytes()).expect("path");
    let target_c = CString::new(target).expect("target");
    // setns into a mount namespace changes the calling thread's root: a
    // thread of its own, which ends afterwards.
    let result = std::thread::spawn(move || -> Result<(), String> {
        let flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint;
        // SAFETY: open_tree with a NUL-terminated path; a non-negative result
        // is a new descriptor that nothing else owns.
        let fd =
            unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, node.as_ptr(), flags) };
        if fd < 0 {
            return Err(format!("open_tree: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: see above; the descriptor is owned from here on.
        let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
            .map_err(|e| format!("unshare: {e}"))?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(|e| e.to_string())?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("setns: {e}"))?;
        let empty = c"";
        // SAFETY: move_mount with a live descriptor and NUL-terminated paths.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                std::os::fd::AsRawFd::as_raw_fd(&tree),
                empty.as_ptr(),
                libc::AT_FDCWD,
                target_c.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if rc < 0 {
            return Err(format!("move_mount: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    })
    .join()
    .expect("inject thread");
    if let Err(e) = result {
        panic!("injecting {target:?} into {id}: {e}");
    }
}

#[tokio::test]
async fn a_gpu_sandbox_reaches_its_own_gpu_and_no_other() {
    require_host!();
    let Some(fake) = FakeGpus::new() else { return };
    let d = fake.daemon(&[]);

    let listed = gpus(&d).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["index"], 0);
    assert_eq!(listed[0]["uuid"], UUID0);
    assert_eq!(listed[0]["name"], "NVIDIA H200");
    assert_eq!(listed[0]["memory_mib"], 143771);
    assert_eq!(listed[0]["pci_bus_id"], "00000000:3B:00.0");
    assert_eq!(listed[1]["minor_number"], 1);
    assert_eq!(holders(&d).await, vec![None, None]);

    let (status, first) = create_raw(&d, json!({"image": "python", "gpu": "H200"})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}\n{}", d.log());
    let a = first["id"].as_str().expect("id").to_string();
    assert_eq!(first["gpus"], json!([UUID0]), "lowest index first");
    let b = d.create(json!({"image": "python", "gpu": "any"})).await;
    let c = d.create(json!({"image": "python"})).await;
    assert_eq!(holders(&d).await, vec![Some(a.clone()), Some(b.clone())]);
    let (_, view) = d
        .call(Method::GET, &format!("/v1/sandboxes/{b}"), None)
        .await;
    assert_eq!(view["gpus"], json!([UUID1]));
    let (_, view) = d
        .call(Method::GET, &format!("/v1/sandboxes/{c}"), None)
        .await;
    assert_eq!(view["gpus"], json!([]));

    // Its own GPU and the control nodes pass the cgroup and reach the
    // missing driver; the other GPU's node is not there at all.
    for node in [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ] {
        assert_eq!(open_result(&d, &a, node).await, "ENXIO", "{node} in {a}");
    }
    assert_eq!(open_result(&d, &a, "/dev/nvidia1").await, "ENOENT");
    assert_eq!(open_result(&d, &b, "/dev/nvidia1").await, "ENXIO");
    assert_eq!(open_result(&d, &b, "/dev/nvidia0").await, "ENOENT");
    for node in [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ] {
        assert_eq!(open_result(&d, &c, node).await, "ENOENT", "{node} in {c}");
    }

    // Given GPU 0's node anyway, the sandbox holding GPU 1 and the one
    // without a GPU are refused by the device cgroup.
    for id in [&b, &c] {
        let touch = d.sh(id, "touch /dev/nvidia0").await;
        assert_eq!(touch.exit_code(), Some(0), "{}", touch.err());
        inject_node(id, &fake.dev().join("nvidia0"), "/dev/nvidia0");
        assert_eq!(
            open_result(&d, id, "/dev/nvidia0").await,
            "EPERM",
            "in {id}"
        );
    }
    // The same node in the sandbox holding GPU 0 is allowed (the injected
    // mount behaves like the daemon's own).
    let run = d.sh(&a, "touch /tmp/n").await;
    assert_eq!(run.exit_code(), Some(0));
    inject_node(&a, &fake.dev().join("nvidia0"), "/tmp/n");
    assert_eq!(open_result(&d, &a, "/tmp/n").await, "ENXIO");

    // Environment, driver files and nvidia-smi.
    let env = d
        .sh(
            &a,
            "echo $NVIDIA_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES $LD_LIBRARY_PATH",
        )
        .await;
    assert_eq!(
        env.out(),
        format!("{UUID0} {UUID0} /usr/local/nvidia/lib64\n")
    );
    let smi = d.exec(&a, &["nvidia-smi"]).await;
    assert_eq!(
        smi.out(),
        format!("fake nvidia-smi sees {UUID0}\n"),
        "{}",
        smi.err()
    );
    let lib = d
        .sh(
            &a,
            "cat /usr/local/nvidia/lib64/libcuda.so.1; echo x >> /usr/bin/nvidia-smi && echo writable",
        )
        .await;
    assert_eq!(
        lib.out(),
        "not really libcuda\n",
        "read-only: {}",
        lib.err()
    );
    let none = d
        .sh(
            &c,
            "echo \"[$NVIDIA_VISIBLE_DEVICES]\"; test -e /usr/local/nvidia || echo no-driver",
        )
        .await;
    assert_eq!(none.out(), "[]\nno-driver\n");

    d.delete(&a).await;
    assert_eq!(holders(&d).await, vec![None, Some(b.clone())]);
}

#[tokio::test]
async fn allocation_is_exclusive_under_concurrent_creates() {
    require_host!();
    let Some(fake) = FakeGpus::new() else { return };
    let d = fake.daemon(&[]);
    let results = futures::future::join_all((0..20).map(|_| {
        create_raw(
            &d,
            json!({"image": "busybox", "gpu": "H200", "gpu_count": 1}),
        )
    }))
    .await;
    let mut won = Vec::new();
    for (status, body) in &results {
        match *status {
            StatusCode::CREATED => won.push((
                body["id"].as_str().expect("id").to_string(),
                body["gpus"][0].as_str().expect("gpu").to_string(),
            )),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["error"]["resource"], "gpu", "{body}");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("in use"),
                    "{body}"
                );
            }
            other => panic!("unexpected {other}: {body}\n{}", d.log()),
        }
    }
    assert_eq!(won.len(), 2, "exactly one create per GPU: {results:?}");
    let mut got: Vec<&str> = won.iter().map(|(_, g)| g.as_str()).collect();
    got.sort();
    assert_eq!(got, vec![UUID0, UUID1]);
    let (_, list) = d.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(2),
        "losers left nothing"
    );

    // A freed GPU can be taken again.
    d.delete(&won[0].0).await;
    let id = d.create(json!({"image": "busybox", "gpu_count": 1})).await;
    let (_, view) = d
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(view["gpus"], json!([won[0].1]));
}

#[tokio::test]
async fn gpus_are_released_on_failed_create_ttl_expiry_and_kept_across_a_restart() {
    require_host!();
    let Some(fake) = FakeGpus::new() else { return };
    let mut d = fake.daemon(&[]);

    // Failed create: the GPU was taken, then the image was not found.
    let (status, body) = create_raw(&d, json!({"image": "no-such-image", "gpu_count": 2})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(holders(&d).await, vec![None, None]);

    // TTL expiry.
    let short = d
        .create(json!({"image": "busybox", "gpu": "any", "ttl_seconds": 1}))
        .await;
    assert_eq!(holders(&d).await, vec![Some(short.clone()), None]);
    // The reaper says `expired`, then `deleted` once the teardown (which
    // releases the GPU first) is done.
    let mut events = d.follow_events(0).await;
    let seen = events
        .until(Duration::from_secs(30), |e| {
            e["kind"] == "deleted" && e["sandbox_id"] == short.as_str()
        })
        .await;
    let kinds: Vec<&str> = seen
        .iter()
        .filter(|e| e["sandbox_id"] == short.as_str())
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.ends_with(&["expired", "deleted"]), "{kinds:?}");
    assert_eq!(
        holders(&d).await,
        vec![None, None],
        "GPU not released after the TTL"
    );
    let (status, _) = d
        .call(Method::GET, &format!("/v1/sandboxes/{short}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A daemon killed outright comes back with the allocation it had.
    let kept = d.create(json!({"image": "busybox", "gpu": "H200"})).await;
    d.kill(nix::sys::signal::Signal::SIGKILL);
    d.restart();
    assert_eq!(holders(&d).await, vec![Some(kept.clone()), None]);
    let (status, body) = create_raw(&d, json!({"image": "busybox", "gpu_count": 2})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["resource"], "gpu");
    let other = d.create(json!({"image": "busybox", "gpu_count": 1})).await;
    assert_eq!(
        holders(&d).await,
        vec![Some(kept.clone()), Some(other.clone())]
    );
    d.delete(&kept).await;
    d.delete(&other).await;
    let both = d.create(json!({"image": "busybox", "gpu_count": 2})).await;
    assert_eq!(holders(&d).await, vec![Some(both.clone()), Some(both)]);
}

#[tokio::test]
async fn impossible_gpu_requests_are_400_with_a_reason() {
    require_host!();
    let Some(fake) = FakeGpus::new() else { return };
    let d = fake.daemon(&[]);
    for (body, code, needles) in [
        (
            json!({"gpu": "A100"}),
            "gpu_not_found",
            vec!["A100", "2 × NVIDIA H200"],
        ),
        (
            json!({"gpu": "H200", "gpu_count": 3}),
            "gpu_count_too_large",
            vec!["only 2"],
        ),
        (
            json!({"gpu": "H200", "gpu_count": 0}),
            "invalid_gpu",
            vec!["gpu_count"],
        ),
        (json!({"gpu": "H200\n"}), "invalid_gpu", vec!["model"]),
        (
            json!({"gpu": "H200", "runtime": "vm"}),
            "gpu_unsupported_runtime",
            vec!["CPU-only"],
        ),
    ] {
        let (status, reply) = create_raw(&d, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or("");
        for needle in needles {
            assert!(message.contains(needle), "{body}: {message}");
        }
    }
    assert_eq!(holders(&d).await, vec![None, None]);
    let (_, list) = d.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn a_host_without_the_driver_has_no_gpus() {
    require_host!();
    if Path::new("/proc/driver/nvidia").exists() {
        common::skip!(
            common::Reason::GpuDriverPresent,
            "this host has the NVIDIA driver"
        );
    }
    // Real NVML discovery: libnvidia-ml cannot load here, which is no error.
    let d = Daemon::start();
    assert_eq!(gpus(&d).await, Vec::<Value>::new());
    let (status, reply) = create_raw(&d, json!({"image": "busybox", "gpu": "any"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(reply["error"]["code"], "gpu_not_found");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no GPUs"),
        "{reply}"
    );
    // Sandboxes without GPUs are unaffected.
    let id = d.create(json!({"image": "busybox"})).await;
    d.delete(&id).await;
}
