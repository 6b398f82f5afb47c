//! Root-only: Kubernetes pods through containerd's CRI with the `sandboxd`
//! runtime handler, driven by a CRI client as the kubelet drives it (Debian
//! 12 has no crictl). A pod is one sandbox in the network namespace CNI
//! made (a bridge of the test's own); each of its containers has a root of
//! its own in that sandbox, and they talk over localhost; the pod's egress
//! policy comes from its annotations.

mod common;
#[path = "common/containerd.rs"]
mod containerd;
#[path = "common/oci.rs"]
mod oci;
#[path = "common/upstream.rs"]
mod upstream;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::{cgroup, Daemon};
use containerd::{Containerd, IMAGE};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, ContainerState, ContainerStatsRequest,
    ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec, ImageStatusRequest,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, Mount, PodSandboxConfig, PodSandboxMetadata, PodSandboxState,
    PodSandboxStatus, PodSandboxStatusRequest, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, SecurityProfile, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};
use upstream::Upstream;

/// The CPU shares every pod of these tests asks for as a whole.
const POD_CPU_SHARES: i64 = 2048;

/// Every CRI call is answered within this, or the test fails saying which.
const CALL: Duration = Duration::from_secs(90);

/// A CNI bridge network of the test's own: its config directory (what
/// containerd's CRI reads), its host-local address store, and the bridge
/// it makes on the host, removed at the end.
struct CniNetwork {
    dir: tempfile::TempDir,
    bridge: String,
}

/// CRI's CreateContainer of container `name` of `pod` running `command`
/// in the test image, with its own `resources` and `mounts` when given.
fn create_request(
    pod: &(String, PodSandboxConfig),
    name: &str,
    command: &[&str],
    resources: Option<LinuxContainerResources>,
    mounts: Vec<Mount>,
) -> CreateContainerRequest {
    CreateContainerRequest {
        pod_sandbox_id: pod.0.clone(),
        config: Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(image_spec(IMAGE)),
            command: command.iter().map(|s| s.to_string()).collect(),
            // A container with limits of its own also asks for a
            // supplementary group, as a pod with `fsGroup` or
            // `supplementalGroups` does, for one capability of Docker's
            // fourteen (`drop: [ALL]`, `add: [...]`), and for the runtime's
            // default seccomp profile.
            linux: resources.map(|resources| LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(LinuxContainerSecurityContext {
                    supplemental_groups: vec![SUPPLEMENTAL_GROUP],
                    capabilities: Some(Capability {
                        add_capabilities: vec!["NET_BIND_SERVICE".into()],
                        drop_capabilities: vec!["ALL".into()],
                        ..Default::default()
                    }),
                    seccomp: Some(SecurityProfile {
                        profile_type: ProfileType::RuntimeDefault.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            mounts,
            ..Default::default()
        }),
        sandbox_config: Some(pod.1.clone()),
    }
}

/// The supplementary group the limited container asks for.
const SUPPLEMENTAL_GROUP: i64 = 4000;
impl CniNetwork {
    fn new() -> CniNetwork {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let bridge = format!("sbxcni{}", std::process::id() % 100_000);
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "sandboxd-test",
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.233.71.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.path().join("ipam").display().to_string()
                }
            }]
        });
        std::fs::create_dir_all(dir.path().join("conf")).expect("conf dir");
        std::fs::write(
            dir.path().join("conf/10-sandboxd-test.conflist"),
            conf.to_string(),
        )
        .expect("conflist");
        CniNetwork { dir, bridge }
    }

    fn conf_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("conf")
    }
}

impl Drop for CniNetwork {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    async fn connect(socket: &Path) -> Cri {
        let socket = socket.to_path_buf();
        let channel = Endpoint::try_from("http://[::]:50051")
            .expect("endpoint")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .expect("connect to containerd's CRI");
        Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// Waits until CRI knows the imported image (it learns of it from
    /// containerd's image events).
    async fn await_image(&mut self, image: &str) {
        let deadline = tokio::time::Instant::now() + CALL;
        loop {
            let status = self
                .images
                .image_status(ImageStatusRequest {
                    image: Some(image_spec(image)),
                    verbose: false,
                })
                .await
                .expect("ImageStatus");
            if status.into_inner().image.is_some() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "CRI never saw {image}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn run_pod(
        &mut self,
        name: &str,
        annotations: &[(&str, &str)],
    ) -> (String, PodSandboxConfig) {
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            // What the kubelet sends for a pod whose containers request two
            // CPUs in all: their summed shares, the pod cgroup's weight.
            linux: Some(LinuxPodSandboxConfig {
                resources: Some(LinuxContainerResources {
                    cpu_shares: POD_CPU_SHARES,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let reply = tokio::time::timeout(
            CALL,
            self.runtime.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: "sandboxd".into(),
            }),
        )
        .await
        .expect("RunPodSandbox in time")
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"));
        (reply.into_inner().pod_sandbox_id, config)
    }

    async fn start_container(
        &mut self,
        pod: &(String, PodSandboxConfig),
        name: &str,
        command: &[&str],
    ) -> String {
        self.start_container_with(pod, name, command, None, Vec::new())
            .await
    }

    /// [`Self::start_container`] with the container's own `resources`, as
    /// the kubelet sets them from its `resources.limits`, and `mounts`, as
    /// it hands over a pod's volumes.
    async fn start_container_with(
        &mut self,
        pod: &(String, PodSandboxConfig),
        name: &str,
        command: &[&str],
        resources: Option<LinuxContainerResources>,
        mounts: Vec<Mount>,
    ) -> String {
        let created = tokio::time::timeout(
            CALL,
            self.runtime
                .create_container(create_request(pod, name, command, resources, mounts)),
        )
        .await
        .expect("CreateContainer in time")
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"));
        let id = created.into_inner().container_id;
        tokio::time::timeout(
            CALL,
            self.runtime.start_container(StartContainerRequest {
                container_id: id.clone(),
            }),
        )
        .await
        .expect("StartContainer in time")
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
        id
    }

    /// Creates and starts container `name` of `pod` with `mounts`, which
    /// is to fail: the refusal, whichever call made it.
    async fn start_refused(
        &mut self,
        pod: &(String, PodSandboxConfig),
        name: &str,
        mounts: Vec<Mount>,
    ) -> tonic::Status {
        let created = self
            .runtime
            .create_container(create_request(pod, name, &["sleep", "3600"], None, mounts))
            .await;
        let started = match created {
            Ok(created) => self
                .runtime
                .start_container(StartContainerRequest {
                    container_id: created.into_inner().container_id,
                })
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        started.expect_err(&format!("container {name} is refused"))
    }

    /// The memory container `id` is charged for, as CRI's container stats
    /// say (what the kubelet's eviction and `kubectl top` read).
    async fn memory_usage(&mut self, id: &str) -> u64 {
        let reply = tokio::time::timeout(
            CALL,
            self.runtime.container_stats(ContainerStatsRequest {
                container_id: id.into(),
            }),
        )
        .await
        .expect("ContainerStats in time")
        .unwrap_or_else(|e| panic!("ContainerStats {id}: {e}"))
        .into_inner();
        reply
            .stats
            .and_then(|s| s.memory)
            .and_then(|m| m.usage_bytes)
            .map(|v| v.value)
            .unwrap_or_else(|| panic!("no memory usage in the stats of {id}"))
    }

    /// Runs `script` with sh in container `id`; (exit code, stdout+stderr).
    async fn exec(&mut self, id: &str, script: &str) -> (i32, String) {
        let reply = tokio::time::timeout(
            CALL,
            self.runtime.exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 60,
            }),
        )
        .await
        .expect("ExecSync in time")
        .unwrap_or_else(|e| panic!("ExecSync {script:?}: {e}"))
        .into_inner();
        (
            reply.exit_code,
            format!(
                "{}{}",
                String::from_utf8_lossy(&reply.stdout),
                String::from_utf8_lossy(&reply.stderr)
            ),
        )
    }

    async fn pod_status(&mut self, pod: &str) -> Option<PodSandboxStatus> {
        self.runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .into_inner()
            .status
    }

    async fn pod_ip(&mut self, pod: &str) -> String {
        self.pod_status(pod)
            .await
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .expect("the pod has an address")
    }

    /// The states CRI reports of pod `pod` and its container `container`.
    async fn states(&mut self, pod: &str, container: &str) -> (PodSandboxState, ContainerState) {
        let pod = self.pod_status(pod).await;
        let container = self
            .runtime
            .container_status(ContainerStatusRequest {
                container_id: container.into(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner();
        (
            pod.map(|s| s.state()).unwrap_or_default(),
            container.status.map(|s| s.state()).unwrap_or_default(),
        )
    }

    /// Waits (CRI has no events to await) until containerd reports pod
    /// `pod` not ready and its container `container` exited.
    async fn await_ended(&mut self, pod: &str, container: &str) {
        let deadline = tokio::time::Instant::now() + CALL;
        loop {
            let states = self.states(pod, container).await;
            if states
                == (
                    PodSandboxState::SandboxNotready,
                    ContainerState::ContainerExited,
                )
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {pod} and container {container} still {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts a `server` container serving `page` with httpd on port 8080
    /// and a `client` one in `pod`, and waits until the client reads the
    /// page over localhost (httpd listens once its container started).
    async fn serve_over_localhost(
        &mut self,
        pod: &(String, PodSandboxConfig),
        page: &str,
    ) -> (String, String) {
        let serve = format!(
            "mkdir -p /www && echo {page} > /www/index.html && exec httpd -f -p 8080 -h /www"
        );
        let server = self
            .start_container(pod, "server", &["sh", "-c", &serve])
            .await;
        let client = self
            .start_container(pod, "client", &["sleep", "3600"])
            .await;
        let (code, said) = self
            .exec(
                &client,
                "for i in $(seq 300); do wget -qO- http://127.0.0.1:8080/index.html && exit 0; sleep 0.1; done; exit 1",
            )
            .await;
        assert_eq!((code, said.trim()), (0, page), "{said}");
        (server, client)
    }

    /// The host reaches `page` at the pod IP's port 8080 but not sandboxd's
    /// proxy port there; from `client`, the pod's allow list (only
    /// allowed.example.test) holds.
    async fn assert_pod_ip_and_allow_list(
        &mut self,
        pod: &(String, PodSandboxConfig),
        client: &str,
        page: &str,
    ) {
        let ip = self.pod_ip(&pod.0).await;
        let got = get_from_host(&format!("{ip}:8080")).expect("the pod's port from the host");
        assert!(got.contains(page), "{got}");
        assert!(
            get_from_host(&format!("{ip}:15001")).is_err(),
            "the egress proxy's port is not served to the pod network"
        );
        let (code, said) = self
            .exec(client, "timeout 20 wget -qO- http://allowed.example.test/")
            .await;
        assert_eq!((code, said.trim()), (0, upstream::BODY), "{said}");
        let (code, said) = self
            .exec(client, "timeout 20 wget -qO- http://other.example.test/")
            .await;
        assert_ne!(code, 0, "a host off the allow list is refused: {said}");
    }

    /// A container `limited` in `pod` with limits of its own, as the
    /// kubelet sets them from `resources.limits`: 32 MiB and half a CPU,
    /// and from its CPU request, 512 shares.
    async fn start_container_of_32_mib(&mut self, pod: &(String, PodSandboxConfig)) -> String {
        let resources = LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            ..Default::default()
        };
        self.start_container_with(
            pod,
            "limited",
            &["sleep", "3600"],
            Some(resources),
            Vec::new(),
        )
        .await
    }

    /// 64 MiB is fine for `client` (no limits of its own) and over
    /// `limited`'s 32: it is OOM-killed at its own ceiling, not the pod's.
    async fn assert_killed_at_its_own_ceiling(&mut self, client: &str, limited: &str) {
        let fill = "dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null; echo rc=$?";
        let (code, said) = self.exec(client, fill).await;
        assert_eq!((code, said.trim()), (0, "rc=0"), "{said}");
        let (code, said) = self.exec(limited, fill).await;
        assert_eq!(
            (code, said.trim()),
            (0, "rc=137"),
            "killed at its own ceiling: {said}"
        );
    }

    /// The limited container's processes (an exec here) hold the one
    /// capability it asked for and one seccomp filter more than the
    /// client's, which asked for neither and keeps sandboxd's fourteen
    /// (but one).
    async fn assert_confined_as_asked(&mut self, client: &str, limited: &str) {
        let read = "grep -E '^(CapBnd|CapEff|Seccomp_filters):' /proc/self/status";
        let mut of = Vec::new();
        for id in [client, limited] {
            let (code, said) = self.exec(id, read).await;
            assert_eq!(code, 0, "{said}");
            let fields: std::collections::BTreeMap<String, String> = said
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect();
            of.push(fields);
        }
        let (client, limited) = (&of[0], &of[1]);
        // Less CAP_SYS_CHROOT, which a process gives up entering its
        // container's root.
        let docker_fourteen_less_chroot = "00000000a80025fb";
        let net_bind_service = "0000000000000400";
        assert_eq!(client["CapBnd"], docker_fourteen_less_chroot, "{client:?}");
        assert_eq!(client["CapEff"], docker_fourteen_less_chroot, "{client:?}");
        assert_eq!(limited["CapBnd"], net_bind_service, "{limited:?}");
        assert_eq!(limited["CapEff"], net_bind_service, "{limited:?}");
        let filters = |fields: &std::collections::BTreeMap<String, String>| {
            fields["Seccomp_filters"]
                .parse::<u32>()
                .unwrap_or_else(|e| panic!("{fields:?}: {e}"))
        };
        assert_eq!(
            filters(limited),
            filters(client) + 1,
            "{client:?} {limited:?}"
        );
    }

    /// Stops (at once) and removes container `id`, as the kubelet does.
    async fn remove_container(&mut self, id: &str) {
        let container_id = id.to_string();
        let stop = StopContainerRequest {
            container_id: container_id.clone(),
            timeout: 0,
        };
        answered("StopContainer", self.runtime.stop_container(stop)).await;
        let remove = RemoveContainerRequest { container_id };
        answered("RemoveContainer", self.runtime.remove_container(remove)).await;
    }

    async fn remove_pod(&mut self, pod: &str) {
        let stop = StopPodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        answered("StopPodSandbox", self.runtime.stop_pod_sandbox(stop)).await;
        let remove = RemovePodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        answered("RemovePodSandbox", self.runtime.remove_pod_sandbox(remove)).await;
    }
}

/// A CRI call's answer, within [`CALL`]; the test fails naming `what`.
async fn answered<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> T {
    match tokio::time::timeout(CALL, call).await {
        Ok(Ok(answer)) => answer.into_inner(),
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what} not answered in time"),
    }
}

/// A CNI network, a containerd with CRI on it that runs `daemon`'s
/// sandboxes, and a CRI client that sees busybox imported. The network
/// goes when the first is dropped.
async fn cri_with_busybox(daemon: &Daemon) -> (CniNetwork, Containerd, Cri) {
    let cni = CniNetwork::new();
    let containerd = Containerd::start_cri(daemon, &cni.conf_dir());
    containerd.import_busybox();
    let mut cri = Cri::connect(&containerd.socket()).await;
    cri.await_image(IMAGE).await;
    (cni, containerd, cri)
}

fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

/// An HTTP GET of `/` from the host; the body, or why it failed.
fn get_from_host(addr: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect_timeout(
        &addr.parse().map_err(|e| format!("{addr}: {e}"))?,
        Duration::from_secs(5),
    )
    .map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn cri_pods_are_sandboxes_whose_containers_share_localhost_and_the_pods_egress_policy() {
    require_host!();
    let upstream = Upstream::start();
    let flags = upstream.daemon_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start_with(&flags);
    let (_cni, _containerd, mut cri) = cri_with_busybox(&daemon).await;

    // A pod is one sandbox, labelled with its sandbox container's id.
    let web = cri
        .run_pod("web", &[("sandboxd.io/allow-list", "allowed.example.test")])
        .await;
    let sandboxes = daemon.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0]["labels"]["containerd.io/id"], web.0.as_str());
    let sandbox = sandboxes[0]["id"].as_str().expect("id").to_string();
    // The pod's whole weight, not its pause container's 2.
    assert_eq!(
        cgroup::cpu_weight(&sandbox),
        cgroup::weight_of_shares(POD_CPU_SHARES as u64)
    );

    // Two containers, each with a root of its own, talking over localhost.
    let (server, client) = cri.serve_over_localhost(&web, "served-in-the-pod").await;
    assert_eq!(
        daemon.sandboxes().await.len(),
        1,
        "the containers joined the pod's sandbox"
    );
    // A container with limits of its own (the kubelet's from
    // `resources.limits`) runs in a group of them under the pod's: 64 MiB
    // is over its 32 and fine for the client, which has none.
    let limited = cri.start_container_of_32_mib(&web).await;
    cri.assert_confined_as_asked(&client, &limited).await;
    // CRI's additionalGids reach the container's processes.
    let (code, groups) = cri.exec(&limited, "id -G").await;
    assert_eq!(code, 0, "{groups}");
    assert!(
        groups
            .split_whitespace()
            .any(|g| g == SUPPLEMENTAL_GROUP.to_string()),
        "{groups}"
    );
    let group = common::cgroup::sandbox_dir("memory", &sandbox).join(format!("root-{limited}"));
    let ceiling = match common::cgroup::version() {
        common::cgroup::Version::V1 => "memory.limit_in_bytes",
        common::cgroup::Version::V2 => "memory.max",
    };
    assert_eq!(
        std::fs::read_to_string(group.join(ceiling))
            .unwrap_or_else(|e| panic!("{}: {e}", group.display()))
            .trim(),
        (32u64 << 20).to_string()
    );
    // Its CPU request's shares weigh it within the pod, in that group.
    assert_eq!(
        cgroup::cpu_weight(&format!("{sandbox}/root-{limited}")),
        cgroup::weight_of_shares(512)
    );
    cri.assert_killed_at_its_own_ceiling(&client, &limited)
        .await;
    // Its stats are its own group's; the client's, which has no limits of
    // its own, are the whole pod's, the limited container's included.
    let own = cri.memory_usage(&limited).await;
    let pod = cri.memory_usage(&client).await;
    eprintln!("info: memory charged, limited container {own}, pod {pod}");
    // A fraction of it (here ~350 KB of ~2.7 MB), not the pod's read twice.
    assert!(own > 0 && own * 4 < pod, "limited {own} vs pod {pod}");

    // A container's volumes, as the kubelet hands them over (a service
    // account's token read-only, an emptyDir), are in its root.
    let volumes = tempfile::tempdir_in("/var/tmp").expect("a volumes dir");
    let (token, cache) = (volumes.path().join("token"), volumes.path().join("cache"));
    std::fs::create_dir(&token).expect("token dir");
    std::fs::create_dir(&cache).expect("cache dir");
    std::fs::write(token.join("token"), "the-token\n").expect("token");
    let mount = |host: &Path, container: &str, readonly: bool| Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        readonly,
        ..Default::default()
    };
    let mounted = cri
        .start_container_with(
            &web,
            "mounted",
            &["sleep", "3600"],
            None,
            vec![
                mount(
                    &token,
                    "/var/run/secrets/kubernetes.io/serviceaccount",
                    true,
                ),
                mount(&cache, "/cache", false),
            ],
        )
        .await;
    let (code, said) = cri
        .exec(
            &mounted,
            "cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo kept > /cache/f && echo wrote; \
             touch /var/run/secrets/kubernetes.io/serviceaccount/more 2>/dev/null || echo read-only",
        )
        .await;
    assert_eq!((code, said.as_str()), (0, "the-token\nwrote\nread-only\n"));
    assert_eq!(
        std::fs::read_to_string(cache.join("f")).ok().as_deref(),
        Some("kept\n")
    );
    let (code, said) = cri.exec(&client, "ls /cache").await;
    assert_ne!(
        code, 0,
        "another container's volume is not the client's: {said}"
    );

    // sandboxd restarts under the pod: its containers keep running and
    // answering, each in its own root.
    daemon.restart();
    let (code, said) = cri
        .exec(&client, "wget -qO- http://127.0.0.1:8080/index.html")
        .await;
    assert_eq!((code, said.trim()), (0, "served-in-the-pod"), "{said}");
    let (code, said) = cri.exec(&server, "cat /www/index.html").await;
    assert_eq!(code, 0, "the server sees its own file: {said}");
    let (code, said) = cri.exec(&client, "cat /www/index.html").await;
    assert_ne!(code, 0, "the client's root is its own: {said}");
    let (code, said) = cri.exec(&client, "hostname; id -u").await;
    assert_eq!(code, 0, "{said}");
    assert!(said.starts_with("web\n"), "the pod's hostname: {said}");

    // The pod IP is CNI's: the host reaches the pod's port there, but not
    // sandboxd's own proxy port in the pod; the pod's allow list holds for
    // its containers.
    cri.assert_pod_ip_and_allow_list(&web, &client, "served-in-the-pod")
        .await;

    // A pod annotated block-network reaches nothing.
    let closed = cri
        .run_pod("closed", &[("sandboxd.io/block-network", "true")])
        .await;
    let shut_in = cri
        .start_container(&closed, "app", &["sleep", "3600"])
        .await;
    let before = upstream.accepted().len();
    let (code, said) = cri
        .exec(
            &shut_in,
            "timeout 10 wget -qO- http://allowed.example.test/",
        )
        .await;
    assert_ne!(code, 0, "a blocked pod reaches nothing: {said}");
    let (code, said) = cri
        .exec(
            &shut_in,
            &format!("timeout 10 wget -qO- http://{}/", upstream::SERVER_IPS[0]),
        )
        .await;
    assert_ne!(code, 0, "not even by address: {said}");
    assert_eq!(
        upstream.accepted().len(),
        before,
        "nothing reached upstream"
    );
    assert_eq!(daemon.sandboxes().await.len(), 2);

    // A pod's sandbox that ends outside containerd (deleted here; a
    // sandbox that dies on its own is the same) ends the pod for the
    // kubelet: its sandbox container and its containers exit.
    assert_eq!(
        cri.states(&closed.0, &shut_in).await,
        (
            PodSandboxState::SandboxReady,
            ContainerState::ContainerRunning
        ),
        "positive control"
    );
    let closed_sandbox = daemon
        .sandboxes()
        .await
        .iter()
        .find(|s| s["labels"]["containerd.io/id"] == closed.0.as_str())
        .and_then(|s| s["id"].as_str().map(str::to_string))
        .expect("the closed pod's sandbox");
    assert!(
        common::cgroup::sandbox_dir("pids", &closed_sandbox).exists(),
        "positive control: the closed pod's cgroup while it lives"
    );
    daemon.delete(&closed_sandbox).await;
    cri.await_ended(&closed.0, &shut_in).await;

    // Stopping and removing the pods (the ended one too) leaves nothing
    // in sandboxd, its cgroups or the host's mounts.
    cri.remove_pod(&web.0).await;
    cri.remove_pod(&closed.0).await;
    assert!(daemon.sandboxes().await.is_empty());
    for pod_sandbox in [&sandbox, &closed_sandbox] {
        assert!(
            !common::cgroup::sandbox_dir("pids", pod_sandbox).exists(),
            "no cgroup of pod sandbox {pod_sandbox} is left"
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&sandbox),
        "no mount of the pod's sandbox is left:\n{mounts}"
    );
    assert!(daemon.sandbox_run_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs VMX/SVM: scripts/nested-tests.sh runs it"]
async fn a_cri_pod_annotated_vm_is_one_microvm_whose_containers_bring_their_roots_after_boot() {
    let upstream = Upstream::start();
    let Some(daemon) = common::linux_vm::linux_vm_daemon(&upstream.daemon_flags()) else {
        return;
    };
    let (_cni, _containerd, mut cri) = cri_with_busybox(&daemon).await;

    // The pod is one microVM in the namespace CNI made.
    let web = cri
        .run_pod(
            "web",
            &[
                ("sandboxd.io/runtime", "vm"),
                ("sandboxd.io/allow-list", "allowed.example.test"),
            ],
        )
        .await;
    let sandboxes = daemon.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0]["runtime"], "vm", "{sandboxes:?}");
    let sandbox = sandboxes[0]["id"].as_str().expect("id").to_string();
    // The pod's whole weight, not its pause container's 2.
    assert_eq!(
        cgroup::cpu_weight(&sandbox),
        cgroup::weight_of_shares(POD_CPU_SHARES as u64)
    );

    // Its containers' roots arrive after boot, each as a disk put into one
    // of the VM's slots; they talk over the guest's localhost.
    let (server, client) = cri.serve_over_localhost(&web, "served-in-the-vm").await;
    assert_eq!(daemon.sandboxes().await.len(), 1, "one VM for the pod");
    let (code, said) = cri.exec(&server, "cat /www/index.html").await;
    assert_eq!(code, 0, "the server sees its own file: {said}");
    let (code, said) = cri.exec(&client, "cat /www/index.html").await;
    assert_ne!(code, 0, "the client's root is its own: {said}");
    let (code, said) = cri
        .exec(&client, "hostname; grep -c sandbox-agent /proc/cmdline")
        .await;
    assert_eq!(
        (code, said.as_str()),
        (0, "web\n1\n"),
        "the pod's name, in a guest kernel: {said}"
    );

    // The pod IP is CNI's and reaches the guest's port; the egress proxy's
    // port in the pod's namespace is not served; the allow list holds.
    cri.assert_pod_ip_and_allow_list(&web, &client, "served-in-the-vm")
        .await;

    // Fourteen containers fill the VM's slots (the server and the client
    // hold two); a fifteenth finds none free and is refused, saying why; a
    // removed container frees its slot.
    let mut fillers = Vec::new();
    for n in 3..=14 {
        let name = format!("filler-{n}");
        fillers.push(cri.start_container(&web, &name, &["sleep", "3600"]).await);
    }
    let (code, said) = cri.exec(&fillers[11], "echo in-the-last-slot").await;
    assert_eq!(
        (code, said.as_str()),
        (0, "in-the-last-slot\n"),
        "the fourteenth slot's container runs: {said}"
    );
    let err = cri.start_refused(&web, "fifteenth", Vec::new()).await;
    assert!(
        err.message().contains("14 root slots are all in use"),
        "{err}"
    );
    cri.remove_container(&fillers[0]).await;

    // The freed slot serves again, here a container with limits of its
    // own: the agent keeps them on a guest group of its own, so 64 MiB is
    // over its 32 and fine for the client, which has none.
    let limited = cri.start_container_of_32_mib(&web).await;
    cri.assert_confined_as_asked(&client, &limited).await;
    cri.assert_killed_at_its_own_ceiling(&client, &limited)
        .await;
    let (code, said) = cri.exec(&limited, "cat /proc/self/cgroup").await;
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("/workload/root-"),
        "its group is under its root's: {said}"
    );
    // Its CPU request's 512 shares weigh that group in the guest, as
    // cgroup v2's weight on runc's curve.
    let (code, said) = cri
        .exec(
            &limited,
            "g=$(sed -n 's/^0:://p' /proc/self/cgroup); cat /sys/fs/cgroup${g%/*}/cpu.weight",
        )
        .await;
    assert_eq!((code, said.trim()), (0, "59"), "{said}");
    // Its stats are that group's, read by the guest's agent: its own
    // ceiling and OOM kill, and a fraction of the memory the client,
    // without limits of its own, reports for the whole VM.
    let (status, stats) = daemon
        .call(
            hyper::Method::GET,
            &format!("/v1/sandboxes/{sandbox}/roots/{limited}/stats"),
            None,
        )
        .await;
    assert_eq!(status, hyper::StatusCode::OK, "{stats}");
    assert_eq!(stats["memory_limit_bytes"], 32u64 << 20, "{stats}");
    assert!(stats["oom_kills"].as_u64() >= Some(1), "{stats}");
    let own = cri.memory_usage(&limited).await;
    let pod = cri.memory_usage(&client).await;
    eprintln!("info: memory charged, limited container {own}, microVM pod {pod}");
    assert!(own > 0 && own * 4 < pod, "limited {own} vs pod {pod}");
    // A container without limits of its own has no group: a 404 that
    // says so (the shim then reports the pod's stats, as above).
    let (status, refused) = daemon
        .call(
            hyper::Method::GET,
            &format!("/v1/sandboxes/{sandbox}/roots/{client}/stats"),
            None,
        )
        .await;
    assert_eq!(status, hyper::StatusCode::NOT_FOUND, "{refused}");
    assert_eq!(refused["error"]["code"], "root_not_limited", "{refused}");

    // A container's volumes, as the kubelet lays them out, are copied into
    // the guest, which cannot see the host's files: a service account's
    // token behind its `..data` links, read-only, and an emptyDir that the
    // pod's containers share there (what they write stays in the guest).
    cri.remove_container(&fillers[1]).await;
    cri.remove_container(&fillers[2]).await;
    let volumes = tempfile::tempdir_in("/var/tmp").expect("a volumes dir");
    // Laid out as the kubelet keeps a pod's volumes.
    let pod_dir = volumes.path().join("pods/0c1d");
    let (token, cache) = (
        pod_dir.join("volumes/kubernetes.io~projected/token"),
        pod_dir.join("volumes/kubernetes.io~empty-dir/cache"),
    );
    let timestamped = token.join("..2026_12_06_10_00_00.1");
    std::fs::create_dir_all(&timestamped).expect("token dir");
    std::fs::create_dir_all(&cache).expect("cache dir");
    std::fs::write(timestamped.join("token"), "the-token\n").expect("token");
    std::os::unix::fs::symlink("..2026_12_06_10_00_00.1", token.join("..data")).expect("link");
    std::os::unix::fs::symlink("..data/token", token.join("token")).expect("link");
    let mount = |host: &Path, container: &str, readonly: bool| Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        readonly,
        ..Default::default()
    };
    let account = "/var/run/secrets/kubernetes.io/serviceaccount";
    let writer = cri
        .start_container_with(
            &web,
            "writer",
            &["sleep", "3600"],
            None,
            vec![mount(&token, account, true), mount(&cache, "/cache", false)],
        )
        .await;
    let (code, said) = cri
        .exec(
            &writer,
            &format!(
                "cat {account}/token; echo kept > /cache/f && echo wrote; \
                 touch {account}/more 2>/dev/null || echo read-only"
            ),
        )
        .await;
    assert_eq!((code, said.as_str()), (0, "the-token\nwrote\nread-only\n"));
    // The kubelet rotates the token in place, as its atomic writer does: a
    // new timestamped directory, `..data` swapped by a rename, the old one
    // removed. The guest's read-only copy follows; the writable emptyDir,
    // the guest's own once copied, does not.
    std::fs::write(cache.join("from-host"), "x").expect("a host write");
    let rotated = token.join("..2026_12_06_11_00_00.2");
    std::fs::create_dir(&rotated).expect("rotated dir");
    std::fs::write(rotated.join("token"), "the-rotated-token\n").expect("rotated token");
    std::os::unix::fs::symlink("..2026_12_06_11_00_00.2", token.join("..data_tmp")).expect("link");
    std::fs::rename(token.join("..data_tmp"), token.join("..data")).expect("swap");
    std::fs::remove_dir_all(&timestamped).expect("old token dir");
    // No event of the guest's reaches the test: the guest looks, up to 30 s.
    let (code, said) = cri
        .exec(
            &writer,
            &format!(
                "i=0; until grep -q rotated {account}/token && \
                 [ ! -e {account}/..2026_12_06_10_00_00.1 ] || [ $i -ge 300 ]; do \
                 i=$((i+1)); sleep 0.1; done; cat {account}/token; ls -a {account}; \
                 ls /cache"
            ),
        )
        .await;
    assert_eq!(code, 0, "{said}");
    assert_eq!(
        said, "the-rotated-token\n.\n..\n..2026_12_06_11_00_00.2\n..data\ntoken\nf\n",
        "the rotated token, only its own timestamped directory, and no host \
         write in the emptyDir"
    );
    let reader = cri
        .start_container_with(
            &web,
            "reader",
            &["sleep", "3600"],
            None,
            vec![mount(&cache, "/cache", false)],
        )
        .await;
    let (code, said) = cri.exec(&reader, "cat /cache/f").await;
    assert_eq!(
        (code, said.as_str()),
        (0, "kept\n"),
        "the emptyDir is shared"
    );
    assert!(!cache.join("f").exists(), "the guest's writes stay in it");
    // A `subPath` of the emptyDir, as the kubelet hands it over: made on
    // the host as the container starts, then bound under
    // `volume-subpaths/`, another path to a directory inside the emptyDir.
    // The guest binds that part of the pod's one copy, so what a container
    // writes through it and what one with the whole emptyDir writes meet.
    cri.remove_container(&fillers[3]).await;
    std::fs::create_dir(cache.join("logs")).expect("the subPath's directory");
    let subpath = pod_dir.join("volume-subpaths/cache/logger/0");
    std::fs::create_dir_all(&subpath).expect("the subPath's mount point");
    nix::mount::mount(
        Some(&cache.join("logs")),
        &subpath,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("the kubelet's bind of the subPath");
    let logger = cri
        .start_container_with(
            &web,
            "logger",
            &["sleep", "3600"],
            None,
            vec![mount(&subpath, "/logs", false)],
        )
        .await;
    let (code, said) = cri
        .exec(&logger, "echo from-logger > /logs/l && ls /logs")
        .await;
    assert_eq!((code, said.as_str()), (0, "l\n"));
    let (code, said) = cri
        .exec(
            &reader,
            "cat /cache/logs/l && echo from-reader > /cache/logs/r && ls /cache",
        )
        .await;
    assert_eq!(
        (code, said.as_str()),
        (0, "from-logger\nf\nlogs\n"),
        "the whole emptyDir holds what came through the subPath"
    );
    let (code, said) = cri.exec(&logger, "cat /logs/r").await;
    assert_eq!((code, said.as_str()), (0, "from-reader\n"));
    assert!(
        !cache.join("logs/l").exists(),
        "the guest's writes stay in it"
    );
    nix::mount::umount2(&subpath, nix::mount::MntFlags::MNT_DETACH).expect("unbind");
    // A volume the guest cannot hold is refused by name.
    let odd = volumes.path().join("odd");
    std::fs::create_dir(&odd).expect("odd dir");
    nix::unistd::mkfifo(
        &odd.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("a FIFO");
    let err = cri
        .start_refused(&web, "odd", vec![mount(&odd, "/odd", true)])
        .await;
    assert!(err.message().contains("pipe is a FIFO"), "{err}");

    // Stopping and removing the pod leaves nothing in sandboxd, its
    // cgroups or vmm processes.
    cri.remove_pod(&web.0).await;
    common::linux_vm::assert_nothing_left(&daemon, &[&sandbox]).await;
    assert!(daemon.sandbox_run_dirs().is_empty());
}
