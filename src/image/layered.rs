//! Reading a few files of an image before anything runs it: its layers
//! (top first) seen the way overlayfs would stack them, enough to tell
//! what the base is (`/etc/os-release`), where its apt sources point,
//! whether it has a Python already, and who its config's `User` is
//! (`/etc/passwd`, `/etc/group`). Symlinks are followed inside the image,
//! never out of it.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::SFlag;

use crate::image::Image;
use crate::runtime::beneath::Dir;

/// Files read here are small; a larger one is not what it claims to be.
const MAX_READ: u64 = 256 << 10;
const MAX_HOPS: usize = 8;

/// The layers of an image, top first.
pub struct Layered {
    dirs: Vec<PathBuf>,
}

/// What `/etc/os-release` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID` (`debian`, `alpine`...).
    pub id: String,
    /// `VERSION_CODENAME` (`bookworm`), if given.
    pub codename: Option<String>,
}

impl Layered {
    pub fn of(image: &Image) -> Self {
        let mut dirs = image.layers.clone();
        dirs.push(image.rootfs.clone());
        Layered { dirs }
    }

    /// The path of `/rel` in the topmost layer that has it, symlinks
    /// followed within the image; `None` when absent or deleted above.
    pub fn find(&self, rel: &str) -> Option<PathBuf> {
        self.resolve(rel).map(|found| found.path)
    }

    /// [`Self::find`], with where inside the image the entry was found and
    /// what it is. Each component is looked up on its own, beneath its
    /// layer and through no symlink (a layer comes from an image, so its
    /// links may point anywhere on the host): a link found on the way is
    /// resolved against the image's root and the lookup starts again.
    fn resolve(&self, rel: &str) -> Option<Found> {
        let mut wanted = normalize(Path::new(rel))?;
        'hop: for _ in 0..MAX_HOPS {
            let parts: Vec<Component> = wanted.components().collect();
            let mut prefix = PathBuf::new();
            for (i, part) in parts.iter().enumerate() {
                prefix.push(part);
                let (path, kind) = self.top_entry(&prefix)?;
                if kind == SFlag::S_IFLNK {
                    let target = fs::read_link(&path).ok()?;
                    let base = if target.is_absolute() {
                        target
                    } else {
                        prefix.parent().unwrap_or(Path::new("")).join(target)
                    };
                    let rest: PathBuf = parts[i + 1..].iter().collect();
                    wanted = normalize(&base.join(rest))?;
                    continue 'hop;
                }
                if i + 1 == parts.len() {
                    return Some(Found {
                        path,
                        rel: prefix,
                        kind,
                    });
                }
                if kind != SFlag::S_IFDIR {
                    return None;
                }
            }
            return None;
        }
        None
    }

    /// The text of `/rel`, if the image has it as a small file.
    pub fn read(&self, rel: &str) -> Option<String> {
        let found = self.resolve(rel)?;
        // Only a regular file is opened: a FIFO would block the reader.
        if found.kind != SFlag::S_IFREG {
            return None;
        }
        let mut text = String::new();
        fs::File::open(found.path)
            .ok()?
            .take(MAX_READ)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    }

    /// The names in directory `/rel` across all layers (a whiteout above
    /// hides a name below).
    pub fn list(&self, rel: &str) -> Vec<String> {
        let Some(dir) = self
            .resolve(rel)
            .filter(|found| found.kind == SFlag::S_IFDIR)
            .map(|found| found.rel)
        else {
            return Vec::new();
        };
        let mut seen = BTreeSet::new();
        let mut names = BTreeSet::new();
        for layer in &self.dirs {
            // Only a layer where the directory is reached through no symlink.
            if kind_in(layer, &dir) != Some(SFlag::S_IFDIR) {
                continue;
            }
            for entry in fs::read_dir(layer.join(&dir))
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !seen.insert(name.clone()) {
                    continue;
                }
                let whiteout = entry.file_type().is_ok_and(|t| t.is_char_device());
                if !whiteout {
                    names.insert(name);
                }
            }
        }
        names.into_iter().collect()
    }

    pub fn os_release(&self) -> Option<OsRelease> {
        let text = self
            .read("etc/os-release")
            .or_else(|| self.read("usr/lib/os-release"))?;
        let field = |key: &str| {
            text.lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().trim_matches('"').to_string())
                .filter(|v| !v.is_empty())
        };
        Some(OsRelease {
            id: field("ID")?,
            codename: field("VERSION_CODENAME"),
        })
    }

    /// The apt sources the image ships (`sources.list` and
    /// `sources.list.d/*.{list,sources}`), as one text.
    pub fn apt_sources(&self) -> String {
        let mut text = self.read("etc/apt/sources.list").unwrap_or_default();
        for name in self.list("etc/apt/sources.list.d") {
            if name.ends_with(".list") || name.ends_with(".sources") {
                if let Some(more) = self.read(&format!("etc/apt/sources.list.d/{name}")) {
                    text.push('\n');
                    text.push_str(&more);
                }
            }
        }
        text
    }

    /// The uid and gid of an image config's `User` (`name`, `uid`,
    /// `name:group`, `uid:gid`), names looked up in the image's
    /// `/etc/passwd` and `/etc/group`; a numeric uid without a group takes
    /// its passwd entry's group, else 0.
    pub fn user(&self, user: &str) -> Result<(u32, u32), String> {
        let (who, group) = match user.split_once(':') {
            Some((who, group)) => (who, Some(group)),
            None => (user, None),
        };
        let passwd = self.read("etc/passwd").unwrap_or_default();
        let entry = |matches: &dyn Fn(&[&str]) -> bool| {
            passwd
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 4 && matches(f))
                .and_then(|f| Some((f[2].parse::<u32>().ok()?, f[3].parse::<u32>().ok()?)))
        };
        let (uid, primary) = match who.parse::<u32>() {
            Ok(uid) => (uid, entry(&|f| f[2] == who).map(|(_, g)| g).unwrap_or(0)),
            Err(_) => entry(&|f| f[0] == who)
                .ok_or_else(|| format!("user {who:?} is not in the image's /etc/passwd"))?,
        };
        let gid = match group {
            None => primary,
            Some(group) => match group.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => self
                    .read("etc/group")
                    .unwrap_or_default()
                    .lines()
                    .map(|l| l.split(':').collect::<Vec<_>>())
                    .find(|f| f.len() >= 3 && f[0] == group)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| format!("group {group:?} is not in the image's /etc/group"))?,
            },
        };
        Ok((uid, gid))
    }

    /// The topmost layer's entry for `rel` (normalised, relative) and its
    /// type, unless a whiteout there deletes it. A layer where `rel` is not
    /// reached through directories alone (a link or a file on the way)
    /// holds none: overlayfs merges a lower layer's directory only under a
    /// directory.
    fn top_entry(&self, rel: &Path) -> Option<(PathBuf, SFlag)> {
        for layer in &self.dirs {
            match kind_in(layer, rel) {
                Some(SFlag::S_IFCHR) => return None,
                Some(kind) => return Some((layer.join(rel), kind)),
                None => continue,
            }
        }
        None
    }
}

/// An entry of the image: its path on the host, the path inside the image
/// it was found at (links resolved), and its type.
struct Found {
    path: PathBuf,
    rel: PathBuf,
    kind: SFlag,
}

/// The type of `rel` in `layer`, looked up beneath it through no symlink
/// (a trailing one is the entry); `None` when it is not reached so.
fn kind_in(layer: &Path, rel: &Path) -> Option<SFlag> {
    let (_, stat) = Dir::at(layer).ok()?.entry(rel.to_str()?).ok()??;
    Some(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT)
}

/// `rel` relative to the image root with `.` and `..` resolved, never
/// above the root.
fn normalize(rel: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in rel.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn image(layers: &[&Path], root: &Path) -> Image {
        Image {
            name: "t".into(),
            digest: "sha256:t".into(),
            rootfs: root.to_path_buf(),
            layers: layers.iter().map(|p| p.to_path_buf()).collect(),
            defaults: Default::default(),
        }
    }

    #[test]
    fn os_release_through_a_symlink_into_a_lower_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, top) = (tmp.path().join("root"), tmp.path().join("top"));
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir_all(top.join("etc")).unwrap();
        fs::write(
            root.join("usr/lib/os-release"),
            "PRETTY_NAME=\"Debian\"\nID=debian\nVERSION_CODENAME=trixie\n",
        )
        .unwrap();
        // The upper layer's link climbs past the root: it stays inside.
        symlink("../../../../usr/lib/os-release", top.join("etc/os-release")).unwrap();
        let release = Layered::of(&image(&[&top], &root)).os_release().unwrap();
        assert_eq!(release.id, "debian");
        assert_eq!(release.codename.as_deref(), Some("trixie"));
    }

    #[test]
    fn links_on_the_way_resolve_inside_the_image_and_fifos_are_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, top, host) = (
            tmp.path().join("root"),
            tmp.path().join("top"),
            tmp.path().join("host"),
        );
        for dir in [root.join("usr/etc"), top.clone(), host.clone()] {
            fs::create_dir_all(dir).unwrap();
        }
        fs::write(host.join("passwd"), "root:x:0:0:host:/root:/bin/sh\n").unwrap();
        fs::write(root.join("usr/etc/group"), "staff:x:50:\n").unwrap();
        // The top layer's etc points at a host directory by its absolute
        // path: inside the image that is /<host path>, which it lacks.
        symlink(&host, top.join("etc")).unwrap();
        let image = image(&[&top], &root);
        let layered = Layered::of(&image);
        assert_eq!(
            layered.read("etc/passwd"),
            None,
            "read through the host's link"
        );
        // Positive control: a relative link on the way resolves inside.
        fs::remove_file(top.join("etc")).unwrap();
        symlink("usr/etc", top.join("etc")).unwrap();
        assert_eq!(layered.read("etc/group").as_deref(), Some("staff:x:50:\n"));
        assert_eq!(layered.list("etc"), ["group"]);
        // A FIFO is not opened (it would block).
        nix::unistd::mkfifo(
            &root.join("usr/etc/os-release"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        assert_eq!(layered.read("etc/os-release"), None);
    }

    #[test]
    fn users_by_name_and_number() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1001::/home/node:/bin/sh\n",
        )
        .unwrap();
        fs::write(root.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let layered = Layered::of(&image(&[], &root));
        assert_eq!(layered.user("node"), Ok((1000, 1001)));
        assert_eq!(layered.user("1000"), Ok((1000, 1001)));
        assert_eq!(layered.user("node:staff"), Ok((1000, 50)));
        assert_eq!(layered.user("2000"), Ok((2000, 0)));
        assert_eq!(layered.user("7:8"), Ok((7, 8)));
        assert!(layered.user("nobody").unwrap_err().contains("/etc/passwd"));
        assert!(layered
            .user("node:wheel")
            .unwrap_err()
            .contains("/etc/group"));
    }

    #[test]
    fn a_whiteout_above_hides_a_file_below() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, top) = (tmp.path().join("root"), tmp.path().join("top"));
        fs::create_dir_all(root.join("etc/apt/sources.list.d")).unwrap();
        fs::create_dir_all(top.join("etc/apt/sources.list.d")).unwrap();
        fs::write(
            root.join("etc/apt/sources.list.d/a.list"),
            "deb http://a/ x main",
        )
        .unwrap();
        fs::write(
            root.join("etc/apt/sources.list.d/b.list"),
            "deb http://b/ x main",
        )
        .unwrap();
        nix::sys::stat::mknod(
            &top.join("etc/apt/sources.list.d/b.list"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            0,
        )
        .unwrap();
        let layered = Layered::of(&image(&[&top], &root));
        let text = layered.apt_sources();
        assert!(text.contains("http://a/"), "{text}");
        assert!(!text.contains("http://b/"), "{text}");
        assert!(layered.find("etc/apt/sources.list.d/b.list").is_none());
    }
}
