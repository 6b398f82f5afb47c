//! Builds the freestanding test guest (guest/) with the host's C compiler
//! through guest/build.sh, and tells the crate where it is through the
//! VMM_TEST_GUEST environment variable (empty when it could not be built,
//! which makes the KVM tests skip with that reason). A missing compiler is a
//! warning, not a build failure: the VMM itself does not need the guest.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=guest");
    println!("cargo:rerun-if-env-changed=CC_GUEST");
    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let guest_dir = out_dir.join("guest");
    let cc = env::var("CC_GUEST").unwrap_or_else(|_| "gcc".into());

    let skip = |why: &str| {
        println!("cargo:warning=test guest not built: {why}; KVM boot tests will skip");
        println!("cargo:rustc-env=VMM_TEST_GUEST=");
    };
    if target_arch != "x86_64" {
        return skip("the test guest is x86_64 only");
    }
    if Command::new(&cc).arg("--version").output().is_err() {
        return skip(&format!("no C compiler `{cc}` (set CC_GUEST)"));
    }
    let status = Command::new("sh")
        .arg("guest/build.sh")
        .arg(&guest_dir)
        .env("CC_GUEST", &cc)
        .status()
        .expect("sh runs");
    // The compiler exists, so a failure is a bug in the guest's sources.
    assert!(status.success(), "guest/build.sh failed: {status}");
    println!(
        "cargo:rustc-env=VMM_TEST_GUEST={}",
        guest_dir.join("test-guest.elf").display()
    );
}
