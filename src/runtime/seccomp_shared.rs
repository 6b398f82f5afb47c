//! The sandbox seccomp program compiled once by the daemon and read by its
//! supervisors, instead of compiled by each. libseccomp's compile is about
//! a millisecond of CPU in a freshly started supervisor, which every
//! supervisor spawned for a create (all but the few standbys in a burst)
//! spent on its create's path.
//!
//! The daemon writes `<sandboxes run dir>/.seccomp-<digest>.bpf` as it
//! starts. The digest covers the profile as this build makes it and the
//! libseccomp that compiled it, so a supervisor of another build, or of a
//! changed profile, finds no file of its name and compiles its own. A file
//! someone else could have written (not owned by this process's user, or
//! writable by group or others), or one that is not whole instructions, is
//! not used either: the supervisor compiles, and says why.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oci_spec::runtime::LinuxSeccomp;
use sha2::{Digest, Sha256};

use super::seccomp::sandbox_seccomp;
use super::seccomp_filter::CompiledFilter;

/// Names the shared programs (a dot: no sandbox id starts with one).
const PREFIX: &str = ".seccomp-";
const SUFFIX: &str = ".bpf";

/// Bytes in one BPF instruction.
const INSTRUCTION: usize = std::mem::size_of::<libc::sock_filter>();

#[derive(Debug, thiserror::Error)]
pub enum SeccompSharedError {
    #[error(
        "building the sandbox seccomp profile: {0}; this is a bug in sandboxd, please report it"
    )]
    Profile(String),
    #[error("compiling the sandbox seccomp profile: {0}")]
    Compile(String),
    #[error("writing the shared sandbox seccomp program {}: {source}; check that the run directory is writable by the daemon", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where this process (a supervisor) reads the shared program: the
/// sandboxes' run directory. Unset, [`read`] finds nothing.
static SHARED_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Tells this supervisor where its daemon shares the program.
pub fn read_from(sandboxes_dir: &Path) {
    let _ = SHARED_DIR.set(sandboxes_dir.to_path_buf());
}

/// The shared file's name for `profile` compiled by the libseccomp this
/// process loaded.
fn file_name(profile: &LinuxSeccomp) -> Option<String> {
    let text = serde_json::to_vec(profile).ok()?;
    let version = libseccomp::ScmpVersion::current().ok()?;
    let mut digest = Sha256::new();
    digest.update(b"sandboxd sandbox seccomp program 1\0");
    digest.update(
        format!(
            "libseccomp {}.{}.{}\0",
            version.major, version.minor, version.micro
        )
        .as_bytes(),
    );
    digest.update(&text);
    let digest = hex::encode(&digest.finalize()[..16]);
    Some(format!("{PREFIX}{digest}{SUFFIX}"))
}

/// The daemon's program for `profile`, if it shared one this process may
/// trust.
pub fn read(profile: &LinuxSeccomp) -> Option<CompiledFilter> {
    let path = SHARED_DIR.get()?.join(file_name(profile)?);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(
                "no shared sandbox seccomp program at {} ({e}); compiling the profile",
                path.display()
            );
            return None;
        }
    };
    match trusted_program(file) {
        Ok(program) => Some(program),
        Err(why) => {
            tracing::warn!(
                "not using the shared sandbox seccomp program {}: {why}; compiling the profile",
                path.display()
            );
            None
        }
    }
}

fn trusted_program(file: File) -> Result<CompiledFilter, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "it is not a regular file owned by uid {euid} and writable by it alone (uid {}, mode {:o})",
            meta.uid(),
            meta.mode()
        ));
    }
    let max = sandbox_proto::confinement::SECCOMP_MAX_INSTRUCTIONS * INSTRUCTION;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.is_empty() || bytes.len() > max || bytes.len() % INSTRUCTION != 0 {
        return Err(format!(
            "{} bytes is not a program of 1 to {} whole instructions",
            bytes.len(),
            max / INSTRUCTION
        ));
    }
    Ok(CompiledFilter::from_exported(&bytes))
}

/// Compiles the sandbox profile and shares the program in `sandboxes_dir`
/// for the supervisors this daemon starts; removes programs shared by
/// other builds. Returns the file's path.
pub fn share(sandboxes_dir: &Path) -> Result<PathBuf, SeccompSharedError> {
    let profile = sandbox_seccomp().map_err(|e| SeccompSharedError::Profile(e.to_string()))?;
    let name = file_name(&profile)
        .ok_or_else(|| SeccompSharedError::Profile("its digest could not be taken".to_string()))?;
    let program = CompiledFilter::compile(&profile)
        .map_err(|e| SeccompSharedError::Compile(e.to_string()))?;
    let path = sandboxes_dir.join(&name);
    let staged = sandboxes_dir.join(format!("{name}.new"));
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SeccompSharedError::Write { path, source }
    };
    let _ = fs::remove_file(&staged);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&staged)
        .map_err(write_err(&staged))?;
    file.write_all(&program.exported())
        .map_err(write_err(&staged))?;
    drop(file);
    fs::rename(&staged, &path).map_err(write_err(&path))?;
    remove_others(sandboxes_dir, &name);
    Ok(path)
}

/// Removes the programs earlier builds shared (a file of another name is
/// never read again).
fn remove_others(sandboxes_dir: &Path, keep: &str) {
    for entry in fs::read_dir(sandboxes_dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(PREFIX) && name != keep {
            if let Err(e) = fs::remove_file(entry.path()) {
                tracing::warn!(
                    "removing an earlier shared seccomp program {}: {e}",
                    entry.path().display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn profile() -> LinuxSeccomp {
        sandbox_seccomp().expect("profile")
    }

    fn compiled() -> Vec<u8> {
        CompiledFilter::compile(&profile())
            .expect("compile")
            .exported()
    }

    #[test]
    fn a_program_round_trips_through_its_exported_bytes() {
        let bytes = compiled();
        assert!(bytes.len() > 50 * INSTRUCTION, "{} bytes", bytes.len());
        assert_eq!(CompiledFilter::from_exported(&bytes).exported(), bytes);
    }

    #[test]
    fn the_name_follows_the_profile() {
        let base = profile();
        let mut other = base.clone();
        other.set_default_errno_ret(Some(1));
        let (a, b) = (file_name(&base), file_name(&other));
        assert!(a.is_some() && b.is_some() && a != b, "{a:?} {b:?}");
        assert_eq!(file_name(&base), a, "the same profile, the same name");
    }

    #[test]
    fn only_a_whole_program_that_only_its_owner_may_write_is_trusted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.bpf");
        let open = || File::open(&path).expect("open");
        let write = |bytes: &[u8], mode: u32| {
            fs::write(&path, bytes).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod");
        };
        let program = compiled();
        write(&program, 0o600);
        let trusted = trusted_program(open()).expect("the positive control");
        assert_eq!(trusted.exported(), program);
        write(&program, 0o620);
        assert!(trusted_program(open()).is_err(), "group-writable");
        write(&program, 0o602);
        assert!(trusted_program(open()).is_err(), "writable by others");
        write(&program[..program.len() - 3], 0o600);
        assert!(trusted_program(open()).is_err(), "a partial instruction");
        write(b"", 0o600);
        assert!(trusted_program(open()).is_err(), "empty");
        let too_long = vec![0u8; (sandbox_proto::confinement::SECCOMP_MAX_INSTRUCTIONS + 1) * 8];
        write(&too_long, 0o600);
        assert!(
            trusted_program(open()).is_err(),
            "longer than the kernel takes"
        );
    }

    #[test]
    fn the_daemon_shares_the_program_a_supervisor_then_reads_and_earlier_ones_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let earlier = dir.path().join(format!("{PREFIX}0123{SUFFIX}"));
        let sandbox = dir.path().join("sb-kept");
        fs::write(&earlier, b"old").expect("write");
        fs::create_dir(&sandbox).expect("mkdir");
        let path = share(dir.path()).expect("share");
        let meta = fs::metadata(&path).expect("stat");
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(fs::read(&path).expect("read"), compiled());
        assert!(!earlier.exists(), "an earlier build's program is removed");
        assert!(sandbox.is_dir(), "nothing else is touched");
        read_from(dir.path());
        let read = read(&profile()).expect("the shared program is read");
        assert_eq!(read.exported(), compiled());
    }
}
