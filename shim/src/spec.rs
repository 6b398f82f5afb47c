//! What containerd hands the shim, as sandboxd requests: the bundle's OCI
//! `config.json` becomes a create body and a process body, the rootfs
//! mounts become `host_rootfs`, the bind mounts of a task (`ctr run
//! --mount`) its sandbox's `volumes` and those of a pod's container (its
//! Kubernetes volumes) its root's. Whatever the spec asks that sandboxd
//! cannot honour is refused with the field's name, never dropped silently.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

mod refusals;

/// Annotations that select sandboxd features for a task (or a pod).
pub mod annotations {
    /// What every one of them starts with.
    pub const PREFIX: &str = "sandboxd.io/";
    pub const RUNTIME: &str = "sandboxd.io/runtime";
    pub const BLOCK_NETWORK: &str = "sandboxd.io/block-network";
    pub const ALLOW_LIST: &str = "sandboxd.io/allow-list";
    pub const SECRETS: &str = "sandboxd.io/secrets";
    pub const TTL_SECONDS: &str = "sandboxd.io/ttl-seconds";
}

/// The labels a task's sandbox carries, so `shim delete` finds it.
pub const LABEL_NAMESPACE: &str = "containerd.io/namespace";
pub const LABEL_ID: &str = "containerd.io/id";

/// What CRI writes into the specs of a pod's containers.
pub mod cri {
    /// `sandbox` for the pod's own ("pause") container, `container` for
    /// the others.
    pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    /// The pod sandbox's container id, in every container of the pod.
    pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
    /// containerd's own AppArmor profile, which CRI names when the host
    /// has AppArmor and the pod asks for none.
    pub const DEFAULT_APPARMOR: &str = "cri-containerd.apparmor.d";
    /// On the pod sandbox container: the CPU shares of the pod as a whole
    /// (the sum of its containers' requests), what the kubelet gives its
    /// pod cgroup; containerd copies it from the pod's config when the
    /// kubelet sends its resources (Kubernetes 1.23 and later).
    pub const SANDBOX_CPU_SHARES: &str = "io.kubernetes.cri.sandbox-cpu-shares";
}

/// Mounts CRI gives a pod's containers that the sandbox serves itself: its
/// own /etc/hosts, /etc/hostname and /etc/resolv.conf (bound into every
/// container root), its /dev/shm, and a /dev/termination-log (written in
/// the sandbox's /dev; its message does not reach the kubelet).
const POD_SERVED_DESTINATIONS: &[&str] = &[
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/dev/shm",
    "/dev/termination-log",
];

/// What a task is to the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A plain task (`ctr run`): its own sandbox, its init a process.
    Task,
    /// A CRI pod's sandbox ("pause") container: it makes the pod's sandbox,
    /// and no process runs for it.
    PodSandbox,
    /// A container of the CRI pod whose sandbox container is `pod`: a root
    /// of its own in that sandbox.
    PodMember { pod: String },
}

/// The spec's annotation `key`, if it is a string.
fn annotation<'a>(config: &'a Value, key: &str) -> Option<&'a str> {
    config.get("annotations")?.get(key)?.as_str()
}

/// The role the spec's CRI annotations give the task.
pub fn role(config: &Value) -> Result<Role, SpecError> {
    match annotation(config, cri::CONTAINER_TYPE) {
        None => Ok(Role::Task),
        Some("sandbox") => Ok(Role::PodSandbox),
        Some("container") => match annotation(config, cri::SANDBOX_ID) {
            Some(pod) if !pod.is_empty() => Ok(Role::PodMember { pod: pod.into() }),
            _ => Err(refuse(
                format!("annotations[{}]", cri::SANDBOX_ID),
                "a pod's container must name its pod sandbox",
            )),
        },
        Some(other) => Err(refuse(
            format!("annotations[{}]", cri::CONTAINER_TYPE),
            format!("{other:?} is neither sandbox nor container"),
        )),
    }
}

/// The shim a task is served by: one per pod (its sandbox container's
/// id), one per plain task.
pub fn grouping(config: &Value, id: &str) -> String {
    annotation(config, cri::SANDBOX_ID)
        .filter(|pod| !pod.is_empty())
        .unwrap_or(id)
        .to_string()
}

/// Mounts every container gets from sandboxd itself; the spec may list
/// them (containerd's default spec does).
const STANDARD_DESTINATIONS: &[&str] = &[
    "/proc",
    "/dev",
    "/dev/pts",
    "/dev/shm",
    "/dev/mqueue",
    "/sys",
    "/sys/fs/cgroup",
    "/run",
];

#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// A process to start in the sandbox: the API's start body.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSpec {
    pub body: Value,
}

/// Reads `<bundle>/config.json`.
pub fn read_bundle(bundle: &Path) -> Result<Value, SpecError> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path)
        .map_err(|e| refuse("config.json", format!("reading {}: {e}", path.display())))?;
    serde_json::from_slice(&text).map_err(|e| refuse("config.json", e.to_string()))
}

/// The process of an OCI `process` object (the task's, or an exec's);
/// `under_cri` when it is a CRI pod's.
pub fn process(process: &Value, field: &str, under_cri: bool) -> Result<ProcessSpec, SpecError> {
    let args: Vec<String> = process
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if args.is_empty() {
        return Err(refuse(format!("{field}.args"), "no command to run"));
    }
    refusals::check_process(process, field, under_cri)?;
    let mut env = Map::new();
    for entry in process
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let entry = entry.as_str().unwrap_or_default();
        let (key, value) = entry.split_once('=').ok_or_else(|| {
            refuse(
                format!("{field}.env"),
                format!("{entry:?} is not KEY=VALUE"),
            )
        })?;
        env.insert(key.to_string(), Value::String(value.to_string()));
    }
    let mut body = json!({"argv": args, "env": env, "stdin": true});
    if process.get("terminal").and_then(Value::as_bool) == Some(true) {
        // containerd sends the console's size (ResizePty) once it started.
        let size = process.get("consoleSize");
        let dimension = |key: &str, default: u64| {
            size.and_then(|s| s.get(key))
                .and_then(Value::as_u64)
                .filter(|v| (1..=u64::from(u16::MAX)).contains(v))
                .unwrap_or(default)
        };
        body["pty"] = json!({"rows": dimension("height", 24), "cols": dimension("width", 80)});
    }
    if let Some(cwd) = process.get("cwd").and_then(Value::as_str) {
        body["cwd"] = json!(cwd);
    }
    if let Some(user) = process.get("user") {
        let uid = user.get("uid").and_then(Value::as_u64).unwrap_or(0);
        let gid = user.get("gid").and_then(Value::as_u64).unwrap_or(0);
        body["uid"] = json!(uid);
        body["gid"] = json!(gid);
        // CRI merges the pod's supplementalGroups and fsGroup with what the
        // image's /etc/group lists for the user.
        let mut groups = Vec::new();
        for group in user
            .get("additionalGids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let group = group
                .as_u64()
                .and_then(|g| u32::try_from(g).ok())
                .ok_or_else(|| {
                    refuse(
                        format!("{field}.user.additionalGids"),
                        format!("{group} is not a group id"),
                    )
                })?;
            if u64::from(group) != gid && !groups.contains(&group) {
                groups.push(group);
            }
        }
        if !groups.is_empty() {
            body["groups"] = json!(groups);
        }
    }
    // What the process keeps is its bounding set, which bounds what it
    // holds after its exec as root (its effective and permitted sets,
    // containerd's equal to it, are within it or refused). A process
    // without the field has none, as the OCI spec says.
    body["capabilities"] = json!(refusals::capability_set(process, "bounding"));
    // The kubelet's negative scores (its Guaranteed pods' containers and
    // pod sandboxes) would shield untrusted code from the OOM killer:
    // sandboxd keeps a sandbox's processes at 0 and up.
    if let Some(score) = process
        .get("oomScoreAdj")
        .and_then(Value::as_i64)
        .filter(|s| *s > 0)
    {
        body["oom_score_adj"] = json!(score.min(1000));
    }
    Ok(ProcessSpec { body })
}

/// The seccomp profile of a container (`linux.seccomp`), which each of
/// its processes loads on top of the sandbox's own.
pub fn seccomp(config: &Value) -> Option<Value> {
    config
        .pointer("/linux/seccomp")
        .filter(|profile| !profile.is_null())
        .cloned()
}

/// The create body of a task's sandbox: its root, limits from
/// `linux.resources`, features from annotations, and labels naming the task.
pub fn sandbox(
    config: &Value,
    host_rootfs: &[PathBuf],
    namespace: &str,
    id: &str,
) -> Result<Value, SpecError> {
    let mut body = json!({
        "host_rootfs": host_rootfs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "ttl_seconds": -1,
        "labels": {LABEL_NAMESPACE: namespace, LABEL_ID: id},
    });
    let role = role(config)?;
    let pod = role == Role::PodSandbox;
    let linux = config.get("linux").unwrap_or(&Value::Null);
    if let Some(netns) = check_namespaces(linux, pod)? {
        body["join_netns"] = json!(netns);
    }
    refusals::check_spec(config, linux, &role)?;
    let volumes = check_mounts(config, &role)?;
    if !volumes.is_empty() {
        body["volumes"] = Value::Array(volumes);
    }
    if let Some(resources) = linux.get("resources") {
        limits(resources, &mut body)?;
    }
    if let Some(shares) = sandbox_cpu_shares(config, linux, &role)? {
        body["cpu_shares"] = json!(shares);
    }
    if let Some(hostname) = config
        .get("hostname")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
    {
        body["hostname"] = json!(hostname);
    }
    if let Some(annotations) = config.get("annotations").and_then(Value::as_object) {
        features(annotations, &mut body)?;
    }
    Ok(body)
}

/// What a pod's container adds to its root's attach body.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRoot {
    /// Its own ceilings, CPU weight and OOM group from `linux.resources`
    /// (the root's `limits`), if it has any: they apply to it alone,
    /// under the pod's.
    pub limits: Option<Value>,
    /// Its bind mounts (the root's `volumes`).
    pub volumes: Vec<Value>,
}

/// Checks the refusals of a pod's container (its root and process come
/// from [`host_rootfs`] and [`process`]): it shares the pod sandbox's
/// namespaces, so what it would set for itself alone there is refused,
/// and so is a sandboxd annotation that differs from its pod's (`pod`,
/// the pod sandbox container's spec).
pub fn member(config: &Value, pod: &Value) -> Result<MemberRoot, SpecError> {
    let linux = config.get("linux").unwrap_or(&Value::Null);
    if linux
        .get("namespaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|ns| ns.get("type").and_then(Value::as_str) == Some("user"))
    {
        return Err(refuse(
            "linux.namespaces[user]",
            "sandboxd makes each sandbox's user namespace and id map itself",
        ));
    }
    let role = Role::PodMember { pod: String::new() };
    refusals::check_spec(config, linux, &role)?;
    refusals::check_member_annotations(config, pod)?;
    let volumes = check_mounts(config, &role)?;
    let mut own = json!({});
    if let Some(resources) = linux.get("resources") {
        limits(resources, &mut own)?;
    }
    // An OOM kill ends the whole container, as the kubelet asks on cgroup
    // v2 (1.28 and later, unless its `singleProcessOOMKill`); the pod's
    // sandbox and a plain task are not given it (that would end their
    // agent, the sandbox itself).
    if linux.pointer("/resources/unified/memory.oom.group") == Some(&json!("1")) {
        own["oom_group"] = json!(true);
    }
    // Its weight within the pod, as its own cgroup under the pod's would
    // give it under runc (the kubelet sets one on every container).
    if let Some(shares) = cpu_shares_within_bounds(
        linux
            .pointer("/resources/cpu/shares")
            .and_then(Value::as_u64),
    ) {
        own["cpu_shares"] = json!(shares);
    }
    Ok(MemberRoot {
        limits: own
            .as_object()
            .is_some_and(|o| !o.is_empty())
            .then_some(own),
        volumes,
    })
}

/// Checks the namespaces; returns the network namespace to join (a CRI
/// pod's, only for a pod's sandbox container).
fn check_namespaces(linux: &Value, pod: bool) -> Result<Option<String>, SpecError> {
    let namespaces: &[Value] = linux
        .get("namespaces")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    for ns in namespaces {
        let kind = ns.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind == "user" {
            return Err(refuse(
                "linux.namespaces[user]",
                "sandboxd makes each sandbox's user namespace and id map itself",
            ));
        }
        let joins = ns
            .get("path")
            .and_then(Value::as_str)
            .is_some_and(|p| !p.is_empty());
        if joins && !(pod && kind == "network") {
            return Err(refuse(
                format!("linux.namespaces[{kind}].path"),
                "joining an existing namespace is not supported by sandboxd",
            ));
        }
    }
    let network = namespaces
        .iter()
        .find(|n| n.get("type").and_then(Value::as_str) == Some("network"));
    match network {
        None => Err(refuse(
            "linux.namespaces",
            "no network namespace (host networking) cannot be sandboxed; sandboxd gives every sandbox its own",
        )),
        Some(ns) => Ok(ns
            .get("path")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(str::to_string)),
    }
}

/// Checks the spec's mounts: those sandboxd makes itself (or a pod's
/// sandbox serves) are skipped; the bind mounts of a task or a pod's
/// container are returned as `volumes`; anything else is refused by field.
fn check_mounts(config: &Value, role: &Role) -> Result<Vec<Value>, SpecError> {
    let pod = *role != Role::Task;
    // The pod's sandbox container runs nothing of the pod's.
    let takes_volumes = *role != Role::PodSandbox;
    let mut volumes = Vec::new();
    for (index, mount) in config
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let destination = mount
            .get("destination")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = mount.get("type").and_then(Value::as_str).unwrap_or("");
        let bind = kind == "bind"
            || kind == "rbind"
            || mount
                .get("options")
                .and_then(Value::as_array)
                .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"));
        if pod && POD_SERVED_DESTINATIONS.contains(&destination) {
            continue;
        }
        if bind && takes_volumes {
            volumes.push(volume(index, destination, mount)?);
            continue;
        }
        if bind || !STANDARD_DESTINATIONS.contains(&destination) {
            return Err(refuse(
                format!("mounts[{index}]"),
                format!("{destination}: sandboxd takes bind mounts from the host, and makes its own /proc, /dev, /sys, /run; a {kind:?} mount is not supported"),
            ));
        }
    }
    Ok(volumes)
}

/// Bind mount `index` of a task or a pod's container as a volume: always
/// recursive, private, nodev and nosuid; read-only with `ro`.
fn volume(index: usize, destination: &str, mount: &Value) -> Result<Value, SpecError> {
    let source = mount
        .get("source")
        .and_then(Value::as_str)
        .filter(|s| s.starts_with('/'))
        .ok_or_else(|| {
            refuse(
                format!("mounts[{index}].source"),
                "a bind mount needs an absolute host path",
            )
        })?;
    let mut read_only = false;
    for option in mount
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match option.as_str().unwrap_or_default() {
            // rro: recursively read-only, which every volume's binding is.
            "ro" | "rro" => read_only = true,
            "rw" | "bind" | "rbind" | "private" | "rprivate" | "nosuid" | "nodev" => {}
            propagation @ ("slave" | "rslave" | "shared" | "rshared") => {
                return Err(refuse(
                    format!("mounts[{index}].options"),
                    format!("{propagation}: mount propagation between the host and a sandbox is not supported by sandboxd (its volumes are private)"),
                ))
            }
            other => {
                return Err(refuse(
                    format!("mounts[{index}].options"),
                    format!("{other:?} is not supported by sandboxd for a volume (bound recursively, private, nodev, nosuid; ro or rw)"),
                ))
            }
        }
    }
    // The kubelet passes a volume's mountPath as written (`/data/` too).
    let clean: Vec<&str> = destination.split('/').filter(|c| !c.is_empty()).collect();
    let destination = format!("/{}", clean.join("/"));
    Ok(json!({"source": source, "destination": destination, "read_only": read_only}))
}

fn limits(resources: &Value, body: &mut Value) -> Result<(), SpecError> {
    if let Some(limit) = resources.pointer("/memory/limit").and_then(Value::as_i64) {
        if limit > 0 {
            let mib = (limit as u64).div_ceil(1024 * 1024);
            body["memory_mib"] = json!(mib);
        }
    }
    let quota = resources.pointer("/cpu/quota").and_then(Value::as_i64);
    let period = resources.pointer("/cpu/period").and_then(Value::as_u64);
    if let (Some(quota), Some(period)) = (quota, period) {
        if quota > 0 && period > 0 {
            body["cpu"] = json!(quota as f64 / period as f64);
        }
    }
    if let Some(pids) = resources.pointer("/pids/limit").and_then(Value::as_i64) {
        if pids > 0 {
            body["pids"] = json!(pids);
        }
    }
    Ok(())
}

/// The CPU weight of a task's sandbox, in shares: a plain task's own
/// `linux.resources.cpu.shares`; for a pod, the pod's whole weight CRI
/// annotates its sandbox container with. That container's own shares are
/// the kubelet's minimum (2), which would starve the pod; the containers'
/// weigh them within the pod, each in its root's group ([`member`]).
fn sandbox_cpu_shares(
    config: &Value,
    linux: &Value,
    role: &Role,
) -> Result<Option<u64>, SpecError> {
    let shares = match role {
        Role::Task => linux
            .pointer("/resources/cpu/shares")
            .and_then(Value::as_u64),
        Role::PodSandbox => match annotation(config, cri::SANDBOX_CPU_SHARES) {
            None => None,
            Some(text) => Some(text.parse::<u64>().map_err(|_| {
                refuse(
                    format!("annotations[{}]", cri::SANDBOX_CPU_SHARES),
                    format!("{text:?} is not a number of CPU shares"),
                )
            })?),
        },
        Role::PodMember { .. } => None,
    };
    Ok(cpu_shares_within_bounds(shares))
}

/// CPU shares as sandboxd takes them: 0 is CRI's "not set", and a weight
/// beyond what a cgroup takes is clamped to it, as the kernel would.
fn cpu_shares_within_bounds(shares: Option<u64>) -> Option<u64> {
    let (least, most) = sandbox_proto::limits::CPU_SHARES.into_inner();
    shares.filter(|s| *s > 0).map(|s| s.clamp(least, most))
}

fn features(annotations: &Map<String, Value>, body: &mut Value) -> Result<(), SpecError> {
    let get = |key: &str| annotations.get(key).and_then(Value::as_str);
    if let Some(runtime) = get(annotations::RUNTIME) {
        match runtime {
            "container" => {}
            "vm" => body["runtime"] = json!("vm"),
            other => {
                return Err(refuse(
                    annotations::RUNTIME,
                    format!("{other:?} is neither container nor vm"),
                ))
            }
        }
    }
    if let Some(block) = get(annotations::BLOCK_NETWORK) {
        let block = match block {
            "true" => true,
            "false" => false,
            other => {
                return Err(refuse(
                    annotations::BLOCK_NETWORK,
                    format!("{other:?} is neither true nor false"),
                ))
            }
        };
        body["block_network"] = json!(block);
    }
    let list = |value: &str| -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    if let Some(hosts) = get(annotations::ALLOW_LIST) {
        body["allow_list"] = json!(list(hosts));
    }
    if let Some(names) = get(annotations::SECRETS) {
        body["secrets"] = json!(list(names));
    }
    if let Some(ttl) = get(annotations::TTL_SECONDS) {
        let ttl: i64 = ttl.trim().parse().map_err(|_| {
            refuse(
                annotations::TTL_SECONDS,
                format!("{ttl:?} is not a number of seconds"),
            )
        })?;
        body["ttl_seconds"] = json!(ttl);
    }
    Ok(())
}

/// One rootfs mount containerd hands over (`CreateTaskRequest.rootfs`).
pub struct RootMount<'a> {
    pub kind: &'a str,
    pub source: &'a str,
    pub options: &'a [String],
}

/// The directories, top first, that a task's root stacks: an overlay
/// snapshot's upperdir then lowerdirs, a bind snapshot's source, or with no
/// mounts the bundle's `rootfs` directory as containerd left it.
pub fn host_rootfs(
    mounts: &[RootMount<'_>],
    bundle: &Path,
    root_path: Option<&str>,
) -> Result<Vec<PathBuf>, SpecError> {
    let [mount] = mounts else {
        if mounts.is_empty() {
            // The spec's root.path, relative to the bundle unless absolute.
            return Ok(vec![bundle.join(root_path.unwrap_or("rootfs"))]);
        }
        return Err(refuse(
            "rootfs",
            format!(
                "{} mounts; the sandboxd shim takes one (an overlay or bind snapshot)",
                mounts.len()
            ),
        ));
    };
    match mount.kind {
        "bind" | "rbind" => Ok(vec![PathBuf::from(mount.source)]),
        "overlay" => {
            let mut upper = Vec::new();
            let mut lower = Vec::new();
            for option in mount.options {
                if let Some(dirs) = option.strip_prefix("lowerdir=") {
                    lower.extend(dirs.split(':').map(PathBuf::from));
                } else if let Some(dir) = option.strip_prefix("upperdir=") {
                    upper.push(PathBuf::from(dir));
                }
            }
            if lower.is_empty() {
                return Err(refuse("rootfs", "an overlay mount without lowerdir="));
            }
            upper.extend(lower);
            Ok(upper)
        }
        other => Err(refuse(
            "rootfs",
            format!("a {other:?} mount; the sandboxd shim takes overlay or bind snapshots"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr_spec() -> Value {
        json!({
            "process": {"args": ["sh", "-c", "echo hi"], "env": ["PATH=/bin", "A=b=c"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "mounts": [{"destination": "/proc"}, {"destination": "/dev"}, {"destination": "/run"}],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}],
                "resources": {"memory": {"limit": 268435456}, "cpu": {"quota": 50000, "period": 100000}, "pids": {"limit": 64}}
            },
            "annotations": {
                "sandboxd.io/block-network": "true",
                "sandboxd.io/ttl-seconds": "600",
                "sandboxd.io/secrets": "openai, github"
            }
        })
    }

    #[test]
    fn a_ctr_spec_becomes_a_create_and_a_process() {
        let spec = ctr_spec();
        let body = sandbox(
            &spec,
            &[PathBuf::from("/s/up"), PathBuf::from("/s/low")],
            "default",
            "t1",
        )
        .unwrap();
        assert_eq!(body["host_rootfs"], json!(["/s/up", "/s/low"]));
        assert_eq!(body["memory_mib"], 256);
        assert_eq!(body["cpu"], 0.5);
        assert_eq!(body["pids"], 64);
        assert_eq!(body["block_network"], true);
        assert_eq!(body["ttl_seconds"], 600);
        assert_eq!(body["secrets"], json!(["openai", "github"]));
        assert_eq!(body["labels"][LABEL_ID], "t1");
        let p = process(&spec["process"], "process", false).unwrap();
        assert_eq!(p.body["argv"], json!(["sh", "-c", "echo hi"]));
        assert_eq!(p.body["env"]["A"], "b=c");
        assert_eq!(p.body["uid"], 0);
        assert!(body.get("runtime").is_none(), "{body}");
        assert!(
            p.body.get("groups").is_none(),
            "no supplementary groups asked"
        );
        // CRI's merge of /etc/group (Alpine's root is in eleven groups) and
        // a pod's supplementalGroups: passed on, the primary and repeats
        // left out.
        let grouped = json!({"args": ["id"], "user": {"uid": 0, "gid": 0, "additionalGids": [0, 10, 27, 10, 4000]}});
        let p = process(&grouped, "process", true).unwrap();
        assert_eq!(p.body["groups"], json!([10, 27, 4000]));
        let bad = json!({"args": ["id"], "user": {"uid": 0, "gid": 0, "additionalGids": [-1]}});
        assert_eq!(
            process(&bad, "process", true).unwrap_err().field,
            "process.user.additionalGids"
        );
    }

    #[test]
    fn a_task_annotated_vm_is_a_microvm_on_its_snapshot() {
        let mut spec = ctr_spec();
        spec["annotations"] = json!({"sandboxd.io/runtime": "vm"});
        let body = sandbox(&spec, &[PathBuf::from("/s/up")], "default", "t1").unwrap();
        assert_eq!(body["runtime"], "vm");
        assert_eq!(body["host_rootfs"], json!(["/s/up"]));
    }

    #[test]
    fn what_sandboxd_cannot_honour_is_refused_by_field() {
        let mut host_net = ctr_spec();
        host_net["linux"]["namespaces"] = json!([{"type": "pid"}]);
        let mut pod_net = ctr_spec();
        pod_net["linux"]["namespaces"] =
            json!([{"type": "network", "path": "/var/run/netns/cni-1"}]);
        let mut tmpfs = ctr_spec();
        tmpfs["mounts"] = json!([{"destination": "/data", "type": "tmpfs", "source": "tmpfs"}]);
        let mut shared_bind = ctr_spec();
        shared_bind["mounts"] = json!([{"destination": "/data", "type": "bind", "source": "/srv", "options": ["rbind", "rshared"]}]);
        let mut readonly = ctr_spec();
        readonly["root"] = json!({"path": "rootfs", "readonly": true});
        let mut hooks = ctr_spec();
        hooks["hooks"] = json!({"prestart": [{"path": "/usr/bin/nvidia-hook"}]});
        let mut host_pid = ctr_spec();
        host_pid["linux"]["namespaces"] =
            json!([{"type": "network"}, {"type": "pid", "path": "/proc/1/ns/pid"}]);
        let mut devices = ctr_spec();
        devices["linux"]["devices"] = json!([{"path": "/dev/kvm", "type": "c"}]);
        let mut userns = ctr_spec();
        userns["linux"]["namespaces"] = json!([{"type": "network"}, {"type": "user"}]);
        for (spec, field) in [
            (host_net, "linux.namespaces"),
            (pod_net, "linux.namespaces[network].path"),
            (tmpfs, "mounts[0]"),
            (shared_bind, "mounts[0].options"),
            (readonly, "root.readonly"),
            (hooks, "hooks"),
            (host_pid, "linux.namespaces[pid].path"),
            (userns, "linux.namespaces[user]"),
            (devices, "linux.devices"),
        ] {
            let err = sandbox(&spec, &[], "default", "t").unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        let tty = process(&json!({"args": ["sh"], "terminal": true}), "process", false).unwrap();
        assert_eq!(tty.body["pty"], json!({"rows": 24, "cols": 80}));
    }

    #[test]
    fn overlay_and_bind_snapshots_become_directories_top_first() {
        let options = vec![
            "index=off".to_string(),
            "workdir=/s/2/work".into(),
            "upperdir=/s/2/fs".into(),
            "lowerdir=/s/1/fs:/s/0/fs".into(),
        ];
        let overlay = RootMount {
            kind: "overlay",
            source: "overlay",
            options: &options,
        };
        assert_eq!(
            host_rootfs(&[overlay], Path::new("/b"), None).unwrap(),
            vec![PathBuf::from("/s/2/fs"), "/s/1/fs".into(), "/s/0/fs".into()]
        );
        let bind = RootMount {
            kind: "bind",
            source: "/s/9/fs",
            options: &[],
        };
        assert_eq!(
            host_rootfs(&[bind], Path::new("/b"), None).unwrap(),
            vec![PathBuf::from("/s/9/fs")]
        );
        assert_eq!(
            host_rootfs(&[], Path::new("/b"), None).unwrap(),
            vec![PathBuf::from("/b/rootfs")]
        );
    }

    fn cri_spec(kind: &str) -> Value {
        let mut spec = ctr_spec();
        spec["annotations"] = json!({
            "io.kubernetes.cri.container-type": kind,
            "io.kubernetes.cri.sandbox-id": "pod1",
            "sandboxd.io/block-network": "true",
        });
        spec["linux"]["namespaces"] = json!([
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            {"type": "network", "path": "/var/run/netns/cni-1"}
        ]);
        spec["linux"]["resources"] = json!({"cpu": {"shares": 2}});
        spec["mounts"] = json!([
            {"destination": "/proc", "type": "proc"},
            {"destination": "/dev/shm", "type": "bind", "source": "/run/containerd/x/shm"},
            {"destination": "/etc/resolv.conf", "type": "bind", "source": "/var/lib/x/resolv.conf"}
        ]);
        spec["process"]["apparmorProfile"] = json!(cri::DEFAULT_APPARMOR);
        spec["hostname"] = json!("web-1");
        spec
    }

    /// The pod sandbox ("pause") container's spec of [`cri_spec`]'s pod.
    fn pod() -> Value {
        cri_spec("sandbox")
    }

    /// What containerd 1.6's default spec (`ctr run`) and the kubelet
    /// through CRI put in every container's spec, beyond [`ctr_spec`].
    fn with_defaults(mut spec: Value) -> Value {
        let caps = json!([
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FSETID",
            "CAP_FOWNER",
            "CAP_MKNOD",
            "CAP_NET_RAW",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETFCAP",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_KILL",
            "CAP_AUDIT_WRITE"
        ]);
        spec["process"]["capabilities"] =
            json!({"bounding": caps, "effective": caps, "permitted": caps});
        spec["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]);
        spec["process"]["noNewPrivileges"] = json!(true);
        spec["process"]["oomScoreAdj"] = json!(-997);
        spec["process"]["selinuxLabel"] = json!("");
        spec["linux"]["maskedPaths"] = json!([
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/proc/scsi",
            "/sys/devices/virtual/powercap"
        ]);
        spec["linux"]["readonlyPaths"] = json!([
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger"
        ]);
        spec["linux"]["cgroupsPath"] = json!("/default/t1");
        spec["linux"]["mountLabel"] = json!("");
        let resources = &mut spec["linux"]["resources"];
        resources["devices"] = json!([{"allow": false, "access": "rwm"}]);
        resources["cpu"]["shares"] = json!(1024);
        resources["cpu"]["cpus"] = json!("");
        resources["hugepageLimits"] =
            json!([{"pageSize": "2MB", "limit": 0}, {"pageSize": "1GB", "limit": 0}]);
        if let Some(limit) = resources.pointer("/memory/limit").cloned() {
            resources["memory"]["swap"] = limit;
        }
        resources["unified"] = json!({"memory.swap.max": "0", "memory.oom.group": "1"});
        resources["memory"]["useHierarchy"] = json!(true);
        spec
    }

    #[test]
    fn a_sandboxs_cpu_weight_is_its_tasks_or_its_whole_pods() {
        let mut task = ctr_spec();
        task["linux"]["resources"]["cpu"]["shares"] = json!(512);
        let body = sandbox(&task, &[], "default", "t").unwrap();
        assert_eq!(body["cpu_shares"], 512);
        // The pod sandbox container's own 2 is not the pod's weight; the
        // annotation CRI copies from the pod's resources is.
        let pod = cri_spec("sandbox");
        assert_eq!(pod["linux"]["resources"]["cpu"]["shares"], 2);
        assert!(sandbox(&pod, &[], "k8s.io", "p")
            .unwrap()
            .get("cpu_shares")
            .is_none());
        for (annotated, weight) in [
            ("1536", Some(1536)),
            ("0", None),
            ("1", Some(2)),
            ("999999", Some(262_144)),
        ] {
            let mut pod = cri_spec("sandbox");
            pod["annotations"][cri::SANDBOX_CPU_SHARES] = json!(annotated);
            let body = sandbox(&pod, &[], "k8s.io", "p").unwrap();
            assert_eq!(
                body.get("cpu_shares").and_then(Value::as_u64),
                weight,
                "{annotated}"
            );
        }
        let mut pod = cri_spec("sandbox");
        pod["annotations"][cri::SANDBOX_CPU_SHARES] = json!("lots");
        let err = sandbox(&pod, &[], "k8s.io", "p").unwrap_err();
        assert_eq!(
            err.field,
            format!("annotations[{}]", cri::SANDBOX_CPU_SHARES)
        );
        // A member's shares weigh it within its pod: its root's, not the
        // pod's.
        let mut member_spec = cri_spec("container");
        member_spec["linux"]["resources"]["cpu"]["shares"] = json!(256);
        assert_eq!(
            member(&member_spec, &cri_spec("sandbox")).unwrap().limits,
            Some(json!({"cpu_shares": 256}))
        );
    }

    #[test]
    fn containerds_and_the_kubelets_defaults_are_accepted() {
        let task = with_defaults(ctr_spec());
        let body = sandbox(&task, &[PathBuf::from("/s/up")], "default", "t1").unwrap();
        assert_eq!(body["memory_mib"], 256);
        process(&task["process"], "process", false).unwrap();
        let mut member_spec = with_defaults(cri_spec("container"));
        member_spec["linux"]["resources"]["memory"] = json!({"limit": 1 << 28, "swap": 1 << 28});
        let own = member(&member_spec, &pod()).unwrap();
        // The kubelet's cgroup v2 whole-container OOM kill is its root's.
        assert_eq!(
            own.limits,
            Some(json!({"memory_mib": 256, "cpu_shares": 1024, "oom_group": true}))
        );
        // Without it (a cgroup v1 node's kubelet), one process is killed.
        member_spec["linux"]["resources"]["unified"] = json!({"memory.swap.max": "0"});
        assert_eq!(
            member(&member_spec, &pod()).unwrap().limits,
            Some(json!({"memory_mib": 256, "cpu_shares": 1024}))
        );
        let pause = with_defaults(pod());
        sandbox(&pause, &[PathBuf::from("/s/pause")], "k8s.io", "pod1").unwrap();
    }

    #[test]
    fn a_process_keeps_its_bounding_set_a_positive_oom_score_and_its_containers_seccomp() {
        let task = with_defaults(ctr_spec());
        let body = process(&task["process"], "process", false).unwrap().body;
        assert_eq!(
            body["capabilities"],
            json!(sandbox_proto::confinement::CAPABILITIES)
        );
        // The kubelet's -997 is not passed on; a score above 0 is.
        assert_eq!(body.get("oom_score_adj"), None, "{body}");
        let mut burstable = task["process"].clone();
        burstable["oomScoreAdj"] = json!(932);
        let body = process(&burstable, "process", false).unwrap().body;
        assert_eq!(body["oom_score_adj"], 932);
        // Kubernetes' `drop: [ALL]`, and a process without the field.
        let mut dropped = task["process"].clone();
        dropped["capabilities"] = json!({"bounding": [], "effective": [], "permitted": []});
        let body = process(&dropped, "process", false).unwrap().body;
        assert_eq!(body["capabilities"], json!([]));
        let bare = process(&json!({"args": ["true"]}), "process", false)
            .unwrap()
            .body;
        assert_eq!(bare["capabilities"], json!([]));
        // Held beyond the bounding set: refused.
        let mut beyond = task["process"].clone();
        beyond["capabilities"]["bounding"] = json!(["CAP_CHOWN"]);
        let err = process(&beyond, "process", false).unwrap_err();
        assert_eq!(err.field, "process.capabilities.effective", "{err}");
        assert_eq!(seccomp(&task), None);
        for (profile, field) in [
            (
                json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
                "linux.seccomp.defaultAction",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["ptrace"], "action": "SCMP_ACT_TRACE"}]}),
                "linux.seccomp.syscalls.action",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/l"}),
                "linux.seccomp.listenerPath",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"]}),
                "linux.seccomp.flags",
            ),
        ] {
            let mut spec = task.clone();
            spec["linux"]["seccomp"] = profile;
            let err = sandbox(&spec, &[], "default", "t").unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        let mut confined = task.clone();
        confined["linux"]["seccomp"] = json!({"defaultAction": "SCMP_ACT_ALLOW"});
        assert_eq!(
            seccomp(&confined),
            Some(json!({"defaultAction": "SCMP_ACT_ALLOW"}))
        );
    }

    #[test]
    fn what_sandboxd_does_not_set_is_refused_by_field() {
        let changed = |change: &dyn Fn(&mut Value)| {
            let mut spec = with_defaults(ctr_spec());
            change(&mut spec);
            spec
        };
        let cases: Vec<(Value, &str)> = vec![
            (
                changed(&|s| {
                    s["process"]["rlimits"] = json!([
                        {"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
                        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}
                    ])
                }),
                "process.rlimits[RLIMIT_CORE]",
            ),
            (
                changed(&|s| s["process"]["capabilities"]["bounding"][0] = json!("CAP_SYS_ADMIN")),
                "process.capabilities.bounding",
            ),
            (
                changed(&|s| s["process"]["capabilities"]["ambient"] = json!(["CAP_NET_ADMIN"])),
                "process.capabilities.ambient",
            ),
            (
                changed(&|s| s["process"]["user"]["umask"] = json!(0o077)),
                "process.user.umask",
            ),
            (
                changed(&|s| s["process"]["user"]["username"] = json!("app")),
                "process.user.username",
            ),
            (
                changed(&|s| s["process"]["ioPriority"] = json!({"class": "IOPRIO_CLASS_RT"})),
                "process.ioPriority",
            ),
            (
                changed(&|s| {
                    s["process"]["selinuxLabel"] = json!("system_u:system_r:container_t:s0")
                }),
                "process.selinuxLabel",
            ),
            (
                changed(&|s| s["linux"]["maskedPaths"][0] = json!("/proc/cpuinfo")),
                "linux.maskedPaths",
            ),
            (
                changed(&|s| s["linux"]["readonlyPaths"][0] = json!("/etc")),
                "linux.readonlyPaths",
            ),
            (
                changed(&|s| s["linux"]["resources"]["cpu"]["cpus"] = json!("0-1")),
                "linux.resources.cpu.cpus",
            ),
            (
                changed(&|s| s["linux"]["resources"]["memory"]["reservation"] = json!(1 << 20)),
                "linux.resources.memory.reservation",
            ),
            (
                changed(&|s| s["linux"]["resources"]["memory"]["swap"] = json!(-1)),
                "linux.resources.memory.swap",
            ),
            (
                changed(&|s| s["linux"]["resources"]["memory"]["swappiness"] = json!(60)),
                "linux.resources.memory.swappiness",
            ),
            (
                changed(&|s| s["linux"]["resources"]["blockIO"] = json!({"weight": 100})),
                "linux.resources.blockIO",
            ),
            (
                changed(&|s| {
                    s["linux"]["resources"]["hugepageLimits"][0]["limit"] = json!(1 << 21)
                }),
                "linux.resources.hugepageLimits",
            ),
            (
                changed(&|s| s["linux"]["resources"]["unified"] = json!({"io.weight": "100"})),
                "linux.resources.unified[io.weight]",
            ),
            (
                changed(&|s| s["linux"]["intelRdt"] = json!({"closID": "a"})),
                "linux.intelRdt",
            ),
            (
                changed(&|s| s["linux"]["rootfsPropagation"] = json!("rshared")),
                "linux.rootfsPropagation",
            ),
            (
                changed(&|s| s["domainname"] = json!("example")),
                "domainname",
            ),
            (
                changed(&|s| s["linux"]["netDevices"] = json!({"eth1": {}})),
                "linux.netDevices",
            ),
        ];
        for (spec, field) in cases {
            let err = sandbox(&spec, &[], "default", "t").unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        // An exec's process is checked as the task's is; it may carry
        // containerd's default AppArmor profile, not another.
        let default_profile = json!({"args": ["sh"], "apparmorProfile": cri::DEFAULT_APPARMOR});
        process(&default_profile, "exec", true).unwrap();
        assert_eq!(
            process(&default_profile, "exec", false).unwrap_err().field,
            "exec.apparmorProfile",
            "a plain task's exec gets no AppArmor profile, not even containerd's default"
        );
        let other_profile = json!({"args": ["sh"], "apparmorProfile": "unconfined"});
        assert_eq!(
            process(&other_profile, "exec", true).unwrap_err().field,
            "exec.apparmorProfile"
        );
        let exec =
            json!({"args": ["sh"], "rlimits": [{"type": "RLIMIT_NPROC", "hard": 1, "soft": 1}]});
        assert_eq!(
            process(&exec, "exec", false).unwrap_err().field,
            "exec.rlimits[RLIMIT_NPROC]"
        );
    }

    #[test]
    fn a_pod_members_sandboxd_annotations_must_be_its_pods() {
        let spec = cri_spec("container");
        member(&spec, &pod()).unwrap();
        let mut other = cri_spec("container");
        other["annotations"]["sandboxd.io/block-network"] = json!("false");
        let err = member(&other, &pod()).unwrap_err();
        assert_eq!(err.field, "annotations[sandboxd.io/block-network]", "{err}");
        let mut own = cri_spec("container");
        own["annotations"]["sandboxd.io/ttl-seconds"] = json!("60");
        let err = member(&own, &pod()).unwrap_err();
        assert_eq!(err.field, "annotations[sandboxd.io/ttl-seconds]", "{err}");
        // The pod's, passed down unchanged, are fine; so is none at all.
        let mut none = cri_spec("container");
        none["annotations"] = json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "pod1",
        });
        member(&none, &pod()).unwrap();
    }

    #[test]
    fn a_cri_pod_sandbox_joins_its_network_namespace() {
        let spec = cri_spec("sandbox");
        assert_eq!(role(&spec).unwrap(), Role::PodSandbox);
        assert_eq!(grouping(&spec, "pod1"), "pod1");
        let body = sandbox(&spec, &[PathBuf::from("/s/pause")], "k8s.io", "pod1").unwrap();
        assert_eq!(body["join_netns"], "/var/run/netns/cni-1");
        assert_eq!(body["hostname"], "web-1", "the pod's name inside");
        assert_eq!(body["block_network"], true);
        assert!(body.get("memory_mib").is_none());
    }

    #[test]
    fn a_cri_pod_annotated_vm_is_a_microvm_in_its_network_namespace() {
        let mut spec = cri_spec("sandbox");
        spec["annotations"]["sandboxd.io/runtime"] = json!("vm");
        let body = sandbox(&spec, &[PathBuf::from("/s/pause")], "k8s.io", "pod1").unwrap();
        assert_eq!(body["runtime"], "vm");
        assert_eq!(body["join_netns"], "/var/run/netns/cni-1");
        assert_eq!(body["hostname"], "web-1");
    }

    #[test]
    fn a_cri_pod_member_shares_its_pod_and_keeps_limits_of_its_own() {
        let spec = cri_spec("container");
        assert_eq!(role(&spec).unwrap(), Role::PodMember { pod: "pod1".into() });
        assert_eq!(grouping(&spec, "c1"), "pod1");
        assert_eq!(
            member(&spec, &pod()).unwrap(),
            MemberRoot {
                limits: Some(json!({"cpu_shares": 2})),
                volumes: Vec::new()
            }
        );
        let mut limited = cri_spec("container");
        limited["linux"]["resources"] = json!({
            "memory": {"limit": 1 << 28},
            "cpu": {"quota": 25000, "period": 100000, "shares": 256},
            "pids": {"limit": 64}
        });
        assert_eq!(
            member(&limited, &pod()).unwrap().limits,
            Some(json!({"memory_mib": 256, "cpu": 0.25, "pids": 64, "cpu_shares": 256}))
        );
        // Shares alone weigh the container within its pod, in bounds; 0
        // is CRI's unset.
        for (shares, limits) in [
            (2, Some(json!({"cpu_shares": 2}))),
            (1 << 20, Some(json!({"cpu_shares": 262_144}))),
            (0, None),
        ] {
            limited["linux"]["resources"] = json!({"cpu": {"shares": shares}});
            assert_eq!(member(&limited, &pod()).unwrap().limits, limits, "{shares}");
        }
        let mut other_profile = cri_spec("container");
        other_profile["process"]["apparmorProfile"] = json!("my-profile");
        assert_eq!(
            member(&other_profile, &pod()).unwrap_err().field,
            "process.apparmorProfile"
        );
        // A plain task keeps its own namespaces: no pod, no grouping.
        assert_eq!(role(&ctr_spec()).unwrap(), Role::Task);
        assert_eq!(grouping(&ctr_spec(), "t1"), "t1");
    }

    #[test]
    fn bind_mounts_are_volumes_of_a_pod_members_root_or_a_tasks_sandbox() {
        let mut spec = cri_spec("container");
        // As containerd's CRI plugin writes the kubelet's mounts.
        spec["mounts"] = json!([
            {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/pod/hosts", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/var/run/secrets/kubernetes.io/serviceaccount", "type": "bind",
             "source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~projected/kube-api-access-x",
             "options": ["rbind", "rprivate", "ro"]},
            {"destination": "/cache/", "type": "bind", "source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache",
             "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/etc//conf", "type": "bind", "source": "/srv/conf", "options": ["rbind", "rro"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]);
        assert_eq!(
            member(&spec, &pod()).unwrap().volumes,
            vec![
                json!({"source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~projected/kube-api-access-x",
                       "destination": "/var/run/secrets/kubernetes.io/serviceaccount", "read_only": true}),
                json!({"source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache",
                       "destination": "/cache", "read_only": false}),
                json!({"source": "/srv/conf", "destination": "/etc/conf", "read_only": true}),
            ]
        );
        let refused = |mounts: Value| {
            let mut spec = cri_spec("container");
            spec["mounts"] = mounts;
            member(&spec, &pod()).unwrap_err().field
        };
        assert_eq!(
            refused(
                json!([{"destination": "/d", "type": "bind", "source": "/s", "options": ["rbind", "rslave"]}])
            ),
            "mounts[0].options"
        );
        assert_eq!(
            refused(
                json!([{"destination": "/d", "type": "bind", "source": "/s", "options": ["rbind", "noexec"]}])
            ),
            "mounts[0].options"
        );
        assert_eq!(
            refused(json!([{"destination": "/d", "type": "bind", "source": "rel"}])),
            "mounts[0].source"
        );
        assert_eq!(
            refused(json!([{"destination": "/d", "type": "tmpfs", "source": "tmpfs"}])),
            "mounts[0]"
        );
        // A plain task's (`ctr run --mount`) are its sandbox's, beside
        // the standard mounts containerd's default spec lists.
        let mut task = ctr_spec();
        task["mounts"] = json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/data", "type": "bind", "source": "/srv", "options": ["rbind", "ro"]},
            {"destination": "/out", "type": "none", "source": "/var/out", "options": ["bind"]}
        ]);
        let body = sandbox(&task, &[PathBuf::from("/s/rootfs")], "default", "t1").unwrap();
        assert_eq!(
            body["volumes"],
            json!([
                {"source": "/srv", "destination": "/data", "read_only": true},
                {"source": "/var/out", "destination": "/out", "read_only": false}
            ])
        );
        // Without any, the body names none.
        let body = sandbox(&ctr_spec(), &[PathBuf::from("/s/rootfs")], "default", "t1").unwrap();
        assert!(body.get("volumes").is_none(), "{body}");
        // The pod's sandbox container runs nothing of the pod's: a bind
        // mount there (not one the sandbox serves) is refused.
        let mut pause = cri_spec("sandbox");
        pause["mounts"] = json!([{"destination": "/data", "type": "bind", "source": "/srv"}]);
        let err = sandbox(&pause, &[PathBuf::from("/s/rootfs")], "k8s.io", "p1").unwrap_err();
        assert_eq!(err.field, "mounts[0]");
    }
}
