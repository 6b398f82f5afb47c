//! The command line a Linux guest gets: the caller's, plus what the VMM
//! knows and the caller cannot:
//! - defaults for a microVM, each added only when the caller's command line
//!   does not set that parameter itself (any value counts, so a caller's
//!   `console=hvc0` or `panic=0` wins): `console=ttyS0` (the serial log),
//!   `reboot=k` (reboot through the i8042, which ends the VMM cleanly),
//!   `panic=1` (a panic reboots, so it ends the VMM too instead of hanging),
//!   `pci=off` (there is no PCI bus; probing it costs boot time);
//! - one `virtio_mmio.device=4K@0xADDR:IRQ` per virtio device, always (they
//!   describe the machine; there is no ACPI or device tree).
//!
//! The additions go before a `--` word, since words after it are passed to
//! init. The caller's text is kept byte for byte, quotes included. The test
//! guest (boot-info protocol) gets the caller's command line unchanged.

use crate::arch::boot_info::BootVirtio;
use crate::arch::layout::VIRTIO_MMIO_SIZE;
use crate::devices::virtio::linux_cmdline_device;

/// The defaults, as (parameter, word).
pub const LINUX_DEFAULTS: [(&str, &str); 4] = [
    ("console", "console=ttyS0"),
    ("reboot", "reboot=k"),
    ("panic", "panic=1"),
    ("pci", "pci=off"),
];

/// Why the command line cannot be composed.
#[derive(Debug, thiserror::Error)]
pub enum CmdlineError {
    /// The result is longer than the kernel accepts.
    #[error(
        "the kernel command line is {len} bytes with the vmm's additions ({added} bytes: \
         defaults and one virtio_mmio.device word per device), the kernel accepts {max}: \
         shorten --cmdline by {excess} bytes, set the defaults yourself, or use fewer devices"
    )]
    TooLong {
        /// Length of the composed line.
        len: usize,
        /// Bytes the VMM added.
        added: usize,
        /// The limit.
        max: usize,
        /// `len - max`.
        excess: usize,
    },
}

/// Byte ranges of the words of `line`, split on spaces outside double
/// quotes, as Linux's `next_arg` splits them.
fn words(line: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        if c == '"' {
            quoted = !quoted;
        }
        let space = c.is_ascii_whitespace() && !quoted;
        match (space, start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, line.len()));
    }
    out
}

/// The parameter name of a word: before `=`, without quotes; Linux treats
/// `-` and `_` in names alike.
fn param_name(word: &str) -> String {
    let name = word.split('=').next().unwrap_or(word);
    name.trim_matches('"').replace('-', "_")
}

/// `user`'s command line with the defaults it lacks and the virtio devices'
/// words, at most `max` bytes long.
pub fn linux_cmdline(
    user: &str,
    virtio: &[BootVirtio],
    max: usize,
) -> Result<String, CmdlineError> {
    let spans = words(user);
    // Where the kernel's own parameters end: at a `--` word, or the end.
    let split = spans
        .iter()
        .find(|&&(s, e)| &user[s..e] == "--")
        .map(|&(s, _)| s);
    let kernel_part = &user[..split.unwrap_or(user.len())];
    let set: Vec<String> = spans
        .iter()
        .filter(|&&(s, _)| split.is_none_or(|at| s < at))
        .map(|&(s, e)| param_name(&user[s..e]))
        .collect();

    let mut added: Vec<String> = LINUX_DEFAULTS
        .iter()
        .filter(|(name, _)| !set.iter().any(|n| n == name))
        .map(|(_, word)| (*word).to_owned())
        .collect();
    added.extend(
        virtio
            .iter()
            .map(|d| linux_cmdline_device(d.base, VIRTIO_MMIO_SIZE, d.gsi)),
    );

    let mut line = kernel_part.trim().to_owned();
    for word in &added {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if let Some(at) = split {
        line.push(' ');
        line.push_str(user[at..].trim_end());
    }
    if line.len() > max {
        return Err(CmdlineError::TooLong {
            len: line.len(),
            added: line.len().saturating_sub(user.trim().len()),
            max,
            excess: line.len() - max,
        });
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::{virtio_slot, CMDLINE_MAX_LEN};

    fn devices(n: usize) -> Vec<BootVirtio> {
        (0..n)
            .map(|i| {
                let (base, gsi) = virtio_slot(i);
                BootVirtio {
                    base,
                    gsi,
                    device_type: 2,
                }
            })
            .collect()
    }

    #[test]
    fn empty_line_gets_defaults_and_devices() {
        let line = linux_cmdline("", &devices(2), CMDLINE_MAX_LEN).expect("fits");
        assert_eq!(
            line,
            "console=ttyS0 reboot=k panic=1 pci=off \
             virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
    }

    #[test]
    fn callers_settings_win_and_are_kept_verbatim() {
        let line = linux_cmdline(
            "  root=/dev/vda ro console=hvc0 panic=0 foo=\"a b\"  ",
            &[],
            CMDLINE_MAX_LEN,
        )
        .expect("fits");
        assert_eq!(
            line,
            "root=/dev/vda ro console=hvc0 panic=0 foo=\"a b\" reboot=k pci=off"
        );
        // A quoted value that mentions a parameter does not set it.
        let line = linux_cmdline("x=\"pci=on\"", &[], CMDLINE_MAX_LEN).expect("fits");
        assert!(line.ends_with("pci=off"), "{line}");
    }

    #[test]
    fn additions_go_before_init_arguments() {
        let line = linux_cmdline(
            "quiet -- --agent-flag panic=3",
            &devices(1),
            CMDLINE_MAX_LEN,
        )
        .expect("fits");
        assert_eq!(
            line,
            "quiet console=ttyS0 reboot=k panic=1 pci=off \
             virtio_mmio.device=4K@0xd0000000:5 -- --agent-flag panic=3"
        );
    }

    #[test]
    fn too_long_says_by_how_much() {
        let user = "x".repeat(CMDLINE_MAX_LEN - 10);
        let err = linux_cmdline(&user, &devices(1), CMDLINE_MAX_LEN).unwrap_err();
        let CmdlineError::TooLong {
            len, max, excess, ..
        } = err;
        assert_eq!(max, CMDLINE_MAX_LEN);
        assert_eq!(excess, len - max);
        assert!(err.to_string().contains("shorten --cmdline"), "{err}");
        // Exactly at the limit is fine.
        let base = linux_cmdline("", &[], CMDLINE_MAX_LEN).expect("fits");
        let pad = "y".repeat(CMDLINE_MAX_LEN - base.len() - 1);
        let line = linux_cmdline(&pad, &[], CMDLINE_MAX_LEN).expect("fits exactly");
        assert_eq!(line.len(), CMDLINE_MAX_LEN);
    }
}
