//! Checks the agent binary before any sandbox needs it: it runs as PID 1 in
//! images that may have no C library at all, so it must be statically linked.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum AgentBinaryError {
    #[error("sandbox agent {path} is missing ({source}); build it with `scripts/build.sh` or set `agent_path`")]
    Missing {
        path: String,
        source: std::io::Error,
    },
    #[error("sandbox agent {path} is not an x86_64 ELF executable")]
    NotElf { path: String },
    #[error("sandbox agent {path} is dynamically linked; build it with RUSTFLAGS=\"-C target-feature=+crt-static\" --target x86_64-unknown-linux-gnu")]
    Dynamic { path: String },
}

const PT_INTERP: u32 = 3;

pub fn check(path: &Path) -> Result<(), AgentBinaryError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| AgentBinaryError::Missing {
        path: shown.clone(),
        source,
    })?;
    let not_elf = || AgentBinaryError::NotElf {
        path: shown.clone(),
    };
    // ELF64 little-endian, x86_64 (machine 62).
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Err(not_elf());
    }
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bytes.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    if u16_at(0x12) != Some(62) {
        return Err(not_elf());
    }
    let phoff = u64_at(0x20).ok_or_else(not_elf)? as usize;
    let phentsize = u16_at(0x36).ok_or_else(not_elf)? as usize;
    let phnum = u16_at(0x38).ok_or_else(not_elf)? as usize;
    for i in 0..phnum {
        let kind = u32_at(phoff + i * phentsize).ok_or_else(not_elf)?;
        if kind == PT_INTERP {
            return Err(AgentBinaryError::Dynamic { path: shown });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_is_refused_with_the_fix() {
        // The test binary itself is dynamically linked.
        let exe = std::env::current_exe().expect("exe");
        let err = check(&exe).expect_err("dynamic");
        assert!(err.to_string().contains("crt-static"), "{err}");
        let err = check(Path::new("/nonexistent/agent")).expect_err("missing");
        assert!(err.to_string().contains("agent_path"));
    }
}
