//! Root-only: containerd runs tasks as sandboxd sandboxes through
//! `containerd-shim-sandboxd-v2`. The test starts Debian's containerd with
//! its own root, state and socket (the packaged service stays off), imports
//! a busybox image it builds, and drives it with `ctr` as a user would.

mod common;
#[path = "common/oci.rs"]
mod oci;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::Daemon;
use hyper::Method;
use oci::{blob, config, Layout};
use serde_json::json;

const RUNTIME: &str = "io.containerd.sandboxd.v2";
const IMAGE: &str = "docker.io/library/sbx-busybox:test";

fn shim_binary() -> PathBuf {
    let shim = Path::new(common::DAEMON).with_file_name("containerd-shim-sandboxd-v2");
    assert!(
        shim.exists(),
        "{} is missing: build it with `cargo build --bins`",
        shim.display()
    );
    shim
}

/// A containerd of the test's own: root, state and sockets in a temp dir,
/// CRI off, the shim's directory first on its PATH and the daemon's socket
/// in its environment (which the shims it starts inherit).
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The snapshotter's mounts of tasks that were not removed.
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.path().join("root"))
            .status();
    }
}

impl Containerd {
    fn start(daemon: &Daemon) -> Containerd {
        // Under /var/tmp: overlayfs snapshots need a real filesystem.
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
                root = dir.path().join("root").display(),
                state = dir.path().join("state").display(),
                sock = dir.path().join("containerd.sock").display(),
            ),
        )
        .expect("config");
        let path = format!(
            "{}:{}",
            shim_binary().parent().expect("dir").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .env("SANDBOXD_SOCKET", &daemon.socket)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start containerd (install-deps installs it)");
        // Its log says when it serves; keep draining it after that.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let booted = line.contains("containerd successfully booted");
                    seen.push(line);
                    if booted {
                        break;
                    }
                }
                _ => panic!("containerd exited before it served:\n{}", seen.join("\n")),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Containerd { dir, child }
    }

    fn ctr_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(["--namespace", "sbx"])
            .args(args)
            .stdin(Stdio::null());
        command
    }

    fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(args).output().expect("run ctr")
    }

    fn ctr_ok(&self, args: &[&str]) -> String {
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
    fn import_busybox(&self) {
        let work = self.dir.path().join("image");
        let tree = work.join("tree");
        let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("rootfs/images/busybox.sh");
        let built = Command::new("bash")
            .arg(&recipe)
            .arg(&tree)
            .output()
            .expect("recipe");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
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

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn sandboxes(daemon: &Daemon) -> Vec<serde_json::Value> {
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    list["sandboxes"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn ctr_runs_tasks_as_sandboxes_with_output_exit_codes_exec_kill_and_nothing_left() {
    require_host!();
    let daemon = Daemon::start();
    let containerd = Containerd::start(&daemon);
    containerd.import_busybox();

    // Output reaches ctr and the exit code comes back; inside, it is a
    // sandbox: root of the image under shifted ids, its own hostname.
    let ran = containerd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-run",
        "sh",
        "-c",
        "echo hello from $(hostname); cat /proc/self/uid_map; ls /bin/busybox; exit 3",
    ]);
    let said = text(&ran);
    assert_eq!(ran.status.code(), Some(3), "{said}");
    assert!(said.contains("hello from sb-"), "{said}");
    assert!(
        said.contains("100000"),
        "the sandbox's user namespace: {said}"
    );
    assert!(said.contains("/bin/busybox"), "{said}");
    assert!(
        sandboxes(&daemon).await.is_empty(),
        "--rm removed the sandbox"
    );

    // A long task: exec into it, then kill it from outside. ctr stays
    // attached, so its first line says the task runs and its exit says
    // the kill arrived.
    let mut attached = containerd.ctr_command(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-long",
        "sh",
        "-c",
        "echo ready; exec sleep 1000",
    ]);
    attached.stdout(Stdio::piped());
    let mut attached = attached.spawn().expect("ctr run");
    let mut first = String::new();
    BufReader::new(attached.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read ctr's output");
    assert_eq!(first, "ready\n");
    let live = sandboxes(&daemon).await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["labels"]["containerd.io/id"], "t-long", "{live:?}");
    assert_eq!(live[0]["image"], "host-rootfs", "{live:?}");
    let exec = containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "t-long",
        "sh",
        "-c",
        "echo from exec; exit 5",
    ]);
    assert_eq!(exec.status.code(), Some(5), "{}", text(&exec));
    assert!(text(&exec).contains("from exec"), "{}", text(&exec));
    let tasks = containerd.ctr_ok(&["task", "ls"]);
    assert!(
        tasks.contains("t-long") && tasks.contains("RUNNING"),
        "{tasks}"
    );

    containerd.ctr_ok(&["task", "kill", "t-long"]);
    let ended = attached.wait().expect("ctr run ends");
    assert_eq!(ended.code(), Some(143), "SIGTERM's status reaches ctr");
    assert!(
        sandboxes(&daemon).await.is_empty(),
        "--rm removed the sandbox"
    );
    assert!(!containerd
        .ctr_ok(&["containers", "ls", "-q"])
        .contains("t-long"));

    // What sandboxd cannot honour is refused naming the field.
    let refused = containerd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "--net-host",
        IMAGE,
        "t-host",
        "true",
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("linux.namespaces"),
        "{}",
        text(&refused)
    );
    assert!(sandboxes(&daemon).await.is_empty());

    // Nothing of the sandboxes is left mounted (the overlay was the
    // sandbox's, under the daemon's run dir).
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let run = daemon.run_dir().join("sandboxes").display().to_string();
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(&run) && l.contains("overlay")),
        "{mounts}"
    );
}
