//! What every sandbox process is confined to by default, named once for
//! the daemon, which writes it into each container's OCI spec, and for
//! the containerd shim, which accepts a spec asking for no more.

/// Docker's default capability set (containerd's too), by their OCI
/// names, granted in the bounding, effective and permitted sets.
pub const CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Docker's default masked paths: files become /dev/null, directories an
/// empty read-only tmpfs. Paths missing in the sandbox (all of /sys there)
/// are skipped.
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Docker's default read-only paths.
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The umask sandbox processes start with (the agent's, which they
/// inherit).
pub const UMASK: u32 = 0o022;
