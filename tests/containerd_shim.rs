//! Root-only: containerd runs tasks as sandboxd sandboxes through
//! `containerd-shim-sandboxd-v2`. The test starts Debian's containerd with
//! its own root, state and socket (the packaged service stays off), imports
//! a busybox image it builds, and drives it with `ctr` as a user would.

mod common;
#[path = "common/containerd.rs"]
mod containerd;
#[path = "common/oci.rs"]
mod oci;

use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::Daemon;
use containerd::{Containerd, IMAGE, RUNTIME};
use serde_json::json;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Spawns `ctr` (a `ctr run` of a task that prints `ready` first) and
/// returns it once that line came.
fn started_saying_ready(mut ctr: std::process::Command, daemon: &Daemon) -> std::process::Child {
    ctr.stdout(Stdio::piped());
    let mut attached = ctr.spawn().expect("ctr run");
    let mut first = String::new();
    BufReader::new(attached.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read ctr's output");
    assert_eq!(first, "ready\n", "{}", daemon.log());
    attached
}

/// Counts the tasks' `sleep 1000` and `sleep 1001` in a sandbox.
const SLEEPERS: &str = "ps -o args | grep -c '^sleep 100[01]$'";

/// A task's processes end with its init, as under runc: what it left
/// running in the background too. The task runs detached (with `extra`
/// ctr flags), so that it stays once ended (ctr run deletes it) for a
/// look; an exec ends its init.
async fn assert_leftovers_end_with_the_init(
    containerd: &Containerd,
    daemon: &Daemon,
    extra: &[&str],
) {
    let mut run = vec!["run", "-d", "--runtime", RUNTIME];
    run.extend(extra);
    run.extend([
        IMAGE,
        "t-leaves",
        "sh",
        "-c",
        "sleep 1001 >/dev/null 2>&1 & echo $$ > /tmp/init; exec sleep 1000",
    ]);
    containerd.ctr_ok(&run);
    // `ctr task ps` lists the sandbox's running processes by their pids
    // inside it: here the init alone (what it starts itself is not
    // sandboxd's process).
    let ps = containerd.ctr_ok(&["task", "ps", "t-leaves"]);
    let pids: Vec<u32> = ps
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 1, "{ps}");
    let exits = TaskExits::follow(containerd);
    exits.heard_live(containerd, "t-leaves");
    let _ = containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "end",
        "t-leaves",
        "sh",
        "-c",
        "until [ -s /tmp/init ]; do sleep 0.02; done; kill $(cat /tmp/init)",
    ]);
    // The init's exit as containerd hears of it (not the exec's).
    let init_exit = exits.of("t-leaves");
    assert!(init_exit.contains(r#""exit_status":143"#), "{init_exit}");
    let live = daemon.sandboxes().await;
    let stopped = live[0]["id"].as_str().expect("the ended task's sandbox");
    assert_eq!(daemon.sh(stopped, SLEEPERS).await.out(), "0\n");
    let gone = stopped.to_string();
    let hierarchies = common::cgroup::hierarchies_or_fail();
    let groups_of = |id: &str| -> Vec<std::path::PathBuf> {
        hierarchies
            .iter()
            .flat_map(|h| std::fs::read_dir(h).into_iter().flatten().flatten())
            .map(|e| e.path().join(id))
            .filter(|p| p.exists())
            .collect()
    };
    assert!(
        !groups_of(&gone).is_empty(),
        "positive control: the sandbox's groups are found while it lives"
    );
    let mounts_of = |id: &str| -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter(|l| l.contains(id))
            .map(str::to_string)
            .collect()
    };
    assert!(
        !mounts_of(&gone).is_empty(),
        "positive control: the sandbox's network namespace is mounted while it lives"
    );
    containerd.ctr_ok(&["task", "rm", "t-leaves"]);
    containerd.ctr_ok(&["containers", "rm", "t-leaves"]);
    assert!(daemon.sandboxes().await.is_empty());
    assert_eq!(
        groups_of(&gone),
        Vec::<std::path::PathBuf>::new(),
        "cgroups left"
    );
    assert_eq!(mounts_of(&gone), Vec::<String>::new(), "mounts left");
}

/// `ctr task exec` into running `task`: its output and exit code come back.
fn assert_exec_answers(containerd: &Containerd, task: &str) {
    let exec = containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        task,
        "sh",
        "-c",
        "echo from exec; exit 5",
    ]);
    assert_eq!(exec.status.code(), Some(5), "{}", text(&exec));
    assert!(text(&exec).contains("from exec"), "{}", text(&exec));
}

/// The value of the brokered secret the long task binds.
const SHIM_KEY_VALUE: &str = "sk-shim-test-real-value";

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
        daemon.sandboxes().await.is_empty(),
        "--rm removed the sandbox"
    );

    // A long task: exec into it, then kill it from outside. ctr stays
    // attached, so its first line says the task runs and its exit says
    // the kill arrived. It binds a brokered secret by annotation.
    let (status, made) = daemon
        .call(
            hyper::Method::POST,
            "/v1/secrets",
            Some(
                json!({"name": "SHIM_KEY", "value": SHIM_KEY_VALUE, "hosts": ["api.example.test"]}),
            ),
        )
        .await;
    assert!(status.is_success(), "{made}");
    let attached = containerd.ctr_command(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "--annotation",
        "sandboxd.io/secrets=SHIM_KEY",
        "--annotation",
        "sandboxd.io/allow-list=pypi.org,example.com",
        "--annotation",
        "sandboxd.io/ttl-seconds=600",
        "--memory-limit",
        "268435456",
        IMAGE,
        "t-long",
        "sh",
        "-c",
        "echo ready; exec sleep 1000",
    ]);
    let mut attached = started_saying_ready(attached, &daemon);
    let live = daemon.sandboxes().await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["labels"]["containerd.io/id"], "t-long", "{live:?}");
    assert_eq!(live[0]["image"], "host-rootfs", "{live:?}");
    let sandbox = live[0]["id"].as_str().expect("id").to_string();
    assert!(
        common::cgroup::sandbox_dir("pids", &sandbox).exists(),
        "the task's sandbox has its cgroup while it runs"
    );
    // Annotations and the spec's limits reached the sandbox.
    assert_eq!(live[0]["ttl_seconds"], 600, "{live:?}");
    assert_eq!(live[0]["limits"]["memory_mib"], 256, "{live:?}");
    assert_eq!(
        live[0]["network"]["allow_list"],
        json!(["pypi.org", "example.com"]),
        "{live:?}"
    );
    assert_exec_answers(&containerd, "t-long");
    // The task's processes see the secret's placeholder, never its value.
    let key = containerd.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "key",
        "t-long",
        "sh",
        "-c",
        "echo $SHIM_KEY",
    ]);
    assert!(key.starts_with("sandboxd-placeholder-"), "{key}");
    assert!(!key.contains(SHIM_KEY_VALUE), "{key}");
    let tasks = containerd.ctr_ok(&["task", "ls"]);
    assert!(
        tasks.contains("t-long") && tasks.contains("RUNNING"),
        "{tasks}"
    );
    // Task metrics are the sandbox's, read from its cgroups by sandboxd.
    let metrics = containerd.ctr_ok(&["task", "metrics", "t-long"]);
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert_eq!(value("memory.limit_in_bytes"), "268435456", "{metrics}");
    assert!(
        value("memory.usage_in_bytes").parse::<u64>().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert!(
        value("pids.current").parse::<u64>().unwrap_or(0) >= 2,
        "{metrics}"
    );

    assert_eq!(
        daemon.sh(&sandbox, SLEEPERS).await.out(),
        "1\n",
        "positive control: the task's sleep is seen"
    );
    containerd.ctr_ok(&["task", "kill", "t-long"]);
    let ended = attached.wait().expect("ctr run ends");
    assert_eq!(ended.code(), Some(143), "SIGTERM's status reaches ctr");
    assert!(
        daemon.sandboxes().await.is_empty(),
        "--rm removed the sandbox"
    );
    assert!(!containerd
        .ctr_ok(&["containers", "ls", "-q"])
        .contains("t-long"));
    assert!(
        !common::cgroup::sandbox_dir("pids", &sandbox).exists(),
        "no cgroup of the task's sandbox is left"
    );

    assert_leftovers_end_with_the_init(&containerd, &daemon, &[]).await;

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
    assert!(daemon.sandboxes().await.is_empty());

    // A task's bind mounts (`ctr run --mount`) are its sandbox's volumes:
    // read-only where asked, its writes elsewhere landing on the host.
    let given = tempfile::tempdir_in("/var/tmp").expect("a volume");
    std::fs::write(given.path().join("seed"), "seeded\n").unwrap();
    let taken = tempfile::tempdir_in("/var/tmp").expect("a volume");
    let bind = |dir: &std::path::Path, dst: &str, mode: &str| {
        format!(
            "type=bind,src={},dst={dst},options=rbind:{mode}",
            dir.display()
        )
    };
    let ran = containerd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "--mount",
        &bind(given.path(), "/in", "ro"),
        "--mount",
        &bind(taken.path(), "/out", "rw"),
        IMAGE,
        "t-mounts",
        "sh",
        "-c",
        "cat /in/seed; echo x > /in/new 2>/dev/null; echo ro=$?; echo done > /out/result",
    ]);
    let said = text(&ran);
    assert_eq!(ran.status.code(), Some(0), "{said}");
    assert!(said.contains("seeded\nro=1\n"), "{said}");
    assert_eq!(
        std::fs::read_to_string(taken.path().join("result")).unwrap(),
        "done\n"
    );
    assert!(!given.path().join("new").exists());
    assert!(daemon.sandboxes().await.is_empty());

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

#[tokio::test]
async fn tasks_outlive_restarts_of_sandboxd_and_containerd_and_a_dead_shim_is_cleaned_up() {
    require_host!();
    let mut daemon = Daemon::start();
    let mut containerd = Containerd::start(&daemon);
    containerd.import_busybox();

    // A process killed from inside: its status reaches ctr.
    let killed = containerd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-self",
        "sh",
        "-c",
        "kill -9 $$",
    ]);
    assert_eq!(killed.status.code(), Some(137), "{}", text(&killed));

    containerd.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-kept",
        "sleep",
        "1000",
    ]);
    let exec_says = |containerd: &Containerd, exec_id: &str| {
        let out = containerd.ctr(&[
            "task",
            "exec",
            "--exec-id",
            exec_id,
            "t-kept",
            "echo",
            exec_id,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(exec_says(&containerd, "before"), "before\n");
    // A task that ends, with its own status, once told to: after the
    // restart below.
    containerd.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-ends",
        "sh",
        "-c",
        "mkfifo /tmp/go 2>/dev/null; read go < /tmp/go; exit 7",
    ]);
    let exits = TaskExits::follow(&containerd);
    exits.heard_live(&containerd, "t-ends");

    // sandboxd restarts under the tasks: containerd sees nothing of it.
    daemon.restart();
    assert_eq!(exec_says(&containerd, "after-sandboxd"), "after-sandboxd\n");
    // A task's exit after the restart still reaches containerd, with its
    // status (the shim's wait resumed against the new daemon).
    containerd.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "go",
        "t-ends",
        "timeout",
        "30",
        "sh",
        "-c",
        "echo go > /tmp/go",
    ]);
    let ended = exits.of("t-ends");
    assert!(ended.contains(r#""exit_status":7"#), "{ended}");
    containerd.ctr_ok(&["task", "rm", "t-ends"]);
    containerd.ctr_ok(&["containers", "rm", "t-ends"]);
    // containerd restarts: it reattaches to the live shim.
    containerd.restart();
    let tasks = containerd.ctr_ok(&["task", "ls"]);
    assert!(
        tasks.contains("t-kept") && tasks.contains("RUNNING"),
        "{tasks}"
    );
    assert_eq!(
        exec_says(&containerd, "after-containerd"),
        "after-containerd\n"
    );

    // The shim dies: containerd sees the task exit and its cleanup
    // (`shim delete`) removes the sandbox.
    let live = daemon.sandboxes().await;
    assert_eq!(live.len(), 1, "{live:?}");
    let sandbox = live[0]["id"].as_str().expect("id").to_string();
    let mut events = daemon.follow_events(0).await;
    let address = containerd.socket().display().to_string();
    let shims = common::processes_where(|_, argv| {
        argv.first()
            .is_some_and(|a| a.ends_with("containerd-shim-sandboxd-v2"))
            && argv.contains(&address.as_str())
    });
    assert_eq!(shims.len(), 1, "one shim serves the task: {shims:?}");
    let exits = TaskExits::follow(&containerd);
    exits.heard_live(&containerd, "t-kept");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shims[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the shim");
    events
        .until(Duration::from_secs(60), |e| {
            e["kind"] == "deleted" && e["sandbox_id"] == sandbox.as_str()
        })
        .await;
    // containerd publishes the dead shim's task as exited.
    let ended = exits.of("t-kept");
    assert!(ended.contains("exit_status"), "{ended}");
    let tasks = containerd.ctr_ok(&["task", "ls"]);
    assert!(!tasks.contains("RUNNING"), "{tasks}");
    assert!(daemon.sandboxes().await.is_empty());
}

/// The `/tasks/exit` events containerd publishes, from `ctr events`
/// started now.
struct TaskExits {
    events: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl TaskExits {
    fn follow(containerd: &Containerd) -> Self {
        let mut events = containerd.ctr_command(&["events"]);
        events.stdout(Stdio::piped());
        let mut events = events.spawn().expect("ctr events");
        let stdout = events.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("/tasks/exit") && send.send(line).is_err() {
                    break;
                }
            }
        });
        Self { events, lines }
    }

    /// Returns once the events are followed: an exec in `task` ends and
    /// its exit event is heard, so no later exit can go unheard. `ctr
    /// events` may subscribe after the first canary ended, so each try
    /// is a new exec.
    fn heard_live(&self, containerd: &Containerd, task: &str) {
        for attempt in 0..30 {
            let id = format!("canary-{attempt}");
            containerd.ctr_ok(&["task", "exec", "--exec-id", &id, task, "true"]);
            if self.within(&id, Duration::from_secs(1)).is_some() {
                return;
            }
        }
        panic!("ctr events never heard a canary exec of {task} end");
    }

    /// The exit event of task `id` (its init) or of an exec of that id,
    /// waited for up to a minute.
    fn of(&self, id: &str) -> String {
        self.within(id, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("no exit event of {id} from containerd"))
    }

    fn within(&self, id: &str, wait: Duration) -> Option<String> {
        let wanted = format!(r#""id":"{id}""#);
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(&wanted) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

impl Drop for TaskExits {
    fn drop(&mut self) {
        let _ = self.events.kill();
        let _ = self.events.wait();
    }
}

/// Runs `ctr args` on a terminal of `rows` x `cols` (ctr -t reads its
/// console from its stdio); returns everything it wrote there, and its
/// exit status.
fn ctr_on_terminal(
    containerd: &Containerd,
    args: &[&str],
    rows: u16,
    cols: u16,
) -> (Option<i32>, String) {
    use std::io::Read;
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
    let slave = || Stdio::from(pty.slave.try_clone().expect("dup the terminal"));
    let mut command = containerd.ctr_command(args);
    command.stdin(slave()).stdout(slave()).stderr(slave());
    let mut child = command.spawn().expect("run ctr");
    drop(command);
    drop(pty.slave);
    // The master reads until every copy of the slave is closed (EIO).
    let mut master = std::fs::File::from(pty.master);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let status = child.wait().expect("wait for ctr");
    (status.code(), String::from_utf8_lossy(&seen).into_owned())
}

/// Prints the terminal's size once it is not the size it starts with: ctr
/// sends its console's size (ResizePty) after the process started, so the
/// process waits for the SIGWINCH that brings it (at most 10 s), then
/// exits 5.
const AWAIT_RESIZE: &str = "trap 'stty size; exit 5' WINCH; \
    [ \"$(stty size)\" != '24 80' ] && { stty size; exit 5; }; \
    for i in $(seq 100); do sleep 0.1 & wait; done; echo no resize; exit 9";

#[tokio::test]
async fn a_task_on_a_terminal_gets_a_terminal_of_its_consoles_size() {
    require_host!();
    let daemon = Daemon::start();
    let containerd = Containerd::start(&daemon);
    containerd.import_busybox();
    let (code, said) = ctr_on_terminal(
        &containerd,
        &[
            "run",
            "--rm",
            "-t",
            "--runtime",
            RUNTIME,
            IMAGE,
            "t-tty",
            "sh",
            "-c",
            &format!("tty; {AWAIT_RESIZE}"),
        ],
        33,
        101,
    );
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains("/dev/pts/"), "a terminal inside: {said}");
    assert!(
        said.contains("33 101"),
        "ctr's console size reached it (ResizePty): {said}"
    );
    // An exec on a terminal too, in a task without one (the positive
    // control: the task's own stdout is no terminal).
    let started = containerd.ctr(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        IMAGE,
        "t-tty2",
        "sleep",
        "600",
    ]);
    assert!(started.status.success(), "{}", text(&started));
    let plain = containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "t-tty2",
        "sh",
        "-c",
        "tty; true",
    ]);
    assert!(text(&plain).contains("not a tty"), "{}", text(&plain));
    let (code, said) = ctr_on_terminal(
        &containerd,
        &[
            "task",
            "exec",
            "-t",
            "--exec-id",
            "e2",
            "t-tty2",
            "sh",
            "-c",
            AWAIT_RESIZE,
        ],
        17,
        61,
    );
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains("17 61"), "{said}");
    containerd.ctr_ok(&["task", "rm", "-f", "t-tty2"]);
    containerd.ctr_ok(&["container", "rm", "t-tty2"]);
    assert!(daemon.sandboxes().await.is_empty());
}

/// `sandboxd.io/runtime: vm`: the task's snapshot boots as the disk of a
/// Linux microVM. Linux needs VMX or SVM; scripts/nested-tests.sh runs
/// this in the nested host.
#[tokio::test]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn ctr_runs_a_task_annotated_vm_as_a_linux_microvm() {
    let Some(daemon) = common::linux_vm::linux_vm_daemon(&[]) else {
        return;
    };
    let containerd = Containerd::start(&daemon);
    containerd.import_busybox();
    let vm = ["--annotation", "sandboxd.io/runtime=vm"];

    // Output and exit code come back; inside, the guest kernel runs the
    // agent as init (a container would see the host's command line). Its
    // bind mount is copied into the guest, read-only as asked; what the
    // guest writes to a writable one stays there.
    let given = tempfile::tempdir_in("/var/tmp").expect("a volume");
    std::fs::write(given.path().join("seed"), "seeded\n").expect("seed");
    let scratch = tempfile::tempdir_in("/var/tmp").expect("a volume");
    let mounts = [
        format!(
            "type=bind,src={},dst=/in,options=rbind:ro",
            given.path().display()
        ),
        format!(
            "type=bind,src={},dst=/out,options=rbind:rw",
            scratch.path().display()
        ),
    ];
    let mut run = vec!["run", "--rm", "--runtime", RUNTIME];
    run.extend(vm);
    let ran = containerd.ctr(
        &[
            &run[..],
            &["--mount", &mounts[0], "--mount", &mounts[1]],
            &[
                IMAGE,
                "t-vm",
                "sh",
                "-c",
                "cat /proc/cmdline; ls /bin/busybox; cat /in/seed; \
                 echo x > /in/new 2>/dev/null; echo ro=$?; echo kept > /out/f && cat /out/f; exit 3",
            ],
        ]
        .concat(),
    );
    let said = text(&ran);
    assert_eq!(ran.status.code(), Some(3), "{said}\n{}", daemon.log());
    assert!(said.contains("init=/sandbox-agent"), "{said}");
    assert!(said.contains("/bin/busybox"), "{said}");
    assert!(
        said.contains("seeded\nro=1\nkept\n"),
        "the volumes in the guest: {said}"
    );
    assert!(
        !scratch.path().join("f").exists(),
        "the guest's writes stay in it"
    );
    assert!(daemon.sandboxes().await.is_empty(), "--rm removed it");

    // A long task of the same image: exec into it, kill it from outside.
    // Its read-only volume follows the host (the copy is brought up to
    // date in place).
    let mut long = run.clone();
    long.extend([
        "--mount",
        &mounts[0],
        IMAGE,
        "t-vm-long",
        "sh",
        "-c",
        "echo ready; exec sleep 1000",
    ]);
    let mut attached = started_saying_ready(containerd.ctr_command(&long), &daemon);
    let live = daemon.sandboxes().await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["runtime"], "vm", "{live:?}");
    assert_eq!(live[0]["image"], "host-rootfs", "{live:?}");
    let sandbox = live[0]["id"].as_str().expect("id").to_string();
    assert_exec_answers(&containerd, "t-vm-long");
    std::fs::write(given.path().join("later"), "written later\n").expect("a host write");
    // No event of the guest's reaches the test: the guest looks, up to 30 s.
    let looked = containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "t-vm-long",
        "sh",
        "-c",
        "i=0; until grep -q 'written later' /in/later 2>/dev/null || [ $i -ge 300 ]; do \
         i=$((i+1)); sleep 0.1; done; \
         cat /in/seed /in/later; grep -c ' /run/sandboxd/scratch ' /proc/mounts || true",
    ]);
    assert!(looked.status.success(), "{}", text(&looked));
    assert_eq!(
        text(&looked),
        "seeded\nwritten later\n0\n",
        "the host's later file in the task's volume, and no scratch mount left in its view"
    );
    assert_eq!(
        daemon.sh(&sandbox, SLEEPERS).await.out(),
        "1\n",
        "positive control: the task's sleep is seen"
    );
    containerd.ctr_ok(&["task", "kill", "t-vm-long"]);
    let ended = attached.wait().expect("ctr run ends");
    assert_eq!(ended.code(), Some(143), "SIGTERM's status reaches ctr");
    assert!(!containerd
        .ctr_ok(&["containers", "ls", "-q"])
        .contains("t-vm-long"));
    common::linux_vm::assert_nothing_left(&daemon, &[&sandbox]).await;
    assert_leftovers_end_with_the_init(&containerd, &daemon, &vm).await;

    // Both tasks booted one disk of the image (their upperdirs empty).
    let disks: Vec<String> = std::fs::read_dir(common::images_dir().join("vm-disks"))
        .expect("vm-disks")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("host-") && n.ends_with(".ext4"))
        .collect();
    assert_eq!(disks.len(), 1, "{disks:?}");
}
