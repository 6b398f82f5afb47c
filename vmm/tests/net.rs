//! virtio-net on real KVM, set up exactly as the daemon will: a network
//! namespace holding a persistent tap `tap0` (vnet_hdr) with MAC
//! 06:00:0a:c9:00:01 and 10.201.0.1/30, up, and a static neighbour for the
//! guest (10.201.0.2, 06:00:0a:c9:00:02). The VM is built on a thread that
//! entered that namespace, so the vmm attaches to the namespace's tap; the
//! test guest's `net-syn` built-in (guest/net.c) is driven through the agent
//! protocol. Also the binary's `--net` errors.

mod common;

use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{guest, Agent, Captured};
use sandbox_proto::AGENT_VSOCK_PORT;
use vmm::config::{NetConfig, VsockConfig};
use vmm::devices::virtio::net::DEFAULT_GUEST_MAC;
use vmm::VmConfig;

/// A network namespace, deleted when dropped (the tap in it goes with it).
struct Netns(String);

impl Netns {
    /// A new namespace with the daemon's tap in it, or `None` (with the
    /// reason printed) where namespaces or taps cannot be made.
    fn with_tap() -> Option<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "vmmnet-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let status = Command::new("ip").args(["netns", "add", &name]).status();
        if !matches!(status, Ok(s) if s.success()) {
            common::note_skip!(
                common::Reason::NoNetns,
                "cannot create a network namespace (root and iproute2 needed)"
            );
            return None;
        }
        let ns = Netns(name);
        for args in [
            "link set lo up",
            "tuntap add dev tap0 mode tap vnet_hdr",
            "link set tap0 address 06:00:0a:c9:00:01",
            "addr add 10.201.0.1/30 dev tap0",
            "link set tap0 up",
            "neigh add 10.201.0.2 lladdr 06:00:0a:c9:00:02 dev tap0",
        ] {
            let ok = Command::new("ip")
                .args(["-n", &ns.0])
                .args(args.split(' '))
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                common::note_skip!(
                    common::Reason::NoKernelSupport,
                    "`ip -n {} {args}` failed (no tun driver?)",
                    ns.0
                );
                return None;
            }
        }
        Some(ns)
    }
}

/// Moves the calling thread into network namespace `name`.
fn enter_netns(name: &str) {
    {
        let f = File::open(format!("/var/run/netns/{name}")).expect("netns file");
        // SAFETY: setns on a descriptor we own; it changes only this thread's
        // network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_guest_reaches_a_listener_behind_the_tap_and_sees_a_closed_port_refused() {
    let Some(kernel) = guest() else { return };
    let Some(ns) = Netns::with_tap() else { return };
    let dir = Dir(std::env::temp_dir().join(format!("vmm-net-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let uds = dir.0.join("v.sock");
    let agent_listener =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", uds.display())).expect("listen");
    let config = VmConfig {
        kernel,
        mem_mib: 32,
        vcpus: 1,
        timeout: Some(Duration::from_secs(60)),
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.clone(),
        }),
        net: Some(NetConfig {
            tap: "tap0".into(),
            mac: DEFAULT_GUEST_MAC,
        }),
        ..Default::default()
    };
    let serial = Captured::default();
    let out = serial.clone();
    // Everything that must live in the namespace is made on this thread:
    // the listener, the closed port, and the tap attachment.
    let (tx, rx) = std::sync::mpsc::channel();
    let ns_name = ns.0.clone();
    let vm = std::thread::spawn(move || {
        enter_netns(&ns_name);
        let listener = TcpListener::bind("10.201.0.1:0").expect("listen in the namespace");
        let closed = TcpListener::bind("10.201.0.1:0").expect("a free port");
        let closed_port = closed.local_addr().expect("addr").port();
        drop(closed);
        let machine = vmm::build(&config, Box::new(out)).expect("build");
        tx.send((listener.local_addr().expect("addr").port(), closed_port))
            .expect("send");
        let report = machine.run();
        drop(listener);
        report
    });
    let (open_port, closed_port) = rx.recv().expect("the VM was built");

    let mut agent = Agent::accept(
        &agent_listener,
        Duration::from_secs(30),
        1,
        "the guest's agent connects",
    );
    assert_eq!(
        agent.run(1, &["net-syn", "10.201.0.1", &open_port.to_string()]),
        (format!("synack from 10.201.0.1:{open_port}\n"), Some(0)),
        "{:?}",
        serial.lines()
    );
    // Again: the gateway's MAC is cached now, and a second SYN works too.
    assert_eq!(
        agent.run(2, &["net-syn", "10.201.0.1", &open_port.to_string()]),
        (format!("synack from 10.201.0.1:{open_port}\n"), Some(0))
    );
    // Nothing listens: the host's stack answers RST.
    assert_eq!(
        agent.run(3, &["net-syn", "10.201.0.1", &closed_port.to_string()]),
        (format!("rst from 10.201.0.1:{closed_port}\n"), Some(1))
    );
    assert_eq!(agent.run(4, &["net-syn", "10.201.0.1"]).1, Some(2), "usage");
    assert!(
        serial
            .lines()
            .contains(&"guest: net mac=06:00:0a:c9:00:02".to_string()),
        "{:?}",
        serial.lines()
    );

    // End the VM through the echo port.
    let echo = common::GuestConn::open(&uds);
    echo.quit();
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.exit, vmm::GuestExit::Code(0), "{:?}", serial.lines());
    drop(ns);
}

fn vmm_bin(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vmm"))
        .args(args)
        .output()
        .expect("run vmm");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_refuses_bad_net_flags_with_a_clear_message() {
    let Some(kernel) = guest() else { return };
    let kernel = kernel.display().to_string();
    let base = ["--kernel", kernel.as_str(), "--mem-mib", "16"];
    let run = |net: &str| vmm_bin(&[&base[..], &["--net", net]].concat());

    let (code, err) = run("tap0,mac=06:00:0a:c9:00");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad MAC address `06:00:0a:c9:00`"), "{err}");
    let (code, err) = run("tap0,speed=fast");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown option `speed=fast`"), "{err}");
    let (code, err) = run("a-name-that-is-too-long");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tap name `a-name-that-is-too-long` is invalid"),
        "{err}"
    );

    // A name with no persistent tap behind it: refused, naming the tap
    // (as root TUNSETIFF would have made a throwaway one).
    let (code, err) = run("vmmnotap0");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no persistent tap named vmmnotap0")
            || err.contains("cannot open /dev/net/tun for tap vmmnotap0"),
        "{err}"
    );
    let links = Command::new("ip")
        .args(["link", "show", "vmmnotap0"])
        .output();
    assert!(
        !links.is_ok_and(|o| o.status.success()),
        "the refused tap was left behind"
    );
    // Not a tap at all.
    let (code, err) = run("lo");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot attach to tap lo"), "{err}");
}

/// The binary, started as the daemon will (`ip netns exec`, default seccomp
/// filter): the net worker's run-time system calls are all allowed, or the
/// vmm would die of SIGSYS here.
#[test]
fn the_binary_under_seccomp_passes_traffic_through_the_tap() {
    let Some(kernel) = guest() else { return };
    let Some(ns) = Netns::with_tap() else { return };
    let dir = Dir(std::env::temp_dir().join(format!("vmm-net-bin-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let uds = dir.0.join("v.sock");
    let agent_listener =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", uds.display())).expect("listen");
    let ns_name = ns.0.clone();
    let listener = std::thread::spawn(move || {
        enter_netns(&ns_name);
        TcpListener::bind("10.201.0.1:0").expect("listen in the namespace")
    })
    .join()
    .expect("listener thread");
    let port = listener.local_addr().expect("addr").port().to_string();
    let uds_arg = uds.display().to_string();
    let kernel = kernel.display().to_string();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_vmm")])
        .args([
            "--kernel",
            &kernel,
            "--mem-mib",
            "32",
            "--timeout-ms",
            "60000",
        ])
        .args([
            "--net",
            "tap0,mac=06:00:0a:c9:00:02",
            "--vsock-uds",
            &uds_arg,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let mut agent = Agent::accept(
        &agent_listener,
        Duration::from_secs(30),
        1,
        "the guest's agent connects",
    );
    assert_eq!(
        agent.run(1, &["net-syn", "10.201.0.1", &port]),
        (format!("synack from 10.201.0.1:{port}\n"), Some(0))
    );
    common::GuestConn::open(&uds).quit();
    let out = child.wait_with_output().expect("vmm exits");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    drop(listener);
    drop(ns);
}

/// Every open tun/tap descriptor on the host, as "pid (comm) fd: iff",
/// from `/proc/*/fdinfo` (a tap's shows the device it is attached to).
fn tap_holders() -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for proc in procs.flatten() {
        let pid = proc.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(proc.path().join("comm")).unwrap_or_default();
        let Ok(fds) = std::fs::read_dir(proc.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
            if let Some(iff) = info.lines().find_map(|l| l.strip_prefix("iff:")) {
                out.push(format!(
                    "{pid} ({}) fd {}: {}",
                    comm.trim(),
                    fd.file_name().to_string_lossy(),
                    iff.trim()
                ));
            }
        }
    }
    out
}

/// Snapshot a VM with a net device, stop it, and fork it with `--restore
/// ... --net tap0` in the same namespace: the fork re-attaches to the tap
/// and its guest (gateway MAC still cached in its memory) reaches the
/// listener. A restore without `--net`, or with another MAC, is refused.
#[test]
fn a_snapshot_restores_onto_the_tap_named_again() {
    let Some(kernel) = guest() else { return };
    let Some(ns) = Netns::with_tap() else { return };
    let dir = Dir(std::env::temp_dir().join(format!("vmm-net-snap-{}", std::process::id())));
    let snap = dir.0.join("snap");
    std::fs::create_dir_all(&snap).expect("temp dir");
    let uds = dir.0.join("a.sock");
    let agent_listener =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", uds.display())).expect("listen");
    let config = VmConfig {
        kernel,
        mem_mib: 32,
        timeout: Some(Duration::from_secs(60)),
        vsock: Some(VsockConfig {
            cid: 3,
            uds_path: uds.clone(),
        }),
        net: Some(NetConfig {
            tap: "tap0".into(),
            mac: DEFAULT_GUEST_MAC,
        }),
        ..Default::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let ns_name = ns.0.clone();
    let vm = std::thread::spawn(move || {
        enter_netns(&ns_name);
        let listener = TcpListener::bind("10.201.0.1:0").expect("listen in the namespace");
        let machine = vmm::build(&config, Box::new(Captured::default())).expect("build");
        tx.send((listener, machine.handle())).expect("send");
        machine.run()
    });
    let (listener, handle) = rx.recv().expect("the VM was built");
    let port = listener.local_addr().expect("addr").port().to_string();
    let mut agent = Agent::accept(
        &agent_listener,
        Duration::from_secs(30),
        1,
        "the guest's agent connects",
    );
    assert_eq!(agent.run(1, &["net-syn", "10.201.0.1", &port]).1, Some(0));
    handle.snapshot(&snap).expect("snapshot");
    handle.resume().expect("resume");
    common::GuestConn::open(&uds).quit();
    let report = vm.join().expect("thread").expect("run");
    assert_eq!(report.exit, vmm::GuestExit::Code(0));
    // The handle shares the devices: the tap stays attached (and a second
    // attach gets EBUSY) until it goes.
    drop(handle);

    let fork_uds = dir.0.join("b.sock");
    let snap_arg = snap.display().to_string();
    let fork_uds_arg = fork_uds.display().to_string();
    let restore = |extra: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_vmm")])
            .args(["--restore", &snap_arg, "--vsock-uds", &fork_uds_arg])
            .args(["--timeout-ms", "60000"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let out = restore(&[]).output().expect("run vmm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the snapshot has a net device: give --net TAP"),
        "{err}"
    );
    let out = restore(&["--net", "tap0,mac=02:00:00:00:00:01"])
        .output()
        .expect("run vmm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("use --net tap0,mac=06:00:0a:c9:00:02"),
        "{err}"
    );

    let fork_agent =
        UnixListener::bind(format!("{}_{AGENT_VSOCK_PORT}", fork_uds.display())).expect("listen");
    let dial = Duration::from_secs(30);
    // Now and then (2 in 40 runs here, twice in CI) the fork finds tap0
    // still attached (EBUSY) just after this process closed its VM's
    // descriptor, while no process holds a tun descriptor any more (a
    // scan of /proc/*/fdinfo right after shows none): the detach ends
    // after close returns, with nothing to wait on. A fork refused so is
    // started again, at most twice; the holders seen each time go into
    // the failure message, should a descriptor ever really leak.
    let mut busy = Vec::new();
    let child = loop {
        let mut child = restore(&["--net", "tap0"]).spawn().expect("spawn fork");
        if common::connects_before_exit(&fork_agent, Some(&child), dial) {
            break child;
        }
        // What the fork's VMM said is all there is to read about why.
        let _ = child.kill();
        let out = child.wait_with_output().expect("fork's output");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        if said.contains("Device or resource busy") && busy.len() < 2 {
            busy.push(tap_holders());
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        panic!(
            "the fork's agent did not dial within {dial:?}; the fork's VMM ({}) said:\n{}\n{said}\n\
             tap holders at each earlier EBUSY: {busy:?}; now: {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            tap_holders()
        );
    };
    if !busy.is_empty() {
        eprintln!(
            "the fork's tap was busy {} time(s); holders: {busy:?}",
            busy.len()
        );
    }
    let mut agent = Agent::accept(
        &fork_agent,
        Duration::from_secs(30),
        100,
        "the fork's agent dials again",
    );
    assert_eq!(
        agent.run(2, &["net-syn", "10.201.0.1", &port]),
        (format!("synack from 10.201.0.1:{port}\n"), Some(0))
    );
    common::GuestConn::open(&fork_uds).quit();
    let out = child.wait_with_output().expect("fork exits");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(listener);
    drop(ns);
}
