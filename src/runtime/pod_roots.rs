//! The root of one container of a pod, inside the pod's sandbox: an overlay
//! of the container's layers (owned by host ids, so idmapped as in
//! [`super::idmap`]) over a writable layer of its own in the sandbox's disk
//! layer (`containers/<name>/`, under the sandbox's quota, gone with the
//! sandbox). The supervisor makes it in the host's mount namespace, takes a
//! detached clone (`open_tree`) and unmounts its own copy at once, so
//! nothing stays mounted on the host. It then attaches the clone inside the
//! sandbox's mount namespace at `sandbox_proto::container_root(name)`,
//! with the sandbox's `/proc`, `/dev` and `/sys` and its `/etc/hosts`,
//! `/etc/hostname` and `/etc/resolv.conf` bound in; the agent chroots
//! spawns naming the root there. That tree is the sandbox's to change
//! while the host works in it, so each step there is taken beneath a
//! descriptor through no symlink (`super::beneath`). The host does the mounting because the
//! sandbox cannot: its seccomp filter refuses the mount calls to all in it.

use std::fs::{self, File, Permissions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{lchown, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags};
use nix::sched::{setns, unshare, CloneFlags};
use sandbox_proto::{container_root, CONTAINER_ROOTS_DIR};

use super::beneath::Dir;
use super::idmap::{idmap_layers, IdmapError};
use super::paths::SandboxPaths;
use super::sandbox::SandboxSpec;
use super::volumes::{bind_volumes, VolumeError};
use crate::model::HostVolume;

#[derive(Debug, thiserror::Error)]
pub enum PodRootError {
    #[error("container root {name:?}: {step}: {source}")]
    Io {
        name: String,
        step: &'static str,
        source: io::Error,
    },
    #[error("container root {name:?}: {source}")]
    Idmap { name: String, source: IdmapError },
    #[error("container root {name:?}: {source}")]
    Volume { name: String, source: VolumeError },
    #[error("container root {0:?} is attached already")]
    Exists(String),
    #[error("no container root named {0:?} is attached")]
    Missing(String),
    #[error("container root {name:?}: {path} is a symlink or not a directory in the image; refusing to mount over it")]
    UnsafeTarget { name: String, path: String },
}

/// The sandbox directories every container root gets, bound recursively.
const SHARED_DIRS: [&str; 3] = ["proc", "dev", "sys"];
/// The sandbox's files that name it on the network, bound over the image's.
const SHARED_FILES: [&str; 3] = ["hosts", "hostname", "resolv.conf"];

/// What turns an I/O error at `step` of root `name` into its error.
fn failed(name: &str, step: &'static str) -> impl FnOnce(io::Error) -> PodRootError {
    let name = name.to_string();
    move |source| PodRootError::Io { name, step, source }
}

/// The writable layer of container root `name` (its `upper` and `work`).
pub fn writable_dir(spec: &SandboxSpec, name: &str) -> PathBuf {
    spec.layer_dir.join("containers").join(name)
}

/// Makes container root `name` on `layers` (top first), with `volumes`
/// bound in, and returns it as a detached mount.
pub fn make(
    spec: &SandboxSpec,
    paths: &SandboxPaths,
    name: &str,
    layers: &[PathBuf],
    volumes: &[HostVolume],
) -> Result<OwnedFd, PodRootError> {
    let fail = |step: &'static str| failed(name, step);
    let writable = writable_dir(spec, name);
    if let Some(parent) = writable.parent() {
        fs::create_dir_all(parent).map_err(fail("making its writable layer"))?;
    }
    // Claims the name: a second attach of it fails here, never shares it.
    match fs::create_dir(&writable) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(PodRootError::Exists(name.into()))
        }
        Err(e) => return Err(fail("making its writable layer")(e)),
    }
    let made = make_claimed(spec, paths, name, layers, volumes, &writable);
    if made.is_err() {
        let _ = remove(spec, name);
    }
    made
}

fn make_claimed(
    spec: &SandboxSpec,
    paths: &SandboxPaths,
    name: &str,
    layers: &[PathBuf],
    volumes: &[HostVolume],
    writable: &Path,
) -> Result<OwnedFd, PodRootError> {
    let fail = |step: &'static str| failed(name, step);
    let (upper, work) = (writable.join("upper"), writable.join("work"));
    for dir in [&upper, &work] {
        fs::create_dir(dir).map_err(fail("making its writable layer"))?;
        lchown(dir, Some(spec.id_map_base), Some(spec.id_map_base))
            .map_err(fail("giving its writable layer to the sandbox"))?;
    }
    // upper/ becomes the container's `/`: the same mode as an image root.
    fs::set_permissions(&upper, Permissions::from_mode(0o755))
        .map_err(fail("giving its writable layer to the sandbox"))?;

    // A staging directory of this attempt's own: the name is claimed, but
    // a teardown's sweep of the run directory must never meet a mount
    // another attempt left (see unmount_staging).
    let staging = paths.pod_roots().join(format!(
        "{name}.{}",
        STAGING_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let target = staging.join("rootfs");
    fs::create_dir_all(&target).map_err(fail("making its mount point"))?;
    let made = mount_and_clone(spec, &staging, &upper, &work, layers, volumes, name);
    // The sandbox holds the clone; the host keeps nothing mounted (the
    // volumes go with the overlay: the unmount is recursive). Only empty
    // directories are removed: a recursive removal would walk into
    // whatever stayed mounted and delete through it as host root
    // (unmount_staging detaches such leftovers at teardown).
    let _ = umount2(&target, MntFlags::MNT_DETACH);
    for dir in [target, staging.join("layers"), staging] {
        let _ = fs::remove_dir(dir);
    }
    made
}

/// Numbers staging directories within this supervisor.
static STAGING_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Detaches whatever an interrupted attach left mounted under the run
/// directory's `pod-roots/` (idmapped layers, an overlay), so a teardown
/// that removes the run directory never walks into a mounted tree.
pub fn unmount_staging(paths: &SandboxPaths) -> Vec<String> {
    let dir = paths.pod_roots();
    // Only a pod's sandbox has the directory (made by its first attach):
    // every other teardown skips reading the host's whole mount table,
    // which grows with the sandboxes on it.
    if !dir.exists() {
        return Vec::new();
    }
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut under: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(&dir))
        .collect();
    // Deepest first.
    under.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    under
        .into_iter()
        .filter_map(|point| match umount2(&point, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => None,
            Err(e) => Some(format!("unmounting {}: {e}", point.display())),
        })
        .collect()
}

/// Mounts the root at `<staging>/rootfs` and clones it.
fn mount_and_clone(
    spec: &SandboxSpec,
    staging: &Path,
    upper: &Path,
    work: &Path,
    layers: &[PathBuf],
    volumes: &[HostVolume],
    name: &str,
) -> Result<OwnedFd, PodRootError> {
    let fail = |step: &'static str| failed(name, step);
    let target = &staging.join("rootfs");
    let layers: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    // Detached again when this returns: the overlay holds its own clones.
    let idmapped = idmap_layers(
        &layers,
        &staging.join("layers"),
        spec.id_map_base,
        spec.id_map_size,
    )
    .map_err(|source| PodRootError::Idmap {
        name: name.to_string(),
        source,
    })?;
    super::container::mount_overlay(target, &idmapped.paths(), upper, work)
        .map_err(fail("mounting its overlay"))?;
    make_mount_points(spec, name, target)?;
    let bound =
        bind_volumes(target, volumes, spec.id_map_base, spec.id_map_size).map_err(|source| {
            PodRootError::Volume {
                name: name.to_string(),
                source,
            }
        })?;
    super::volumes::warn_host_ids(name, volumes, &bound);
    // With the volumes mounted inside it.
    let clone = mountfd::clone_tree(mountfd::Source::Path(target), !volumes.is_empty())
        .map_err(fail("cloning its overlay"))?;
    // Its own peer group: mounts made on either side never propagate
    // (no attribute set, only MS_PRIVATE, on every mount of the clone).
    mountfd::set_attrs(clone.as_fd(), 0, None, true).map_err(fail("making its clone private"))?;
    Ok(clone)
}

/// Makes the mount points of the sandbox's shared directories and files
/// in the root while only the host sees it (no process of the sandbox can
/// race these checks), owned by the sandbox's root.
fn make_mount_points(spec: &SandboxSpec, name: &str, root: &Path) -> Result<(), PodRootError> {
    let unsafe_target = |path: &Path| PodRootError::UnsafeTarget {
        name: name.into(),
        path: path.display().to_string(),
    };
    let io_err = |step: &'static str| failed(name, step);
    let owned = |path: &Path| {
        lchown(path, Some(spec.id_map_base), Some(spec.id_map_base))
            .map_err(io_err("giving a mount point to the sandbox"))
    };
    let ensure_dir = |path: &Path| -> Result<(), PodRootError> {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(unsafe_target(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(path).map_err(io_err("making a mount point"))?;
                owned(path)
            }
            Err(e) => Err(io_err("reading a mount point")(e)),
        }
    };
    for dir in SHARED_DIRS {
        ensure_dir(&root.join(dir))?;
    }
    let etc = root.join("etc");
    ensure_dir(&etc)?;
    for file in SHARED_FILES {
        let target = etc.join(file);
        match fs::symlink_metadata(&target) {
            // The image's own link (a resolv.conf managed elsewhere) stays,
            // and is not mounted over.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(io_err("making an /etc file"))?;
                owned(&target)?;
            }
            Err(e) => return Err(io_err("reading an /etc file")(e)),
        }
    }
    Ok(())
}

/// Attaches `root` (from [`make`]) as container root `name` inside the
/// mount namespace of the sandbox whose init is host pid `init_pid`. The
/// sandbox's root can change that tree at any moment, so every step is
/// taken beneath a descriptor and through no symlink ([`super::beneath`]).
pub fn attach(init_pid: i32, name: &str, root: &OwnedFd) -> Result<(), PodRootError> {
    in_mount_namespace(init_pid, name, || {
        let step = |step: &'static str| refused_or_failed(name, step);
        let roots = Dir::root()
            .and_then(|top| top.make_all(CONTAINER_ROOTS_DIR.trim_start_matches('/'), 0o755))
            .map_err(step("making the roots directory"))?;
        if !roots
            .make(name, 0o755)
            .map_err(step("making its directory"))?
        {
            return Err(PodRootError::Exists(name.into()));
        }
        let attached = roots
            .open(name)
            .and_then(|dir| {
                dir.make("rootfs", 0o755)?;
                dir.open("rootfs")
            })
            .map_err(step("making its mount point"))
            .and_then(|target| {
                mountfd::attach_onto(root.as_fd(), target.as_fd())
                    .map_err(step("attaching its overlay"))
            })
            // Opened again: the name now leads to the overlay's root.
            .and_then(|()| {
                roots
                    .open(&format!("{name}/rootfs"))
                    .map_err(step("opening it"))
            })
            .and_then(|mounted| bind_shared(name, &mounted));
        if let Err(e) = attached {
            if let Ok(dir) = roots.open(name) {
                let _ = unmount_rootfs_of(&dir);
            }
            remove_dirs(&roots, name);
            return Err(e);
        }
        Ok(())
    })
}

/// Unmounts the `rootfs` mount of root directory `dir` (with all bound
/// inside it), named from `dir` itself: the thread works in it (its
/// filesystem context is its own, see [`in_mount_namespace`]) and the
/// name is not followed if it has become a symlink.
fn unmount_rootfs_of(dir: &Dir) -> nix::Result<()> {
    nix::unistd::fchdir(dir.as_fd().as_raw_fd())?;
    umount2("rootfs", MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)
}

/// Removes root `name`'s directories under `roots` once nothing is
/// mounted there (best effort: a busy one stays).
fn remove_dirs(roots: &Dir, name: &str) {
    for dir in [format!("{name}/rootfs"), name.to_string()] {
        let _ = nix::unistd::unlinkat(
            Some(roots.as_fd().as_raw_fd()),
            dir.as_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        );
    }
}

/// Unmounts container root `name` (and all bound inside it) in the
/// sandbox whose init is host pid `init_pid`.
pub fn detach(init_pid: i32, name: &str) -> Result<(), PodRootError> {
    in_mount_namespace(init_pid, name, || {
        let missing = |_| PodRootError::Missing(name.into());
        let roots = Dir::root()
            .and_then(|top| top.open(CONTAINER_ROOTS_DIR.trim_start_matches('/')))
            .map_err(missing)?;
        let dir = roots.open(name).map_err(missing)?;
        dir.open("rootfs").map_err(missing)?;
        unmount_rootfs_of(&dir).map_err(|e| failed(name, "unmounting it")(e.into()))?;
        remove_dirs(&roots, name);
        Ok(())
    })
}

/// A failed step of an attach: a symlink met on the way (ELOOP) or a way
/// out of the tree (EXDEV) is the sandbox's doing, refused as unsafe.
fn refused_or_failed<'a>(
    name: &'a str,
    step: &'static str,
) -> impl Fn(io::Error) -> PodRootError + 'a {
    move |e| match e.raw_os_error() {
        Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR) => PodRootError::UnsafeTarget {
            name: name.into(),
            path: format!("{} ({step})", container_root(name)),
        },
        _ => PodRootError::Io {
            name: name.into(),
            step,
            source: e,
        },
    }
}

/// Runs `work` on a thread of its own that entered the mount namespace of
/// host pid `pid`: a thread sharing its filesystem context (every thread
/// by default) cannot change mount namespace, so it unshares that first.
/// The thread ends with `work`; the caller's namespace is never touched.
fn in_mount_namespace<T: Send>(
    pid: i32,
    name: &str,
    work: impl FnOnce() -> Result<T, PodRootError> + Send,
) -> Result<T, PodRootError> {
    let fail = |step: &'static str| failed(name, step);
    let namespace = File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(fail("opening the sandbox's mount namespace"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                unshare(CloneFlags::CLONE_FS)
                    .map_err(|e| fail("entering the sandbox's mount namespace")(e.into()))?;
                setns(&namespace, CloneFlags::CLONE_NEWNS)
                    .map_err(|e| fail("entering the sandbox's mount namespace")(e.into()))?;
                work()
            })
            .join()
            .unwrap_or_else(|_| {
                Err(fail("entering the sandbox's mount namespace")(
                    io::Error::other("the thread panicked"),
                ))
            })
    })
}

/// Binds the sandbox's shared directories and /etc files into `root` (the
/// attached overlay's root), on the mount points [`make_mount_points`]
/// made. A process of the sandbox may have replaced one since: each is
/// looked up beneath `root` through no symlink, and the bind goes onto
/// what was looked up.
fn bind_shared(name: &str, root: &Dir) -> Result<(), PodRootError> {
    let step = |step: &'static str| refused_or_failed(name, step);
    let clone = |source: &Path, recursive: bool| {
        mountfd::clone_tree(mountfd::Source::Path(source), recursive).map_err(failed(
            name,
            "cloning the sandbox's /proc, /dev, /sys or /etc files",
        ))
    };
    for dir in SHARED_DIRS {
        let target = root.open(dir).map_err(step("opening a mount point"))?;
        let tree = clone(&Path::new("/").join(dir), true)?;
        mountfd::attach_onto(tree.as_fd(), target.as_fd())
            .map_err(step("binding a shared directory"))?;
    }
    let etc = root.open("etc").map_err(step("opening /etc"))?;
    for file in SHARED_FILES {
        let source = Path::new("/etc").join(file);
        let Some(target) = etc
            .regular_file(file)
            .map_err(step("opening an /etc file"))?
        else {
            continue;
        };
        if !source.exists() {
            continue;
        }
        let tree = clone(&source, false)?;
        mountfd::attach_onto(tree.as_fd(), target.as_fd()).map_err(step("binding an /etc file"))?;
    }
    Ok(())
}

/// Removes container root `name`'s writable layer (once it is detached).
pub fn remove(spec: &SandboxSpec, name: &str) -> Result<(), PodRootError> {
    match fs::remove_dir_all(writable_dir(spec, name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed(name, "removing its writable layer")(e)),
    }
}
