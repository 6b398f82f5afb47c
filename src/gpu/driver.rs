//! The driver's user-space files a GPU sandbox needs: the libraries CUDA and
//! NVML load (found through the linker cache, `ldconfig -p`, and in folders
//! the operator names for a driver the cache does not list) and `nvidia-smi`.
//! They are bind-mounted read-only: the libraries into
//! [`LIBRARY_DIR_IN_SANDBOX`] (on `LD_LIBRARY_PATH`), `nvidia-smi` at
//! [`SMI_IN_SANDBOX`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::grant::GrantedFile;

/// Where the driver libraries appear in a GPU sandbox.
pub const LIBRARY_DIR_IN_SANDBOX: &str = "/usr/local/nvidia/lib64";

/// Where `nvidia-smi` appears in a GPU sandbox.
pub const SMI_IN_SANDBOX: &str = "/usr/bin/nvidia-smi";

/// Library name stems of the driver's compute and management user space.
/// Every file `<stem>` or `<stem>.<version...>` found is bound (sonames like
/// `libcuda.so.1` and the versioned files alike); absent ones are skipped,
/// since the set differs between driver versions.
pub const LIBRARIES: [&str; 14] = [
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-cfg.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-opencl.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nscq.so",
];

/// Folders searched for `nvidia-smi` after the configured driver folders.
const BIN_DIRS: [&str; 5] = [
    "/usr/bin",
    "/usr/local/bin",
    "/usr/sbin",
    "/bin",
    "/usr/local/nvidia/bin",
];

/// The driver files found on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    pub files: Vec<GrantedFile>,
}

impl DriverFiles {
    pub fn has_libraries(&self) -> bool {
        self.files
            .iter()
            .any(|f| f.path.starts_with(LIBRARY_DIR_IN_SANDBOX))
    }
}

/// The linker cache as `ldconfig -p` prints it, if ldconfig runs.
pub fn ldconfig_cache() -> Option<String> {
    for ldconfig in ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"] {
        if let Ok(out) = std::process::Command::new(ldconfig)
            .arg("-p")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
        {
            if out.status.success() {
                return Some(String::from_utf8_lossy(&out.stdout).into_owned());
            }
        }
    }
    None
}

/// The linker cache's word for this machine's native libraries.
fn native_abi() -> &'static str {
    if cfg!(target_arch = "x86_64") {
        "x86-64"
    } else if cfg!(target_arch = "aarch64") {
        "AArch64"
    } else {
        ""
    }
}

/// `(name, path)` of every native library in `ldconfig -p` output, whose
/// lines look like `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`.
pub fn parse_ldconfig(text: &str) -> Vec<(String, PathBuf)> {
    let abi = native_abi();
    text.lines()
        .filter_map(|line| {
            let (left, path) = line.split_once(" => ")?;
            let (name, flags) = left.trim().split_once(' ')?;
            if !abi.is_empty() && !flags.contains(abi) {
                return None;
            }
            Some((name.to_string(), PathBuf::from(path.trim())))
        })
        .collect()
}

/// Whether `name` is one of [`LIBRARIES`] (exactly, or with a version suffix).
fn is_driver_library(name: &str) -> bool {
    LIBRARIES.iter().any(|stem| {
        name == *stem
            || name
                .strip_prefix(stem)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    })
}

/// Finds the driver's libraries and `nvidia-smi`: `driver_dirs` first, then
/// the folders where the linker cache has driver libraries. `cache` gives
/// the `ldconfig -p` text (a parameter so tests need no ldconfig).
pub fn find(driver_dirs: &[PathBuf], cache: impl FnOnce() -> Option<String>) -> DriverFiles {
    let mut dirs: Vec<PathBuf> = driver_dirs.to_vec();
    if let Some(text) = cache() {
        for (name, path) in parse_ldconfig(&text) {
            if is_driver_library(&name) {
                if let Some(parent) = path.parent() {
                    if !dirs.iter().any(|d| d == parent) {
                        dirs.push(parent.to_path_buf());
                    }
                }
            }
        }
    }
    let mut files = Vec::new();
    let mut names = BTreeSet::new();
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            .filter(|(name, _)| is_driver_library(name))
            .collect();
        found.sort();
        for (name, path) in found {
            if names.contains(&name) {
                continue;
            }
            if let Some(real) = regular_file(&path) {
                names.insert(name.clone());
                files.push(GrantedFile {
                    host_path: real,
                    path: Path::new(LIBRARY_DIR_IN_SANDBOX).join(&name),
                });
            }
        }
    }
    let smi = driver_dirs
        .iter()
        .cloned()
        .chain(BIN_DIRS.iter().map(PathBuf::from))
        .find_map(|dir| regular_file(&dir.join("nvidia-smi")));
    if let Some(real) = smi {
        files.push(GrantedFile {
            host_path: real,
            path: PathBuf::from(SMI_IN_SANDBOX),
        });
    }
    DriverFiles { files }
}

/// `path` with symlinks resolved, when that is a regular file.
fn regular_file(path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).ok()?;
    std::fs::metadata(&real)
        .ok()
        .filter(|m| m.is_file())
        .map(|_| real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines_are_parsed_for_the_native_abi() {
        let text = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n\
            \tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n\
            Cache generated by: ldconfig (GNU libc) stable release version 2.36\n";
        let entries = parse_ldconfig(text);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                entries,
                vec![
                    (
                        "libcuda.so.1".to_string(),
                        PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
                    ),
                    (
                        "libc.so.6".to_string(),
                        PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
                    ),
                ]
            );
        }
    }

    #[test]
    fn driver_library_names() {
        for yes in [
            "libcuda.so",
            "libcuda.so.1",
            "libcuda.so.550.54.15",
            "libnvidia-ml.so.1",
            "libnvidia-nvvm.so.4",
        ] {
            assert!(is_driver_library(yes), "{yes}");
        }
        for no in [
            "libcudart.so.12",
            "libcuda.so.1.bak",
            "libcuda.so.",
            "libnvidia-glcore.so.550.54.15",
            "libc.so.6",
        ] {
            assert!(!is_driver_library(no), "{no}");
        }
    }

    #[test]
    fn files_are_found_in_driver_dirs_and_through_the_cache() {
        let tmp = tempfile::tempdir().expect("tmp");
        let own = tmp.path().join("driver");
        let cached = tmp.path().join("cached");
        std::fs::create_dir_all(&own).expect("dir");
        std::fs::create_dir_all(&cached).expect("dir");
        std::fs::write(own.join("libcuda.so.550.54.15"), b"elf").expect("write");
        std::os::unix::fs::symlink("libcuda.so.550.54.15", own.join("libcuda.so.1")).expect("link");
        std::fs::write(own.join("libcudart.so.12"), b"not the driver").expect("write");
        std::fs::write(own.join("nvidia-smi"), b"#!/bin/sh\n").expect("write");
        std::fs::write(cached.join("libnvidia-ml.so.1"), b"elf").expect("write");
        // Also in the first folder: the first one found wins.
        std::fs::write(cached.join("libcuda.so.1"), b"other").expect("write");
        let cache = format!(
            "\tlibnvidia-ml.so.1 (libc6,{}) => {}\n\tlibcuda.so.1 (libc6,{}) => {}\n",
            native_abi(),
            cached.join("libnvidia-ml.so.1").display(),
            native_abi(),
            cached.join("libcuda.so.1").display(),
        );
        let found = find(std::slice::from_ref(&own), || Some(cache));
        let mut got: Vec<(String, String)> = found
            .files
            .iter()
            .map(|f| {
                (
                    f.path.display().to_string(),
                    f.host_path.display().to_string(),
                )
            })
            .collect();
        got.sort();
        let real = |p: PathBuf| {
            std::fs::canonicalize(p)
                .expect("real")
                .display()
                .to_string()
        };
        let mut want = vec![
            (
                format!("{LIBRARY_DIR_IN_SANDBOX}/libcuda.so.1"),
                real(own.join("libcuda.so.550.54.15")),
            ),
            (
                format!("{LIBRARY_DIR_IN_SANDBOX}/libcuda.so.550.54.15"),
                real(own.join("libcuda.so.550.54.15")),
            ),
            (
                format!("{LIBRARY_DIR_IN_SANDBOX}/libnvidia-ml.so.1"),
                real(cached.join("libnvidia-ml.so.1")),
            ),
            (SMI_IN_SANDBOX.to_string(), real(own.join("nvidia-smi"))),
        ];
        want.sort();
        assert_eq!(got, want);
        assert!(found.has_libraries());
    }

    #[test]
    fn nothing_found_is_empty() {
        let tmp = tempfile::tempdir().expect("tmp");
        let found = find(&[tmp.path().to_path_buf()], || None);
        assert!(found
            .files
            .iter()
            .all(|f| f.path == Path::new(SMI_IN_SANDBOX)));
        assert!(!found.has_libraries());
    }
}
