//! The sandbox seccomp program compiled once by the daemon and read by its
//! supervisors, instead of compiled by each. libseccomp's compile is about
//! a millisecond of CPU in a freshly started supervisor, which every
//! supervisor spawned for a create (all but the few standbys in a burst)
//! spent on its create's path.
//!
//! The daemon writes `<sandboxes run dir>/.seccomp-<digest>.bpf` as it
//! starts, after removing any such file (so a share that fails leaves
//! none). The digest covers the profile as this build makes it, the
//! executable (supervisors run the daemon's own) and the libseccomp that
//! compiled it, so a supervisor of another build finds no file of its name
//! and compiles its own. A file someone else could have written (not owned
//! by this process's user, writable by group or others, linked in from
//! elsewhere), or one that is not whole instructions, is not used either:
//! the supervisor compiles, and says why. The daemon does not share into a
//! directory others may write to.

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
    #[error("not sharing the sandbox seccomp program in {}: {why}", path.display())]
    OpenDirectory { path: PathBuf, why: String },
}

/// Where this process (a supervisor) reads the shared program: the
/// sandboxes' run directory. Unset, [`read`] finds nothing.
static SHARED_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Tells this supervisor where its daemon shares the program.
pub fn read_from(sandboxes_dir: &Path) {
    let _ = SHARED_DIR.set(sandboxes_dir.to_path_buf());
}

/// The shared file's name for `profile` compiled by this executable
/// (supervisors run the daemon's own, `/proc/self/exe`: a binary replaced
/// since is another file, so another name; its times are left out, which
/// a `touch` changes) with the libseccomp it loaded.
fn file_name(profile: &LinuxSeccomp) -> Option<String> {
    let text = serde_json::to_vec(profile).ok()?;
    let version = libseccomp::ScmpVersion::current().ok()?;
    let exe = fs::metadata("/proc/self/exe").ok()?;
    let mut digest = Sha256::new();
    digest.update(b"sandboxd sandbox seccomp program 1\0");
    digest.update(
        format!(
            "libseccomp {}.{}.{}\0exe {} {} {}\0",
            version.major,
            version.minor,
            version.micro,
            exe.dev(),
            exe.ino(),
            exe.size()
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
    let dir = SHARED_DIR.get()?;
    if let Err(why) = trusted_directory(dir) {
        tracing::warn!(
            "not reading a shared sandbox seccomp program in {}: {why}; compiling the profile",
            dir.display()
        );
        return None;
    }
    let path = dir.join(file_name(profile)?);
    // Not blocking: a FIFO put there must not hold every supervisor up.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
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

/// Whether only this process's user may have put files in `dir`: it owns
/// it, and group and others may not write to it.
fn trusted_directory(dir: &Path) -> Result<(), String> {
    let meta = fs::metadata(dir).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "the directory is not owned by uid {euid} and writable by it alone (uid {}, mode {:o}); make the run directory root's alone",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

fn trusted_program(file: File) -> Result<CompiledFilter, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    // One link: a file of ours linked in from elsewhere is not what the
    // daemon wrote.
    if !meta.is_file() || meta.uid() != euid || meta.mode() & 0o022 != 0 || meta.nlink() != 1 {
        return Err(format!(
            "it is not a regular file of exactly one link, owned by uid {euid} and writable by it alone (uid {}, mode {:o}, {} links)",
            meta.uid(),
            meta.mode(),
            meta.nlink()
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

/// Removes every program shared in `sandboxes_dir` before, then compiles
/// the sandbox profile and shares the program there for the supervisors
/// this daemon starts. Returns the file's path. Whatever fails leaves no
/// program there, so supervisors compile their own.
pub fn share(sandboxes_dir: &Path) -> Result<PathBuf, SeccompSharedError> {
    remove_all(sandboxes_dir);
    let profile = sandbox_seccomp().map_err(|e| SeccompSharedError::Profile(e.to_string()))?;
    let name = file_name(&profile)
        .ok_or_else(|| SeccompSharedError::Profile("its digest could not be taken".to_string()))?;
    let program = CompiledFilter::compile(&profile)
        .map_err(|e| SeccompSharedError::Compile(e.to_string()))?;
    if let Err(why) = trusted_directory(sandboxes_dir) {
        return Err(SeccompSharedError::OpenDirectory {
            path: sandboxes_dir.to_path_buf(),
            why,
        });
    }
    let path = sandboxes_dir.join(&name);
    let staged = sandboxes_dir.join(format!("{name}.new"));
    let written = write_new(&staged, &program.exported()).and_then(|()| {
        fs::rename(&staged, &path).map_err(|source| SeccompSharedError::Write {
            path: path.clone(),
            source,
        })
    });
    if written.is_err() {
        let _ = fs::remove_file(&staged);
    }
    written.map(|()| path)
}

/// Writes `bytes` to a new file at `path`, readable and writable by its
/// owner alone.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), SeccompSharedError> {
    let write_err = |source| SeccompSharedError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(write_err)?;
    file.write_all(bytes).map_err(write_err)
}

/// Removes every shared program (and staged one) in `sandboxes_dir`:
/// those of earlier builds are never read again.
fn remove_all(sandboxes_dir: &Path) {
    for entry in fs::read_dir(sandboxes_dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(PREFIX) {
            if let Err(e) = fs::remove_file(entry.path()) {
                tracing::warn!(
                    "removing a shared seccomp program {}: {e}",
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
        write(&program, 0o600);
        fs::hard_link(&path, dir.path().join("elsewhere")).expect("link");
        assert!(trusted_program(open()).is_err(), "two links");
        fs::remove_file(dir.path().join("elsewhere")).expect("unlink");
        assert!(trusted_program(open()).is_ok(), "one link again");
        let too_long = vec![0u8; (sandbox_proto::confinement::SECCOMP_MAX_INSTRUCTIONS + 1) * 8];
        write(&too_long, 0o600);
        assert!(
            trusted_program(open()).is_err(),
            "longer than the kernel takes"
        );
    }

    #[test]
    fn a_share_that_fails_leaves_no_program_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = file_name(&profile()).expect("name");
        fs::write(dir.path().join(&name), b"an earlier build's").expect("write");
        // A directory where the staged file goes makes the write fail.
        fs::create_dir(dir.path().join(format!("{name}.new"))).expect("mkdir");
        assert!(share(dir.path()).is_err());
        assert!(!dir.path().join(&name).exists(), "the earlier one is gone");
        // The positive control: the same directory shares once it can.
        fs::remove_dir(dir.path().join(format!("{name}.new"))).expect("rmdir");
        let shared = share(dir.path()).expect("share");
        assert_eq!(shared, dir.path().join(&name));
        // A directory others may write to is refused, and what was shared
        // there before is gone.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(matches!(
            share(dir.path()),
            Err(SeccompSharedError::OpenDirectory { .. })
        ));
        assert!(!shared.exists());
        assert!(trusted_directory(dir.path()).is_err());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(
            trusted_directory(dir.path()).is_ok(),
            "the positive control"
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
