//! A guest's copy of a read-only host volume brought up to date in place
//! (`RequestBody::ReplaceVolume`), when the host's changed: the kubelet
//! updates a ConfigMap or rotates a service account token long after the
//! container started. The host writes the new tree beside the copy (as
//! copy `from`) and this moves it into the copy: the copy's directories
//! stay the ones bound into roots, so their processes see the change, and
//! each name that both trees hold is swapped by one `renameat2`
//! (`RENAME_EXCHANGE`), so a reader sees the old entry or the new one.
//! Names only the new tree has come in before any swap, and names only
//! the old one has go after: the kubelet's layout (`token -> ..data/token`,
//! `..data -> ..<timestamp>`) then switches in one step, as on the host.
//! A copy bound writable anywhere is the guest's own, and never replaced.
//!
//! Every step starts at a descriptor and follows no symlink, as the copy's
//! writes do (`guest_volumes`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{renameat2, RenameFlags};
use sandbox_proto::valid_root_name;

use crate::guest_volumes::{list, open_listable, remove_at, set_owner_and_mode, VolumeError};

/// Makes copy `key` what copy `from` holds, and removes `from`.
pub fn replace(key: &str, from: &str) -> Result<(), VolumeError> {
    let _copies = crate::guest_volumes::copies_held();
    let volumes = crate::guest_volumes::volumes_dir(key)?;
    replace_at(&volumes, key, from)
}

/// [`replace`] with the copies in `volumes`.
fn replace_at(volumes: &OwnedFd, key: &str, from: &str) -> Result<(), VolumeError> {
    for name in [key, from] {
        if !valid_root_name(name) {
            return Err(VolumeError::BadKey(name.to_owned()));
        }
    }
    if key == from {
        return Err(VolumeError::BadKey(from.to_owned()));
    }
    if crate::guest_volumes::bound_writable(key) {
        let _ = remove_at(volumes, from);
        return Err(VolumeError::BoundWritable(key.to_owned()));
    }
    let merged = merge_copies(volumes, key, from);
    // Whatever is left of the new tree (the old entries swapped out, or
    // all of it after a failure) goes: the host writes it afresh next time.
    let removed = remove_at(volumes, from).map_err(|source| VolumeError::Io {
        key: key.to_owned(),
        path: String::new(),
        step: "removing what the new copy replaced",
        source,
    });
    merged.and(removed)
}

fn merge_copies(volumes: &OwnedFd, key: &str, from: &str) -> Result<(), VolumeError> {
    let failed = |path: String, step: &'static str| {
        let key = key.to_owned();
        move |source: io::Error| VolumeError::Io {
            key,
            path,
            step,
            source,
        }
    };
    let live = open_listable(volumes, key).map_err(failed(
        String::new(),
        "opening the copy (only a directory is replaced)",
    ))?;
    let staged =
        open_listable(volumes, from).map_err(failed(String::new(), "opening the new copy"))?;
    take_owner_and_mode(&live, &staged)
        .map_err(failed(String::new(), "giving it the new owner and mode"))?;
    merge(&live, &staged, "")
        .map_err(|(path, source)| failed(path, "moving the new copy in")(source))
}

/// Moves `staged`'s entries into `live` (entry `at` of the copy), as the
/// module says; a failure names the entry it failed at.
fn merge(live: &OwnedFd, staged: &OwnedFd, at: &str) -> Result<(), (String, io::Error)> {
    let named = |name: &str| {
        if at.is_empty() {
            name.to_owned()
        } else {
            format!("{at}/{name}")
        }
    };
    let new = list(staged).map_err(|e| (at.to_owned(), e))?;
    let old = list(live).map_err(|e| (at.to_owned(), e))?;
    for name in new.keys().filter(|name| !old.contains_key(*name)) {
        rename(staged, name, live, RenameFlags::RENAME_NOREPLACE).map_err(|e| (named(name), e))?;
    }
    for (name, new_is_dir) in new.iter() {
        match old.get(name) {
            None => {}
            Some(true) if *new_is_dir => {
                let entry = named(name);
                let (live_dir, staged_dir) = open_listable(live, name)
                    .and_then(|l| Ok((l, open_listable(staged, name)?)))
                    .map_err(|e| (entry.clone(), e))?;
                take_owner_and_mode(&live_dir, &staged_dir).map_err(|e| (entry.clone(), e))?;
                merge(&live_dir, &staged_dir, &entry)?;
            }
            Some(_) => rename(staged, name, live, RenameFlags::RENAME_EXCHANGE)
                .map_err(|e| (named(name), e))?,
        }
    }
    for name in old.keys().filter(|name| !new.contains_key(*name)) {
        remove_at(live, name).map_err(|e| (named(name), e))?;
    }
    Ok(())
}

/// Gives directory `live` the owner and mode `staged` has.
fn take_owner_and_mode(live: &OwnedFd, staged: &OwnedFd) -> io::Result<()> {
    let stat = nix::sys::stat::fstat(staged.as_raw_fd())?;
    set_owner_and_mode(live, stat.st_mode, stat.st_uid, stat.st_gid)
}

fn rename(from_dir: &OwnedFd, name: &str, to_dir: &OwnedFd, flags: RenameFlags) -> io::Result<()> {
    renameat2(
        Some(from_dir.as_raw_fd()),
        name,
        Some(to_dir.as_raw_fd()),
        name,
        flags,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_proto::VolumeEntry;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("volume-replace-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn replace_dir(volumes: &Path, key: &str, from: &str) -> Result<(), VolumeError> {
        let dir = crate::guest_volumes::open_dir(None, volumes).expect("volumes dir");
        replace_at(&dir, key, from)
    }

    fn ids() -> (u32, u32) {
        (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        )
    }

    fn dir(path: &str, mode: u32) -> VolumeEntry {
        let (uid, gid) = ids();
        VolumeEntry::Dir {
            path: path.into(),
            mode,
            uid,
            gid,
        }
    }

    fn file(path: &str, data: &str) -> VolumeEntry {
        let (uid, gid) = ids();
        VolumeEntry::File {
            path: path.into(),
            mode: 0o644,
            uid,
            gid,
            data: data.as_bytes().to_vec(),
        }
    }

    fn link(path: &str, target: &str) -> VolumeEntry {
        let (uid, gid) = ids();
        VolumeEntry::Symlink {
            path: path.into(),
            target: target.into(),
            uid,
            gid,
        }
    }

    /// A projected volume as the kubelet lays it out, at `stamp`.
    fn projected(stamp: &str, token: &str) -> Vec<VolumeEntry> {
        vec![
            dir("", 0o755),
            dir(stamp, 0o755),
            file(&format!("{stamp}/token"), token),
            link("..data", stamp),
            link("token", "..data/token"),
        ]
    }

    #[test]
    fn a_rotated_token_replaces_the_old_in_the_same_directory() {
        let volumes = scratch("rotated");
        crate::guest_volumes::write_in(&volumes, "vol-1", true, &projected("..a", "old"))
            .expect("first copy");
        let top = volumes.join("vol-1");
        let inode = fs::metadata(&top).expect("top").ino();
        // A process holding the old directory open (as a bind mount does).
        let held = fs::File::open(&top).expect("held");
        let mut rotated = projected("..b", "new");
        rotated[0] = dir("", 0o750);
        crate::guest_volumes::write_in(&volumes, "vol-1.next", true, &rotated).expect("staged");
        replace_dir(&volumes, "vol-1", "vol-1.next").expect("replaced");

        assert_eq!(fs::read_to_string(top.join("token")).expect("token"), "new");
        assert_eq!(fs::metadata(&top).expect("top").ino(), inode);
        assert_eq!(
            fs::metadata(&top).expect("top").permissions().mode() & 0o7777,
            0o750
        );
        assert!(!top.join("..a").exists(), "the old timestamp is gone");
        assert!(
            !volumes.join("vol-1.next").exists(),
            "the staging copy is gone"
        );
        let mut names: Vec<String> = fs::read_dir(format!("/proc/self/fd/{}", held.as_raw_fd()))
            .expect("through the held directory")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["..b", "..data", "token"]);
        let _ = fs::remove_dir_all(&volumes);
    }

    #[test]
    fn nested_directories_merge_and_an_entry_may_change_its_kind() {
        let volumes = scratch("nested");
        let first = vec![
            dir("", 0o755),
            dir("conf", 0o755),
            file("conf/a", "a1"),
            file("conf/gone", "x"),
            file("was-file", "f"),
            dir("was-dir", 0o755),
            file("was-dir/inside", "i"),
        ];
        crate::guest_volumes::write_in(&volumes, "vol-2", true, &first).expect("first");
        let conf_inode = fs::metadata(volumes.join("vol-2/conf"))
            .expect("conf")
            .ino();
        let second = vec![
            dir("", 0o755),
            dir("conf", 0o700),
            file("conf/a", "a2"),
            file("conf/b", "b"),
            dir("was-file", 0o755),
            file("was-file/now", "n"),
            file("was-dir", "now a file"),
        ];
        crate::guest_volumes::write_in(&volumes, "vol-2.next", true, &second).expect("second");
        replace_dir(&volumes, "vol-2", "vol-2.next").expect("replaced");

        let top = volumes.join("vol-2");
        let conf = fs::metadata(top.join("conf")).expect("conf");
        assert_eq!(conf.ino(), conf_inode, "a directory both hold stays");
        assert_eq!(conf.permissions().mode() & 0o7777, 0o700);
        assert_eq!(fs::read_to_string(top.join("conf/a")).expect("a"), "a2");
        assert_eq!(fs::read_to_string(top.join("conf/b")).expect("b"), "b");
        assert!(!top.join("conf/gone").exists());
        assert_eq!(
            fs::read_to_string(top.join("was-file/now")).expect("now"),
            "n"
        );
        assert_eq!(
            fs::read_to_string(top.join("was-dir")).expect("was-dir"),
            "now a file"
        );
        assert!(!volumes.join("vol-2.next").exists());
        let _ = fs::remove_dir_all(&volumes);
    }

    #[test]
    fn a_link_in_place_of_a_copy_is_not_followed() {
        let volumes = scratch("links");
        let outside = volumes.join("outside");
        fs::create_dir_all(&outside).expect("outside");
        fs::write(outside.join("keep"), "kept").expect("keep");
        std::os::unix::fs::symlink(&outside, volumes.join("vol-3")).expect("planted link");
        crate::guest_volumes::write_in(&volumes, "vol-3.next", true, &projected("..a", "t"))
            .expect("staged");
        let refused = replace_dir(&volumes, "vol-3", "vol-3.next");
        assert!(refused.is_err(), "{refused:?}");
        assert!(
            !volumes.join("vol-3.next").exists(),
            "a failed replacement leaves no staging copy"
        );
        assert_eq!(
            fs::read_to_string(outside.join("keep")).expect("keep"),
            "kept"
        );
        assert_eq!(fs::read_dir(&outside).expect("outside").count(), 1);
        // The positive control: the same staging replaces a real copy.
        fs::remove_file(volumes.join("vol-3")).expect("unplant");
        crate::guest_volumes::write_in(&volumes, "vol-3", true, &projected("..z", "z"))
            .expect("a real copy");
        crate::guest_volumes::write_in(&volumes, "vol-3.next", true, &projected("..a", "t"))
            .expect("staged again");
        replace_dir(&volumes, "vol-3", "vol-3.next").expect("replaced");
        assert_eq!(
            fs::read_to_string(volumes.join("vol-3/token")).expect("token"),
            "t"
        );
        assert!(
            matches!(
                replace_dir(&volumes, "vol-3", "vol-3"),
                Err(VolumeError::BadKey(_))
            ),
            "a copy is not replaced by itself"
        );
        let _ = fs::remove_dir_all(&volumes);
    }
}
