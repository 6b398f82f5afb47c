//! A daemon whose microVMs boot a real Linux guest: the project's guest
//! kernel (scripts/build-guest-kernel.sh) with the static agent as init.
//! Linux needs a KVM with VMX or SVM; scripts/nested-tests.sh runs the
//! tests that use it in the nested host where this host's KVM is kvm_pvm.

use std::path::Path;

use super::{note_skip, vmm_path, Daemon, Reason};

/// What scripts/build-guest-kernel.sh leaves.
pub const GUEST_KERNEL: &str = "/var/cache/sandboxd-build/kernel/current/vmlinux";

/// A daemon whose microVMs boot the guest kernel (with `extra` flags), or
/// `None` (the reason recorded) where they cannot.
pub fn linux_vm_daemon(extra: &[String]) -> Option<Daemon> {
    if let Some((reason, why)) = super::skip_reason() {
        note_skip!(reason, "{why}");
        return None;
    }
    let kernel = std::env::var("SANDBOXD_TEST_GUEST_KERNEL").unwrap_or(GUEST_KERNEL.into());
    if !Path::new(&kernel).is_file() {
        note_skip!(
            Reason::MissingBuild,
            "no guest kernel at {kernel}: run scripts/build-guest-kernel.sh"
        );
        return None;
    }
    if !vmm_path().is_file() {
        note_skip!(
            Reason::MissingBuild,
            "{} missing: run cargo build --bins",
            vmm_path().display()
        );
        return None;
    }
    let vmm = vmm_path().display().to_string();
    // The nested host runs guests 10-20x slower than KVM.
    let mut flags = vec![
        "--vm-kernel",
        kernel.as_str(),
        "--vmm-path",
        vmm.as_str(),
        "--ready-timeout-seconds",
        "120",
    ];
    // A boot template made in the background would share the slow CPUs
    // with the test and outlive its "nothing left" checks: the tests of
    // templates ask for them.
    if !extra.iter().any(|f| f == "--vm-boot-templates") {
        flags.extend(["--vm-boot-templates", "false"]);
    }
    flags.extend(extra.iter().map(String::as_str));
    Some(Daemon::start_with(&flags))
}

/// What deleting microVMs `ids` must leave: no sandbox, no cgroup, no `vmm`.
pub async fn assert_nothing_left(daemon: &Daemon, ids: &[&str]) {
    assert!(daemon.sandboxes().await.is_empty());
    for id in ids {
        let group = super::cgroup::sandbox_dir("memory", id);
        assert!(!group.exists(), "{} outlived {id}", group.display());
    }
    let vmms = super::processes_where(|_, argv| {
        argv.first().is_some_and(|a| a.ends_with("/vmm"))
            && ids.iter().any(|id| argv.iter().any(|a| a.contains(id)))
    });
    assert!(vmms.is_empty(), "vmm processes left: {vmms:?}");
}
