//! What every sandbox process is confined to by default, named once for
//! the daemon, which writes it into each container's OCI spec, and for
//! the containerd shim, which accepts a spec asking for no more; and what
//! one process may be confined to beyond that.

use serde::{Deserialize, Serialize};

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

/// Linux's number of each capability sandboxd may grant (linux/capability.h).
pub fn capability_number(name: &str) -> Option<u32> {
    Some(match name {
        "CAP_CHOWN" => 0,
        "CAP_DAC_OVERRIDE" => 1,
        "CAP_FOWNER" => 3,
        "CAP_FSETID" => 4,
        "CAP_KILL" => 5,
        "CAP_SETGID" => 6,
        "CAP_SETUID" => 7,
        "CAP_SETPCAP" => 8,
        "CAP_NET_BIND_SERVICE" => 10,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_CHROOT" => 18,
        "CAP_MKNOD" => 27,
        "CAP_AUDIT_WRITE" => 29,
        "CAP_SETFCAP" => 31,
        _ => return None,
    })
}

/// What one process is confined to beyond its sandbox's own; each field
/// left empty leaves that to the sandbox. It can only take away: a process
/// never holds more than the sandbox grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessConfinement {
    /// The capabilities the process may keep, a bit per capability number
    /// ([`capability_number`]): its bounding set, and what it holds if it
    /// runs as root. Its inheritable and ambient sets are empty.
    pub capabilities: Option<u64>,
    /// A seccomp program (`struct sock_filter` array in the host's byte
    /// order) loaded on the process right before it execs, on top of the
    /// sandbox's own filter: the kernel applies the stricter answer of the
    /// two to each call.
    #[serde(with = "serde_bytes")]
    pub seccomp_filter: Option<Vec<u8>>,
    /// Its `oom_score_adj`; the kernel refuses one below what the process
    /// would inherit.
    pub oom_score_adj: Option<i16>,
}

/// The size of one BPF instruction in [`ProcessConfinement::seccomp_filter`].
pub const SECCOMP_INSTRUCTION_BYTES: usize = 8;

/// The most instructions one seccomp program may have (`BPF_MAXINSNS`).
pub const SECCOMP_MAX_INSTRUCTIONS: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_granted_capability_has_its_number() {
        let numbers: Vec<u32> = CAPABILITIES
            .iter()
            .map(|name| capability_number(name).unwrap_or_else(|| panic!("{name}")))
            .collect();
        let mut distinct = numbers.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), CAPABILITIES.len(), "{numbers:?}");
        assert_eq!(capability_number("CAP_SYS_ADMIN"), None);
    }
}
