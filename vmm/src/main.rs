//! The `vmm` binary: boots one VM from the command line and exits with the
//! guest's exit code. sandboxd starts one per microVM sandbox.
//!
//! Exit status: the guest's exit-port code; 0 when the guest resets (Linux
//! `reboot`); 1 when the VMM fails or the guest crashes (triple fault), with
//! the reason on stderr; 2 for command-line errors. Killed by SIGSYS: the
//! VMM made a system call its seccomp filter does not allow (a vmm bug, or a
//! compromised VMM); rerun with `--seccomp log` to see which.
//!
//! For an unprivileged VMM (a uid that may not open /dev/kvm, in a chroot
//! that shows it nothing), everything can be handed in as inherited
//! descriptors: `--kvm-fd`, `--kernel-fd`, `--serial-fd`, `--disk fd=N`.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use vmm::config::{dup_inherited, DiskConfig, NetConfig, VsockConfig};
use vmm::control::ControlServer;
use vmm::devices::serial::DEFAULT_SERIAL_CAP_BYTES;
use vmm::seccomp::{self, SeccompMode};
use vmm::snapshot::restore::{restore, RestoreConfig, VerifyMemory};
use vmm::{GuestExit, VmConfig};

/// Run one microVM on KVM.
#[derive(Debug, Parser)]
#[command(name = "vmm", version)]
struct Args {
    /// Kernel to boot: an ELF vmlinux (PVH entry if it has one), a bzImage,
    /// or the test guest. The image decides the boot protocol.
    #[arg(long, required_unless_present_any = ["restore", "kernel_fd"], conflicts_with = "kernel_fd")]
    kernel: Option<PathBuf>,
    /// Read the kernel from this inherited descriptor (a seekable file)
    /// instead of --kernel.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    kernel_fd: Option<i32>,
    /// Restore (fork) the VM saved in this snapshot directory instead of
    /// booting a kernel; give the same --disk list again and a new
    /// --vsock-uds. Memory size, vCPUs and command line come from the snapshot.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kernel", "kernel_fd", "mem_mib", "vcpus", "cmdline", "vsock_cid", "kvm_fd"])]
    restore: Option<PathBuf>,
    /// With --restore: `stamp` (default) hashes the memory file unless a
    /// verification stamp shows it unchanged since it was last checked;
    /// `always` hashes it every time.
    #[arg(long, value_name = "stamp|always", default_value = "stamp", value_parser = ["stamp", "always"])]
    verify_memory: String,
    /// Listen for control commands (pause, resume, status, snapshot DIR) on
    /// this Unix socket; see vmm/README.md.
    #[arg(long, value_name = "PATH")]
    control_sock: Option<PathBuf>,
    /// Write `ready <us>\n` (microseconds since the vmm started) to this
    /// inherited descriptor once the vCPUs run.
    #[arg(long, value_name = "FD")]
    ready_fd: Option<i32>,
    /// Initramfs (cpio archive) for a Linux kernel.
    #[arg(long, value_name = "PATH", conflicts_with = "restore")]
    initrd: Option<PathBuf>,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 128)]
    mem_mib: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Kernel command line.
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Where the guest's serial console goes; `-` is stdout.
    #[arg(long, default_value = "-")]
    serial_log: PathBuf,
    /// Write the serial console to this inherited descriptor instead of
    /// --serial-log.
    #[arg(long, value_name = "N", conflicts_with = "serial_log",
          value_parser = clap::value_parser!(i32).range(0..))]
    serial_fd: Option<i32>,
    /// Most serial bytes written; the rest is dropped.
    #[arg(long, default_value_t = DEFAULT_SERIAL_CAP_BYTES)]
    serial_log_cap: u64,
    /// Stop with an error if the guest has not finished after this many ms.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The KVM device.
    #[arg(long, default_value = "/dev/kvm")]
    kvm_device: PathBuf,
    /// Use this inherited descriptor of /dev/kvm instead of opening
    /// --kvm-device.
    #[arg(long, value_name = "N", conflicts_with = "kvm_device",
          value_parser = clap::value_parser!(i32).range(0..))]
    kvm_fd: Option<i32>,
    /// A virtio-blk disk: PATH[,ro], fd=N[,ro] (an inherited descriptor), or
    /// `empty` (a read-only slot of 0 sectors that the control socket's
    /// `attach-disk` fills later). Repeat for more disks; the guest sees
    /// them in order. `ro` disks refuse every write.
    #[arg(long = "disk", value_name = "PATH[,ro]", value_parser = parse_disk)]
    disks: Vec<DiskConfig>,
    /// Host side of a virtio-vsock device: host processes connect here and
    /// write `CONNECT <port>\n`; guest connections to host port P go to
    /// PATH_P.
    #[arg(long, value_name = "PATH")]
    vsock_uds: Option<PathBuf>,
    /// virtio-net on the daemon's persistent tap (IFF_TAP | IFF_NO_PI |
    /// IFF_VNET_HDR) named TAP, in the vmm's network namespace; the guest
    /// gets MAC (default 06:00:0a:c9:00:02). Opened before --jail and seccomp.
    #[arg(long, value_name = "TAP[,mac=MAC]", value_parser = parse_net)]
    net: Option<NetConfig>,
    /// The guest's vsock context ID.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "vsock_uds")]
    vsock_cid: u64,
    /// What a system call outside the seccomp allow-list does: `kill` the
    /// process (default), `log` it and let it run (to find what the list
    /// lacks: see the kernel log, type=1326), or `off` (no filter).
    #[arg(long, value_name = "kill|log|off", default_value = "kill", value_parser = parse_seccomp)]
    seccomp: SeccompMode,
    /// No seccomp filter (debugging; same as --seccomp off).
    #[arg(long, conflicts_with = "seccomp")]
    no_seccomp: bool,
    /// Before running the guest, chroot into DIR and become --uid/--gid
    /// (root is needed until then, to open /dev/kvm, the kernel and the
    /// disks). Paths given to the control socket's `snapshot` are then
    /// inside DIR.
    #[arg(long, value_name = "DIR", requires_all = ["uid", "gid"])]
    jail: Option<PathBuf>,
    /// The uid the jailed VMM runs as.
    #[arg(long, requires = "jail")]
    uid: Option<u32>,
    /// The gid the jailed VMM runs as.
    #[arg(long, requires = "jail")]
    gid: Option<u32>,
    /// Print a summary of the run on stderr.
    #[arg(short, long)]
    verbose: bool,
}

fn parse_disk(s: &str) -> Result<DiskConfig, String> {
    s.parse().map_err(|e: vmm::ConfigError| e.to_string())
}

fn parse_net(s: &str) -> Result<NetConfig, String> {
    s.parse().map_err(|e: vmm::ConfigError| e.to_string())
}

fn parse_seccomp(s: &str) -> Result<SeccompMode, String> {
    s.parse()
        .map_err(|e: vmm::seccomp::SeccompError| e.to_string())
}

fn serial_output(path: &Path, fd: Option<i32>) -> io::Result<Box<dyn Write + Send>> {
    if let Some(fd) = fd {
        Ok(Box::new(File::from(dup_inherited(fd)?)))
    } else if path.as_os_str() == "-" {
        Ok(Box::new(io::stdout()))
    } else {
        Ok(Box::new(File::create(path)?))
    }
}

/// Tells whoever waits on `fd` that the VM runs.
fn notify_ready(fd: i32, since: Instant) {
    let line = format!("ready {}\n", since.elapsed().as_micros());
    // SAFETY: write(2) of a buffer we own to a descriptor number; an invalid
    // or closed descriptor fails with EBADF and touches no memory.
    let written = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    if written < 0 {
        eprintln!(
            "vmm: warning: cannot write to --ready-fd {fd}: {}",
            io::Error::last_os_error()
        );
    }
}

fn serial_log_error(args: &Args, e: &io::Error) -> ExitCode {
    match args.serial_fd {
        Some(fd) => eprintln!(
            "vmm: error: cannot use --serial-fd {fd}: {e}; pass a descriptor the vmm inherits"
        ),
        None => eprintln!(
            "vmm: error: cannot open serial log {}: {e}",
            args.serial_log.display()
        ),
    }
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let started = Instant::now();
    let args = Args::parse();
    // The filter is compiled before the VM is built, so the hook that
    // installs it makes only the prctl and seccomp calls that do so.
    let seccomp_mode = if args.no_seccomp {
        SeccompMode::Off
    } else {
        args.seccomp
    };
    let filters = match seccomp::filters(seccomp_mode) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let vsock = args.vsock_uds.clone().map(|uds_path| VsockConfig {
        cid: args.vsock_cid,
        uds_path,
    });
    let machine = if let Some(dir) = &args.restore {
        let config = RestoreConfig {
            dir: dir.clone(),
            disks: args.disks.clone(),
            vsock_uds: args.vsock_uds.clone(),
            net: args.net.clone(),
            serial_cap_bytes: args.serial_log_cap,
            kvm_device: args.kvm_device.clone(),
            timeout: args.timeout_ms.map(Duration::from_millis),
            verify_memory: if args.verify_memory == "always" {
                VerifyMemory::Always
            } else {
                VerifyMemory::Stamp
            },
        };
        let out = match serial_output(&args.serial_log, args.serial_fd) {
            Ok(out) => out,
            Err(e) => return serial_log_error(&args, &e),
        };
        restore(&config, out).map_err(|e| e.to_string())
    } else {
        let config = VmConfig {
            // clap requires --kernel without --restore.
            kernel: args.kernel.clone().unwrap_or_default(),
            kernel_fd: args.kernel_fd,
            initrd: args.initrd.clone(),
            kvm_fd: args.kvm_fd,
            mem_mib: args.mem_mib,
            vcpus: args.vcpus,
            cmdline: args.cmdline.clone(),
            serial_cap_bytes: args.serial_log_cap,
            kvm_device: args.kvm_device.clone(),
            timeout: args.timeout_ms.map(Duration::from_millis),
            disks: args.disks.clone(),
            vsock,
            net: args.net.clone(),
        };
        // Refuse bad input before creating the log file.
        if let Err(e) = config.validate() {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
        let out = match serial_output(&args.serial_log, args.serial_fd) {
            Ok(out) => out,
            Err(e) => return serial_log_error(&args, &e),
        };
        vmm::build(&config, out).map_err(|e| e.to_string())
    };
    let machine = match machine {
        Ok(machine) => machine,
        Err(e) => {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Kept until the VM ends: dropping it removes the socket.
    let _control = match &args.control_sock {
        Some(path) => match ControlServer::spawn(path, machine.handle()) {
            Ok(server) => Some(server),
            Err(e) => {
                eprintln!("vmm: error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    if let (Some(dir), Some(uid), Some(gid)) = (&args.jail, args.uid, args.gid) {
        let jail = vmm::jail::Jail {
            dir: dir.clone(),
            uid,
            gid,
        };
        if let Err(e) = jail.enter() {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let verbose = args.verbose;
    let restoring = args.restore.is_some();
    let report = machine.run_with(
        || seccomp::apply(&filters),
        || {
            if verbose && restoring {
                eprintln!(
                    "vmm: restored: vCPUs running {} us after start",
                    started.elapsed().as_micros()
                );
            }
            if let Some(fd) = args.ready_fd {
                notify_ready(fd, started);
            }
        },
    );
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.verbose {
        let s = &report.serial;
        eprintln!(
            "vmm: {:?}; serial {} bytes written, {} dropped{}; first line after {}; \
             unhandled accesses: {} port, {} MMIO; virtio notifies via exit: {}",
            report.exit,
            s.bytes_written,
            s.bytes_dropped,
            s.error
                .as_deref()
                .map(|e| format!(" (output failed: {e})"))
                .unwrap_or_default(),
            s.first_line
                .map(|d| format!("{} us", d.as_micros()))
                .unwrap_or_else(|| "-".into()),
            report.unhandled_pio,
            report.unhandled_mmio,
            report.virtio_notify_exits,
        );
    }
    if let Some(e) = &report.serial.error {
        eprintln!("vmm: warning: serial output stopped: {e}");
    }
    match report.exit {
        GuestExit::Code(code) => ExitCode::from(code),
        GuestExit::Reset => ExitCode::SUCCESS,
        GuestExit::TripleFault { vcpu } => {
            eprintln!("vmm: guest crashed: vCPU {vcpu} triple-faulted");
            ExitCode::FAILURE
        }
        GuestExit::Halted { vcpu } => {
            eprintln!("vmm: guest stopped: vCPU {vcpu} halted for good");
            ExitCode::FAILURE
        }
    }
}
