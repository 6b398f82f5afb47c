//! OCI test fixtures shared by tests and benchmarks: a real registry
//! (Debian's docker-registry on a random loopback port, filled with
//! skopeo) and OCI image layouts written by hand.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A docker-registry process with its storage in a temporary directory.
pub struct Registry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    pub fn start() -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("data").display()
            ),
        )
        .expect("config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (scripts/install-deps.sh installs it)");
        let registry = Registry { dir, port, child };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return registry;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("docker-registry did not listen on {port}");
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Copies `layout:tag` to `repo:tag` here (every platform of an index).
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) {
        let out = Command::new("skopeo")
            .args(["copy", "--all", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.host()))
            .output()
            .expect("skopeo (scripts/install-deps.sh installs it)");
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Where the registry keeps blob `digest`'s bytes.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// A gzip-compressed tar layer: its bytes and digest.
pub struct Blob {
    pub bytes: Vec<u8>,
    pub digest: String,
}

pub fn blob(bytes: Vec<u8>) -> Blob {
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    Blob { bytes, digest }
}

/// An OCI image layout on disk that skopeo reads.
pub struct Layout {
    pub dir: PathBuf,
    index: Vec<Value>,
}

impl Layout {
    pub fn new(dir: PathBuf) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).expect("layout");
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("oci-layout");
        Layout {
            dir,
            index: Vec::new(),
        }
    }

    pub fn put(&self, bytes: &[u8]) -> (String, usize) {
        let b = blob(bytes.to_vec());
        let path = self
            .dir
            .join("blobs/sha256")
            .join(b.digest.trim_start_matches("sha256:"));
        std::fs::write(path, bytes).expect("blob");
        (b.digest, bytes.len())
    }

    /// Writes a manifest of `layers` with `config`; its descriptor.
    pub fn manifest(&self, layers: &[&Blob], config: Value) -> Value {
        let (config_digest, config_size) = self.put(config.to_string().as_bytes());
        let layers: Vec<Value> = layers
            .iter()
            .map(|l| {
                self.put(&l.bytes);
                json!({
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": l.digest,
                    "size": l.bytes.len(),
                })
            })
            .collect();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": layers,
        });
        let (digest, size) = self.put(manifest.to_string().as_bytes());
        json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
        })
    }

    pub fn tag(&mut self, tag: &str, mut descriptor: Value) {
        descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(descriptor);
        let index = json!({"schemaVersion": 2, "manifests": self.index});
        std::fs::write(self.dir.join("index.json"), index.to_string()).expect("index.json");
    }

    /// An image index of `platforms` (descriptor, os/arch).
    pub fn image_index(&self, platforms: &[(Value, &str)]) -> Value {
        let manifests: Vec<Value> = platforms
            .iter()
            .map(|(d, arch)| {
                let mut d = d.clone();
                d["platform"] = json!({"os": "linux", "architecture": arch});
                d
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        let (digest, size) = self.put(index.to_string().as_bytes());
        json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": digest,
            "size": size,
        })
    }
}

pub fn config(arch: &str, env: &[&str], workdir: &str, layers: &[&Blob]) -> Value {
    // diff_ids are the uncompressed digests; the puller does not use them,
    // but skopeo copies the config as written.
    json!({
        "architecture": arch,
        "os": "linux",
        "config": {"Env": env, "WorkingDir": workdir, "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
    })
}
