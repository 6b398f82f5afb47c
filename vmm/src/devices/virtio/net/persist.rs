//! virtio-net saved state: the guest's MAC. The tap is not saved (it is a
//! descriptor of the VMM that saved it); a restore attaches to the tap named
//! again (`--net` with `--restore`), and frames in flight at the snapshot
//! are lost, as on a real network.

use serde::{Deserialize, Serialize};

use super::device::Net;
use super::Mac;
use crate::devices::virtio::persist::{check_version, PersistError};

/// Version of [`NetState`].
pub const NET_STATE_VERSION: u32 = 1;

/// A net device's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// [`NET_STATE_VERSION`].
    pub version: u32,
    /// The guest's MAC (the guest has it cached; it must not change).
    pub mac: Mac,
}

impl Net {
    /// Saves the device's own state.
    pub fn save(&self) -> NetState {
        NetState {
            version: NET_STATE_VERSION,
            mac: self.mac(),
        }
    }

    /// Checks that `self` (a device on the tap given to the restore) matches
    /// `state`; put it behind `MmioTransport::restore`.
    pub fn restore(state: &NetState, device: Net) -> Result<Net, PersistError> {
        check_version("virtio-net", state.version, NET_STATE_VERSION)?;
        if device.mac() != state.mac {
            return Err(PersistError::Mismatch(format!(
                "the guest had MAC {} when saved, the restored VM is configured with {}: give \
                 --net {},mac={}",
                state.mac,
                device.mac(),
                device.tap_name(),
                state.mac
            )));
        }
        Ok(device)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;

    use super::*;
    use crate::devices::virtio::mmio::{MmioTransport, MmioTransportState};
    use crate::devices::virtio::net::device::tests::{frame, Driver};
    use crate::devices::virtio::net::VNET_HDR_LEN;
    use crate::devices::virtio::Interrupt;

    #[test]
    fn state_round_trips_and_the_restored_device_continues_its_queues() {
        let mut d = Driver::new();
        d.send(&frame(60, 1));
        let mut got = vec![0u8; 4096];
        d.peer.recv(&mut got).expect("frame");
        Driver::wait_used(&mut d.tx, 1);
        d.post_rx(0);

        let saved = d.t.snapshot();
        let json = serde_json::to_string(&saved).expect("serialise");
        let back: crate::devices::virtio::persist::VirtioMmioState =
            serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, saved);
        let crate::devices::virtio::persist::DeviceState::Net(state) = &back.device else {
            panic!("not a net state: {back:?}");
        };
        assert_eq!(state.version, NET_STATE_VERSION);
        assert_eq!(state.mac, crate::devices::virtio::net::DEFAULT_GUEST_MAC);

        let (ours, peer) = UnixDatagram::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("nonblocking");
        let dev = Net::with_backend(std::fs::File::from(OwnedFd::from(ours)), "test0", state.mac)
            .expect("net");
        let dev = Net::restore(state, dev).expect("restore");
        let transport_state: &MmioTransportState = &back.transport;
        let t = MmioTransport::restore(
            Box::new(dev),
            d.mem.clone(),
            Arc::new(Interrupt::new().expect("irq")),
            transport_state,
        )
        .expect("restore transport");
        assert_eq!(t.snapshot(), saved, "save -> restore -> save");
        // The RX buffer posted before the save gets the next frame.
        let mut pkt = vec![0u8; VNET_HDR_LEN];
        pkt.extend(frame(80, 2));
        peer.send(&pkt).expect("send");
        let used = Driver::wait_used(&mut d.rx, 1);
        assert_eq!(used[0].1 as usize, VNET_HDR_LEN + 80);
        drop(t);
    }

    #[test]
    fn restore_with_another_mac_or_version_is_refused() {
        let mk = || {
            let (ours, _peer) = UnixDatagram::pair().expect("socketpair");
            Net::with_backend(
                std::fs::File::from(OwnedFd::from(ours)),
                "test0",
                crate::devices::virtio::net::DEFAULT_GUEST_MAC,
            )
            .expect("net")
        };
        let other = NetState {
            version: NET_STATE_VERSION,
            mac: crate::devices::virtio::net::Mac([2, 0, 0, 0, 0, 1]),
        };
        assert!(matches!(
            Net::restore(&other, mk()),
            Err(PersistError::Mismatch(_))
        ));
        let old = NetState {
            version: 7,
            mac: crate::devices::virtio::net::DEFAULT_GUEST_MAC,
        };
        assert!(matches!(
            Net::restore(&old, mk()),
            Err(PersistError::Version { .. })
        ));
    }
}
