//! Unit tests of the manager's orchestration against a recording fake of
//! the supervisors: what a health reply, a refusal or a gone supervisor
//! does to the records, the store and the event log. No root, no sandbox:
//! the manager runs on a temp dir with a pool that is a plain directory.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::events::EventKind;
use super::warm_pool::PoolClaim;
use super::{Manager, SandboxError, SandboxRecord};
use crate::config::{Config, ConfigOverrides};
use crate::model::{CreateRequest, Limits, RuntimeKind, SandboxState, Usage};
use crate::net::policy::NetworkPolicy;
use crate::net::proxy::EgressCounters;
use crate::supervisor::client::fake::{Call, FakeSupervisors};
use crate::supervisor::protocol::{
    Ceilings, SupervisorError, SupervisorErrorKind, SupervisorHealth, SupervisorReply,
};

struct Harness {
    manager: Arc<Manager>,
    fake: Arc<FakeSupervisors>,
    _dir: tempfile::TempDir,
}

fn harness(pool_size: usize) -> Harness {
    harness_with(pool_size, |_| {})
}

/// A harness whose config `adjust` changes after it is loaded (to have
/// what a flag could not give without a kernel or images, say).
fn harness_with(pool_size: usize, adjust: impl FnOnce(&mut Config)) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    // A parent of its own: recovery sweeps the groups under its parent and
    // kills the supervisors there, which under the default (`/sandboxd`)
    // would be those of a daemon running on the host.
    let cgroup_parent = format!(
        "/sandboxd-unit-test-{}",
        dir.path()
            .file_name()
            .map(|n| n.to_string_lossy().trim_start_matches('.').to_owned())
            .unwrap_or_default()
    );
    let mut config = Config::load(
        None,
        ConfigOverrides {
            state_dir: Some(dir.path().join("state")),
            run_dir: Some(dir.path().join("run")),
            pool_size: Some(pool_size),
            cgroup_parent: Some(cgroup_parent),
            ..Default::default()
        },
    )
    .expect("config");
    adjust(&mut config);
    std::fs::create_dir_all(&config.state_dir).expect("state dir");
    let store = crate::store::Store::open(&dir.path().join("store.redb")).expect("store");
    let images =
        crate::image::ImageCache::open(dir.path().join("images"), Vec::new()).expect("images");
    let disk = crate::disk::DiskPool::unmounted(&dir.path().join("disk")).expect("disk");
    let mut manager = Manager::new(config, store, images, disk);
    let fake = Arc::new(FakeSupervisors::default());
    Arc::get_mut(&mut manager)
        .expect("nobody else holds the manager yet")
        .supervisors = Arc::clone(&fake) as _;
    Harness {
        manager,
        fake,
        _dir: dir,
    }
}

/// A harness with a warm pool of one microVM of the default image.
fn vm_pool_harness() -> Harness {
    let h = harness_with(0, |config| {
        config.warm_pools.push(crate::config::WarmPoolSize {
            runtime: RuntimeKind::Vm,
            image: config.default_image.clone(),
            size: 1,
        })
    });
    // A refill would make real sandboxes: mark one as already running.
    h.manager.refilling.store(true, Ordering::Release);
    h
}

impl Harness {
    /// [`Self::ready`] for a microVM, after `adjust` changes its record.
    fn ready_vm(
        &self,
        id: &str,
        pooled: bool,
        adjust: impl FnOnce(&mut SandboxRecord),
    ) -> SandboxRecord {
        let mut record = self.ready(id, pooled);
        record.runtime = RuntimeKind::Vm;
        adjust(&mut record);
        self.manager.persist(&record).expect("persist");
        self.manager.records().insert(id.into(), record.clone());
        record
    }

    /// A ready microVM `id` waiting in its pool.
    fn pooled_vm(&self, id: &str, adjust: impl FnOnce(&mut SandboxRecord)) -> SandboxRecord {
        let record = self.ready_vm(id, true, adjust);
        self.manager
            .pool()
            .put(RuntimeKind::Vm, &record.image, id.into());
        record
    }

    /// Puts a ready sandbox `id` in the records and the store.
    /// Secrets `names` stored (value "value", bound to api.example.test)
    /// and bound, as a create asking for them binds them.
    fn secrets_bound(&self, names: &[&str]) -> Vec<crate::secrets::SecretBinding> {
        for name in names {
            self.manager
                .secrets
                .create(crate::secrets::NewSecret {
                    name: name.to_string(),
                    value: zeroize::Zeroizing::new(b"value".to_vec()),
                    hosts: vec!["api.example.test".into()],
                    allow_wildcards: false,
                })
                .expect("secret");
        }
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.manager.secrets.bind(&names).expect("bind")
    }

    /// Ready pooled containers `ids` of the default image, in that order,
    /// each supervisor scripted to take one claim; no refill starts.
    /// Returns the image.
    fn pooled_scripted(&self, ids: &[&str]) -> String {
        self.manager.refilling.store(true, Ordering::Release);
        let image = self.manager.config.default_image.clone();
        for id in ids {
            self.ready(id, true);
            self.manager
                .pool()
                .put(RuntimeKind::Container, &image, id.to_string());
            self.fake.script(id, SupervisorReply::Ok);
        }
        image
    }

    fn ready(&self, id: &str, pooled: bool) -> SandboxRecord {
        let record = SandboxRecord {
            id: id.into(),
            state: SandboxState::Ready,
            runtime: RuntimeKind::Container,
            image: self.manager.config.default_image.clone(),
            image_digest: "sha256-test".into(),
            limits: self.manager.pooled_limits(),
            ttl_seconds: -1,
            expires_at_ms: None,
            created_at: "2026-01-01T00:00:00.000Z".into(),
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            cgroups_path: format!("sandboxd-unit-test/{id}"),
            supervisor_pid: 0,
            init_pid: 0,
            oom_kills: 0,
            failure: None,
            pooled,
            claiming: false,
            supervisor_events_seen: 0,
            gpus: Vec::new(),
            usage: Usage::default(),
            idempotency_key: None,
            request_digest: None,
            network: NetworkPolicy {
                block_network: Some(false),
                allow_list: None,
            },
            base_snapshot: None,
            vm_uid: None,
            secrets: Vec::new(),
            ports: Vec::new(),
            process_user: None,
            foreign_supervisor: false,
            host_rootfs: Vec::new(),
            join_netns: None,
            hostname: None,
            volumes: Vec::new(),
        };
        self.manager.persist(&record).expect("persist");
        self.manager.records().insert(id.into(), record.clone());
        record
    }

    fn stored(&self, id: &str) -> Option<SandboxRecord> {
        self.manager
            .store
            .all::<SandboxRecord>()
            .expect("store")
            .into_iter()
            .find(|r| r.id == id)
    }

    fn events(&self, id: &str) -> Vec<(EventKind, Option<String>)> {
        self.manager
            .events
            .after(0)
            .0
            .into_iter()
            .filter(|e| e.sandbox_id == id)
            .map(|e| (e.kind, e.detail))
            .collect()
    }
}

fn health(oom_kills: u64, egress_bytes: u64, failure: Option<&str>) -> SupervisorReply {
    SupervisorReply::Health(SupervisorHealth {
        protocol: crate::supervisor::protocol::SUPERVISOR_PROTOCOL_VERSION,
        init_pid: 1,
        oom_kills,
        failure: failure.map(String::from),
        egress: EgressCounters {
            bytes: egress_bytes,
            ..Default::default()
        },
        substitutions: Vec::new(),
        claimed: false,
    })
}

#[tokio::test]
async fn get_takes_oom_kills_and_egress_bytes_from_the_health_reply() {
    let h = harness(0);
    h.ready("sb-a", false);
    h.fake.script("sb-a", health(2, 4096, None));
    let got = h.manager.get("sb-a").await.expect("get");
    assert_eq!(got.state, SandboxState::Ready);
    assert_eq!(got.oom_kills, 2);
    assert_eq!(got.usage.egress_bytes, 4096);
    assert_eq!(h.fake.calls(), vec![Call::Health("sb-a".into())]);
    assert!(
        h.events("sb-a").is_empty(),
        "a healthy sandbox makes no event"
    );
}

#[tokio::test]
async fn get_marks_a_sandbox_the_supervisor_reports_dead_failed() {
    let h = harness(0);
    h.ready("sb-b", false);
    h.fake
        .script("sb-b", health(0, 0, Some("the agent exited")));
    let got = h.manager.get("sb-b").await.expect("get");
    assert_eq!(got.state, SandboxState::Failed);
    assert_eq!(got.failure.as_deref(), Some("the agent exited"));
    let stored = h.stored("sb-b").expect("still stored");
    assert_eq!(stored.state, SandboxState::Failed);
    assert_eq!(
        h.events("sb-b"),
        vec![(EventKind::Failed, Some("the agent exited".into()))]
    );
}

#[tokio::test]
async fn get_marks_a_sandbox_whose_supervisor_is_gone_failed() {
    let h = harness(0);
    h.ready("sb-c", false);
    // Nothing scripted: the fake answers as an unreachable socket.
    let got = h.manager.get("sb-c").await.expect("get");
    assert_eq!(got.state, SandboxState::Failed);
    assert_eq!(
        got.failure.as_deref(),
        Some("the sandbox's supervisor is gone")
    );
    assert_eq!(
        h.stored("sb-c").map(|r| r.state),
        Some(SandboxState::Failed)
    );
    assert_eq!(h.events("sb-c").len(), 1);
    // A failed sandbox is not asked again.
    let again = h.manager.get("sb-c").await.expect("get");
    assert_eq!(again.state, SandboxState::Failed);
    assert_eq!(h.fake.calls().len(), 1);
}

#[tokio::test]
async fn set_network_persists_only_what_the_supervisor_accepted() {
    let h = harness(0);
    h.ready("sb-d", false);
    let wanted = NetworkPolicy {
        block_network: None,
        allow_list: Some(vec!["example.com".into()]),
    };
    h.fake.script(
        "sb-d",
        SupervisorReply::Error(SupervisorError::new(
            SupervisorErrorKind::Internal,
            "the proxy is gone",
        )),
    );
    let refused = h.manager.set_network("sb-d", &wanted).await;
    assert!(matches!(refused, Err(SandboxError::Internal(m)) if m == "the proxy is gone"));
    let before = Some(false);
    assert_eq!(h.manager.records()["sb-d"].network.block_network, before);
    assert_eq!(
        h.stored("sb-d").and_then(|r| r.network.allow_list),
        None,
        "a refused policy is not persisted"
    );

    h.fake.script("sb-d", SupervisorReply::Ok);
    let set = h.manager.set_network("sb-d", &wanted).await.expect("set");
    assert_eq!(set.network, wanted);
    assert_eq!(h.stored("sb-d").map(|r| r.network), Some(wanted.clone()));
    assert_eq!(
        h.fake.calls(),
        vec![
            Call::SetPolicy("sb-d".into(), wanted.clone()),
            Call::SetPolicy("sb-d".into(), wanted),
        ]
    );
}

#[tokio::test]
async fn set_network_sends_the_default_and_a_gone_supervisor_is_a_409() {
    let h = harness(0);
    h.ready("sb-e", false);
    let result = h
        .manager
        .set_network("sb-e", &NetworkPolicy::default())
        .await;
    assert!(
        matches!(&result, Err(SandboxError::Conflict { code, .. }) if *code == "sandbox_not_running"),
        "{result:?}"
    );
    // The empty request was resolved to the daemon's default before it was sent.
    let default_block = h.manager.config.default_egress == crate::net::policy::DefaultEgress::Block;
    assert_eq!(
        h.fake.calls(),
        vec![Call::SetPolicy(
            "sb-e".into(),
            NetworkPolicy {
                block_network: Some(default_block),
                allow_list: None,
            }
        )]
    );
}

#[tokio::test]
async fn a_sandbox_that_is_not_ready_is_not_asked() {
    let h = harness(0);
    let mut record = h.ready("sb-f", false);
    record.state = SandboxState::Failed;
    h.manager.records().insert("sb-f".into(), record);
    assert_eq!(
        h.manager.get("sb-f").await.expect("get").state,
        SandboxState::Failed
    );
    let set = h
        .manager
        .set_network("sb-f", &NetworkPolicy::default())
        .await;
    assert!(matches!(set, Err(SandboxError::Conflict { code, .. }) if code == "sandbox_not_ready"));
    assert!(h.fake.calls().is_empty());
}

/// A claim of `image` for `req`: a 60 s TTL, no secrets, no GPU.
fn claim<'a>(
    image: &'a str,
    limits: &'a Limits,
    req: &'a CreateRequest,
    network: &'a NetworkPolicy,
) -> PoolClaim<'a> {
    PoolClaim {
        runtime: RuntimeKind::Container,
        image,
        limits,
        ttl_seconds: 60,
        req,
        request_digest: None,
        network,
        secrets: &[],
        gpu: false,
    }
}

/// Claims a pooled container of `image` for `req` at the pooled limits,
/// with an open network; panics when none is handed out.
async fn claim_pooled_container(h: &Harness, image: &str, req: &CreateRequest) -> SandboxRecord {
    let limits = h.manager.pooled_limits();
    let network = open_network();
    h.manager
        .claim_pooled(&claim(image, &limits, req, &network))
        .await
        .expect("claim")
        .expect("a pooled sandbox")
}

/// [`claim_pooled_container`] of a default request with `secrets` bound.
async fn claim_pooled_binding(
    h: &Harness,
    image: &str,
    secrets: &[crate::secrets::SecretBinding],
) -> SandboxRecord {
    let (limits, req, network) = (
        h.manager.pooled_limits(),
        CreateRequest::default(),
        open_network(),
    );
    h.manager
        .claim_pooled(&PoolClaim {
            secrets,
            ..claim(image, &limits, &req, &network)
        })
        .await
        .expect("claim")
        .expect("a pooled sandbox")
}

/// A default request for a pooled microVM of `image` with `limits`.
async fn claim_pooled_vm(h: &Harness, image: &str, limits: &Limits) -> Option<SandboxRecord> {
    let req = CreateRequest::default();
    let network = open_network();
    h.manager
        .claim_pooled(&PoolClaim {
            runtime: RuntimeKind::Vm,
            ..claim(image, limits, &req, &network)
        })
        .await
        .expect("claim")
}

fn open_network() -> NetworkPolicy {
    NetworkPolicy {
        block_network: Some(false),
        allow_list: None,
    }
}

/// A claim's lower limits go to the supervisor with the rest of its
/// hand-over: the cgroup ceilings and, where the disk differs, the layer's
/// quota; nothing where they stay the pool's.
#[tokio::test]
async fn a_claims_lower_limits_are_handed_over() {
    let h = harness(2);
    let image = h.pooled_scripted(&["sb-l", "sb-d"]);
    let pooled = h.manager.pooled_limits();
    let lower = Limits {
        cpu: pooled.cpu / 2.0,
        memory_mib: pooled.memory_mib / 2,
        pids: pooled.pids / 2,
        ..pooled.clone()
    };
    let (req, network) = (CreateRequest::default(), open_network());
    let claimed = h
        .manager
        .claim_pooled(&claim(&image, &lower, &req, &network))
        .await
        .expect("claim")
        .expect("a pooled sandbox");
    let less_disk = Limits {
        disk_mib: pooled.disk_mib / 2,
        ..pooled.clone()
    };
    h.manager
        .claim_pooled(&claim(&image, &less_disk, &req, &network))
        .await
        .expect("claim")
        .expect("a pooled sandbox");
    let quota_us = crate::runtime::spec::cpu_quota_us(lower.cpu).expect("quota");
    let calls = h.fake.calls();
    let [Call::HandOver {
        id: first,
        ceilings: Some(Ceilings::Container(limits)),
        disk_quota_bytes: None,
        ..
    }, Call::HandOver {
        id: second,
        ceilings: None,
        disk_quota_bytes: Some(bytes),
        ..
    }] = calls.as_slice()
    else {
        panic!("two hand-overs with the limits expected, got {calls:?}");
    };
    assert_eq!(first, &claimed.id);
    assert_eq!(second, "sb-d");
    assert_eq!(
        *limits,
        crate::runtime::cgroups::CgroupLimits {
            cpu_quota_us: quota_us,
            memory_bytes: lower.memory_mib << 20,
            pids_max: lower.pids as i64,
        }
    );
    assert_eq!(*bytes, less_disk.disk_mib << 20);
}

/// A claimed sandbox's watch (whose first request makes its supervisor
/// put the claim in force) waits until the create has been answered, and
/// does not start for a sandbox removed before.
#[tokio::test]
async fn a_claimed_sandboxs_watch_waits_for_the_answer() {
    let h = harness(2);
    let image = h.pooled_scripted(&["sb-a", "sb-b"]);
    let waiting = |id: &str| h.manager.awaiting_answer().get(id).copied();
    let req = CreateRequest {
        env: BTreeMap::from([("A".to_string(), "1".to_string())]),
        ..Default::default()
    };
    // A permit left by the TTL's wake-up, taken.
    let ttl_woken = || futures::FutureExt::now_or_never(h.manager.ttl_changed.notified()).is_some();
    let first = claim_pooled_container(&h, &image, &req).await;
    assert_eq!(
        waiting(&first.id),
        Some(true),
        "the watch waits for the answer"
    );
    assert!(!ttl_woken(), "so does the TTL's wake-up");
    drop(h.manager.answering(&first.id));
    assert_eq!(waiting(&first.id), None, "answered: the watch starts");
    assert!(ttl_woken(), "and the TTL looks at the new deadline");

    let second = claim_pooled_container(&h, &image, &req).await;
    assert_eq!(waiting(&second.id), Some(true));
    h.manager.remove_everything(&second).await;
    assert_eq!(
        waiting(&second.id),
        Some(false),
        "removed unanswered: no watch"
    );
    // Its guard, dropped after the removal, starts no watch.
    drop(h.manager.answering(&second.id));
    assert_eq!(waiting(&second.id), None);
}

/// A refill's sandbox joins the pool only while its record is still a
/// ready pooled one: one removed, or failed, while the refill was making
/// what its claim would use stays out, and keeps none of it.
#[tokio::test]
async fn a_sandbox_joins_the_pool_only_while_its_record_is_a_ready_pooled_one() {
    let h = harness(1);
    h.manager.refilling.store(true, Ordering::Release);
    let image = h.manager.config.default_image.clone();
    h.ready("sb-ready", true);
    h.ready("sb-failed", true);
    h.manager
        .records()
        .get_mut("sb-failed")
        .expect("its record")
        .state = SandboxState::Failed;
    h.ready("sb-handed-out", false);
    for id in ["sb-ready", "sb-failed", "sb-handed-out", "sb-removed"] {
        h.manager
            .pool_ready(RuntimeKind::Container, &image, id.into())
            .await;
    }
    assert_eq!(h.manager.pooled(), 1);
    let pools = h.manager.pool();
    assert_eq!(
        pools.made.keys().collect::<Vec<_>>(),
        ["sb-ready"],
        "the pool kept what was made for another"
    );
}

#[tokio::test]
async fn a_pooled_sandbox_is_handed_out_with_the_callers_env() {
    let h = harness(1);
    // A refill would make real sandboxes: mark one as already running.
    h.manager.refilling.store(true, Ordering::Release);
    h.ready("sb-p", true);
    let image = h.manager.config.default_image.clone();
    {
        let mut pools = h.manager.pool();
        pools.put(RuntimeKind::Container, &image, "sb-p".into());
        // Looked up as it joined the pool: the claim does not again.
        pools.keep_image_defaults(
            "sb-p".into(),
            crate::image::ImageDefaults {
                env: vec![("FROM_IMAGE".into(), "1".into())],
                ..Default::default()
            },
        );
    }
    h.fake.script("sb-p", SupervisorReply::Ok);
    let req = CreateRequest {
        env: BTreeMap::from([("GREETING".to_string(), "hi".to_string())]),
        labels: BTreeMap::from([("team".to_string(), "a".to_string())]),
        ..Default::default()
    };
    let claimed = claim_pooled_container(&h, &image, &req).await;
    assert_eq!(claimed.id, "sb-p");
    assert!(!claimed.pooled);
    assert_eq!(claimed.labels, req.labels);
    assert_eq!(claimed.ttl_seconds, 60);
    assert!(claimed.expires_at_ms.is_some());
    assert_eq!(h.stored("sb-p").map(|r| r.pooled), Some(false));
    assert_eq!(h.manager.pooled(), 0);
    // The supervisor got the default environment with the caller's on top.
    let calls = h.fake.calls();
    let [Call::HandOver {
        id,
        policy: None,
        secrets: None,
        env: Some(env),
        guest_pids: None,
        ceilings: None,
        disk_quota_bytes: None,
        trust_bundle_append: None,
    }] = calls.as_slice()
    else {
        panic!("one HandOver with the environment alone expected, got {calls:?}");
    };
    assert_eq!(id, "sb-p");
    assert_eq!(
        env.last(),
        Some(&("GREETING".to_string(), "hi".to_string()))
    );
    assert!(env.iter().any(|(k, _)| k == "PATH"));
    assert!(
        env.contains(&("FROM_IMAGE".to_string(), "1".to_string())),
        "the image's defaults kept by the pool: {env:?}"
    );
    let kinds: Vec<EventKind> = h.events("sb-p").into_iter().map(|e| e.0).collect();
    assert_eq!(kinds, vec![EventKind::Created, EventKind::Ready]);
}

/// A claim reaches a pooled supervisor that has a mailbox through it, with
/// no request; one whose supervisor has exited is sent as a request
/// (which fails here, as it would there: the next pooled sandbox is tried).
#[tokio::test]
async fn a_claim_is_posted_to_the_mailbox_unless_the_supervisor_is_gone() {
    use crate::supervisor::mailbox::{Mailbox, Postbox};
    let h = harness(2);
    h.manager.refilling.store(true, Ordering::Release);
    let image = h.manager.config.default_image.clone();
    let mailbox = Mailbox::create().unwrap();
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let gone = crate::pidfd::open(exited.id() as i32).unwrap();
    exited.wait().unwrap();
    let alive = crate::pidfd::open(std::process::id() as i32).unwrap();
    for (id, supervisor) in [("sb-gone", gone), ("sb-mail", alive)] {
        h.ready(id, true);
        let mut pools = h.manager.pool();
        let postbox = Postbox::new(mailbox.share().unwrap(), supervisor);
        pools.keep_postbox(id.into(), postbox);
        pools.put(RuntimeKind::Container, &image, id.into());
    }
    let req = CreateRequest {
        env: BTreeMap::from([("GREETING".to_string(), "hi".to_string())]),
        ..Default::default()
    };
    let claimed = claim_pooled_container(&h, &image, &req).await;
    assert_eq!(claimed.id, "sb-mail");
    // The first was asked by request (unscripted here, so unreachable)
    // and given up; the second was asked nothing.
    let calls = h.fake.calls();
    assert!(
        matches!(calls.as_slice(), [Call::HandOver { id, .. }] if id == "sb-gone"),
        "{calls:?}"
    );
    let mut posted = None;
    mailbox
        .take_with(
            |claim| {
                posted = Some(claim);
                std::future::ready(Ok(()))
            },
            |why| panic!("the posted claim failed: {why}"),
        )
        .await;
    let env = posted.and_then(|claim| claim.env).expect("the env posted");
    assert_eq!(
        env.last(),
        Some(&("GREETING".to_string(), "hi".to_string()))
    );
}

/// The hand-over of a claim that changes a microVM's pids limit alone.
fn guest_pids_alone(id: &str, max: u64) -> Call {
    Call::HandOver {
        id: id.into(),
        policy: None,
        secrets: None,
        env: None,
        guest_pids: Some(max),
        ceilings: None,
        disk_quota_bytes: None,
        trust_bundle_append: None,
    }
}

#[tokio::test]
async fn a_pooled_microvm_claimed_with_fewer_pids_has_its_agent_lower_them() {
    let h = vm_pool_harness();
    let record = h.pooled_vm("vm-p", |_| {});
    h.fake.script("vm-p", SupervisorReply::Ok);
    let fewer = Limits {
        pids: 64,
        ..record.limits.clone()
    };
    assert!(fewer.pids < record.limits.pids, "the test lowers the limit");
    let claimed = claim_pooled_vm(&h, &record.image, &fewer)
        .await
        .expect("a pooled microVM");
    assert_eq!(claimed.limits.pids, 64);
    assert_eq!(h.stored("vm-p").map(|r| r.limits.pids), Some(64));
    assert_eq!(
        h.fake.calls(),
        vec![guest_pids_alone("vm-p", 64)],
        "the guest's agent holds a microVM's pids limit"
    );
}

#[tokio::test]
async fn a_pooled_microvm_booted_before_a_raised_default_has_its_pids_limit_raised() {
    let h = vm_pool_harness();
    let wanted = h.manager.pooled_limits();
    // Made by a daemon whose default was lower, recovered by this one.
    let record = h.pooled_vm("vm-o", |record| record.limits.pids = wanted.pids / 2);
    h.fake.script("vm-o", SupervisorReply::Ok);
    let claimed = claim_pooled_vm(&h, &record.image, &wanted)
        .await
        .expect("a pooled microVM");
    assert_eq!(claimed.limits.pids, wanted.pids);
    assert_eq!(
        h.fake.calls(),
        vec![guest_pids_alone("vm-o", wanted.pids)],
        "the record's limit is the one in force"
    );
}

#[tokio::test]
async fn a_microvms_stats_count_its_guests_tasks_or_zero_when_its_agent_cannot() {
    let h = harness(0);
    let record = h.ready_vm("vm-s", false, |_| {});
    h.fake.script(
        "vm-s",
        SupervisorReply::Agent(sandbox_proto::Reply::Pids { current: 7 }),
    );
    let stats = h.manager.stats("vm-s").await.expect("stats");
    assert_eq!((stats.pids, stats.pids_limit), (7, record.limits.pids));
    assert_eq!(h.fake.calls(), vec![Call::GuestPids("vm-s".into())]);
    // An agent that cannot count (a fork of an older build's snapshot)
    // leaves the other figures standing.
    h.fake.script(
        "vm-s",
        SupervisorReply::Error(SupervisorError::new(
            SupervisorErrorKind::InvalidInput,
            "unknown request",
        )),
    );
    let stats = h.manager.stats("vm-s").await.expect("stats");
    assert_eq!(stats.pids, 0);
}

#[tokio::test]
async fn a_pooled_microvm_whose_agent_refuses_the_pids_limit_is_not_handed_out() {
    let h = vm_pool_harness();
    let record = h.pooled_vm("vm-r", |_| {});
    h.fake.script(
        "vm-r",
        SupervisorReply::Error(SupervisorError::new(
            SupervisorErrorKind::Internal,
            "the guest agent refused the pids limit",
        )),
    );
    let fewer = Limits {
        pids: 64,
        ..record.limits.clone()
    };
    let claimed = claim_pooled_vm(&h, &record.image, &fewer).await;
    assert!(claimed.is_none(), "the create starts cold instead");
    // It is torn down (here, without a real sandbox, the teardown keeps it
    // as failed): never handed out, nor recorded with the claim's limit.
    let stored = h.stored("vm-r");
    assert!(
        stored
            .as_ref()
            .is_none_or(|r| r.state == SandboxState::Failed && r.limits.pids == record.limits.pids),
        "{stored:?}"
    );
    assert_eq!(h.manager.pooled(), 0);
    assert_eq!(h.fake.calls(), vec![guest_pids_alone("vm-r", 64)]);
}

#[tokio::test]
async fn a_pooled_sandbox_takes_the_callers_egress_policy() {
    let h = harness(1);
    h.manager.refilling.store(true, Ordering::Release);
    h.ready("sb-n", true);
    let image = h.manager.config.default_image.clone();
    h.manager
        .pool()
        .put(RuntimeKind::Container, &image, "sb-n".into());
    h.fake.script("sb-n", SupervisorReply::Ok);
    let limits = h.manager.pooled_limits();
    let req = CreateRequest::default();
    let blocked = NetworkPolicy {
        block_network: Some(true),
        allow_list: None,
    };
    let claimed = h
        .manager
        .claim_pooled(&claim(&image, &limits, &req, &blocked))
        .await
        .expect("claim")
        .expect("a pooled sandbox");
    assert_eq!(claimed.network, blocked);
    assert_eq!(h.stored("sb-n").map(|r| r.network), Some(blocked.clone()));
    let calls = h.fake.calls();
    assert!(
        matches!(
            calls.as_slice(),
            [Call::HandOver { id, policy: Some(p), secrets: None, env: None, guest_pids: None, ceilings: None, disk_quota_bytes: None, trust_bundle_append: None }]
                if id == "sb-n" && *p == blocked
        ),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_request_the_pool_does_not_hold_or_needs_no_change_asks_no_supervisor() {
    let h = harness(1);
    h.manager.refilling.store(true, Ordering::Release);
    h.ready("sb-q", true);
    let image = h.manager.config.default_image.clone();
    h.manager
        .pool()
        .put(RuntimeKind::Container, &image, "sb-q".into());
    let limits = h.manager.pooled_limits();
    let req = CreateRequest::default();
    let network = open_network();
    let other = h
        .manager
        .claim_pooled(&claim("not-pooled", &limits, &req, &network))
        .await
        .expect("claim");
    assert!(other.is_none());
    let more = Limits {
        memory_mib: limits.memory_mib + 1,
        ..limits.clone()
    };
    let unfit = h
        .manager
        .claim_pooled(&claim(&image, &more, &req, &network))
        .await
        .expect("claim");
    assert!(
        unfit.is_none(),
        "more memory than the pooled sandboxes have"
    );
    let gpu = h
        .manager
        .claim_pooled(&PoolClaim {
            gpu: true,
            ..claim(&image, &limits, &req, &network)
        })
        .await
        .expect("claim");
    assert!(gpu.is_none());
    assert_eq!(h.manager.pooled(), 1);
    let plain = h
        .manager
        .claim_pooled(&claim(&image, &limits, &req, &network))
        .await
        .expect("claim");
    assert_eq!(plain.map(|r| r.id).as_deref(), Some("sb-q"));
    assert!(h.fake.calls().is_empty());
    let metrics = h.manager.metrics.render(&[]);
    for result in ["hit", "unfit"] {
        assert!(
            metrics.contains(&format!(
                "sandboxd_pool_claims_total{{runtime=\"container\",image=\"{image}\",result=\"{result}\"}} "
            )),
            "{result}: {metrics}"
        );
    }
}

/// A claim that lowers the memory limit reads the pooled sandbox's usage
/// through the file the pool holds open: a sandbox using more than the
/// claim allows stays pooled, and the create starts cold.
#[tokio::test]
async fn a_claims_memory_check_reads_the_held_usage_file() {
    let h = harness(1);
    let image = h.pooled_scripted(&["sb-m"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let usage_path = dir.path().join("memory.usage_in_bytes");
    let limits = h.manager.pooled_limits();
    let lower = Limits {
        memory_mib: limits.memory_mib / 2,
        ..limits.clone()
    };
    std::fs::write(&usage_path, format!("{}\n", (lower.memory_mib << 20) + 1)).expect("usage");
    let usage = std::fs::File::open(&usage_path).expect("open usage");
    h.manager.pool().keep_memory_usage("sb-m".into(), usage);
    let (req, network) = (CreateRequest::default(), open_network());
    let over = h
        .manager
        .claim_pooled(&claim(&image, &lower, &req, &network))
        .await
        .expect("claim");
    assert!(over.is_none(), "its usage is above the claim's limit");
    assert_eq!(h.manager.pooled(), 1, "kept for another claim");
    // The same descriptor, read again, sees the usage of the moment.
    std::fs::write(&usage_path, "4096\n").expect("usage");
    let under = h
        .manager
        .claim_pooled(&claim(&image, &lower, &req, &network))
        .await
        .expect("claim");
    assert_eq!(under.map(|r| r.id).as_deref(), Some("sb-m"));
    assert!(
        h.manager.pool().memory_usage("sb-m").is_none(),
        "the claim drops the held file"
    );
}

#[tokio::test]
async fn egress_sampling_reads_ready_sandboxes_only() {
    let h = harness(0);
    h.ready("sb-r", false);
    h.ready("sb-s", true);
    h.fake.script("sb-r", health(0, 777, None));
    h.manager.sample_egress().await;
    assert_eq!(h.manager.records()["sb-r"].usage.egress_bytes, 777);
    assert_eq!(h.fake.calls(), vec![Call::Health("sb-r".into())]);
}

#[test]
fn a_busy_supervisor_refuses_a_snapshot_with_a_409_and_other_refusals_say_what_failed() {
    use crate::supervisor::client::CallError;
    let busy = super::snapshots::refused(
        "checkpointing the sandbox",
        CallError::Refused(SupervisorError::new(
            SupervisorErrorKind::Conflict,
            "calls to the agent are in flight",
        )),
    );
    assert!(matches!(busy, SandboxError::Conflict { code, .. } if code == "sandbox_busy"));
    let failed = super::snapshots::refused(
        "checkpointing the sandbox",
        CallError::Refused(SupervisorError::new(
            SupervisorErrorKind::Internal,
            "criu dump failed",
        )),
    );
    assert!(
        matches!(&failed, SandboxError::Internal(m) if m == "checkpointing the sandbox: criu dump failed"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_ttl_set_while_the_sandbox_is_created_is_refused_not_lost() {
    let h = harness(0);
    let mut record = h.ready("sb-c", false);
    record.state = SandboxState::Creating;
    h.manager.records().insert("sb-c".into(), record);
    let set = h.manager.set_ttl("sb-c", 60);
    assert!(matches!(set, Err(SandboxError::Conflict { code, .. }) if code == "sandbox_creating"));
    assert_eq!(h.manager.records()["sb-c"].ttl_seconds, -1);
    // The positive control: once ready, the same call takes.
    h.manager.records().get_mut("sb-c").expect("record").state = SandboxState::Ready;
    assert_eq!(h.manager.set_ttl("sb-c", 60).expect("set").ttl_seconds, 60);
    assert_eq!(h.stored("sb-c").expect("stored").ttl_seconds, 60);
}

#[tokio::test]
async fn a_secret_deleted_during_a_create_is_unbound_once_the_sandbox_is_ready() {
    let h = harness(0);
    let bindings = h.secrets_bound(&["gone", "kept"]);
    let mut record = h.ready("sb-c", false);
    record.state = SandboxState::Creating;
    record.secrets = bindings;
    h.manager.persist(&record).expect("persist");
    h.manager.records().insert("sb-c".into(), record.clone());

    h.manager.delete_secret("gone").await.expect("delete");
    // The create's record is left for its own Ready commit to write.
    assert_eq!(h.manager.records()["sb-c"].secrets.len(), 2);
    assert_eq!(
        h.stored("sb-c").expect("stored").state,
        SandboxState::Creating
    );

    // The Ready commit, then what the create does after it.
    record.state = SandboxState::Ready;
    h.manager.persist(&record).expect("persist");
    h.manager.records().insert("sb-c".into(), record.clone());
    h.manager.unbind_deleted_secrets(&mut record).await;
    let names = |r: &SandboxRecord| r.secrets.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&record), ["kept"]);
    assert_eq!(names(&h.manager.records()["sb-c"]), ["kept"]);
    assert_eq!(names(&h.stored("sb-c").expect("stored")), ["kept"]);
    assert_eq!(h.stored("sb-c").expect("stored").state, SandboxState::Ready);
    assert!(h
        .fake
        .calls()
        .contains(&Call::SetSecrets("sb-c".into(), vec!["kept".into()])));
}

#[tokio::test]
async fn a_pooled_sandbox_gets_the_callers_secrets_in_its_one_hand_over() {
    let h = harness(1);
    h.manager.refilling.store(true, Ordering::Release);
    h.ready("sb-k", true);
    let image = h.manager.config.default_image.clone();
    h.manager
        .pool()
        .put(RuntimeKind::Container, &image, "sb-k".into());
    let bindings = h.secrets_bound(&["key"]);
    // The image's trust bundle, in the root as the host sees it.
    let certs = h.manager.paths("sb-k").rootfs().join("etc/ssl/certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    std::fs::write(certs.join("ca-certificates.crt"), "image roots\n").expect("bundle");
    h.fake.script("sb-k", SupervisorReply::Ok);
    let claimed = claim_pooled_binding(&h, &image, &bindings).await;
    assert_eq!(claimed.secrets, bindings);
    let calls = h.fake.calls();
    let [Call::HandOver {
        id,
        policy: None,
        secrets: Some(names),
        env: Some(env),
        guest_pids: None,
        ceilings: None,
        disk_quota_bytes: None,
        trust_bundle_append: None,
    }] = calls.as_slice()
    else {
        panic!("one HandOver with the secrets and environment expected, got {calls:?}");
    };
    assert_eq!(
        (id.as_str(), names.as_slice()),
        ("sb-k", ["key".to_string()].as_slice())
    );
    assert!(
        env.iter().any(|(_, v)| *v == bindings[0].placeholder),
        "the placeholder is in the environment: {env:?}"
    );
    let bundle = std::fs::read_to_string(certs.join("ca-certificates.crt")).expect("bundle");
    assert!(bundle.starts_with("image roots\n"), "{bundle}");
    assert!(
        bundle.contains("BEGIN CERTIFICATE"),
        "the CA was not added: {bundle}"
    );
}

/// Where the pooled container's supervisor holds its copied-up trust
/// bundle and it still has the image's bundle's length, the claim hands
/// the CA to the supervisor with the rest and writes nothing itself; a
/// bundle of another length is written whole by the claim.
#[tokio::test]
async fn a_bundle_the_supervisor_holds_takes_the_ca_through_the_hand_over() {
    use super::warm_pool::SupervisorHolds;
    let h = harness(2);
    h.manager.refilling.store(true, Ordering::Release);
    let image = h.manager.config.default_image.clone();
    let bindings = h.secrets_bound(&["key"]);
    let image_roots = b"image roots\n".to_vec();
    h.manager
        .secrets
        .image_trust_bundle("sha256-test", || Some(image_roots.clone()))
        .expect("bundle")
        .expect("the image's roots lack the CA");
    let mut bundles = Vec::new();
    for (id, on_disk) in [("sb-h", &image_roots[..]), ("sb-o", &b"other length\n"[..])] {
        h.ready(id, true);
        let certs = h.manager.paths(id).rootfs().join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).expect("certs dir");
        let path = certs.join("ca-certificates.crt");
        std::fs::write(&path, on_disk).expect("bundle");
        let held = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("held");
        let mut pools = h.manager.pool();
        pools.keep_copied_up_bundle(id.into(), held, SupervisorHolds::Yes);
        pools.put(RuntimeKind::Container, &image, id.into());
        drop(pools);
        h.fake.script(id, SupervisorReply::Ok);
        bundles.push(path);
    }
    for _ in 0..2 {
        claim_pooled_binding(&h, &image, &bindings).await;
    }
    let appends: Vec<(String, Option<u64>)> = h
        .fake
        .calls()
        .into_iter()
        .filter_map(|call| match call {
            Call::HandOver {
                id,
                trust_bundle_append,
                ..
            } => Some((id, trust_bundle_append)),
            _ => None,
        })
        .collect();
    assert_eq!(
        appends,
        [
            ("sb-h".to_string(), Some(image_roots.len() as u64)),
            ("sb-o".to_string(), None),
        ]
    );
    // The supervisor (a fake here) appends the first; the claim wrote the
    // second whole.
    assert_eq!(std::fs::read(&bundles[0]).expect("bundle"), image_roots);
    let whole = std::fs::read_to_string(&bundles[1]).expect("bundle");
    assert!(whole.starts_with("image roots\n"), "{whole}");
    assert!(whole.contains("BEGIN CERTIFICATE"), "{whole}");
}

/// A pooled root's bundle, copied up ahead and held open, takes only the
/// CA appended where it still has the image's bundle's length; a cold
/// root's, or one of another length, is written whole. The file here has
/// the image's length but other bytes, so the two ways leave different
/// files.
#[tokio::test]
async fn a_copied_up_bundle_of_the_images_length_takes_the_ca_appended() {
    use super::secrets::{write_in_root, RootBundle};
    let h = harness(0);
    let image_roots = b"image roots\n".to_vec();
    let bundle = h
        .manager
        .secrets
        .image_trust_bundle("sha256:appended", || Some(image_roots.clone()))
        .expect("bundle")
        .expect("the image's roots lack the CA");
    let (_, tail) = bundle.appended_to_image().expect("an image part");
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("etc/ssl/certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    let file = certs.join("ca-certificates.crt");
    let held = || {
        RootBundle::CopiedUp(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&file)
                .expect("the bundle, held open"),
            super::warm_pool::SupervisorHolds::No,
        )
    };
    let same_length = b"IMAGE ROOTS\n";
    for (copied_up, on_disk, expected) in [
        (true, &same_length[..], [&same_length[..], tail].concat()),
        (true, &b"other length\n"[..], bundle.bytes.clone()),
        (false, &same_length[..], bundle.bytes.clone()),
    ] {
        std::fs::write(&file, on_disk).expect("bundle");
        let found = if copied_up {
            held()
        } else {
            RootBundle::InImage
        };
        assert!(write_in_root(
            {
                let root = tmp.path().to_path_buf();
                move || crate::runtime::beneath::Dir::at(&root)
            },
            Arc::clone(&bundle),
            found
        )
        .await
        .expect("written"));
        assert_eq!(
            std::fs::read(&file).expect("read"),
            expected,
            "copied up: {copied_up}, over {:?}",
            String::from_utf8_lossy(on_disk)
        );
    }
}

/// A start asks the supervisors for their health at once, not one after
/// another: one that hangs holds the start up for its deadline once. Here
/// each health call answers only once all three are in flight.
#[tokio::test]
async fn recovery_asks_every_supervisor_at_once() {
    let h = harness(0);
    for id in ["sb-a", "sb-b", "sb-c"] {
        h.ready(id, false);
        h.fake.script(id, health(0, 0, None));
    }
    h.manager.records().clear();
    h.fake.gate_health(3);
    tokio::time::timeout(std::time::Duration::from_secs(30), h.manager.recover())
        .await
        .expect("recovery asked one supervisor at a time")
        .expect("recover");
    for id in ["sb-a", "sb-b", "sb-c"] {
        assert!(
            h.manager
                .records()
                .get(id)
                .is_some_and(|r| r.state == SandboxState::Ready),
            "{id} recovered"
        );
    }
}

/// A sandbox under a supervisor of another protocol version is failed to
/// this daemon, yet a TTL its owner sets meanwhile is stored with the
/// record as that build wrote it (ready), which the matching build can
/// still adopt.
#[tokio::test]
async fn a_foreign_sandboxs_ttl_change_keeps_it_adoptable() {
    let h = harness(0);
    h.ready("sb-foreign", false);
    {
        let mut records = h.manager.records();
        let record = records.get_mut("sb-foreign").expect("record");
        record.state = SandboxState::Failed;
        record.failure = Some("not adopted after a daemon restart: v14".into());
        record.foreign_supervisor = true;
    }
    let changed = h.manager.set_ttl("sb-foreign", 600).expect("ttl");
    assert_eq!(changed.state, SandboxState::Failed, "failed to this daemon");
    let stored = h.stored("sb-foreign").expect("stored");
    assert_eq!(
        (stored.state, stored.failure, stored.ttl_seconds),
        (SandboxState::Ready, None, 600)
    );
    // The positive control: a sandbox failed for its own reasons is
    // stored as failed.
    h.ready("sb-failed", false);
    {
        let mut records = h.manager.records();
        let record = records.get_mut("sb-failed").expect("record");
        record.state = SandboxState::Failed;
        record.failure = Some("its supervisor died".into());
    }
    h.manager.set_ttl("sb-failed", 600).expect("ttl");
    assert_eq!(
        h.stored("sb-failed").expect("stored").state,
        SandboxState::Failed
    );
}

/// A daemon that died in the middle of a claim: the sandbox's supervisor
/// says a claim reached it (or, from a daemon before protocol 18, the
/// store has it marked `claiming`), and recovery removes it rather than
/// pooling a sandbox the claim may have changed. One the pool made as it
/// is goes back into the pool.
#[tokio::test]
async fn recovery_removes_a_pooled_sandbox_a_claim_began_to_change() {
    let h = harness(1);
    h.manager.refilling.store(true, Ordering::Release);
    h.ready("sb-kept", true);
    h.ready("sb-told", true);
    let mut half = h.ready("sb-half", true);
    half.claiming = true;
    h.manager.persist(&half).expect("persist");
    // What a restarted daemon starts from: the store alone.
    h.manager.records().clear();
    for id in ["sb-kept", "sb-half"] {
        h.fake.script(id, health(0, 0, None));
    }
    let SupervisorReply::Health(told) = health(0, 0, None) else {
        unreachable!("health() makes a health reply")
    };
    h.fake.script(
        "sb-told",
        SupervisorReply::Health(SupervisorHealth {
            claimed: true,
            ..told
        }),
    );
    h.manager.recover().await.expect("recover");
    assert_eq!(h.manager.pooled(), 1, "the untouched one is pooled again");
    assert!(
        h.manager.records().get("sb-kept").is_some_and(|r| r.pooled),
        "the untouched one is pooled again"
    );
    for id in ["sb-half", "sb-told"] {
        let stored = h.stored(id);
        assert!(
            stored
                .as_ref()
                .is_none_or(|r| r.state == SandboxState::Failed),
            "{id}, half-claimed, was pooled again: {stored:?}"
        );
        assert!(
            !h.manager
                .records()
                .get(id)
                .is_some_and(|r| r.state == SandboxState::Ready),
            "{id}, half-claimed, is ready"
        );
    }
}
