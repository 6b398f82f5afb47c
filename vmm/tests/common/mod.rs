//! What the KVM tests share: the test guest (or why it cannot run here) and
//! a serial sink the test reads after the run.

#![allow(dead_code)]

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The test guest, if it was built and KVM is usable; otherwise prints why not.
pub fn guest() -> Option<PathBuf> {
    let path = env!("VMM_TEST_GUEST");
    if path.is_empty() {
        eprintln!("skipping: the test guest was not built (see the build warning)");
        return None;
    }
    if let Err(e) = vmm::vstate::kvm::KvmContext::open(Path::new("/dev/kvm")) {
        eprintln!("skipping: no usable KVM: {e}");
        return None;
    }
    Some(PathBuf::from(path))
}

/// Serial output the test can read after the run.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("lock"))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}
