//! The OOM score a sandbox starts at. The daemon may run shielded from the
//! OOM killer (`sandboxd.service` sets `OOMScoreAdjust=-500`), and every
//! process inherits its parent's score and the floor below which it may
//! not go without CAP_SYS_RESOURCE: left alone, the untrusted code in each
//! sandbox would be as shielded as the daemon, and the kernel would pick
//! something else on the host in its place. A supervisor therefore raises
//! its own score to at least [`SANDBOX_OOM_SCORE_ADJ`] before it makes its
//! sandbox. Written by root with CAP_SYS_RESOURCE (as systemd starts the
//! daemon), that also raises the floor, so nothing in the sandbox can take
//! the daemon's score back; without it the floor stays, which the
//! supervisor logs. A process may start at a higher score
//! (`oom_score_adj` on `POST .../processes`), which its agent writes
//! without moving the floor: the process may lower it again, down to 0.
//! The supervisor itself runs at the sandbox's score too (a few MB of
//! memory, so it is seldom the kernel's pick).

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

/// What [`start_sandbox_score`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreStart {
    /// The inherited score was at or above [`SANDBOX_OOM_SCORE_ADJ`]; left as it is.
    Kept,
    /// Raised from `from`, and the floor with it.
    Raised { from: i16 },
    /// Raised from `from`, but without CAP_SYS_RESOURCE the floor stayed
    /// where it was: the sandbox's processes may go back down to it.
    RaisedAboveTheFloor { from: i16 },
}

/// Sets the calling process's (a supervisor's) score, and its floor where
/// it may, to [`sandbox_score`] of its own; its children inherit both.
/// Writes nothing when there is nothing to raise.
pub fn start_sandbox_score() -> io::Result<ScoreStart> {
    const FILE: &str = "/proc/self/oom_score_adj";
    let inherited: i16 = std::fs::read_to_string(FILE)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{FILE}: {e}")))?;
    let score = sandbox_score(inherited);
    if score == inherited {
        return Ok(ScoreStart::Kept);
    }
    std::fs::write(FILE, score.to_string())?;
    Ok(if holds_sys_resource() {
        ScoreStart::Raised { from: inherited }
    } else {
        ScoreStart::RaisedAboveTheFloor { from: inherited }
    })
}

/// Whether the calling thread's effective set has CAP_SYS_RESOURCE, which
/// the kernel wants of a write that moves the floor.
fn holds_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|effective| effective & (1 << CAP_SYS_RESOURCE) != 0)
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
