//! A microVM's pod container roots (`RequestBody::MountRoot` and
//! `UnmountRoot`). In a container sandbox the host makes each root and
//! attaches it; a microVM's host cannot reach into the guest, so it puts
//! the root's read-only ext4 disk into a free virtio-blk slot and the
//! agent, which is PID 1 and may mount there, builds the same tree the host
//! builds for a container: at `sandbox_proto::container_root(name)` an
//! overlay of that disk over a writable layer of the root's own on the
//! scratch disk, with the VM's /proc, /dev, /sys and /etc/hosts,
//! /etc/hostname and /etc/resolv.conf bound in. Spawns naming the root are
//! chrooted there as in a container (`launch.rs`).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use sandbox_proto::{
    container_root, valid_root_name, GuestRootLimits, GuestVolume, CONTAINER_ROOTS_DIR,
};

/// The scratch disk mounted once more, out of the roots' reach: home of
/// each root's writable layer (an overlay's upper layer cannot itself be
/// an overlay, which the VM's own root is).
pub(crate) const SCRATCH_AGAIN: &str = "/run/sandboxd/scratch";
/// How long a slot's disk may take to show its size in the guest (the
/// driver learns of it from a configuration-change interrupt, handled on a
/// workqueue; a nested, emulated host is slow).
const APPEAR_WITHIN: Duration = Duration::from_secs(10);
/// How long an unmount waits for the last holder of a root's disk (a
/// killed process still exiting) to let go of it.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);
/// `BLKFLSBUF`: drop the block device's cached pages, which may still hold
/// the disk an earlier root had in the same slot.
const BLKFLSBUF: libc::c_ulong = 0x1261;
/// The VM's files that name it on the network, bound over the image's.
const SHARED_FILES: [&str; 3] = ["hosts", "hostname", "resolv.conf"];

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error(
        "{0:?} is not a root name: use 1 to 128 of A-Z a-z 0-9 _ . - and do not start with a dot"
    )]
    BadName(String),
    #[error("{0:?} is not a slot's disk id (diskN)")]
    BadDisk(String),
    #[error("container root {0:?} is mounted already")]
    Exists(String),
    #[error("no container root named {0:?} is mounted")]
    Missing(String),
    #[error(
        "no disk with id {0:?} of {1} sectors has appeared in the guest within {APPEAR_WITHIN:?}"
    )]
    NoDisk(String, u64),
    #[error("container root {0:?} is unmounted but something in the VM still holds its disk; its slot stays in use")]
    StillHeld(String),
    #[error("container root {name:?}: {path} is a symlink or not a directory in the image; refusing to mount over it")]
    UnsafeTarget { name: String, path: String },
    #[error("container root {name:?}: {source}")]
    Volume {
        name: String,
        source: crate::guest_volumes::VolumeError,
    },
    #[error("container root {name:?}: {step}: {source}")]
    Io {
        name: String,
        step: &'static str,
        source: io::Error,
    },
}

impl From<RootError> for sandbox_proto::AgentError {
    fn from(e: RootError) -> Self {
        use sandbox_proto::ErrorKind;
        let kind = match &e {
            RootError::BadName(_) | RootError::BadDisk(_) | RootError::UnsafeTarget { .. } => {
                ErrorKind::InvalidInput
            }
            RootError::Exists(_) => ErrorKind::AlreadyExists,
            RootError::Missing(_) | RootError::NoDisk(..) => ErrorKind::NotFound,
            // The image has no place for the volume (a file where its
            // directory goes, a link loop): the caller's to fix.
            RootError::Volume { source, .. } if source.is_callers() => ErrorKind::InvalidInput,
            RootError::Volume { .. } | RootError::Io { .. } | RootError::StillHeld(_) => {
                ErrorKind::Other
            }
        };
        sandbox_proto::AgentError::new(kind, e.to_string())
    }
}

fn failed(name: &str, step: &'static str) -> impl FnOnce(io::Error) -> RootError {
    let name = name.to_owned();
    move |source| RootError::Io { name, step, source }
}

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The writable layer of root `name` on the scratch disk.
fn writable_dir(name: &str) -> PathBuf {
    Path::new(SCRATCH_AGAIN).join("roots").join(name)
}

/// The block device each mounted root's disk is, until it is let go.
fn devices() -> std::sync::MutexGuard<'static, HashMap<String, PathBuf>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    DEVICES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes root `name` of the disk of `sectors` whose GET_ID is `disk_id`,
/// with a group of its own holding `limits` when given and the guest's
/// copies of its `volumes` bound in.
pub fn mount_root(
    name: &str,
    disk_id: &str,
    sectors: u64,
    limits: Option<&GuestRootLimits>,
    volumes: &[GuestVolume],
) -> Result<(), RootError> {
    if !valid_root_name(name) {
        return Err(RootError::BadName(name.to_owned()));
    }
    let digits = disk_id.strip_prefix("disk").unwrap_or_default();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RootError::BadDisk(disk_id.to_owned()));
    }
    let root = PathBuf::from(container_root(name));
    if root.exists() || devices().contains_key(name) {
        return Err(RootError::Exists(name.to_owned()));
    }
    // A group an earlier root of this name left (its removal failed) must
    // not hold this one's processes under the old limits.
    groups(name)?.remove_root_group(name).map_err(failed(
        name,
        "removing an earlier root's group of this name",
    ))?;
    let device = await_disk(disk_id, sectors)?;
    let mut made = Made::new(name);
    let result = build(name, &device, &root, volumes, &mut made).and_then(|()| match limits {
        Some(limits) => groups(name)?
            .create_root_group(name, limits)
            .map_err(failed(name, "making the root's limited group")),
        None => Ok(()),
    });
    match result {
        Ok(()) => {
            devices().insert(name.to_owned(), device);
        }
        Err(_) => made.undo(),
    }
    result
}

fn groups(name: &str) -> Result<&'static crate::guest_groups::GuestGroups, RootError> {
    crate::guest_groups::get().ok_or_else(|| RootError::Io {
        name: name.to_owned(),
        step: "finding the guest's process groups",
        source: io::Error::other("the agent is not a microVM's init"),
    })
}

/// Unmounts root `name` (the whole tree under it) and drops its writable
/// layer.
pub fn unmount_root(name: &str) -> Result<(), RootError> {
    if !valid_root_name(name) {
        return Err(RootError::BadName(name.to_owned()));
    }
    let dir = Path::new(CONTAINER_ROOTS_DIR).join(name);
    let device = devices().get(name).cloned();
    if !dir.exists() && device.is_none() {
        return Err(RootError::Missing(name.to_owned()));
    }
    let mut made = Made::new(name);
    made.mounts = vec![dir.join("lower"), dir.join("rootfs")];
    made.dirs = vec![dir, writable_dir(name)];
    made.undo();
    let group_removed = groups(name)?
        .remove_root_group(name)
        .map_err(failed(name, "removing the root's group"));
    // The lazy unmounts let go of the disk once its last user has; until
    // then the slot must not take another disk, whose pages would mix
    // with this one's in the still-live file system.
    if let Some(device) = device {
        let started = Instant::now();
        while !is_free(&device) {
            if started.elapsed() > RELEASE_WITHIN {
                return Err(RootError::StillHeld(name.to_owned()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        devices().remove(name);
    }
    group_removed
}

/// Whether nothing holds `device`: a mounted block device is claimed
/// exclusively, so an exclusive open fails while any mount of it lives.
fn is_free(device: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(device)
        .is_ok()
}

/// What a mount has made so far, undone in reverse on failure or unmount.
struct Made {
    name: String,
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl Made {
    fn new(name: &str) -> Self {
        Made {
            name: name.to_owned(),
            mounts: Vec::new(),
            dirs: Vec::new(),
        }
    }

    fn undo(&mut self) {
        // A lazy unmount takes the tree below with it (the binds in the
        // root) and lets a process that is still dying finish its I/O.
        for target in self.mounts.drain(..).rev() {
            if let Err(e) = umount2(&target, MntFlags::MNT_DETACH) {
                if e != nix::Error::EINVAL && e != nix::Error::ENOENT {
                    crate::vm_init::console(&format!(
                        "sandbox-agent: root {:?}: cannot unmount {}: {e}",
                        self.name,
                        target.display()
                    ));
                }
            }
        }
        for dir in self.dirs.drain(..).rev() {
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

fn build(
    name: &str,
    device: &Path,
    root: &Path,
    volumes: &[GuestVolume],
    made: &mut Made,
) -> Result<(), RootError> {
    let dir = Path::new(CONTAINER_ROOTS_DIR).join(name);
    let lower = dir.join("lower");
    fs::create_dir_all(&lower).map_err(failed(name, "making the root's directory"))?;
    made.dirs.push(dir.clone());
    fs::create_dir_all(root).map_err(failed(name, "making the root's mount point"))?;
    flush_cached_pages(device).map_err(failed(name, "dropping the slot's cached pages"))?;
    mount(
        Some(device),
        &lower,
        Some("ext4"),
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| failed(name, "mounting the root's disk")(errno(e)))?;
    made.mounts.push(lower.clone());

    mount_scratch_again().map_err(failed(name, "mounting the scratch disk for the root"))?;
    let writable = writable_dir(name);
    let _ = fs::remove_dir_all(&writable);
    let (upper, work) = (writable.join("upper"), writable.join("work"));
    for d in [&upper, &work] {
        fs::create_dir_all(d).map_err(failed(name, "making the root's writable layer"))?;
    }
    made.dirs.push(writable);
    // Paths made here from a checked name: no ',' or ':' to escape.
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        root,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|e| failed(name, "mounting the root's overlay")(errno(e)))?;
    made.mounts.push(root.to_owned());

    let etc = root.join("etc");
    ensure_dir(name, &etc)?;
    for file in SHARED_FILES {
        let source = Path::new("/etc").join(file);
        ensure_vm_file(&source).map_err(failed(name, "writing the VM's /etc file"))?;
        let target = etc.join(file);
        match fs::symlink_metadata(&target) {
            // The image's own link (a resolv.conf managed elsewhere) stays,
            // and is not mounted over.
            Ok(meta) if meta.file_type().is_symlink() => continue,
            Ok(meta) if meta.is_dir() => {
                return Err(RootError::UnsafeTarget {
                    name: name.to_owned(),
                    path: format!("/etc/{file}"),
                })
            }
            Ok(_) => {}
            Err(_) => {
                fs::write(&target, b"").map_err(failed(name, "making an /etc file"))?;
            }
        }
        bind(name, &source, &target, false)?;
    }
    // Before the VM's /proc, /dev and /sys come in: a volume that reaches
    // one of them through the image's links then lands in the root's own
    // directory there (and is covered), never in the VM's.
    crate::guest_volumes::bind_all(root, volumes).map_err(|source| RootError::Volume {
        name: name.to_owned(),
        source,
    })?;
    for shared in ["proc", "dev", "sys"] {
        let target = root.join(shared);
        ensure_dir(name, &target)?;
        bind(name, Path::new("/").join(shared).as_path(), &target, true)?;
    }
    Ok(())
}

/// A mount point in the root: a directory, never a link that would carry
/// the mount elsewhere in the VM.
fn ensure_dir(name: &str, path: &Path) -> Result<(), RootError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(RootError::UnsafeTarget {
            name: name.to_owned(),
            path: path.strip_prefix(container_root(name)).map_or_else(
                |_| path.display().to_string(),
                |p| format!("/{}", p.display()),
            ),
        }),
        Err(_) => fs::create_dir(path).map_err(failed(name, "making a mount point")),
    }
}

fn bind(name: &str, source: &Path, target: &Path, recursive: bool) -> Result<(), RootError> {
    let flags = if recursive {
        MsFlags::MS_BIND | MsFlags::MS_REC
    } else {
        MsFlags::MS_BIND
    };
    mount(Some(source), target, None::<&str>, flags, None::<&str>)
        .map_err(|e| failed(name, "binding the VM's files into the root")(errno(e)))
}

/// The VM's own /etc file, made when its image has none (a pod's pause
/// image has no /etc at all).
fn ensure_vm_file(path: &Path) -> io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    fs::create_dir_all("/etc")?;
    let contents = match path.file_name().and_then(|n| n.to_str()) {
        Some("hosts") => format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{}\n",
            hostname()
        ),
        Some("hostname") => format!("{}\n", hostname()),
        _ => String::new(),
    };
    fs::write(path, contents)
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The scratch disk at [`SCRATCH_AGAIN`]: ext4 mounted twice is one file
/// system seen at two places.
pub(crate) fn mount_scratch_again() -> io::Result<()> {
    fs::create_dir_all(SCRATCH_AGAIN)?;
    if crate::vm_init::is_mount_point(Path::new(SCRATCH_AGAIN)) {
        return Ok(());
    }
    mount(
        Some(crate::vm_init::SCRATCH_DISK),
        SCRATCH_AGAIN,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(errno)
}

/// The block device whose serial (virtio-blk GET_ID) is `disk_id`, once
/// the guest sees it at `sectors` (its size tells the new disk from the
/// slot's last one, or from an empty slot).
fn await_disk(disk_id: &str, sectors: u64) -> Result<PathBuf, RootError> {
    let started = Instant::now();
    let sys_block = Path::new("/sys/block");
    let mut found = None;
    loop {
        if found.is_none() {
            found = find_disk(sys_block, disk_id);
        }
        if let Some(name) = &found {
            let size = fs::read_to_string(sys_block.join(name).join("size"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if size == Some(sectors) {
                return Ok(Path::new("/dev").join(name));
            }
        }
        if started.elapsed() > APPEAR_WITHIN {
            return Err(RootError::NoDisk(disk_id.to_owned(), sectors));
        }
        // The size changes on the guest kernel's workqueue with no event
        // the agent can wait on short of a uevent socket; the wait is
        // short and bounded.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The name under `sys_block` of the virtio disk whose serial is `disk_id`.
fn find_disk(sys_block: &Path, disk_id: &str) -> Option<String> {
    fs::read_dir(sys_block).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        if !name.starts_with("vd") {
            return None;
        }
        let serial = fs::read(entry.path().join("serial")).ok()?;
        let serial = String::from_utf8_lossy(&serial);
        (serial.trim_end_matches(['\0', '\n']) == disk_id).then_some(name)
    })
}

fn flush_cached_pages(device: &Path) -> io::Result<()> {
    let file = fs::File::open(device)?;
    // SAFETY: BLKFLSBUF takes no argument and only reads the descriptor,
    // which `file` keeps open across the call.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKFLSBUF as _, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_found_by_its_serial() {
        let dir = std::env::temp_dir().join(format!("guest-roots-{}", std::process::id()));
        for (name, serial) in [("vda", "disk0\n"), ("vdd", "disk3"), ("sda", "disk3")] {
            fs::create_dir_all(dir.join(name)).expect("dir");
            fs::write(dir.join(name).join("serial"), serial).expect("serial");
        }
        assert_eq!(find_disk(&dir, "disk3").as_deref(), Some("vdd"));
        assert_eq!(find_disk(&dir, "disk0").as_deref(), Some("vda"));
        assert_eq!(find_disk(&dir, "disk4"), None);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_and_disk_ids_are_checked_first() {
        assert!(matches!(
            mount_root("../x", "disk3", 8, None, &[]),
            Err(RootError::BadName(_))
        ));
        assert!(matches!(
            mount_root("web", "vdd", 8, None, &[]),
            Err(RootError::BadDisk(_))
        ));
        assert!(matches!(
            mount_root("web", "disk", 8, None, &[]),
            Err(RootError::BadDisk(_))
        ));
        assert!(matches!(
            unmount_root(".hidden"),
            Err(RootError::BadName(_))
        ));
    }
}
