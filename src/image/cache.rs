//! `ImageCache`: maps image names to built root filesystems, building on a miss.
//! Resolving a built image is one `stat`; building is serialised per digest by an
//! flock, so concurrent requests and several daemons build each image once.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, DirBuilderExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{renameat2, Flock, FlockArg, RenameFlags};
use serde::{Deserialize, Serialize};

use super::build::{run_recipe, Outcome};
use super::mounts::detach_below;
use super::name::validate_name;
use super::recipe::{self, digest_dir_name, Recipe};
use super::shift::shift_tree;
use super::ImageError;

/// A built image, ready to be an overlay lower layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Image {
    pub name: String,
    /// `sha256:<hex>` of the recipe (and format version).
    pub digest: String,
    /// Read-only root directory, owned by the shifted ids: the whole image,
    /// or a pulled image's bottom layer.
    pub rootfs: PathBuf,
    /// A pulled image's other layers, top first (overlay lowers above
    /// `rootfs`); empty for a built image.
    pub layers: Vec<PathBuf>,
    /// What the image's config gives every process.
    pub defaults: ImageDefaults,
}

/// An image config's process defaults (`Env`, `WorkingDir`); a built
/// image has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImageDefaults {
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    /// The config's `User`, as written (`node`, `1000:1000`).
    pub user: Option<String>,
}

/// One known image, built or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageInfo {
    pub name: String,
    pub digest: String,
    pub built: bool,
    /// Disk usage in bytes, recorded at build time; `None` when not built.
    pub size_bytes: Option<u64>,
    /// `builtin` or the recipe file's path.
    pub source: String,
}

/// Written next to each built image; `list` reads it instead of walking the tree.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    name: String,
    digest: String,
    size_bytes: u64,
    entries: u64,
    build_seconds: f64,
    built_at_unix: u64,
}

/// Default limit for one recipe run; a debootstrap from a slow mirror fits easily.
const DEFAULT_BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The image cache of one daemon. Cheap to share (`Arc`); all methods take `&self`.
#[derive(Debug)]
pub struct ImageCache {
    dir: PathBuf,
    recipes: BTreeMap<String, Recipe>,
    build_timeout: Duration,
}

impl ImageCache {
    /// Opens (creating if needed) the cache at `images_dir`, with the built-in recipes
    /// plus `<name>.sh` files from `extra_recipe_dirs` (later dirs win). Recipes are
    /// read once here; restart to pick up edits.
    pub fn open(images_dir: PathBuf, extra_recipe_dirs: Vec<PathBuf>) -> Result<Self, ImageError> {
        mkdir(&images_dir)?;
        // mountinfo and the overlay mount options need the real path.
        let dir =
            fs::canonicalize(&images_dir).map_err(|e| ImageError::io("resolve", &images_dir, e))?;
        let recipes = recipe::load(&extra_recipe_dirs)?;
        Ok(ImageCache {
            dir,
            recipes,
            build_timeout: DEFAULT_BUILD_TIMEOUT,
        })
    }

    /// Replaces the 30-minute default limit on one recipe run.
    pub fn with_build_timeout(mut self, timeout: Duration) -> Self {
        self.build_timeout = timeout;
        self
    }

    /// The built image for `name`, building it first if this is its first use. A name
    /// no recipe defines fails at once with [`ImageError::Unknown`].
    pub fn resolve(&self, name: &str) -> Result<Image, ImageError> {
        let recipe = self.recipe(name)?;
        let image = self.image_of(recipe);
        if image.rootfs.is_dir() {
            return Ok(image);
        }
        self.build_recipe(recipe, false)
    }

    /// Builds `name` unless already built; with `force`, rebuilds it anyway (for a
    /// changed mirror or host busybox, which the digest cannot see). A forced rebuild
    /// swaps the new tree in atomically and moves the old one to `trash/`, because
    /// running sandboxes may still use it as their lower layer.
    pub fn build(&self, name: &str, force: bool) -> Result<Image, ImageError> {
        let recipe = self.recipe(name)?;
        self.build_recipe(recipe, force)
    }

    /// Image `name` as built from the recipe with `digest`, if that tree
    /// is still here (the recipe may have changed since).
    pub fn by_digest(&self, name: &str, digest: &str) -> Option<Image> {
        let rootfs = self.digest_dir(digest).join("rootfs");
        rootfs.is_dir().then(|| Image {
            name: name.to_string(),
            digest: digest.to_string(),
            rootfs,
            layers: Vec::new(),
            defaults: ImageDefaults::default(),
        })
    }

    /// Every known image, sorted by name.
    pub fn list(&self) -> Vec<ImageInfo> {
        self.recipes
            .values()
            .map(|r| {
                let digest_dir = self.digest_dir(&r.digest);
                let built = digest_dir.join("rootfs").is_dir();
                let size_bytes = built
                    .then(|| fs::read(digest_dir.join("meta.json")).ok())
                    .flatten()
                    .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
                    .map(|m| m.size_bytes);
                ImageInfo {
                    name: r.name.clone(),
                    digest: r.digest.clone(),
                    built,
                    size_bytes,
                    source: r.source.to_string(),
                }
            })
            .collect()
    }

    /// The cache directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn recipe(&self, name: &str) -> Result<&Recipe, ImageError> {
        validate_name(name)?;
        self.recipes.get(name).ok_or_else(|| ImageError::Unknown {
            name: name.to_string(),
            known: self.recipes.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    fn digest_dir(&self, digest: &str) -> PathBuf {
        self.dir.join(digest_dir_name(digest))
    }

    fn image_of(&self, r: &Recipe) -> Image {
        Image {
            name: r.name.clone(),
            digest: r.digest.clone(),
            rootfs: self.digest_dir(&r.digest).join("rootfs"),
            layers: Vec::new(),
            defaults: ImageDefaults::default(),
        }
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    fn build_recipe(&self, r: &Recipe, force: bool) -> Result<Image, ImageError> {
        let image = self.image_of(r);
        let ddir = self.digest_dir(&r.digest);
        mkdir(&ddir)?;
        let lock_path = ddir.join("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ImageError::io("open", &lock_path, e))?;
        // Blocks while another thread or process builds this digest; held until return.
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, e)| ImageError::io("lock", &lock_path, e.into()))?;
        if !force && image.rootfs.is_dir() {
            return Ok(image);
        }

        // Leftovers of a build that crashed are ours to remove: we hold the lock.
        self.remove_leftovers(&ddir)?;
        let started = Instant::now();
        let tmp = ddir.join(format!("rootfs.tmp-{}", std::process::id()));
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&tmp)
            .map_err(|e| ImageError::io("create", &tmp, e))?;
        let result = self.run_and_shift(r, &ddir, &tmp);
        let stats = match result {
            Ok(stats) => stats,
            Err(e) => {
                detach_below(&tmp);
                let _ = fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };

        // The tree must be on disk before the name says it is complete.
        sync_fs(&tmp);
        if image.rootfs.is_dir() {
            renameat2(
                None,
                &tmp,
                None,
                &image.rootfs,
                RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|e| ImageError::io("swap in", &image.rootfs, e.into()))?;
            self.to_trash(&tmp, &r.digest)?;
        } else {
            fs::rename(&tmp, &image.rootfs)
                .map_err(|e| ImageError::io("rename into place", &image.rootfs, e))?;
        }
        if let Ok(d) = File::open(&ddir) {
            let _ = d.sync_all();
        }

        let meta = Meta {
            name: r.name.clone(),
            digest: r.digest.clone(),
            size_bytes: stats.bytes,
            entries: stats.entries,
            build_seconds: started.elapsed().as_secs_f64(),
            built_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        self.write_meta(&ddir, &meta)?;
        self.link_name(&r.name, &ddir);
        tracing::info!(
            image = %r.name,
            digest = %r.digest,
            seconds = meta.build_seconds,
            mib = stats.bytes >> 20,
            "image built"
        );
        Ok(image)
    }

    /// Runs the recipe into `tmp` and shifts the result; errors name the log.
    fn run_and_shift(
        &self,
        r: &Recipe,
        ddir: &Path,
        tmp: &Path,
    ) -> Result<super::shift::ShiftStats, ImageError> {
        let log_path = self.log_path(&r.name);
        mkdir(&self.dir.join("logs"))?;
        let mut log =
            File::create(&log_path).map_err(|e| ImageError::io("create", &log_path, e))?;
        let _ = writeln!(
            log,
            "sandboxd: building image {} ({}) from {} into {}",
            r.name,
            r.digest,
            r.source,
            tmp.display()
        );
        let script = ddir.join("recipe.sh");
        fs::write(&script, &r.text).map_err(|e| ImageError::io("write", &script, e))?;
        let (lib_name, lib_text) = recipe::RECIPE_LIB;
        let lib = ddir.join(lib_name);
        fs::write(&lib, lib_text).map_err(|e| ImageError::io("write", &lib, e))?;

        let outcome = run_recipe(&script, tmp, ddir, &log, self.build_timeout)
            .map_err(|e| ImageError::io("run /bin/bash for", &script, e))?;
        match outcome {
            Outcome::Exited(status) if status.success() => {}
            Outcome::Exited(status) => {
                return Err(ImageError::BuildFailed {
                    name: r.name.clone(),
                    status: status.to_string(),
                    log: log_path,
                })
            }
            Outcome::TimedOut => {
                return Err(ImageError::BuildTimeout {
                    name: r.name.clone(),
                    seconds: self.build_timeout.as_secs(),
                    log: log_path,
                })
            }
        }
        let detached = detach_below(tmp);
        if detached > 0 {
            let _ = writeln!(
                log,
                "sandboxd: detached {detached} mount(s) the recipe left behind"
            );
        }
        let stats = shift_tree(tmp).map_err(|e| ImageError::Shift {
            name: r.name.clone(),
            path: e.path,
            reason: e.reason,
            log: log_path.clone(),
        })?;
        let _ = writeln!(
            log,
            "sandboxd: shifted {} entries ({} MiB) by +{}",
            stats.entries,
            stats.bytes >> 20,
            super::ID_OFFSET
        );
        Ok(stats)
    }

    fn remove_leftovers(&self, ddir: &Path) -> Result<(), ImageError> {
        let entries = fs::read_dir(ddir).map_err(|e| ImageError::io("list", ddir, e))?;
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("rootfs.tmp-")
            {
                let p = entry.path();
                detach_below(&p);
                fs::remove_dir_all(&p).map_err(|e| ImageError::io("remove stale build", &p, e))?;
            }
        }
        Ok(())
    }

    fn to_trash(&self, old: &Path, digest: &str) -> Result<(), ImageError> {
        let trash = self.dir.join("trash");
        mkdir(&trash)?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dest = trash.join(format!("{}-{nanos}", digest_dir_name(digest)));
        fs::rename(old, &dest).map_err(|e| ImageError::io("move to trash", old, e))?;
        tracing::info!(path = %dest.display(), "previous image tree kept for running sandboxes; delete it when none use it");
        Ok(())
    }

    fn write_meta(&self, ddir: &Path, meta: &Meta) -> Result<(), ImageError> {
        let path = ddir.join("meta.json");
        let tmp = ddir.join("meta.json.tmp");
        let body = serde_json::to_vec_pretty(meta)
            .map_err(|e| ImageError::io("encode", &path, e.into()))?;
        fs::write(&tmp, body).map_err(|e| ImageError::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| ImageError::io("rename", &path, e))
    }

    /// `by-name/<name>` -> `../sha256-<hex>`, for operators; nothing reads it.
    fn link_name(&self, name: &str, ddir: &Path) {
        let by_name = self.dir.join("by-name");
        let Some(target) = ddir.file_name().map(|f| Path::new("..").join(f)) else {
            return;
        };
        let tmp = by_name.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = fs::create_dir_all(&by_name);
        let _ = fs::remove_file(&tmp);
        if symlink(&target, &tmp).is_ok() && fs::rename(&tmp, by_name.join(name)).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

fn mkdir(path: &Path) -> Result<(), ImageError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| ImageError::io("create", path, e))
}

/// Flushes the file system holding `dir` (one call; builds are rare).
fn sync_fs(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        if let Err(e) = nix::unistd::syncfs(d.as_raw_fd()) {
            tracing::warn!(path = %dir.display(), error = %e, "syncfs failed; image may not survive a power loss");
        }
    }
}
