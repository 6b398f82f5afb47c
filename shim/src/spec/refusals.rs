//! What of an OCI spec sandboxd cannot honour, refused by field name.
//!
//! Every field containerd may hand over falls in one of three kinds:
//! - honoured: the shim turns it into the create or start body (the
//!   caller's module does that);
//! - covered by sandboxd's own, stricter setting, and accepted where the
//!   spec asks for no more than that setting gives (masked paths, device
//!   rules, capabilities, swap equal to the memory limit), or replaced by
//!   sandboxd's own (`RLIMIT_NOFILE`, the cgroup path);
//! - neither: refused here with the field's name, so nothing the spec
//!   relies on is dropped silently.
//!
//! A few fields the kubelet sets on every container are accepted although
//! sandboxd does not apply them (a negative `oomScoreAdj`; huge page
//! limits of zero where no hugetlb controller reaches the sandbox, which
//! elsewhere has them for every size whatever the spec says; and
//! `memory.oom.group` on a pod's sandbox container, while a pod's other
//! containers get it on their roots); refusing them would refuse every
//! pod. `docs/kubernetes.md` lists them.

use serde_json::Value;

use super::{cri, refuse, Role, SpecError};

// What every sandbox is confined to by default, as the daemon writes it.
use sandbox_proto::confinement::{
    CAPABILITIES as SANDBOX_CAPABILITIES, MASKED_PATHS as SANDBOX_MASKED_PATHS,
    READONLY_PATHS as SANDBOX_READONLY_PATHS, UMASK as SANDBOX_UMASK,
};

/// Whether a field is set to anything but its empty form.
fn present(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
    }
}

/// The whole spec's refusals but its namespaces and mounts (checked by the
/// caller, which also takes what they give): its own fields, its
/// process's and its resources'.
pub(super) fn check_spec(config: &Value, linux: &Value, role: &Role) -> Result<(), SpecError> {
    check_fields(config, linux, role)?;
    check_paths(linux)?;
    if let Some(process) = config.get("process") {
        check_process(process, "process", *role != Role::Task)?;
    }
    if let Some(resources) = linux.get("resources") {
        check_resources(resources)?;
    }
    if let Some(profile) = linux.get("seccomp").filter(|p| !p.is_null()) {
        check_seccomp(profile)?;
    }
    Ok(())
}

/// What of a seccomp profile sandboxd never loads, refused at the create
/// (sandboxd compiles the rest when each process starts, and refuses what
/// does not compile then).
fn check_seccomp(profile: &Value) -> Result<(), SpecError> {
    for (name, why) in [
        (
            "listenerPath",
            "seccomp notifications go to no agent of the host's in sandboxd",
        ),
        ("flags", "seccomp filter flags are not set by sandboxd"),
    ] {
        if present(profile.get(name)) {
            return Err(refuse(format!("linux.seccomp.{name}"), why));
        }
    }
    let actions = std::iter::once(("linux.seccomp.defaultAction", profile.get("defaultAction")))
        .chain(
            profile
                .get("syscalls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|rule| ("linux.seccomp.syscalls.action", rule.get("action"))),
        );
    for (field, action) in actions {
        let action = action.and_then(Value::as_str).unwrap_or_default();
        if matches!(action, "SCMP_ACT_NOTIFY" | "SCMP_ACT_TRACE") {
            return Err(refuse(
                field,
                format!("{action} needs a tracer or a listener outside the sandbox, which sandboxd does not run"),
            ));
        }
    }
    Ok(())
}

/// Fields sandboxd has no setting for at all.
fn check_fields(config: &Value, linux: &Value, role: &Role) -> Result<(), SpecError> {
    // Device cgroup rules (linux.resources.devices) are not here: they only
    // narrow access, and sandboxd applies its own narrower set.
    let refused: [(&str, Option<&Value>, &str); 13] = [
        (
            "linux.devices",
            linux.get("devices"),
            "device nodes from the host are not given to sandboxes (GPUs go through sandboxd's gpu option)",
        ),
        (
            "root.readonly",
            config.pointer("/root/readonly"),
            "a read-only root is not supported by sandboxd yet (its root has a writable layer)",
        ),
        (
            "hooks",
            config.get("hooks"),
            "OCI hooks run host programs, which sandboxd does not do",
        ),
        (
            "linux.uidMappings",
            linux.get("uidMappings"),
            "sandboxd maps every sandbox's ids itself",
        ),
        (
            "linux.gidMappings",
            linux.get("gidMappings"),
            "sandboxd maps every sandbox's ids itself",
        ),
        (
            "linux.sysctl",
            linux.get("sysctl"),
            "sysctls are not set by sandboxd",
        ),
        (
            "linux.intelRdt",
            linux.get("intelRdt"),
            "Intel RDT is not set up by sandboxd",
        ),
        (
            "linux.personality",
            linux.get("personality"),
            "an execution domain is not set by sandboxd",
        ),
        (
            "linux.timeOffsets",
            linux.get("timeOffsets"),
            "time namespaces are not made by sandboxd",
        ),
        (
            "linux.mountLabel",
            linux.get("mountLabel"),
            "SELinux labels are not applied by sandboxd",
        ),
        (
            "domainname",
            config.get("domainname"),
            "a NIS domain name is not set by sandboxd",
        ),
        (
            "linux.netDevices",
            linux.get("netDevices"),
            "host network devices are not moved into sandboxes",
        ),
        (
            "linux.rootfsPropagation",
            linux
                .get("rootfsPropagation")
                .filter(|p| !matches!(p.as_str(), Some("private" | "rprivate"))),
            "a sandbox's root is private: no mount propagates to or from the host",
        ),
    ];
    for (field, value, why) in refused {
        // The pod sandbox container's root holds no process of the pod's.
        let pause_root = *role == Role::PodSandbox && field == "root.readonly";
        if present(value) && !pause_root {
            return Err(refuse(field, why));
        }
    }
    Ok(())
}

/// Masked and read-only paths: accepted where sandboxd treats each path
/// so too (it may do more: an empty list still gets its own).
fn check_paths(linux: &Value) -> Result<(), SpecError> {
    for (field, own, what) in [
        ("linux.maskedPaths", &SANDBOX_MASKED_PATHS[..], "masks"),
        (
            "linux.readonlyPaths",
            &SANDBOX_READONLY_PATHS[..],
            "makes read-only",
        ),
    ] {
        for path in linux
            .get(field.trim_start_matches("linux."))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let path = path.as_str().unwrap_or_default();
            if !own.contains(&path) {
                return Err(refuse(
                    field,
                    format!(
                        "{path:?} is not among the paths sandboxd {what} ({})",
                        own.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A process's fields sandboxd does not set (the task's, or an exec's).
/// `under_cri`: the process is a CRI pod's, whose containers may carry
/// containerd's default AppArmor profile.
pub(super) fn check_process(
    process: &Value,
    field: &str,
    under_cri: bool,
) -> Result<(), SpecError> {
    for (name, why) in [
        ("ioPriority", "I/O priorities are not set by sandboxd"),
        ("scheduler", "scheduling policies are not set by sandboxd"),
        ("execCPUAffinity", "CPU affinity is not set by sandboxd"),
        ("selinuxLabel", "SELinux labels are not applied by sandboxd"),
    ] {
        if present(process.get(name)) {
            return Err(refuse(format!("{field}.{name}"), why));
        }
    }
    // containerd's default profile under CRI is the runtime's default
    // confinement, which sandboxd's own (user namespace, seccomp) stands
    // for, as it does for containerd's default seccomp; nothing else is
    // applied. The task's own process comes here from `check_spec` too.
    let profile = process.get("apparmorProfile").and_then(Value::as_str);
    let default = under_cri && profile == Some(cri::DEFAULT_APPARMOR);
    if profile.is_some_and(|p| !p.is_empty()) && !default {
        return Err(refuse(
            format!("{field}.apparmorProfile"),
            "AppArmor profiles are not applied by sandboxd",
        ));
    }
    if present(process.pointer("/user/username")) {
        return Err(refuse(
            format!("{field}.user.username"),
            "a user name is for Windows containers; give a uid",
        ));
    }
    if let Some(umask) = process.pointer("/user/umask").filter(|u| !u.is_null()) {
        if umask.as_u64() != Some(u64::from(SANDBOX_UMASK)) {
            return Err(refuse(
                format!("{field}.user.umask"),
                format!("sandbox processes start with umask {SANDBOX_UMASK:04o}; another is not set by sandboxd"),
            ));
        }
    }
    for limit in process
        .get("rlimits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = limit
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if kind != "RLIMIT_NOFILE" {
            return Err(refuse(
                format!("{field}.rlimits[{kind}]"),
                "sandboxd sets no resource limit but RLIMIT_NOFILE (its own)",
            ));
        }
    }
    // The bounding set is what the process keeps (`spec::process`); a
    // root process's effective and permitted sets come from it at its
    // exec, and the inheritable set is emptied, so each may only be
    // within it. Ambient capabilities would give a non-root process some:
    // sandboxd gives none.
    let set_of = |set| capability_set(process, set);
    for set in ["bounding", "effective", "permitted", "inheritable"] {
        let wanted = process
            .pointer(&format!("/capabilities/{set}"))
            .and_then(Value::as_array);
        for capability in wanted.into_iter().flatten() {
            let capability = capability.as_str().unwrap_or_default();
            if !SANDBOX_CAPABILITIES.contains(&capability) {
                return Err(refuse(
                    format!("{field}.capabilities.{set}"),
                    format!(
                        "{capability} is not granted by sandboxd (its processes may hold {})",
                        SANDBOX_CAPABILITIES.join(", ")
                    ),
                ));
            }
        }
    }
    if !set_of("ambient").is_empty() {
        return Err(refuse(
            format!("{field}.capabilities.ambient"),
            "ambient capabilities are not given by sandboxd (a process that is not root holds none)",
        ));
    }
    let bounding = set_of("bounding");
    for set in ["effective", "permitted"] {
        if let Some(extra) = set_of(set).iter().find(|c| !bounding.contains(c)) {
            return Err(refuse(
                format!("{field}.capabilities.{set}"),
                format!(
                    "{extra} is not in the bounding set, which is what sandboxd grants a process"
                ),
            ));
        }
    }
    Ok(())
}

/// The names in a process's capability set `set` (`bounding`, `ambient`,
/// ...); none when the set, or the whole field, is absent.
pub(super) fn capability_set<'a>(process: &'a Value, set: &str) -> Vec<&'a str> {
    process
        .pointer(&format!("/capabilities/{set}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// `linux.resources` beyond the limits the caller takes (memory, CPU quota
/// and period, pids) and the device rules.
fn check_resources(resources: &Value) -> Result<(), SpecError> {
    let field = |path: &str| {
        format!(
            "linux.resources.{}",
            path.trim_start_matches('/').replace('/', ".")
        )
    };
    for path in [
        "/memory/reservation",
        "/memory/kernel",
        "/memory/kernelTCP",
        "/memory/disableOOMKiller",
        "/cpu/cpus",
        "/cpu/mems",
        "/cpu/realtimeRuntime",
        "/cpu/realtimePeriod",
        "/cpu/burst",
        "/cpu/idle",
        "/blockIO",
        "/network",
        "/rdma",
    ] {
        if present(resources.pointer(path)) {
            return Err(refuse(field(path), "not set by sandboxd"));
        }
    }
    // sandboxd allows no swap: memory+swap is the memory limit.
    if let Some(swap) = resources.pointer("/memory/swap").filter(|s| !s.is_null()) {
        let limit = resources.pointer("/memory/limit");
        if Some(swap) != limit {
            return Err(refuse(
                field("/memory/swap"),
                "sandboxd allows no swap: memory+swap must equal linux.resources.memory.limit",
            ));
        }
    }
    if let Some(swappiness) = resources
        .pointer("/memory/swappiness")
        .filter(|s| !s.is_null())
    {
        if swappiness.as_u64() != Some(0) {
            return Err(refuse(
                field("/memory/swappiness"),
                "sandboxd allows no swap (swappiness 0)",
            ));
        }
    }
    // The kubelet names every huge page size with limit 0 when the pod
    // asks for none: nothing to grant.
    for hugepages in resources
        .get("hugepageLimits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if hugepages.get("limit").and_then(Value::as_u64).unwrap_or(0) != 0 {
            return Err(refuse(
                "linux.resources.hugepageLimits",
                "huge pages are not given to sandboxes",
            ));
        }
    }
    for (key, value) in resources
        .get("unified")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        // What the kubelet writes on cgroup v2: no swap (sandboxd allows
        // none), and since 1.28 a whole-group OOM kill, which a pod's
        // container gets on its root ([`super::member`]); a task or a
        // pod's sandbox does not (the kernel kills one process of it).
        let no_swap = key == "memory.swap.max" && value.as_str() == Some("0");
        let oom_group = key == "memory.oom.group" && value.as_str() == Some("1");
        if !no_swap && !oom_group {
            return Err(refuse(
                format!("linux.resources.unified[{key}]"),
                "cgroup v2 files are not written by sandboxd beyond its own limits",
            ));
        }
    }
    Ok(())
}

/// The `sandboxd.io/` annotations of a pod's container: containerd passes
/// the pod's down to every container, and they select the pod sandbox's
/// features, so a container's own must say the same as its pod's.
pub(super) fn check_member_annotations(config: &Value, pod: &Value) -> Result<(), SpecError> {
    let features = |spec: &Value| -> Vec<(String, Value)> {
        spec.get("annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(key, _)| key.starts_with(super::annotations::PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    };
    let of_pod = features(pod);
    for (key, value) in features(config) {
        let pod_value = of_pod.iter().find(|(k, _)| *k == key).map(|(_, v)| v);
        if pod_value != Some(&value) {
            return Err(refuse(
                format!("annotations[{key}]"),
                format!(
                    "a pod's containers share its sandbox, made with the pod's annotations as they were when it started: the container says {value}, the pod's sandbox {}; set {key} on the pod, and recreate the pod after changing it",
                    pod_value.map_or("nothing".to_string(), Value::to_string)
                ),
            ));
        }
    }
    Ok(())
}
