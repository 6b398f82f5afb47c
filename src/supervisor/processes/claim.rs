//! What a pool claim changes in a running supervisor: its cgroup
//! ceilings, disk quota and trust bundle, the egress policy, the brokered
//! secrets and the environment, whether the daemon posts them to the claim
//! mailbox or sends them as a `HandOver` request (which alone carries a
//! microVM guest's pids limit).

use super::{err, HeldBundle, Supervisor};
use crate::runtime::sandbox::RuntimeSpec;
use crate::supervisor::protocol::{SupervisorError, SupervisorErrorKind};

impl Supervisor {
    /// Puts a new egress policy in force.
    pub fn set_policy(
        &self,
        request: &crate::net::policy::NetworkPolicy,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        let policy = crate::net::policy::EgressPolicy::from_request(
            request,
            crate::net::policy::DefaultEgress::Block,
        )
        .map_err(|e| err(SupervisorErrorKind::InvalidInput, e.to_string()))?;
        let egress = self.egress.get().ok_or_else(|| {
            err(
                SupervisorErrorKind::Internal,
                "the egress proxy is not running",
            )
        })?;
        egress.set_policy(policy);
        Ok(crate::supervisor::protocol::SupervisorReply::Ok)
    }

    /// Puts a pool claim's parts in force: the limits first, then the
    /// policy, the secrets, the environment, and last a microVM's pids
    /// limit in its guest; the first that fails ends it.
    pub async fn hand_over(
        &self,
        change: crate::supervisor::protocol::HandOver,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        self.handing_over();
        // A sandbox that failed (a posted claim it could not read, say) is
        // handed to nobody: the daemon removes it and tries another.
        self.ensure_live()?;
        let mut change = change;
        let guest_pids = change.guest_pids.take();
        self.hand_over_here(change).await?;
        if let Some(max) = guest_pids {
            self.limit_guest_pids(max).await?;
        }
        Ok(crate::supervisor::protocol::SupervisorReply::Ok)
    }

    /// A descriptor of the claim mailbox, made at the first ask.
    pub fn open_mailbox(&self) -> Result<std::os::fd::OwnedFd, SupervisorError> {
        let internal = |e: crate::supervisor::mailbox::MailboxError| {
            err(SupervisorErrorKind::Internal, e.to_string())
        };
        let mailbox = match self.mailbox.get() {
            Some(made) => made,
            None => {
                let made = crate::supervisor::mailbox::Mailbox::create().map_err(internal)?;
                self.mailbox.get_or_init(|| made)
            }
        };
        mailbox.share().map_err(internal)
    }

    /// Whether a pool claim reached this supervisor, put in force or not:
    /// one posted to its mailbox (a post cut off included), or a
    /// `HandOver` request. A restarted daemon removes a pooled sandbox
    /// that says so (its last daemon died before recording the claim).
    pub fn claimed(&self) -> bool {
        self.handed_over.load(std::sync::atomic::Ordering::Acquire)
            || self.mailbox.get().is_some_and(|m| m.posted_to())
    }

    /// Notes a `HandOver` request as it is read, before anything else
    /// (a posted claim's settling included) can delay it.
    pub fn handing_over(&self) {
        self.handed_over
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Puts a claim posted to the mailbox in force; called before every
    /// request is acted on. A claim that cannot be read or applied fails
    /// the sandbox (its caller's policy could not be kept), which every
    /// request then hears of as of any failed sandbox.
    pub async fn settle_claim(&self) {
        let Some(mailbox) = self.mailbox.get() else {
            return;
        };
        mailbox
            .take_with(
                |claim| async move { self.hand_over_here(claim).await.map_err(|e| e.message) },
                |reason| self.fail(reason),
            )
            .await;
    }

    /// The parts of a claim the supervisor holds itself (all but a guest's
    /// pids limit, which the daemon never posts).
    async fn hand_over_here(
        &self,
        change: crate::supervisor::protocol::HandOver,
    ) -> Result<(), SupervisorError> {
        if change.guest_pids.is_some() {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "a guest's pids limit cannot come through the mailbox",
            ));
        }
        // First: what the kernel may refuse (a memory limit it cannot
        // reclaim down to), before anything else changed.
        self.write_host_files(
            change.ceilings,
            change.disk_quota_bytes,
            change.trust_bundle_append,
        )
        .await?;
        if let Some(policy) = change.policy {
            self.set_policy(&policy.into())?;
        }
        if let Some(brokered) = &change.secrets {
            self.set_secrets(brokered)?;
        }
        if let Some(env) = change.env {
            self.set_env(env);
        }
        Ok(())
    }

    /// Lowers the sandbox's cgroup ceilings and its layer's disk quota to
    /// a claim's and appends the brokered CA to the trust bundle it holds,
    /// on a blocking thread: the quota's ioctl and the write may wait on a
    /// btrfs commit, and this supervisor's one thread also runs the
    /// sandbox's egress proxy.
    async fn write_host_files(
        &self,
        ceilings: Option<crate::supervisor::protocol::Ceilings>,
        disk_quota_bytes: Option<u64>,
        trust_bundle_append: Option<crate::supervisor::protocol::TrustBundleAppend>,
    ) -> Result<(), SupervisorError> {
        use crate::supervisor::protocol::Ceilings;
        // The claim is the held bundle's only use.
        let held = self.release_trust_bundle();
        if ceilings.is_none() && disk_quota_bytes.is_none() && trust_bundle_append.is_none() {
            return Ok(());
        }
        let vm = matches!(self.config.spec.kind, RuntimeSpec::Vm(_));
        if vm
            && (matches!(ceilings, Some(Ceilings::Container(_)))
                || disk_quota_bytes.is_some()
                || trust_bundle_append.is_some())
        {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "a microVM's claim can lower its CPU quota alone",
            ));
        }
        if trust_bundle_append.is_some() && held.is_none() {
            return Err(err(
                SupervisorErrorKind::Internal,
                "a claim's CA came for a trust bundle this supervisor does not hold",
            ));
        }
        let (cgroups, layer) = (self.cgroups.clone(), self.config.spec.layer_dir.clone());
        let written = tokio::task::spawn_blocking(move || {
            let ceilings = match ceilings {
                Some(Ceilings::Container(limits)) => cgroups.lower_limits(&limits),
                Some(Ceilings::VmCpuQuota { quota_us }) => cgroups.set_cpu_quota(quota_us),
                None => Ok(()),
            };
            if let Err(e) = ceilings {
                return Err(format!("lowering the sandbox's limits to the claim's: {e}"));
            }
            // The CA before a lower quota, which the layer may already be
            // close to.
            if let (Some(append), Some(file)) = (trust_bundle_append, held) {
                let appended = crate::runtime::beneath::append_if_length(
                    &file,
                    append.image_length,
                    &append.tail,
                )
                .map_err(|e| format!("appending the brokered CA to the trust bundle: {e}"))?;
                if !appended {
                    return Err("the trust bundle changed since the pool held it, \
                                so the brokered CA was not added"
                        .to_string());
                }
            }
            match disk_quota_bytes {
                Some(bytes) => crate::disk::limit_layer_at(&layer, bytes)
                    .map_err(|e| format!("lowering the sandbox's disk limit to the claim's: {e}")),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        written.map_err(|message| err(SupervisorErrorKind::Internal, message))
    }

    /// Ends what the supervisor holds for a pool claim (the trust bundle,
    /// whose file held open would keep the root's overlay alive) and
    /// returns the bundle: called as a claim is applied, and when the
    /// daemon starts watching the sandbox (it watches no pooled one), which
    /// a claim that changed nothing here does not otherwise tell.
    pub fn release_trust_bundle(&self) -> Option<std::fs::File> {
        match std::mem::replace(&mut *self.held_bundle(), HeldBundle::Claimed) {
            HeldBundle::Held(file) => Some(file),
            HeldBundle::None | HeldBundle::Claimed => None,
        }
    }

    fn held_bundle(&self) -> std::sync::MutexGuard<'_, HeldBundle> {
        self.trust_bundle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the container's trust bundle at `path` beneath its root for
    /// appending (copied up into its own layer) and holds it for a claim
    /// ([`crate::supervisor::protocol::SupervisorRequest::HoldTrustBundle`]).
    pub async fn hold_trust_bundle(
        &self,
        path: String,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        self.ensure_live()?;
        if !matches!(self.config.spec.kind, RuntimeSpec::Container) {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "only a fresh container's trust bundle is held for a claim",
            ));
        }
        let claimed = || {
            err(
                SupervisorErrorKind::InvalidInput,
                "the sandbox was claimed: no trust bundle is held for it",
            )
        };
        // After a claim the root is the caller's: it is not walked again
        // as the host's root for a claim's bundle.
        if matches!(*self.held_bundle(), HeldBundle::Claimed) {
            return Err(claimed());
        }
        let root = crate::runtime::mount_ns::HostRoot::through_init(
            self.init_pid,
            &self.config.spec.cgroups_path,
        );
        let opened = tokio::task::spawn_blocking(move || root.open()?.copy_up_for_append(&path))
            .await
            .map_err(|e| err(SupervisorErrorKind::Internal, e.to_string()))?;
        match opened {
            Ok(Some(file)) => {
                let mut held = self.held_bundle();
                // Claimed while it was opened: not held after all.
                if matches!(*held, HeldBundle::Claimed) {
                    return Err(claimed());
                }
                // A daemon that pools it again after a restart asks again:
                // the same file, held once.
                *held = HeldBundle::Held(file);
                Ok(crate::supervisor::protocol::SupervisorReply::Ok)
            }
            Ok(None) => Err(err(
                SupervisorErrorKind::InvalidInput,
                "the trust bundle is no regular file reached through no symlink",
            )),
            Err(e) => Err(err(
                SupervisorErrorKind::Internal,
                format!("opening the trust bundle: {e}"),
            )),
        }
    }

    /// Puts the sandbox's brokered secrets in force (replacing what it had).
    pub fn set_secrets(
        &self,
        brokered: &crate::net::intercept::Brokered,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        let egress = self.egress.get().ok_or_else(|| {
            err(
                SupervisorErrorKind::Internal,
                "the egress proxy is not running",
            )
        })?;
        egress
            .set_secrets(brokered)
            .map_err(|e| err(SupervisorErrorKind::InvalidInput, e.to_string()))?;
        Ok(crate::supervisor::protocol::SupervisorReply::Ok)
    }
}
