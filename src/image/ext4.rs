//! Disk images for microVM sandboxes: owns the read-only ext4 export of a
//! cached image directory (`<image_dir>.ext4`, the guest's `/dev/vda`), the
//! per-sandbox writable scratch disk (`/dev/vdb`), which the agent in the guest
//! stacks into an overlay root, and the agent disk (`/dev/vdc`).
//!
//! Image directories are stored with owners shifted by the daemon's
//! `id_map_base` (see `shift.rs`), but a VM's root is not in a user namespace:
//! the guest must see root as 0. Rather than copying and unshifting the tree,
//! `mkfs.ext4 -d` runs in a child in a new user namespace mapping
//! `0 <shift> 65536`, where the tree already reads as unshifted; the output file
//! is owned by the shift base (the namespace's root) while it is written, then
//! handed back to host root, mode 0444, and renamed into place.
//!
//! The agent disk (`/dev/vdc`, the guest kernel's root) holds only the agent
//! and the mount points it needs; it is made once per agent binary.
//!
//! Scratch disks are cut from a template formatted once per size: a btrfs
//! reflink (`FICLONE`) of it costs well under a millisecond, a sparse copy a
//! few, where `mkfs.ext4` costs 13-50 ms here.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::shift::ID_RANGE;

/// Free space left in an image export beyond its files' estimated size: 10%
/// plus this much, for directories' blocks and ext4's own metadata.
const IMAGE_HEADROOM_BYTES: u64 = 32 << 20;
/// On-disk inode size mkfs.ext4 uses by default.
const INODE_BYTES: u64 = 256;
const BLOCK: u64 = 4096;

/// Where [`make_scratch`] keeps its templates, inside the scratch file's directory.
pub const SCRATCH_TEMPLATE_DIR: &str = ".scratch-templates";

#[derive(Debug, thiserror::Error)]
pub enum Ext4Error {
    #[error("{path} is not an image directory: {reason}")]
    NotAnImage { path: PathBuf, reason: String },
    #[error("cannot {action} {path}: {source}; check that the directory is writable by the daemon and has free space")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mkfs.ext4 is not installed: apt-get install e2fsprogs")]
    MkfsMissing,
    #[error("mkfs.ext4 failed for {path} ({status}): {stderr}")]
    MkfsFailed {
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("cannot run mkfs.ext4 in a user namespace mapping 0 to {shift}: {reason}; the daemon must run as root on a kernel that allows user namespaces (user.max_user_namespaces > 0)")]
    UserNamespace { shift: u32, reason: String },
    #[error("id shift {0} leaves no room for {ID_RANGE} ids; set id_map_base in the daemon config to a value between 1 and {max}", max = u32::MAX - ID_RANGE)]
    BadShift(u32),
    #[error("scratch size {0} bytes is not usable: give at least 16 MiB, in whole 4 KiB blocks")]
    BadScratchSize(u64),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Ext4Error {
    let path = path.to_path_buf();
    move |source| Ext4Error::Io {
        action,
        path,
        source,
    }
}

/// `<image_dir>.ext4`, next to the directory.
pub fn ext4_path(image_dir: &Path) -> PathBuf {
    let mut name = image_dir.as_os_str().to_owned();
    name.push(".ext4");
    PathBuf::from(name)
}

/// Returns the read-only ext4 export of `image_dir`, making it first if it
/// does not exist yet. Safe to call concurrently (one maker, under a lock; the
/// others wait and find it). `id_shift` is the daemon's `id_map_base`.
pub fn ensure_ext4(image_dir: &Path, id_shift: u32) -> Result<PathBuf, Ext4Error> {
    let out = ext4_path(image_dir);
    if out.is_file() {
        return Ok(out);
    }
    let meta = std::fs::symlink_metadata(image_dir).map_err(|e| Ext4Error::NotAnImage {
        path: image_dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !meta.is_dir() || meta.uid() != id_shift {
        return Err(Ext4Error::NotAnImage {
            path: image_dir.to_path_buf(),
            reason: format!(
                "expected a directory owned by uid {id_shift} (the shifted root), found uid {}",
                meta.uid()
            ),
        });
    }
    export_at(image_dir, &out, Owners::Shifted(id_shift), false, || Ok(()))
}

/// Whose ids a tree being exported carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owners {
    /// Shifted by the daemon's `id_map_base`: read in a user namespace
    /// that maps them back to 0.
    Shifted(u32),
    /// Host ids as the guest is to see them (a containerd snapshot): read
    /// by mkfs as host root.
    Host,
}

/// Makes `out`, the read-only ext4 export of the tree at `source`, unless
/// it exists, under `out`'s lock. `prepare` runs under the lock before the
/// tree is read, and what it returns is held until the export is made (a
/// caller that mounts the tree returns the mount's guard).
pub(crate) fn export_at<G>(
    source: &Path,
    out: &Path,
    owners: Owners,
    merged: bool,
    prepare: impl FnOnce() -> Result<G, Ext4Error>,
) -> Result<PathBuf, Ext4Error> {
    let image_dir = source;
    let out = out.to_path_buf();
    if let Owners::Shifted(id_shift) = owners {
        if id_shift == 0 || id_shift.checked_add(ID_RANGE).is_none() {
            return Err(Ext4Error::BadShift(id_shift));
        }
    }
    let lock_path = {
        let mut p = out.as_os_str().to_owned();
        p.push(".lock");
        PathBuf::from(p)
    };
    let _lock = lock_file(&lock_path)?;
    if out.is_file() {
        return Ok(out);
    }
    let _prepared = prepare()?;
    remove_stale_tmp(&out);
    let (bytes, inodes) = tree_size(image_dir, merged)?;
    let size = round_up(
        bytes + bytes / 10 + inodes * INODE_BYTES + IMAGE_HEADROOM_BYTES,
        1 << 20,
    );
    let inode_count = inodes + inodes / 10 + 1024;

    let tmp = {
        let mut p = out.as_os_str().to_owned();
        p.push(format!(".tmp{}", std::process::id()));
        PathBuf::from(p)
    };
    let result = make_image(image_dir, &tmp, size, inode_count, owners)
        .and_then(|()| std::fs::rename(&tmp, &out).map_err(io_err("rename into place", &out)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| out)
}

/// Half-made exports of a maker that died (they carry its pid): with the
/// lock held, nobody else is writing one.
fn remove_stale_tmp(out: &Path) {
    let (Some(dir), Some(name)) = (out.parent(), out.file_name()) else {
        return;
    };
    let mut prefix = name.to_owned();
    prefix.push(".tmp");
    let prefix = prefix.as_encoded_bytes().to_vec();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().as_encoded_bytes().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn make_image(
    image_dir: &Path,
    tmp: &Path,
    size: u64,
    inode_count: u64,
    owners: Owners,
) -> Result<(), Ext4Error> {
    let file = create_sparse(tmp, size)?;
    let mut command = mkfs_command("sandbox-image");
    command
        // Never written in the guest: a journal would be dead weight.
        .args(["-O", "^has_journal"])
        .args(["-N", &inode_count.to_string()])
        .args(["-E", "root_owner=0:0"])
        // The child is in image_dir before it leaves the host's user
        // namespace, so no directory above it needs to be searchable by the
        // mapped root.
        .args(["-d", "."])
        .current_dir(image_dir)
        .env_clear()
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .stdin(Stdio::null());
    let output = match owners {
        Owners::Shifted(shift) => {
            // Owned by the namespace's root while mkfs writes it: inside the
            // namespace host root is unmapped, so a root-owned file would
            // not be writable.
            std::os::unix::fs::fchown(&file, Some(shift), Some(shift))
                .map_err(io_err("chown", tmp))?;
            command.arg(format!("/proc/self/fd/{}", file.as_raw_fd()));
            let output = run_in_shifted_userns(command, shift, file.as_raw_fd())?;
            std::os::unix::fs::fchown(&file, Some(0), Some(0)).map_err(io_err("chown", tmp))?;
            output
        }
        Owners::Host => {
            command.arg(tmp);
            match command.output() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(Ext4Error::MkfsMissing)
                }
                other => other.map_err(io_err("run mkfs.ext4 for", tmp))?,
            }
        }
    };
    mkfs_succeeded(&output, image_dir)?;
    file.sync_all().map_err(io_err("sync", tmp))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o444))
        .map_err(io_err("chmod", tmp))?;
    Ok(())
}

/// Runs `command` as root of a new user namespace whose ids 0..65536 are host
/// ids `shift..shift+65536`, with `keep_fd` left open across exec.
///
/// The child cannot write its own maps (it would need to be root of the
/// parent namespace), and `spawn` does not return until the child has
/// exec'd, so a helper thread writes them while the child waits in `pre_exec`.
fn run_in_shifted_userns(
    mut command: Command,
    shift: u32,
    keep_fd: RawFd,
) -> Result<std::process::Output, Ext4Error> {
    let ns_err = |reason: String| Ext4Error::UserNamespace { shift, reason };
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ns_err(format!("pipe: {e}")))?;
    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ns_err(format!("pipe: {e}")))?;
    let helper = std::thread::spawn(move || write_maps(ready_r, go_w, shift));

    let (ready_w_raw, go_r_raw) = (ready_w.as_raw_fd(), go_r.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and makes only
    // raw system calls (unshare, getpid, read, write, setres[ug]id, setgroups,
    // fcntl), which are async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || child_enter_userns(ready_w_raw, go_r_raw, keep_fd));
    }
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let spawned = command.spawn();
    // The child holds its own copies; closing ours lets the helper see EOF
    // if the child died before writing.
    drop(ready_w);
    drop(go_r);
    let output = spawned.and_then(|child| child.wait_with_output());
    let maps = helper
        .join()
        .unwrap_or_else(|_| Err("the map writer panicked".to_owned()));
    match output {
        Ok(output) => {
            // A map failure also fails the child (it sees EOF and refuses to
            // exec), so report the map error, which says more.
            maps.map_err(ns_err)?;
            Ok(output)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Ext4Error::MkfsMissing),
        Err(e) => Err(ns_err(match maps {
            Err(m) => format!("{m}; {e}"),
            Ok(()) => e.to_string(),
        })),
    }
}

/// Child side, between fork and exec. Must stay async-signal-safe.
fn child_enter_userns(ready_w: RawFd, go_r: RawFd, keep_fd: RawFd) -> io::Result<()> {
    // SAFETY (whole function): raw system calls on descriptors inherited from
    // the parent and on stack buffers that outlive each call.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER) != 0 {
            return Err(io::Error::last_os_error());
        }
        let pid = libc::getpid().to_ne_bytes();
        if libc::write(ready_w, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
            return Err(io::Error::last_os_error());
        }
        let mut go = [0u8; 1];
        if libc::read(go_r, go.as_mut_ptr().cast(), 1) != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        // Become the namespace's root (host uid `shift`): exec keeps full
        // capabilities in the namespace only for uid 0. Raw syscalls, not
        // libc's wrappers, which coordinate threads the child does not have.
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
            || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::fcntl(keep_fd, libc::F_SETFD, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Parent side: waits for the child's pid, writes its maps, lets it go on.
fn write_maps(ready_r: OwnedFd, go_w: OwnedFd, shift: u32) -> Result<(), String> {
    let mut ready = File::from(ready_r);
    let mut pid = [0u8; 4];
    ready
        .read_exact(&mut pid)
        .map_err(|e| format!("the child did not enter its namespace: {e}"))?;
    let pid = i32::from_ne_bytes(pid);
    let map = format!("0 {shift} {ID_RANGE}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &map).map_err(|e| format!("writing {path}: {e}"))?;
    }
    File::from(go_w)
        .write_all(b"g")
        .map_err(|e| format!("releasing the child: {e}"))
}

/// Estimated ext4 space for the tree (each file rounded up to whole blocks,
/// hard links once, short symlinks inline) and its inode count. Never
/// follows symlinks or leaves the tree's file system.
/// `merged`: `root` is an overlay of layers, whose files report the
/// device of the layer they come from (its directories, the overlay's).
fn tree_size(root: &Path, merged: bool) -> Result<(u64, u64), Ext4Error> {
    let dev = std::fs::symlink_metadata(root)
        .map_err(io_err("stat", root))?
        .dev();
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        if meta.dev() != dev && (meta.is_dir() || !merged) {
            return Err(Ext4Error::NotAnImage {
                path,
                reason: "a different file system is mounted inside the image".into(),
            });
        }
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        inodes += 1;
        let ft = meta.file_type();
        if ft.is_dir() {
            bytes += BLOCK;
            for entry in std::fs::read_dir(&path).map_err(io_err("list", &path))? {
                stack.push(entry.map_err(io_err("list", &path))?.path());
            }
        } else if ft.is_symlink() {
            // Targets under 60 bytes live in the inode itself.
            if meta.len() >= 60 {
                bytes += BLOCK;
            }
        } else {
            bytes += round_up(meta.len(), BLOCK);
        }
    }
    Ok((bytes, inodes))
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

pub(super) fn lock_file(path: &Path) -> Result<nix::fcntl::Flock<File>, Ext4Error> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open lock", path))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
        Ext4Error::Io {
            action: "lock",
            path: path.to_path_buf(),
            source: e.into(),
        }
    })
}

/// Free space on the agent disk beyond the binary: ext4's metadata.
const AGENT_DISK_HEADROOM_BYTES: u64 = 8 << 20;

/// Returns the read-only agent disk for `agent` (the static sandbox-agent
/// binary), made once per binary in `dir` as `agent-<sha256 prefix>.ext4`: the
/// guest kernel's root (`/dev/vdc`), holding the agent at
/// [`VM_AGENT_INIT`](sandbox_proto::VM_AGENT_INIT) and the empty mount points
/// [`VM_AGENT_DISK_DIRS`](sandbox_proto::VM_AGENT_DISK_DIRS). A separate disk
/// keeps image exports independent of the agent's version, as the bind mount
/// does for containers.
pub fn ensure_agent_disk(agent: &Path, dir: &Path) -> Result<PathBuf, Ext4Error> {
    // Hashing the ~10 MiB binary costs tens of milliseconds, on every VM
    // create: remember the answer for as long as the file is unchanged.
    static KNOWN: std::sync::Mutex<Vec<(AgentFileId, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let id = AgentFileId::of(agent, dir);
    if let Some(id) = &id {
        let known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, disk)) = known.iter().find(|(k, d)| k == id && d.is_file()) {
            return Ok(disk.clone());
        }
    }
    let disk = make_or_find_agent_disk(agent, dir)?;
    if let Some(id) = id {
        let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
        known.retain(|(k, _)| k.dir != id.dir);
        known.push((id, disk.clone()));
    }
    Ok(disk)
}

/// An agent binary's version, and where its disks go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AgentFileId {
    dir: PathBuf,
    version: crate::disk::FileVersion,
}

impl AgentFileId {
    fn of(agent: &Path, dir: &Path) -> Option<Self> {
        Some(AgentFileId {
            dir: dir.to_path_buf(),
            version: crate::disk::FileVersion::read(agent).ok()?,
        })
    }
}

fn make_or_find_agent_disk(agent: &Path, dir: &Path) -> Result<PathBuf, Ext4Error> {
    use sha2::{Digest, Sha256};
    let binary = std::fs::read(agent).map_err(io_err("read the agent binary", agent))?;
    let digest = hex::encode(Sha256::digest(&binary));
    let out = dir.join(format!("agent-{}.ext4", &digest[..16]));
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let _lock = lock_file(&dir.join("agent-disk.lock"))?;
    if out.is_file() {
        return Ok(out);
    }
    let stage = dir.join(format!("agent-{}.stage", &digest[..16]));
    let tmp = dir.join(format!("agent-{}.ext4.tmp", &digest[..16]));
    let result = make_agent_disk(&binary, &stage, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &out).map_err(io_err("rename into place", &out)));
    let _ = std::fs::remove_dir_all(&stage);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| out)
}

fn make_agent_disk(binary: &[u8], stage: &Path, tmp: &Path) -> Result<(), Ext4Error> {
    let _ = std::fs::remove_dir_all(stage);
    let _ = std::fs::remove_file(tmp);
    for sub in sandbox_proto::VM_AGENT_DISK_DIRS {
        let d = stage.join(sub);
        std::fs::create_dir_all(&d).map_err(io_err("create", &d))?;
    }
    let init = stage.join(sandbox_proto::VM_AGENT_INIT.trim_start_matches('/'));
    std::fs::write(&init, binary).map_err(io_err("write", &init))?;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err("chmod", &init))?;
    let size = round_up(binary.len() as u64 + AGENT_DISK_HEADROOM_BYTES, 1 << 20);
    drop(create_sparse(tmp, size)?);
    run_mkfs(
        mkfs_command("sandbox-agent")
            .args(["-O", "^has_journal", "-E", "root_owner=0:0", "-d"])
            .arg(stage)
            .arg(tmp),
        tmp,
    )?;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o444))
        .map_err(io_err("chmod", tmp))
}

/// How a scratch disk was made, for logs and measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScratchCopy {
    /// Shares the template's extents (btrfs, XFS): no data copied.
    Reflink,
    /// The template's data ranges copied, holes kept.
    SparseCopy,
}

/// Makes `path` (which must not exist) a `size_bytes` ext4 file system for a
/// sandbox's writable layer, mode 0600, owned by root, from a template kept in
/// `<dir of path>/.scratch-templates/`. Put the scratch files of all sandboxes
/// in one directory (or call [`make_scratch_with`] with one template
/// directory) so that the template is made once.
pub fn make_scratch(path: &Path, size_bytes: u64) -> Result<ScratchCopy, Ext4Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    make_scratch_with(path, size_bytes, &dir.join(SCRATCH_TEMPLATE_DIR))
}

/// [`make_scratch`] with an explicit template directory, which must be on the
/// same file system as `path` for reflinks to work.
pub fn make_scratch_with(
    path: &Path,
    size_bytes: u64,
    template_dir: &Path,
) -> Result<ScratchCopy, Ext4Error> {
    if size_bytes < (16 << 20) || size_bytes % BLOCK != 0 {
        return Err(Ext4Error::BadScratchSize(size_bytes));
    }
    let template = scratch_template(template_dir, size_bytes)?;
    clone_disk(&template, path)
}

/// A copy of the disk file `from` at `to` (which must not exist), mode
/// 0600: a reflink sharing every extent where the file system can (btrfs,
/// XFS), else a copy of its data ranges that keeps the holes.
pub fn clone_disk(from: &Path, to: &Path) -> Result<ScratchCopy, Ext4Error> {
    let src = File::open(from).map_err(io_err("open", from))?;
    let size = src.metadata().map_err(io_err("stat", from))?.len();
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(io_err("create", to))?;
    let copied = clone_or_copy(&src, &dst, size).map_err(io_err("copy a disk to", to));
    if copied.is_err() {
        let _ = std::fs::remove_file(to);
    }
    copied
}

/// A new sparse file of `size` bytes at `path` (which must not exist), mode
/// 0600, for mkfs to fill.
fn create_sparse(path: &Path, size: u64) -> Result<File, Ext4Error> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    file.set_len(size).map_err(io_err("size", path))?;
    Ok(file)
}

/// `mkfs.ext4` with what every disk here shares: quiet, forced (a file, not
/// a device), 4 KiB blocks, no blocks reserved for root, and `label`.
fn mkfs_command(label: &str) -> Command {
    let mut command = Command::new("mkfs.ext4");
    command
        .args([
            "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-L", label,
        ])
        .stdin(Stdio::null());
    command
}

/// Runs a [`mkfs_command`] that makes `path`.
fn run_mkfs(command: &mut Command, path: &Path) -> Result<(), Ext4Error> {
    let output = match command.output() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Ext4Error::MkfsMissing),
        other => other.map_err(io_err("run mkfs.ext4 for", path))?,
    };
    mkfs_succeeded(&output, path)
}

fn mkfs_succeeded(output: &std::process::Output, path: &Path) -> Result<(), Ext4Error> {
    if output.status.success() {
        return Ok(());
    }
    Err(Ext4Error::MkfsFailed {
        path: path.to_path_buf(),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// The template for `size_bytes`, formatted on first use under a lock.
fn scratch_template(dir: &Path, size_bytes: u64) -> Result<PathBuf, Ext4Error> {
    let template = dir.join(format!("{size_bytes}.ext4"));
    if template.is_file() {
        return Ok(template);
    }
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let _lock = lock_file(&dir.join("lock"))?;
    if template.is_file() {
        return Ok(template);
    }
    let tmp = dir.join(format!("{size_bytes}.ext4.tmp"));
    let _ = std::fs::remove_file(&tmp);
    drop(create_sparse(&tmp, size_bytes)?);
    // lazy_itable_init=0: mkfs marks the inode tables zeroed (on a sparse
    // file by punching, not writing), so the guest kernel does not write
    // every table full of zeroes in the background on first mount.
    // lazy_journal_init=1: an unwritten journal in a sparse file reads as
    // zeroes anyway. A journal at all: the disk may be snapshotted mid-run.
    let made = run_mkfs(
        mkfs_command("sandbox-scratch")
            .args([
                "-E",
                "lazy_itable_init=0,lazy_journal_init=1,root_owner=0:0",
            ])
            .arg(&tmp),
        &tmp,
    );
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &template).map_err(io_err("rename into place", &template))?;
    Ok(template)
}

/// `FICLONE`: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

fn clone_or_copy(src: &File, dst: &File, size: u64) -> io::Result<ScratchCopy> {
    // SAFETY: FICLONE takes the source descriptor as its integer argument;
    // both descriptors are open for the call's duration.
    if unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) } == 0 {
        return Ok(ScratchCopy::Reflink);
    }
    // EOPNOTSUPP (ext4, tmpfs), EXDEV (another file system): copy instead.
    dst.set_len(size)?;
    sparse_copy(src, dst, size)?;
    Ok(ScratchCopy::SparseCopy)
}

/// Copies only the data ranges (SEEK_DATA/SEEK_HOLE): a fresh ext4 is a few
/// MiB of metadata in a file of many GiB.
fn sparse_copy(src: &File, dst: &File, size: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos: i64 = 0;
    let end = i64::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    while pos < end {
        // SAFETY: lseek on an open descriptor with integer arguments.
        let data = unsafe { libc::lseek(src.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data after `pos`.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut at = data;
        while at < hole {
            let want = usize::try_from((hole - at).min(buf.len() as i64)).unwrap_or(buf.len());
            let n = src.read_at(&mut buf[..want], at as u64)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], at as u64)?;
            at += n as i64;
        }
        pos = hole;
    }
    Ok(())
}

/// What `debugfs -R request` prints about the ext4 file `image` (tests).
#[cfg(test)]
pub(crate) fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", request])
        .arg(image)
        .output()
        .expect("run debugfs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_test_support::{note_skip, skip, Reason};
    use std::time::Instant;

    fn tools_and_root() -> bool {
        if !sandboxd_test_support::root_or_note!("needs root (user namespace maps, chown)") {
            return false;
        }
        for tool in ["mkfs.ext4", "debugfs"] {
            let found = ["/usr/sbin", "/sbin", "/usr/bin"]
                .iter()
                .any(|d| Path::new(d).join(tool).exists());
            if !found {
                note_skip!(
                    Reason::MissingTool,
                    "{tool} is missing (apt-get install e2fsprogs)"
                );
                return false;
            }
        }
        true
    }

    use super::debugfs;

    /// `User:     5   Group:     7` from `debugfs -R stat`.
    fn owner(stat: &str) -> (u32, u32) {
        let words: Vec<&str> = stat.split_whitespace().collect();
        let after = |key: &str| {
            let i = words.iter().position(|w| *w == key).expect(key);
            words[i + 1].parse::<u32>().expect("number")
        };
        (after("User:"), after("Group:"))
    }

    const SHIFT: u32 = 100_000;

    /// A small shifted tree: root-owned dirs, a private file of uid 5, a hard
    /// link, a symlink.
    fn shifted_tree(parent: &Path) -> PathBuf {
        let root = parent.join("rootfs");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("home/user")).unwrap();
        std::fs::write(root.join("etc/hostname"), b"sandbox\n").unwrap();
        std::fs::write(root.join("home/user/secret"), b"only uid 5\n").unwrap();
        std::fs::set_permissions(
            root.join("home/user/secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::hard_link(root.join("etc/hostname"), root.join("etc/hostname2")).unwrap();
        std::os::unix::fs::symlink("hostname", root.join("etc/link")).unwrap();
        // The image cache's dirs are private to root: the namespace's root
        // must not need to search them.
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
        for p in ["", "etc", "etc/hostname", "etc/link", "home"] {
            std::os::unix::fs::lchown(root.join(p), Some(SHIFT), Some(SHIFT)).unwrap();
        }
        std::os::unix::fs::chown(root.join("home/user"), Some(SHIFT + 5), Some(SHIFT + 7)).unwrap();
        std::os::unix::fs::chown(
            root.join("home/user/secret"),
            Some(SHIFT + 5),
            Some(SHIFT + 7),
        )
        .unwrap();
        std::fs::set_permissions(
            root.join("home/user"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        root
    }

    #[test]
    fn export_has_unshifted_owners_and_is_made_once() {
        if !tools_and_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = shifted_tree(dir.path());
        let started = Instant::now();
        let image = ensure_ext4(&root, SHIFT).expect("ensure_ext4");
        eprintln!("ext4 export of a small tree: {:?}", started.elapsed());
        assert_eq!(image, dir.path().join("rootfs.ext4"));
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
        assert_eq!(meta.mode() & 0o7777, 0o444);

        assert_eq!(owner(&debugfs(&image, "stat /")), (0, 0));
        assert_eq!(owner(&debugfs(&image, "stat /etc/hostname")), (0, 0));
        assert_eq!(owner(&debugfs(&image, "stat /home/user")), (5, 7));
        assert_eq!(owner(&debugfs(&image, "stat /home/user/secret")), (5, 7));
        assert_eq!(debugfs(&image, "cat /home/user/secret"), "only uid 5\n");
        assert!(debugfs(&image, "stat /etc/link").contains("Fast link dest: \"hostname\""));
        let links = debugfs(&image, "stat /etc/hostname2");
        assert!(links.contains("Links: 2"), "{links}");
        // The host tree is untouched.
        let secret = std::fs::metadata(root.join("home/user/secret")).unwrap();
        assert_eq!(secret.uid(), SHIFT + 5);

        let made = meta.modified().unwrap();
        let again = ensure_ext4(&root, SHIFT).expect("second call");
        assert_eq!(again, image);
        assert_eq!(std::fs::metadata(&again).unwrap().modified().unwrap(), made);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// Set SANDBOXD_TEST_EXT4_IMAGE to a copy of a real cached image tree
    /// (`cp -a .../sha256-X/rootfs /tmp/copy/rootfs`) to time its export.
    /// Opt-in, so ignored by default: a default run does not count it as a
    /// skip, and `--ignored` without the variable is one.
    #[test]
    #[ignore = "opt-in timing run: set SANDBOXD_TEST_EXT4_IMAGE and pass --ignored"]
    fn real_image_export_when_asked() {
        let Some(tree) = std::env::var_os("SANDBOXD_TEST_EXT4_IMAGE") else {
            skip!(
                Reason::NotConfigured,
                "set SANDBOXD_TEST_EXT4_IMAGE to time a real image's export"
            );
        };
        if !tools_and_root() {
            return;
        }
        let tree = PathBuf::from(tree);
        let started = Instant::now();
        let image = ensure_ext4(&tree, SHIFT).expect("ensure_ext4");
        let took = started.elapsed();
        let size = std::fs::metadata(&image).unwrap().len();
        let (bytes, inodes) = tree_size(&tree, false).unwrap();
        eprintln!(
            "export of {}: {took:?}, {} MiB file for ~{} MiB in {inodes} inodes",
            tree.display(),
            size >> 20,
            bytes >> 20
        );
        let fsck = Command::new("e2fsck")
            .args(["-f", "-n"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "{}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        assert_eq!(owner(&debugfs(&image, "stat /")), (0, 0));
    }

    #[test]
    fn agent_disk_holds_the_agent_and_mount_points_once_per_binary() {
        if !tools_and_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("sandbox-agent");
        std::fs::write(&agent, b"\x7fELF not really").unwrap();
        let disks = dir.path().join("disks");
        let started = Instant::now();
        let disk = ensure_agent_disk(&agent, &disks).expect("agent disk");
        eprintln!("agent disk: {:?}", started.elapsed());
        let meta = std::fs::metadata(&disk).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o444);
        let init = debugfs(&disk, "stat /sandbox-agent");
        assert_eq!(owner(&init), (0, 0));
        assert!(init.contains("Mode:  0755"), "{init}");
        assert_eq!(debugfs(&disk, "cat /sandbox-agent"), "\x7fELF not really");
        for sub in sandbox_proto::VM_AGENT_DISK_DIRS {
            let stat = debugfs(&disk, &format!("stat /{sub}"));
            assert!(stat.contains("Type: directory"), "/{sub}: {stat}");
        }
        assert_eq!(ensure_agent_disk(&agent, &disks).unwrap(), disk);
        std::fs::write(&agent, b"\x7fELF another build").unwrap();
        let other = ensure_agent_disk(&agent, &disks).unwrap();
        assert_ne!(other, disk);
        let names: Vec<_> = std::fs::read_dir(&disks)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".stage") || n.contains(".tmp"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn stale_halves_are_removed_under_the_lock() {
        if !tools_and_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = shifted_tree(dir.path());
        let stale = dir.path().join("rootfs.ext4.tmp99999");
        std::fs::write(&stale, b"half").unwrap();
        ensure_ext4(&root, SHIFT).expect("ensure_ext4");
        assert!(!stale.exists());
    }

    #[test]
    fn concurrent_exports_make_one_file() {
        if !tools_and_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = shifted_tree(dir.path());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let root = root.clone();
                std::thread::spawn(move || ensure_ext4(&root, SHIFT).expect("ensure_ext4"))
            })
            .collect();
        let paths: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(paths.iter().all(|p| p == &paths[0]));
        assert_eq!(owner(&debugfs(&paths[0], "stat /")), (0, 0));
    }

    #[test]
    fn unshifted_or_missing_trees_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_ext4(&dir.path().join("absent"), SHIFT).unwrap_err();
        assert!(matches!(err, Ext4Error::NotAnImage { .. }), "{err}");
        assert!(matches!(
            ensure_ext4(dir.path(), 0),
            Err(Ext4Error::BadShift(0))
        ));
        if nix::unistd::geteuid().is_root() {
            // Owned by host root, so not a shifted image: exporting it would
            // give the guest files owned by an unmapped id.
            let err = ensure_ext4(dir.path(), SHIFT).unwrap_err();
            assert!(err.to_string().contains("owned by uid 100000"), "{err}");
        }
    }

    #[test]
    fn scratch_disks_are_cloned_from_one_template() {
        if !tools_and_root() {
            return;
        }
        // SANDBOXD_TEST_REFLINK_DIR names a directory on btrfs or XFS to
        // measure reflinks; the default temp dir (ext4, tmpfs) copies.
        let dir = match std::env::var_os("SANDBOXD_TEST_REFLINK_DIR") {
            Some(base) => tempfile::tempdir_in(base).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        let size = 1u64 << 30;
        let first = Instant::now();
        let how = make_scratch(&dir.path().join("s0.ext4"), size).expect("first scratch");
        let first = first.elapsed();
        let mut times = Vec::new();
        for i in 1..=5 {
            let t = Instant::now();
            let again = make_scratch(&dir.path().join(format!("s{i}.ext4")), size).unwrap();
            times.push(t.elapsed());
            assert_eq!(again, how);
        }
        times.sort();
        eprintln!(
            "scratch 1 GiB: first (mkfs + {how:?}) {first:?}, then median {:?}",
            times[times.len() / 2]
        );
        let s1 = dir.path().join("s1.ext4");
        let meta = std::fs::metadata(&s1).unwrap();
        assert_eq!(meta.len(), size);
        assert_eq!(meta.mode() & 0o777, 0o600);
        // Sparse: a few MiB of metadata, not the whole size.
        assert!(
            meta.blocks() * 512 < 64 << 20,
            "{} bytes allocated",
            meta.blocks() * 512
        );
        assert_eq!(owner(&debugfs(&s1, "stat /")), (0, 0));
        let fsck = Command::new("e2fsck")
            .args(["-f", "-n"])
            .arg(&s1)
            .output()
            .expect("e2fsck");
        assert!(
            fsck.status.success(),
            "{}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        // An existing file is never overwritten.
        assert!(matches!(
            make_scratch(&s1, size),
            Err(Ext4Error::Io {
                action: "create",
                ..
            })
        ));
        assert!(matches!(
            make_scratch(&dir.path().join("tiny"), 4096),
            Err(Ext4Error::BadScratchSize(4096))
        ));
    }

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src_path = dir.path().join("src");
        let src = File::create(&src_path).unwrap();
        src.set_len(8 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        src.write_all_at(b"head", 0).unwrap();
        src.write_all_at(b"tail", (8 << 20) - 4).unwrap();
        let src = File::open(&src_path).unwrap();
        let dst_path = dir.path().join("dst");
        let dst = File::create(&dst_path).unwrap();
        dst.set_len(8 << 20).unwrap();
        sparse_copy(&src, &dst, 8 << 20).unwrap();
        assert_eq!(
            std::fs::read(&src_path).unwrap(),
            std::fs::read(&dst_path).unwrap()
        );
        let allocated = std::fs::metadata(&dst_path).unwrap().blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
    }

    #[test]
    fn sizes_round_up() {
        assert_eq!(round_up(0, 4096), 0);
        assert_eq!(round_up(1, 4096), 4096);
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(
            ext4_path(Path::new("/x/sha256-ab/rootfs")),
            Path::new("/x/sha256-ab/rootfs.ext4")
        );
    }
}
