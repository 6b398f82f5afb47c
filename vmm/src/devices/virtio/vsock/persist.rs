//! virtio-vsock saved state. Connections are not saved: their host ends are
//! sockets of the VMM process that saved them, which a restored VMM does not
//! have. As in Firecracker, the restored device instead tells the guest
//! (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET on the event queue) that every
//! connection is gone, and host processes reconnect.

use serde::{Deserialize, Serialize};

use super::device::Vsock;
use super::unix_backend::VsockUnixBackend;
use crate::devices::virtio::persist::{check_version, PersistError};

/// Version of [`VsockState`].
pub const VSOCK_STATE_VERSION: u32 = 1;

/// A vsock device's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// [`VSOCK_STATE_VERSION`].
    pub version: u32,
    /// The guest's CID (the guest has it cached; it must not change).
    pub cid: u64,
}

impl Vsock {
    /// Saves the device's own state.
    pub fn save(&self) -> VsockState {
        VsockState {
            version: VSOCK_STATE_VERSION,
            cid: self.cid(),
        }
    }

    /// A device on `backend` (a new listener, usually at the same path)
    /// matching `state`. Put it behind `MmioTransport::restore`; once active
    /// it sends the guest a transport-reset event.
    pub fn restore(state: &VsockState, backend: VsockUnixBackend) -> Result<Self, PersistError> {
        check_version("virtio-vsock", state.version, VSOCK_STATE_VERSION)?;
        if backend.guest_cid() != state.cid {
            return Err(PersistError::Mismatch(format!(
                "the guest had vsock CID {} when saved, the restored VM is configured with {}",
                state.cid,
                backend.guest_cid()
            )));
        }
        let mut dev =
            Vsock::with_backend(backend).map_err(|e| PersistError::Device(e.to_string()))?;
        dev.send_reset_event = true;
        Ok(dev)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use super::*;
    use crate::devices::virtio::mmio::{MmioTransport, MmioTransportState};
    use crate::devices::virtio::vsock::device::test_driver::{Driver, CID};
    use crate::devices::virtio::vsock::{
        EVENT_TRANSPORT_RESET, VSOCK_OP_REQUEST, VSOCK_OP_RESPONSE,
    };
    use crate::devices::virtio::Interrupt;

    fn path(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("vsk-persist-{}-{tag}", std::process::id()))
    }

    #[test]
    fn state_round_trips_and_the_guest_is_told_to_reset() {
        let p = path("rt");
        let mut d = Driver::new(Box::new(Vsock::new(CID, &p).expect("vsock")));
        // Some traffic first, so the queue indices are not at zero.
        let host = UnixStream::connect(&p).expect("connect");
        (&host).write_all(b"CONNECT 1024\n").expect("write");
        let (req, _) = d.recv().expect("request");
        assert_eq!(req.op, VSOCK_OP_REQUEST);
        d.send(VSOCK_OP_RESPONSE, 1024, req.src_port, 0, &[]);

        let dev_state = VsockState {
            version: VSOCK_STATE_VERSION,
            cid: CID,
        };
        let transport = d.t.save();
        assert!(transport.queues[0].next_used > 0 && transport.queues[1].next_used > 0);
        let json = serde_json::to_string(&(&dev_state, &transport)).expect("serialise");
        let (dev_back, transport_back): (VsockState, MmioTransportState) =
            serde_json::from_str(&json).expect("deserialise");
        let Driver { t, mem, .. } = d;
        drop(t); // the old VMM goes away, its listener with it
        let mut line = String::new();
        let _ = BufReader::new(&host).read_line(&mut line);

        let backend = VsockUnixBackend::new(CID, &p).expect("backend");
        let dev = Vsock::restore(&dev_back, backend).expect("restore device");
        assert_eq!(dev.save(), dev_state);
        let t = MmioTransport::restore(
            Box::new(dev),
            mem.clone(),
            Arc::new(Interrupt::new().expect("irq")),
            &transport_back,
        )
        .expect("restore transport");
        assert_eq!(t.save(), transport);
        let mut d = Driver::attach(t, mem, false);
        // The event buffer the driver posted before the save is still there.
        assert_eq!(d.events(), vec![EVENT_TRANSPORT_RESET]);
        // New connections work on the restored device. A packet the old
        // device sent after the response (a credit update) may still wait
        // in the ring the driver kept, ahead of the request.
        let host = UnixStream::connect(&p).expect("connect again");
        (&host).write_all(b"CONNECT 1024\n").expect("write");
        let mut ops = Vec::new();
        for _ in 0..4 {
            if ops.contains(&VSOCK_OP_REQUEST) {
                break;
            }
            ops.extend(d.recv_all().into_iter().map(|(h, _)| h.op));
        }
        assert_eq!(
            ops.last(),
            Some(&VSOCK_OP_REQUEST),
            "the request after restore comes last: {ops:?}"
        );
    }

    #[test]
    fn restore_with_another_cid_or_version_is_refused() {
        let p = path("bad");
        let state = VsockState {
            version: VSOCK_STATE_VERSION,
            cid: 7,
        };
        let backend = VsockUnixBackend::new(CID, &p).expect("backend");
        assert!(matches!(
            Vsock::restore(&state, backend),
            Err(PersistError::Mismatch(_))
        ));
        let backend = VsockUnixBackend::new(CID, &p).expect("backend");
        let old = VsockState {
            version: 9,
            cid: CID,
        };
        assert!(matches!(
            Vsock::restore(&old, backend),
            Err(PersistError::Version { .. })
        ));
    }
}
