//! Root-only proof that the container sandbox spec from `runtime::spec` runs under
//! libcontainer on this host: it builds a busybox rootfs on an overlay (as the
//! daemon will), a network namespace owned by the host user namespace, runs the
//! spec with a shell script in place of the agent, checks what the sandbox saw,
//! and reports how long `build()` + `start()` take.
//!
//! Usage: `cargo run --example spec_smoke -- [RUNS] [--netns-in-spec]`
//! (as root; RUNS defaults to 20). `--netns-in-spec` instead puts the network
//! namespace path into the spec, to show libcontainer 0.7 failing on it.
//!
//! Everything it makes lives under /tmp/sandboxd-smoke-<pid> and the cgroup
//! `/sandboxd-smoke`, and is removed on exit, also on failure.

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{lchown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::default::DefaultExecutor;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::resource::{getrlimit, Resource};
use nix::sys::wait::waitpid;
use oci_spec::runtime::{LinuxNamespaceBuilder, LinuxNamespaceType};
use sandboxd::runtime::spec::{build_spec, enter_netns, ContainerSpecInput};

const UID_BASE: u32 = 100_000;
const ID_MAP_SIZE: u32 = 65_536;
const HOSTNAME: &str = "smoke-sbx";
const CGROUP_PARENT: &str = "sandboxd-smoke";
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

const APPLETS: &[&str] = &[
    "sh", "id", "cat", "ls", "echo", "unshare", "hostname", "readlink", "grep", "wc", "touch",
    "ip", "true", "df", "stat", "head",
];

/// What the sandbox runs instead of the agent. Lines starting with "CHECK " are
/// verified by `check_output`.
const SCRIPT: &str = r#"
echo "== id"; id
echo "== uid_map"; cat /proc/self/uid_map /proc/self/gid_map
echo "CHECK uid_map=$(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //')"
echo "CHECK hostname=$(hostname)"
echo "CHECK netns=$(readlink /proc/self/ns/net)"
echo "== /sys/fs/cgroup"; ls /sys/fs/cgroup 2>&1; echo "CHECK sys_entries=$(ls -A /sys | wc -l)"
if echo h 2>/dev/null > /proc/sysrq-trigger; then echo "CHECK sysrq=written"; else echo "CHECK sysrq=refused"; fi
echo "== unshare -U true"; if unshare -U true; then echo "CHECK unshare=ok"; else echo "CHECK unshare=refused"; fi
echo "== status"; grep -E '^(Uid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
echo "CHECK nnp=$(grep NoNewPrivs /proc/self/status | tr -d ' \t' | cut -d: -f2)"
echo "CHECK keys_bytes=$(wc -c < /proc/keys)"
echo "== mounts"; cat /proc/mounts
echo "== /dev"; ls -l /dev /dev/pts
echo "== agent"; ls -l /.sandboxd/agent
echo "CHECK nofile=$(ulimit -n)"
echo "CHECK core=$(ulimit -c)"
echo "== /proc/self/cgroup"; cat /proc/self/cgroup
echo "CHECK cgroup_paths=$(cut -d: -f3 /proc/self/cgroup | sort -u | tr '\n' ' ')"
if touch /tmp/x 2>/dev/null; then echo "CHECK tmp=writable"; else echo "CHECK tmp=readonly"; fi
if echo x 2>/dev/null > /etc/hosts; then echo "CHECK etc_hosts=writable"; else echo "CHECK etc_hosts=readonly"; fi
echo "== /dev/shm"; df /dev/shm
echo "== net"; ip link 2>&1
echo "CHECK done=yes"
"#;

fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spec_smoke: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Host-side fixture shared by all runs; its Drop undoes everything.
struct Fixture {
    base: PathBuf,
    merged: PathBuf,
    netns: PathBuf,
    overlay_mounted: bool,
    netns_mounted: bool,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.overlay_mounted {
            if let Err(e) = umount2(&self.merged, MntFlags::MNT_DETACH) {
                eprintln!("cleanup: umount {}: {e}", self.merged.display());
            }
        }
        if self.netns_mounted {
            if let Err(e) = umount2(&self.netns, MntFlags::MNT_DETACH) {
                eprintln!("cleanup: umount {}: {e}", self.netns.display());
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.base) {
            eprintln!("cleanup: rm -r {}: {e}", self.base.display());
        }
        // The per-run cgroups are removed by container.delete(); their parent is ours.
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let _ = fs::remove_dir(Path::new(root).join(CGROUP_PARENT));
        }
        if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
            for e in entries.flatten() {
                let _ = fs::remove_dir(e.path().join(CGROUP_PARENT));
            }
        }
    }
}

fn run() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("run me as root: libcontainer needs it to map ids and make cgroups");
    }
    let mut runs = 20usize;
    let mut netns_in_spec = false;
    for arg in std::env::args().skip(1) {
        if arg == "--netns-in-spec" {
            netns_in_spec = true;
        } else {
            runs = arg
                .parse()
                .with_context(|| format!("RUNS must be a number, got {arg:?}"))?;
        }
    }

    let base = PathBuf::from(format!("/tmp/sandboxd-smoke-{}", std::process::id()));
    let mut fx = Fixture {
        merged: base.join("merged"),
        netns: base.join("netns"),
        base,
        overlay_mounted: false,
        netns_mounted: false,
    };
    setup(&mut fx)?;

    if netns_in_spec {
        let r = run_once(&fx, 0, true);
        println!(
            "--netns-in-spec: {}",
            match &r {
                Ok(_) => "started (unexpected)".to_owned(),
                Err(e) => format!("failed as expected: {e:#}"),
            }
        );
        return Ok(());
    }

    let mut builds = Vec::new();
    let mut starts = Vec::new();
    let mut totals = Vec::new();
    for i in 0..runs.max(1) {
        let t = run_once(&fx, i, false)?;
        if i == 0 {
            println!("---- sandbox output (run 0) ----\n{}", t.output);
            println!("---- checks ----");
            check_output(&t.output, &fx.netns)?;
        } else if !t.output.contains("CHECK done=yes") {
            bail!("run {i}: script did not finish:\n{}", t.output);
        }
        builds.push(t.build);
        starts.push(t.start);
        totals.push(t.total);
    }
    println!(
        "---- timings over {} runs (median / min / max) ----",
        builds.len()
    );
    for (name, v) in [
        ("build()", &mut builds),
        ("start()", &mut starts),
        ("build()+start()", &mut totals),
    ] {
        v.sort();
        println!(
            "{name:>16}: {:>7.1} ms / {:>7.1} ms / {:>7.1} ms",
            ms(v[v.len() / 2]),
            ms(v[0]),
            ms(v[v.len() - 1])
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn setup(fx: &mut Fixture) -> Result<()> {
    let lower = fx.base.join("lower");
    let upper = fx.base.join("upper");
    let work = fx.base.join("work");
    for d in [
        &fx.base,
        &lower,
        &upper,
        &work,
        &fx.merged,
        &fx.base.join("state"),
    ] {
        fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
        fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
    }
    for d in ["bin", "proc", "dev", "sys", "etc", "root", "tmp"] {
        fs::create_dir_all(lower.join(d))?;
    }
    fs::set_permissions(lower.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::copy("/bin/busybox", lower.join("bin/busybox"))
        .context("copy /bin/busybox (apt install busybox-static)")?;
    for a in APPLETS {
        symlink("busybox", lower.join("bin").join(a))?;
    }
    fs::write(lower.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    fs::write(lower.join("etc/group"), "root:x:0:\ntty:x:5:\n")?;
    // The image is shifted into the sandbox's id range, as the daemon must do.
    for d in [&lower, &upper, &work] {
        chown_tree(d, UID_BASE, UID_BASE)?;
    }
    mount(
        Some("overlay"),
        &fx.merged,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(
            format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.display(),
                upper.display(),
                work.display()
            )
            .as_str(),
        ),
    )
    .context("mount overlay")?;
    fx.overlay_mounted = true;

    for (name, body) in [
        (
            "hosts",
            format!("127.0.0.1 localhost\n127.0.1.1 {HOSTNAME}\n"),
        ),
        ("resolv.conf", "nameserver 192.0.2.53\n".to_owned()),
        ("hostname", format!("{HOSTNAME}\n")),
    ] {
        let p = fx.base.join(name);
        fs::write(&p, body)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
    }

    // A network namespace owned by the host user namespace, pinned by a bind
    // mount. unshare(CLONE_NEWNET) affects only the calling thread, so a
    // throwaway thread does it and ends.
    File::create(&fx.netns)?;
    let netns = fx.netns.clone();
    std::thread::spawn(move || -> Result<()> {
        unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
        mount(
            Some("/proc/thread-self/ns/net"),
            &netns,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .context("bind-mount the netns")?;
        Ok(())
    })
    .join()
    .map_err(|_| anyhow!("netns thread panicked"))??;
    fx.netns_mounted = true;
    Ok(())
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> Result<()> {
    lchown(path, Some(uid), Some(gid)).with_context(|| format!("chown {}", path.display()))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}

struct RunResult {
    output: String,
    build: Duration,
    start: Duration,
    total: Duration,
}

fn run_once(fx: &Fixture, i: usize, netns_in_spec: bool) -> Result<RunResult> {
    let id = format!("smoke-{}-{i}", std::process::id());
    let (_, nofile_hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let input = ContainerSpecInput {
        hostname: HOSTNAME.to_owned(),
        rootfs: fx.merged.clone(),
        agent_binary: "/bin/busybox".into(),
        netns_path: fx.netns.clone(),
        cgroups_path: format!("/{CGROUP_PARENT}/{id}"),
        cpu_cores: 0.5,
        cpu_shares: None,
        denied_huge_page_sizes: sandboxd::runtime::cgroups::huge_page_sizes_to_deny(),
        memory_bytes: 256 << 20,
        pids_max: 128,
        host_uid_base: UID_BASE,
        host_gid_base: UID_BASE,
        id_map_size: ID_MAP_SIZE,
        shm_bytes: 64 << 20,
        env: vec![
            "PATH=/bin".to_owned(),
            "HOME=/root".to_owned(),
            "LANG=C.UTF-8".to_owned(),
            "TZ=UTC".to_owned(),
        ],
        etc_hosts: fx.base.join("hosts"),
        etc_resolv_conf: fx.base.join("resolv.conf"),
        etc_hostname: fx.base.join("hostname"),
        nofile: nofile_hard.min(65_536),
        grant: Default::default(),
    };
    let mut spec = build_spec(&input)?;
    if let Some(p) = spec.process_mut() {
        p.set_args(Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]));
    }
    if netns_in_spec {
        if let Some(ns) = spec
            .linux_mut()
            .as_mut()
            .and_then(|l| l.namespaces_mut().as_mut())
        {
            ns.push(
                LinuxNamespaceBuilder::default()
                    .typ(LinuxNamespaceType::Network)
                    .path(fx.netns.clone())
                    .build()?,
            );
        }
    }
    let cgroups_path = input.cgroups_path.clone();
    let bundle = fx.base.join("bundles").join(&id);
    fs::create_dir_all(&bundle)?;
    spec.save(bundle.join("config.json"))?;

    let (out_r, out_w) = nix::unistd::pipe()?;
    let err_w = out_w.try_clone()?;
    let devnull: OwnedFd = File::open("/dev/null")?.into();
    let netns = fx.netns.clone();
    let state = fx.base.join("state");

    // libcontainer clones from the calling thread, so this thread's network
    // namespace is the sandbox's.
    let launched = std::thread::spawn(move || -> Result<_> {
        enter_netns(&netns)?;
        let t0 = Instant::now();
        let mut c = ContainerBuilder::new(id, SyscallType::default())
            .with_root_path(&state)
            .map_err(|e| anyhow!("with_root_path: {e:?}"))?
            .with_executor(DefaultExecutor {})
            .with_stdin(devnull)
            .with_stdout(out_w)
            .with_stderr(err_w)
            .as_init(&bundle)
            .with_systemd(false)
            .with_detach(true)
            .build()
            .map_err(|e| anyhow!("build: {e:?}"))?;
        let build = t0.elapsed();
        let t1 = Instant::now();
        let started = c.start().map_err(|e| anyhow!("start: {e:?}"));
        let start = t1.elapsed();
        Ok((c, started, build, start, t0.elapsed()))
    })
    .join()
    .map_err(|_| anyhow!("launcher thread panicked"))?;
    // Read the sandbox's output on a side thread so a hung sandbox cannot hang us.
    // It also carries libcontainer's own log lines from the init process, whose
    // stderr is the sandbox's.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let r = File::from(out_r).read_to_string(&mut s).map(|_| s);
        let _ = tx.send(r);
    });
    let (mut container, started, build, start, total) = match launched {
        Ok(l) => l,
        Err(e) => {
            let said = match rx.recv_timeout(RUN_TIMEOUT) {
                Ok(Ok(s)) => s,
                _ => String::new(),
            };
            return Err(e.context(format!("the init process said:\n{said}")));
        }
    };
    let started_ok = started.is_ok();
    let output = match started {
        Ok(()) => match rx.recv_timeout(RUN_TIMEOUT) {
            Ok(r) => r.context("reading sandbox output")?,
            Err(_) => "<timed out waiting for the sandbox to finish>".to_owned(),
        },
        Err(e) => format!("<start failed: {e:#}>"),
    };

    if i == 0 && started_ok {
        print_host_cgroup(&cgroups_path);
    }

    // The init process is our child (libcontainer clones it as a sibling of its
    // intermediate process): reap it, then let libcontainer kill anything left,
    // remove the cgroup and its state directory.
    if let Some(pid) = container.pid() {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
    container
        .delete(true)
        .map_err(|e| anyhow!("delete: {e:?}"))?;
    Ok(RunResult {
        output,
        build,
        start,
        total,
    })
}

/// Prints the limits as the host's cgroup files have them (v1 or v2).
fn print_host_cgroup(cgroups_path: &str) {
    let rel = cgroups_path.trim_start_matches('/');
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let files: Vec<PathBuf> = if v2 {
        ["cpu.max", "memory.max", "memory.swap.max", "pids.max"]
            .iter()
            .map(|f| Path::new("/sys/fs/cgroup").join(rel).join(f))
            .collect()
    } else {
        [
            ("cpu", "cpu.cfs_quota_us"),
            ("cpu", "cpu.cfs_period_us"),
            ("memory", "memory.limit_in_bytes"),
            ("memory", "memory.memsw.limit_in_bytes"),
            ("memory", "memory.swappiness"),
            ("memory", "memory.oom_control"),
            ("pids", "pids.max"),
            ("devices", "devices.list"),
        ]
        .iter()
        .map(|(c, f)| Path::new("/sys/fs/cgroup").join(c).join(rel).join(f))
        .collect()
    };
    println!(
        "---- host cgroup files ({}) ----",
        if v2 { "v2" } else { "v1" }
    );
    for f in files {
        match fs::read_to_string(&f) {
            Ok(v) => println!("{}: {}", f.display(), v.trim().replace('\n', " | ")),
            Err(e) => println!("{}: <{e}>", f.display()),
        }
    }
}

fn check_output(out: &str, netns: &Path) -> Result<()> {
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("CHECK ")?.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("<missing>")
            .trim()
            .to_owned()
    };
    let netns_ino = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(netns)?.ino()
    };
    let expect_netns = format!("net:[{netns_ino}]");
    let checks: Vec<(&str, bool, String)> = vec![
        (
            "uid 0 maps to host 100000 x 65536",
            get("uid_map") == "0 100000 65536",
            get("uid_map"),
        ),
        ("hostname set", get("hostname") == HOSTNAME, get("hostname")),
        (
            "joined the daemon's netns",
            get("netns") == expect_netns,
            format!("{} (want {expect_netns})", get("netns")),
        ),
        (
            "/sys is empty (no cgroupfs, no sysfs)",
            get("sys_entries") == "0",
            get("sys_entries"),
        ),
        (
            "/proc/sysrq-trigger read-only",
            get("sysrq") == "refused",
            get("sysrq"),
        ),
        (
            "unshare -U refused",
            get("unshare") == "refused",
            get("unshare"),
        ),
        ("no_new_privs set", get("nnp") == "1", get("nnp")),
        (
            "/proc/keys masked (/dev/null)",
            get("keys_bytes") == "0",
            get("keys_bytes"),
        ),
        ("RLIMIT_CORE 0", get("core") == "0", get("core")),
        (
            "cgroup namespace: every hierarchy is /",
            get("cgroup_paths") == "/",
            get("cgroup_paths"),
        ),
        (
            "/tmp writable (overlay)",
            get("tmp") == "writable",
            get("tmp"),
        ),
        (
            "/etc/hosts read-only",
            get("etc_hosts") == "readonly",
            get("etc_hosts"),
        ),
        ("script finished", get("done") == "yes", get("done")),
    ];
    let mut failed = 0;
    for (name, ok, seen) in &checks {
        println!("{} {name}: {seen}", if *ok { "PASS" } else { "FAIL" });
        failed += usize::from(!ok);
    }
    if failed > 0 {
        bail!("{failed} check(s) failed");
    }
    Ok(())
}
