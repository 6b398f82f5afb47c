//! Recipes: the built-in ones embedded in the binary, overrides and additions from
//! extra directories, and the content address (digest) of each.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::name::validate_name;
use super::ImageError;

/// Part of every digest: bump it when the on-disk result of the same recipe text
/// changes (ownership shift, layout), so old caches are not reused by mistake.
pub const FORMAT_VERSION: &str = "sandboxd-image-v1 uid+gid+100000";

/// Recipes bigger than this are refused: a recipe is a short shell script.
const MAX_RECIPE_BYTES: u64 = 1 << 20;

/// Shipped with the binary so the daemon works with no files on disk.
const BUILTIN: &[(&str, &str)] = &[
    ("busybox", include_str!("../../rootfs/images/busybox.sh")),
    ("python", include_str!("../../rootfs/images/python.sh")),
];

/// The Debian mirror finder the install scripts share, written beside every
/// recipe the daemon runs (as `debian-mirror.sh`) for recipes that debootstrap.
pub(crate) const RECIPE_LIB: (&str, &str) = (
    "debian-mirror.sh",
    include_str!("../../rootfs/lib/debian-mirror.sh"),
);

/// Where a recipe came from, for `list` and logs.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Builtin,
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin => f.write_str("builtin"),
            Source::File(p) => write!(f, "{}", p.display()),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Recipe {
    pub name: String,
    pub text: String,
    /// `sha256:<hex>`
    pub digest: String,
    pub source: Source,
}

/// `sha256:<hex>` of the format version and the recipe text.
pub(crate) fn digest_of(text: &str) -> String {
    let mut h = Sha256::new();
    h.update(FORMAT_VERSION.as_bytes());
    h.update(b"\n");
    h.update(text.as_bytes());
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The directory name for a digest: `sha256:<hex>` -> `sha256-<hex>`.
pub(crate) fn digest_dir_name(digest: &str) -> String {
    digest.replacen(':', "-", 1)
}

/// Built-in recipes, then each extra dir in order; a later `<name>.sh` replaces an
/// earlier one of the same name.
pub(crate) fn load(extra_dirs: &[PathBuf]) -> Result<BTreeMap<String, Recipe>, ImageError> {
    let mut out = BTreeMap::new();
    for (name, text) in BUILTIN {
        out.insert(
            (*name).to_string(),
            Recipe {
                name: (*name).to_string(),
                text: (*text).to_string(),
                digest: digest_of(text),
                source: Source::Builtin,
            },
        );
    }
    for dir in extra_dirs {
        for recipe in load_dir(dir)? {
            out.insert(recipe.name.clone(), recipe);
        }
    }
    Ok(out)
}

fn load_dir(dir: &Path) -> Result<Vec<Recipe>, ImageError> {
    let rd = |source| ImageError::Recipe {
        path: dir.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(rd)? {
        let path = entry.map_err(rd)?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sh"))
        else {
            continue;
        };
        if validate_name(name).is_err() {
            tracing::warn!(path = %path.display(), "ignoring recipe: file name is not a valid image name");
            continue;
        }
        let meta = fs::metadata(&path).map_err(|source| ImageError::Recipe {
            path: path.clone(),
            source,
        })?;
        if !meta.is_file() {
            continue;
        }
        if meta.len() > MAX_RECIPE_BYTES {
            return Err(ImageError::RecipeTooLarge {
                path,
                size: meta.len(),
                max: MAX_RECIPE_BYTES,
            });
        }
        let text = fs::read_to_string(&path).map_err(|source| ImageError::Recipe {
            path: path.clone(),
            source,
        })?;
        found.push(Recipe {
            name: name.to_string(),
            digest: digest_of(&text),
            text,
            source: Source::File(path),
        });
    }
    Ok(found)
}
