//! The `vmm` binary: boots one VM from the command line and exits with the
//! guest's exit code. sandboxd starts one per microVM sandbox.
//!
//! Exit status: the guest's exit-port code; 0 when the guest resets (Linux
//! `reboot`); 1 when the VMM fails or the guest crashes (triple fault), with
//! the reason on stderr; 2 for command-line errors.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vmm::config::{DiskConfig, VsockConfig};
use vmm::devices::serial::DEFAULT_SERIAL_CAP_BYTES;
use vmm::{GuestExit, VmConfig};

/// Run one microVM on KVM.
#[derive(Debug, Parser)]
#[command(name = "vmm", version)]
struct Args {
    /// Kernel to boot: an ELF vmlinux (PVH entry if it has one), a bzImage,
    /// or the test guest. The image decides the boot protocol.
    #[arg(long)]
    kernel: PathBuf,
    /// Initramfs (cpio archive) for a Linux kernel.
    #[arg(long, value_name = "PATH")]
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
    /// Most serial bytes written; the rest is dropped.
    #[arg(long, default_value_t = DEFAULT_SERIAL_CAP_BYTES)]
    serial_log_cap: u64,
    /// Stop with an error if the guest has not finished after this many ms.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The KVM device.
    #[arg(long, default_value = "/dev/kvm")]
    kvm_device: PathBuf,
    /// A virtio-blk disk: PATH[,ro] or fd=N[,ro] (an inherited descriptor).
    /// Repeat for more disks; the guest sees them in order. `ro` disks
    /// refuse every write.
    #[arg(long = "disk", value_name = "PATH[,ro]", value_parser = parse_disk)]
    disks: Vec<DiskConfig>,
    /// Host side of a virtio-vsock device: host processes connect here and
    /// write `CONNECT <port>\n`; guest connections to host port P go to
    /// PATH_P.
    #[arg(long, value_name = "PATH")]
    vsock_uds: Option<PathBuf>,
    /// The guest's vsock context ID.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "vsock_uds")]
    vsock_cid: u64,
    /// Print a summary of the run on stderr.
    #[arg(short, long)]
    verbose: bool,
}

fn parse_disk(s: &str) -> Result<DiskConfig, String> {
    s.parse().map_err(|e: vmm::ConfigError| e.to_string())
}

fn serial_output(path: &Path) -> io::Result<Box<dyn Write + Send>> {
    if path.as_os_str() == "-" {
        Ok(Box::new(io::stdout()))
    } else {
        Ok(Box::new(File::create(path)?))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = VmConfig {
        kernel: args.kernel,
        initrd: args.initrd,
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        cmdline: args.cmdline,
        serial_cap_bytes: args.serial_log_cap,
        kvm_device: args.kvm_device,
        timeout: args.timeout_ms.map(Duration::from_millis),
        disks: args.disks,
        vsock: args.vsock_uds.map(|uds_path| VsockConfig {
            cid: args.vsock_cid,
            uds_path,
        }),
    };
    // Refuse bad input before creating the log file.
    if let Err(e) = config.validate() {
        eprintln!("vmm: error: {e}");
        return ExitCode::FAILURE;
    }
    let out = match serial_output(&args.serial_log) {
        Ok(out) => out,
        Err(e) => {
            eprintln!(
                "vmm: error: cannot open serial log {}: {e}",
                args.serial_log.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let report = match vmm::build(&config, out).map(|machine| machine.run()) {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
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
