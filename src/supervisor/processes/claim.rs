//! What a pool claim changes in a running supervisor: its cgroup
//! ceilings and disk quota, the egress policy, the brokered secrets and the environment,
//! whether the daemon posts them to the claim mailbox or sends them as a
//! `HandOver` request (which alone carries a microVM guest's pids limit).

use super::{err, Supervisor};
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

    /// Puts a pool claim's parts in force, in the order the request lists
    /// them; the first that fails ends it.
    pub async fn hand_over(
        &self,
        change: crate::supervisor::protocol::HandOver,
    ) -> Result<crate::supervisor::protocol::SupervisorReply, SupervisorError> {
        // A sandbox that failed (a posted claim it could not read, say) is
        // handed to nobody: the daemon removes it and tries another.
        self.ensure_live()?;
        let mut change = change;
        let guest_pids = change.guest_pids.take();
        self.hand_over_here(change)?;
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

    /// Puts a claim posted to the mailbox in force; called before every
    /// request is acted on. A claim that cannot be read or applied fails
    /// the sandbox (its caller's policy could not be kept), which every
    /// request then hears of as of any failed sandbox.
    pub fn settle_claim(&self) {
        let Some(mailbox) = self.mailbox.get() else {
            return;
        };
        mailbox.take_with(
            |claim| self.hand_over_here(claim).map_err(|e| e.message),
            |reason| self.fail(reason),
        );
    }

    /// The parts of a claim the supervisor holds itself (all but a guest's
    /// pids limit, which the daemon never posts).
    fn hand_over_here(
        &self,
        change: crate::supervisor::protocol::HandOver,
    ) -> Result<(), SupervisorError> {
        if change.guest_pids.is_some() {
            return Err(err(
                SupervisorErrorKind::InvalidInput,
                "a guest's pids limit cannot come through the mailbox",
            ));
        }
        // First: the one part the kernel may refuse (a memory limit it
        // cannot reclaim down to), before anything else changed.
        if let Some(ceilings) = change.ceilings {
            self.lower_ceilings(ceilings)?;
        }
        if let Some(bytes) = change.disk_quota_bytes {
            // An ioctl that may wait on a btrfs commit: this supervisor's
            // requests wait for the claim anyway.
            crate::disk::limit_layer_at(&self.config.spec.layer_dir, bytes).map_err(|e| {
                err(
                    SupervisorErrorKind::Internal,
                    format!("lowering the sandbox's disk limit to the claim's: {e}"),
                )
            })?;
        }
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

    /// Lowers the sandbox's cgroup ceilings to a claim's.
    fn lower_ceilings(
        &self,
        ceilings: crate::supervisor::protocol::Ceilings,
    ) -> Result<(), SupervisorError> {
        use crate::supervisor::protocol::Ceilings;
        let lowered = match ceilings {
            Ceilings::Container(limits) => self.cgroups.lower_limits(&limits),
            Ceilings::VmCpuQuota { quota_us } => self.cgroups.set_cpu_quota(quota_us),
        };
        lowered.map_err(|e| {
            err(
                SupervisorErrorKind::Internal,
                format!("lowering the sandbox's limits to the claim's: {e}"),
            )
        })
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
