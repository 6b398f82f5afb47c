//! A containerd of a test's (or benchmark's) own, for the sandboxd shim:
//! Debian's containerd with its own root, state and sockets (the packaged
//! service stays off), driven with `ctr`, and a busybox image imported into
//! it. Needs `crate::common` and `crate::oci` beside it.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::oci::{blob, config, Layout};

/// The shim's runtime name.
pub const RUNTIME: &str = "io.containerd.sandboxd.v2";
/// The image [`Containerd::import_busybox`] imports.
pub const IMAGE: &str = "docker.io/library/sbx-busybox:test";

/// Where a containerd of a test keeps its root: /var/tmp, a real file
/// system (containerd's overlay snapshots need one under them, and /tmp
/// may be small), unless it is an overlay itself, as in the nested host
/// (scripts/nested-kvm.sh), whose /tmp is a tmpfs.
fn snapshot_friendly_tmp() -> &'static str {
    use nix::sys::statfs::{statfs, OVERLAYFS_SUPER_MAGIC};
    match statfs("/var/tmp") {
        Ok(fs) if fs.filesystem_type() == OVERLAYFS_SUPER_MAGIC => "/tmp",
        _ => "/var/tmp",
    }
}

/// The next line of `reader`, invalid UTF-8 replaced; `None` at its end.
fn read_line_lossy(reader: &mut impl BufRead) -> Option<String> {
    let mut line = Vec::new();
    match reader.read_until(b'\n', &mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(String::from_utf8_lossy(&line).trim_end().to_string()),
    }
}

pub fn shim_binary() -> PathBuf {
    let shim = Path::new(crate::common::DAEMON).with_file_name("containerd-shim-sandboxd-v2");
    assert!(
        shim.exists(),
        "{} is missing: build it with `cargo build --bins` (`--release` for a benchmark)",
        shim.display()
    );
    shim
}

/// A containerd of the test's own: root, state and sockets in a temp dir,
/// CRI off, the shim's directory first on its PATH and the daemon's socket
/// in its environment (which the shims it starts inherit).
pub struct Containerd {
    dir: tempfile::TempDir,
    sandboxd_socket: PathBuf,
    child: Option<Child>,
    /// The namespace `ctr` works in: CRI keeps its images and pods in `k8s.io`.
    namespace: &'static str,
    /// The last lines containerd (and the shims, through it) logged, which
    /// a failed test prints.
    log_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // What it logged up to the failure, before its shutdown's lines.
        if std::thread::panicking() {
            let tail = self.log_tail.lock().unwrap_or_else(|e| e.into_inner());
            let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
            eprintln!(
                "--- the end of this test's containerd log (shims included) ---\n{}",
                lines.join("\n")
            );
            // Before the shims go, and their sandboxes' logs with them.
            if let Some(daemon_dir) = self.sandboxd_socket.parent() {
                crate::common::print_sandbox_logs(&daemon_dir.join("run"));
            }
        }
        self.stop();
        // Shims outlive containerd by design: end this test's.
        let address = self.socket().display().to_string();
        for pid in crate::common::processes_where(|_, argv| argv.contains(&address.as_str())) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // What pods and tasks that were not removed (a failed test) leave:
        // their pods' network namespaces, named in their bundles, and the
        // snapshotter's and CRI's mounts (pods' /dev/shm) under this
        // containerd's directory. `umount -R` of the directory itself did
        // not reach them: it is no mount point.
        let namespaces = pod_network_namespaces(&self.dir.path().join("state"));
        for point in mounts_under(self.dir.path()) {
            let _ = nix::mount::umount2(point.as_path(), nix::mount::MntFlags::MNT_DETACH);
        }
        for netns in namespaces {
            let _ = nix::mount::umount2(netns.as_path(), nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&netns);
        }
    }
}

/// The mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points
}

/// The network namespace files (under /run/netns) that the task bundles
/// in containerd's `state` join: CNI's, one per pod sandbox.
fn pod_network_namespaces(state: &Path) -> Vec<PathBuf> {
    let bundles = state.join("io.containerd.runtime.v2.task");
    let mut found = Vec::new();
    for namespace in std::fs::read_dir(&bundles).into_iter().flatten().flatten() {
        for bundle in std::fs::read_dir(namespace.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(text) = std::fs::read(bundle.path().join("config.json")) else {
                continue;
            };
            let config: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
            let paths = config
                .pointer("/linux/namespaces")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter(|ns| ns["type"] == "network")
                .filter_map(|ns| ns["path"].as_str())
                .map(|path| PathBuf::from(path.replacen("/var/run/", "/run/", 1)))
                .filter(|path| path.starts_with("/run/netns"));
            for path in paths {
                if !found.contains(&path) {
                    found.push(path);
                }
            }
        }
    }
    found
}

impl Containerd {
    pub fn start(daemon: &crate::common::Daemon) -> Containerd {
        Self::start_with(daemon, "sbx", |_| {
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n".to_string()
        })
    }

    /// A containerd with its CRI on: the `sandboxd` runtime handler is the
    /// shim (passing `sandboxd.io/*` annotations of pods and containers),
    /// pods get their network from the CNI configs in `cni_conf_dir`, and
    /// the pod sandbox image is [`IMAGE`] (import it into `k8s.io`).
    pub fn start_cri(daemon: &crate::common::Daemon, cni_conf_dir: &Path) -> Containerd {
        let cni_conf_dir = cni_conf_dir.display().to_string();
        Self::start_with(daemon, "k8s.io", move |_| {
            format!(
                "[plugins.\"io.containerd.grpc.v1.cri\"]\n\
                 \x20 sandbox_image = \"{IMAGE}\"\n\
                 \x20 stream_server_address = \"127.0.0.1\"\n\
                 \x20 stream_server_port = \"0\"\n\
                 \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
                 \x20   snapshotter = \"overlayfs\"\n\
                 \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
                 \x20     runtime_type = \"io.containerd.runc.v2\"\n\
                 \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.sandboxd]\n\
                 \x20     runtime_type = \"{RUNTIME}\"\n\
                 \x20     pod_annotations = [\"sandboxd.io/*\"]\n\
                 \x20     container_annotations = [\"sandboxd.io/*\"]\n\
                 \x20 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
                 \x20   bin_dir = \"/usr/lib/cni\"\n\
                 \x20   conf_dir = \"{cni_conf_dir}\"\n"
            )
        })
    }

    fn start_with(
        daemon: &crate::common::Daemon,
        namespace: &'static str,
        plugins: impl FnOnce(&Path) -> String,
    ) -> Containerd {
        let dir = tempfile::tempdir_in(snapshot_friendly_tmp()).expect("tempdir");
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n{plugins}\
                 [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
                root = dir.path().join("root").display(),
                state = dir.path().join("state").display(),
                sock = dir.path().join("containerd.sock").display(),
                plugins = plugins(dir.path()),
            ),
        )
        .expect("config");
        let mut containerd = Containerd {
            dir,
            sandboxd_socket: daemon.socket.clone(),
            child: None,
            namespace,
            log_tail: Arc::default(),
        };
        containerd.spawn();
        containerd
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }

    /// Stops containerd and starts it again on the same root and state.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn spawn(&mut self) {
        let path = format!(
            "{}:{}",
            shim_binary().parent().expect("dir").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .env("PATH", path)
            .env("SANDBOXD_SOCKET", &self.sandboxd_socket)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start containerd (install-deps installs it)");
        // Its log says when it serves; keep draining it after that, to its
        // end whatever it holds: a stopped reader would block containerd
        // (and the shims' logs) on a full pipe.
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut seen = Vec::new();
        loop {
            match read_line_lossy(&mut stderr) {
                Some(line) => {
                    let booted = line.contains("containerd successfully booted");
                    seen.push(line);
                    if booted {
                        break;
                    }
                }
                None => panic!("containerd exited before it served:\n{}", seen.join("\n")),
            }
        }
        let tail = Arc::clone(&self.log_tail);
        std::thread::spawn(move || {
            while let Some(line) = read_line_lossy(&mut stderr) {
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == crate::common::FAILURE_LOG_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        self.child = Some(child);
    }

    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", self.namespace])
            .args(args)
            .stdin(Stdio::null());
        command
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(args).output().expect("run ctr")
    }

    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports a one-layer busybox image (the image recipe's tree, root-owned)
    /// as [`IMAGE`].
    pub fn import_busybox(&self) {
        let work = self.dir.path().join("image");
        let tree = crate::common::root_owned_busybox(&work);
        let tar = Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(&tree)
            .args(["-cf", "-", "."])
            .output()
            .expect("tar the layer");
        assert!(tar.status.success());
        // Uncompressed, so the blob's digest is also its diff_id.
        let layer = blob(tar.stdout);
        let layout_dir = work.join("layout");
        let layout = Layout::new(layout_dir.clone());
        let mut descriptor =
            layout.manifest(&[&layer], config("amd64", &["PATH=/bin"], "/", &[&layer]));
        descriptor["annotations"] = json!({
            "io.containerd.image.name": IMAGE,
            "org.opencontainers.image.ref.name": "test",
        });
        std::fs::write(
            layout_dir.join("index.json"),
            json!({"schemaVersion": 2, "manifests": [descriptor]}).to_string(),
        )
        .expect("index.json");
        let archive = work.join("image.tar");
        let packed = Command::new("tar")
            .arg("-C")
            .arg(&layout_dir)
            .arg("-cf")
            .arg(&archive)
            .arg(".")
            .status()
            .expect("tar the layout");
        assert!(packed.success());
        self.ctr_ok(&["images", "import", &archive.display().to_string()]);
        assert!(self.ctr_ok(&["images", "ls", "-q"]).contains(IMAGE));
    }
}
