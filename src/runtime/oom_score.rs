//! The OOM score a sandbox starts at. The daemon may run shielded from the
//! OOM killer (`sandboxd.service` sets `OOMScoreAdjust=-500`), and every
//! process inherits its parent's score and the floor below which it may
//! not go without CAP_SYS_RESOURCE: left alone, the untrusted code in each
//! sandbox would be as shielded as the daemon, and the kernel would pick
//! something else on the host in its place. A supervisor therefore raises
//! its own score to at least [`SANDBOX_OOM_SCORE_ADJ`] before it makes its
//! sandbox. Written by root with CAP_SYS_RESOURCE (as systemd starts the
//! daemon), that also raises the floor, so nothing in the sandbox can take
//! the daemon's score back; a process may ask for a higher score
//! (`oom_score_adj` on `POST .../processes`).

use std::io;

/// The lowest score a sandbox's processes start at, that of a plain
/// process on the host.
pub const SANDBOX_OOM_SCORE_ADJ: i16 = 0;

/// What a sandbox starts at when its supervisor has `inherited`: never
/// below [`SANDBOX_OOM_SCORE_ADJ`], and never lowered, which an operator
/// who runs the daemon above it asked for and which only CAP_SYS_RESOURCE
/// could do.
pub fn sandbox_score(inherited: i16) -> i16 {
    inherited.max(SANDBOX_OOM_SCORE_ADJ)
}

/// Sets the calling process's (a supervisor's) score, and its floor where
/// it may, to [`sandbox_score`] of its own; its children inherit both.
pub fn start_sandbox_score() -> io::Result<()> {
    const FILE: &str = "/proc/self/oom_score_adj";
    let inherited: i16 = std::fs::read_to_string(FILE)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{FILE}: {e}")))?;
    std::fs::write(FILE, sandbox_score(inherited).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_starts_at_zero_or_at_a_daemons_higher_score() {
        assert_eq!(sandbox_score(-500), 0);
        assert_eq!(sandbox_score(-1000), 0);
        assert_eq!(sandbox_score(0), 0);
        assert_eq!(sandbox_score(300), 300);
    }
}
