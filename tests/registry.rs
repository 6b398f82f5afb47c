//! Root-only: images pulled from a real registry (Debian's docker-registry,
//! started here on a random loopback port) that the test fills with skopeo
//! from OCI layouts it writes itself from the host's static busybox.

mod common;
#[path = "common/oci.rs"]
mod oci;

use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine;
use std::path::Path;

use common::Daemon;
use hyper::{Method, StatusCode};
use oci::{blob, config, Blob, Layout, Registry};
use serde_json::{json, Value};

/// Tar entries for a layer. Names are written as given.
enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
}

fn layer(entries: &[Entry<'_>]) -> Blob {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        let (name, body): (&str, &[u8]) = match entry {
            Entry::Dir(name) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (name, &[])
            }
            Entry::File(name, body, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (name, body)
            }
            Entry::Symlink(name, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_link_name(target).expect("link name");
                (name, &[])
            }
        };
        h.set_path(name).expect("name");
        h.set_size(body.len() as u64);
        h.set_cksum();
        builder.append(&h, body).expect("append");
    }
    let tar = builder.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    blob(gz.finish().expect("gzip"))
}

/// The base layer: static busybox as /bin/sh and friends, a file the next
/// layer deletes and a directory it makes opaque. `nonce` makes each run's
/// digests new, so nothing is found already stored.
fn base_layer(nonce: &str) -> Blob {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    let mut entries = vec![
        Entry::Dir("bin/"),
        Entry::File("bin/busybox", &busybox, 0o755),
        Entry::Dir("etc/"),
        Entry::File("etc/motd", b"base motd\n", 0o644),
        Entry::File("etc/nonce", nonce.as_bytes(), 0o644),
        Entry::Dir("opt/"),
        Entry::Dir("opt/old/"),
        Entry::File("opt/old/file", b"old\n", 0o644),
        Entry::Dir("root/"),
        Entry::Dir("tmp/"),
        Entry::Dir("proc/"),
        Entry::Dir("sys/"),
        Entry::Dir("dev/"),
    ];
    let applets = ["sh", "cat", "ls", "pwd", "echo", "env", "sleep", "true"];
    let links: Vec<String> = applets.iter().map(|a| format!("bin/{a}")).collect();
    for link in &links {
        entries.push(Entry::Symlink(link, "busybox"));
    }
    layer(&entries)
}

fn layer_dirs(images_dir: &Path) -> Vec<String> {
    std::fs::read_dir(images_dir.join("oci/layers"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn daemon_for(registry: &Registry, images: &Path, private: bool) -> Daemon {
    // The registry, and port 1 of loopback where nothing listens.
    let hosts = format!("{},127.0.0.1:1", registry.host());
    let extra: &[&str] = if private {
        &["--private-registries", &hosts]
    } else {
        &[]
    };
    daemon_for_with(registry, images, extra)
}

fn daemon_for_with(registry: &Registry, images: &Path, extra: &[&str]) -> Daemon {
    let hosts = format!("{},127.0.0.1:1", registry.host());
    let images = images.display().to_string();
    let mut flags = vec![
        "--images-dir",
        images.as_str(),
        "--insecure-registries",
        hosts.as_str(),
    ];
    flags.extend(extra);
    Daemon::start_with(&flags)
}

#[tokio::test]
async fn pulled_images_run_with_their_layers_and_config_and_share_a_base() {
    require_host!();
    let registry = Registry::start();
    let work = tempfile::tempdir().expect("tempdir");
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let base = base_layer(&nonce);
    let upper = layer(&[
        Entry::File("etc/.wh.motd", b"", 0o644),
        Entry::Dir("opt/"),
        Entry::File("opt/.wh..wh..opq", b"", 0o644),
        Entry::File("opt/new", b"new\n", 0o644),
        Entry::Dir("work/"),
    ]);
    let other = layer(&[
        Entry::File("other", b"other\n", 0o644),
        Entry::Dir("etc/"),
        Entry::File(
            "etc/passwd",
            b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/:/bin/sh\n",
            0o644,
        ),
        Entry::File("etc/group", b"root:x:0:\nstaff:x:50:\n", 0o644),
    ]);
    let mut layout = Layout::new(work.path().join("layout"));
    let app = layout.manifest(
        &[&base, &upper],
        config(
            "amd64",
            &["PATH=/bin", "GREETING=hello from the config"],
            "/work",
            &[&base, &upper],
        ),
    );
    layout.tag("v1", app.clone());
    let mut other_config = config("amd64", &["PATH=/bin"], "/", &[&base, &other]);
    other_config["config"]["User"] = json!("app:staff");
    let second = layout.manifest(&[&base, &other], other_config);
    layout.tag("other", second);
    let arm = layout.manifest(&[&other], config("arm64", &["PATH=/bin"], "/", &[&other]));
    let multi = layout.image_index(&[(arm.clone(), "arm64"), (app.clone(), "amd64")]);
    layout.tag("multi", multi);
    let arm_only = layout.image_index(&[(arm, "arm64")]);
    layout.tag("armonly", arm_only);
    registry.push(&layout.dir, "v1", "team/app");
    registry.push(&layout.dir, "other", "team/app");
    registry.push(&layout.dir, "multi", "team/app");
    registry.push(&layout.dir, "armonly", "team/app");

    let images = work.path().join("images");
    let daemon = daemon_for(&registry, &images, true);
    let host = registry.host();

    // Ten creates of an image not yet pulled: one pull serves them all.
    let reference = format!("{host}/team/app:v1");
    let creates = (0..10).map(|_| daemon.create(json!({"image": reference})));
    let ids = futures::future::join_all(creates).await;
    let pulls = daemon.log().matches("image pulled").count();
    assert_eq!(pulls, 1, "one pull for ten creates:\n{}", daemon.log());

    // Deletions and the opaque directory of the upper layer hold; the
    // config's Env and WorkingDir are every process's defaults.
    let id = &ids[0];
    let run = daemon
        .sh(
            id,
            "cat /etc/motd 2>&1; ls /opt; pwd; echo \"$GREETING\"; cat /etc/nonce",
        )
        .await;
    assert_eq!(
        run.out(),
        format!("cat: can't open '/etc/motd': No such file or directory\nnew\n/work\nhello from the config\n{nonce}"),
        "{}",
        run.err()
    );
    for id in &ids[1..] {
        daemon.delete(id).await;
    }

    // A second image on the same base stores the base layer once. Pulled
    // ahead with progress: the one new layer's bytes, then the image.
    let before = layer_dirs(&images);
    assert_eq!(before.len(), 2, "{before:?}");
    let lines = daemon
        .ready_image_lines(json!(format!("{host}/team/app:other")))
        .await;
    let layer_lines: Vec<&Value> = lines.iter().filter(|l| l["type"] == "layer").collect();
    assert!(!layer_lines.is_empty(), "{lines:?}");
    assert!(
        layer_lines
            .iter()
            .all(|l| l["digest"] == json!(other.digest)),
        "only the new layer is fetched: {lines:?}"
    );
    let last_report = layer_lines.last().expect("a report");
    assert_eq!(last_report["bytes"], json!(other.bytes.len()), "{lines:?}");
    assert_eq!(last_report["total"], json!(other.bytes.len()), "{lines:?}");
    let done = lines.last().expect("a last line");
    assert_eq!(done["type"], "done", "{lines:?}");
    assert!(done["image"]["digest"].is_string(), "{lines:?}");
    let second = daemon
        .create(json!({"image": format!("{host}/team/app:other")}))
        .await;
    assert_eq!(daemon.sh(&second, "cat /other").await.out(), "other\n");
    // Its config's User is every process's, unless a start names a uid.
    assert_eq!(daemon.sh(&second, "id -u; id -g").await.out(), "1000\n50\n");
    let as_root = daemon
        .start_process(&second, json!({"argv": ["sh", "-c", "id -u"], "uid": 0}))
        .await;
    assert_eq!(daemon.output(&second, as_root).await.out(), "0\n");
    let after = layer_dirs(&images);
    assert_eq!(after.len(), 3, "only the new layer is stored: {after:?}");
    assert!(after.contains(&base.digest.trim_start_matches("sha256:").to_string()));

    // An index resolves to its linux/amd64 manifest; one without it is a
    // 400 naming what it offers.
    let from_index = daemon
        .create(json!({"image": format!("{host}/team/app:multi")}))
        .await;
    assert_eq!(daemon.sh(&from_index, "cat /opt/new").await.out(), "new\n");
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": format!("{host}/team/app:armonly")})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["code"], "image_platform_unsupported",
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("linux/arm64"),
        "{body}"
    );

    // The cache lists what was pulled.
    let (status, list) = daemon.call(Method::GET, "/v1/images", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let pulled: Vec<&str> = list["pulled"]
        .as_array()
        .expect("pulled")
        .iter()
        .filter_map(|p| p["references"].as_array())
        .flatten()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(pulled.contains(&reference.as_str()), "{list}");
    // v1 (and multi, the same manifest) and other share the base layer.
    assert!(
        list["pulled"]
            .as_array()
            .expect("pulled")
            .iter()
            .all(|p| p["shared_layers"] == 1),
        "{list}"
    );
    assert!(
        pulled.contains(&format!("{host}/team/app:multi").as_str()),
        "{list}"
    );

    // An unknown tag is a 404; pulling ahead works through POST /v1/images.
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": format!("{host}/team/app:nope")})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "image_not_found", "{body}");
    let (status, body) = daemon.ready_image(json!(reference)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["working_dir"], "/work", "{body}");

    // A prune removes the image nothing runs and the layer only it had,
    // keeping the base and the image a sandbox still runs.
    let app_digest = body["digest"].clone();
    for id in [&second, &from_index] {
        daemon.delete(id).await;
    }
    let prune = || async {
        let (status, report) = daemon.call(Method::POST, "/v1/images/prune", None).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        report
    };
    let report = prune().await;
    let other_layer = other.digest.trim_start_matches("sha256:").to_string();
    assert!(
        report["removed"].as_array().is_some_and(|r| r
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.contains(&other_layer)))),
        "{report}"
    );
    let kept = layer_dirs(&images);
    assert_eq!(kept.len(), 2, "base and upper stay: {kept:?}");
    assert!(!kept.contains(&other_layer), "{kept:?}");
    let (_, list) = daemon.call(Method::GET, "/v1/images", None).await;
    let pulled = list["pulled"].as_array().expect("pulled");
    assert_eq!(pulled.len(), 1, "{list}");
    assert_eq!(pulled[0]["digest"], app_digest, "{list}");
    assert!(pulled[0]["last_used_at"].is_string(), "{list}");
    daemon.delete(&ids[0]).await;
    prune().await;
    assert!(layer_dirs(&images).is_empty(), "{:?}", layer_dirs(&images));
    let (_, list) = daemon.call(Method::GET, "/v1/images", None).await;
    assert_eq!(list["pulled"], json!([]), "{list}");
}

#[tokio::test]
async fn tampered_blobs_private_addresses_and_dead_registries_are_refused() {
    require_host!();
    let registry = Registry::start();
    let work = tempfile::tempdir().expect("tempdir");
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let base = base_layer(&nonce);
    let tampered = layer(&[Entry::File("victim", nonce.as_bytes(), 0o644)]);
    let mut layout = Layout::new(work.path().join("layout"));
    let good = layout.manifest(&[&base], config("amd64", &["PATH=/bin"], "/", &[&base]));
    layout.tag("good", good);
    let bad = layout.manifest(
        &[&base, &tampered],
        config("amd64", &["PATH=/bin"], "/", &[&base, &tampered]),
    );
    layout.tag("bad", bad);
    registry.push(&layout.dir, "good", "team/app");
    registry.push(&layout.dir, "bad", "team/app");
    // The registry now serves other bytes under the layer's digest.
    let data = registry.blob_data(&tampered.digest);
    let mut bytes = std::fs::read(&data).expect("stored blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).expect("tamper");

    let host = registry.host();
    let images = work.path().join("images");
    let daemon = daemon_for(&registry, &images, true);
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": format!("{host}/team/app:bad")})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "image_digest_mismatch", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&tampered.digest),
        "{body}"
    );
    let stored = layer_dirs(&images);
    assert!(
        !stored.contains(&tampered.digest.trim_start_matches("sha256:").to_string()),
        "{stored:?}"
    );
    // Positive control: the untampered image from the same registry runs.
    let id = daemon
        .create(json!({"image": format!("{host}/team/app:good")}))
        .await;
    assert_eq!(daemon.sh(&id, "cat /etc/nonce").await.out(), nonce);
    daemon.delete(&id).await;

    // A registry that does not answer is a 502 naming it.
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "127.0.0.1:1/team/app:v1"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "registry_unreachable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1:1"),
        "{body}"
    );

    // Without private_registries, loopback and private addresses are the
    // deny list's: the same registry is refused, and so is a metadata
    // address, before any connection is made.
    let strict_images = work.path().join("strict-images");
    let strict = daemon_for(&registry, &strict_images, false);
    for (image, reason) in [
        (format!("{host}/team/app:good"), "loopback"),
        ("169.254.169.254/x/y:latest".to_string(), "metadata"),
        ("10.0.0.5:5000/x/y:latest".to_string(), "private"),
    ] {
        let (status, body) = strict
            .call(Method::POST, "/v1/sandboxes", Some(json!({"image": image})))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{image}: {body}");
        assert_eq!(body["error"]["code"], "registry_refused", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(reason),
            "{body}"
        );
    }
    assert!(layer_dirs(&strict_images).is_empty());

    // An operator's allow-list of registries refuses the others before
    // any dial, and lets its own through.
    let allowing = daemon_for_with(
        &registry,
        &work.path().join("allow-images"),
        &["--allowed-registries", &host, "--private-registries", &host],
    );
    let (status, body) = allowing
        .call(
            Method::POST,
            "/v1/images",
            Some(json!({"image": "docker.io/library/busybox:latest"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "registry_not_allowed", "{body}");
    let (status, body) = allowing
        .call(
            Method::POST,
            "/v1/images",
            Some(json!({"image": format!("{host}/team/app:good")})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// How an [`AuthFront`] asks for credentials.
#[derive(Clone, Copy, PartialEq)]
enum Challenge {
    /// `401` with `WWW-Authenticate: Basic`: the client sends its
    /// credentials with every request.
    Basic,
    /// Docker Hub's flow: `401` with `WWW-Authenticate: Bearer realm=...`;
    /// the client fetches a token from the realm with its credentials,
    /// then retries with the token.
    Bearer,
}

/// A registry front that demands credentials, as a private registry or
/// Docker Hub does, and forwards what it lets through to a plain
/// docker-registry. Counts challenges and token fetches.
struct AuthFront {
    port: u16,
    challenges: Arc<AtomicUsize>,
    tokens_issued: Arc<AtomicUsize>,
}

const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pass-9f2c";

impl AuthFront {
    fn start(registry: &Registry, challenge: Challenge) -> AuthFront {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let front = AuthFront {
            port,
            challenges: Arc::default(),
            tokens_issued: Arc::default(),
        };
        let (challenges, tokens) = (
            Arc::clone(&front.challenges),
            Arc::clone(&front.tokens_issued),
        );
        let upstream = registry.port;
        let token = format!("token-{}", hex::encode(rand::random::<[u8; 8]>()));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (challenges, tokens, token) =
                    (Arc::clone(&challenges), Arc::clone(&tokens), token.clone());
                std::thread::spawn(move || {
                    serve_front(
                        conn,
                        port,
                        upstream,
                        challenge,
                        &token,
                        &challenges,
                        &tokens,
                    )
                });
            }
        });
        front
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

fn serve_front(
    conn: std::net::TcpStream,
    port: u16,
    upstream: u16,
    challenge: Challenge,
    token: &str,
    challenges: &AtomicUsize,
    tokens: &AtomicUsize,
) {
    use std::io::{BufRead, BufReader, Read};
    let mut reader = BufReader::new(conn);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => head.push(line.trim_end().to_string()),
        }
    }
    let Some(request_line) = head.first().cloned() else {
        return;
    };
    // Origin-form or, through a proxy, absolute-form.
    let uri = request_line.split(' ').nth(1).unwrap_or("/");
    let target = match uri.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => uri.to_string(),
    };
    let header = |name: &str| {
        head[1..].iter().find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let authorization = header("authorization").unwrap_or_default();
    let mut conn = reader.into_inner();
    let reply = |conn: &mut std::net::TcpStream, status: &str, extra: &str, body: &str| {
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if target.starts_with("/token") {
        if authorization == basic {
            tokens.fetch_add(1, Ordering::SeqCst);
            let body = format!("{{\"token\":\"{token}\",\"expires_in\":300}}");
            reply(&mut conn, "200 OK", "", &body);
        } else {
            reply(&mut conn, "401 Unauthorized", "", "{}");
        }
        return;
    }
    let (allowed, ask) = match challenge {
        Challenge::Basic => (
            authorization == basic,
            "WWW-Authenticate: Basic realm=\"sandboxd-test\"\r\n".to_string(),
        ),
        Challenge::Bearer => (
            authorization == format!("Bearer {token}"),
            format!(
                "WWW-Authenticate: Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"sandboxd-test\",scope=\"repository:team/app:pull\"\r\n"
            ),
        ),
    };
    if !allowed {
        challenges.fetch_add(1, Ordering::SeqCst);
        reply(
            &mut conn,
            "401 Unauthorized",
            &ask,
            "{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}",
        );
        return;
    }
    let Ok(mut registry) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let mut forwarded =
        format!("{request_line}\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n");
    for h in &head[1..] {
        let name = h.split(':').next().unwrap_or("").to_ascii_lowercase();
        if !matches!(name.as_str(), "host" | "connection" | "authorization") {
            forwarded.push_str(h);
            forwarded.push_str("\r\n");
        }
    }
    forwarded.push_str("\r\n");
    if registry.write_all(forwarded.as_bytes()).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = registry.read_to_end(&mut answer);
    let _ = conn.write_all(&answer);
}

#[tokio::test]
async fn private_registries_with_basic_auth_and_bearer_tokens() {
    require_host!();
    let registry = Registry::start();
    let work = tempfile::tempdir().expect("tempdir");
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let base = base_layer(&nonce);
    let mut layout = Layout::new(work.path().join("layout"));
    let image = layout.manifest(&[&base], config("amd64", &["PATH=/bin"], "/", &[&base]));
    layout.tag("v1", image);
    registry.push(&layout.dir, "v1", "team/app");
    let basic = AuthFront::start(&registry, Challenge::Basic);
    let bearer = AuthFront::start(&registry, Challenge::Bearer);
    let unknown = AuthFront::start(&registry, Challenge::Basic);

    // Credentials for two of the three fronts, in a 0600 file.
    let auth_file = work.path().join("auths.json");
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        &auth_file,
        json!({"auths": {
            basic.host(): {"auth": encoded},
            bearer.host(): {"username": USER, "password": PASSWORD},
        }})
        .to_string(),
    )
    .expect("auth file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&auth_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let hosts = [basic.host(), bearer.host(), unknown.host()].join(",");
    let images = work.path().join("images").display().to_string();
    let auth = auth_file.display().to_string();
    let daemon = Daemon::start_with(&[
        "--images-dir",
        &images,
        "--insecure-registries",
        &hosts,
        "--private-registries",
        &hosts,
        "--registry-auth-file",
        &auth,
    ]);

    for front in [&basic, &bearer] {
        let id = daemon
            .create(json!({"image": format!("{}/team/app:v1", front.host())}))
            .await;
        assert_eq!(daemon.sh(&id, "cat /etc/nonce").await.out(), nonce);
        assert!(
            front.challenges.load(Ordering::SeqCst) >= 1,
            "the client was asked for credentials first"
        );
        daemon.delete(&id).await;
    }
    assert_eq!(basic.tokens_issued.load(Ordering::SeqCst), 0);
    assert!(
        bearer.tokens_issued.load(Ordering::SeqCst) >= 1,
        "the Bearer flow fetched a token from the realm"
    );
    // No credentials for a registry that wants them: a 403 that says so.
    let (status, body) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": format!("{}/team/app:v1", unknown.host())})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "registry_unauthorized", "{body}");
    // The password is in no answer and no log line.
    let (_, list) = daemon.raw(Method::GET, "/v1/images", Vec::new()).await;
    assert!(!String::from_utf8_lossy(&list).contains(PASSWORD));
    assert!(
        !daemon.log().contains(PASSWORD),
        "the log shows the password"
    );
    assert!(daemon.log().contains("image pulled"), "positive control");
}

/// Sixty layers of long paths do not fit one page of mount options as
/// paths: the container's root still mounts, every layer in it.
#[tokio::test]
async fn an_image_of_sixty_layers_runs() {
    require_host!();
    let registry = Registry::start();
    let work = tempfile::tempdir().expect("tempdir");
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let mut layers = vec![base_layer(&nonce)];
    let names: Vec<String> = (0..59).map(|i| format!("many/{i:02}")).collect();
    for name in &names {
        layers.push(layer(&[
            Entry::Dir("many/"),
            Entry::File(name, name.as_bytes(), 0o644),
        ]));
    }
    let refs: Vec<&Blob> = layers.iter().collect();
    let mut layout = Layout::new(work.path().join("layout"));
    let image = layout.manifest(&refs, config("amd64", &["PATH=/bin"], "/", &refs));
    layout.tag("many", image);
    registry.push(&layout.dir, "many", "team/many");
    let images = work.path().join("images");
    let daemon = daemon_for(&registry, &images, true);
    let id = daemon
        .create(json!({"image": format!("{}/team/many:many", registry.host())}))
        .await;
    let run = daemon
        .sh(
            &id,
            "ls /many | wc -l; cat /many/00 /many/58; cat /etc/nonce",
        )
        .await;
    assert_eq!(
        run.out(),
        format!("59\nmany/00many/58{nonce}"),
        "{}",
        run.err()
    );
    daemon.delete(&id).await;
}
