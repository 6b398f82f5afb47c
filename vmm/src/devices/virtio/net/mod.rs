//! virtio-net on a tap device: the guest's Ethernet frames go to and come
//! from a persistent tap that the daemon created in the sandbox's network
//! namespace (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, 12-byte virtio 1.0
//! header). No offloads, no mergeable RX buffers, no control queue: the
//! guest sends and receives whole frames with full checksums.
//!
//! [`device`] is the device and its worker (queues <-> tap), [`tap`] opens
//! the tap, [`persist`] is the saved state.

pub mod device;
pub mod persist;
pub mod tap;

use std::fmt;
use std::str::FromStr;

pub use device::{Net, NetError};
pub use persist::{NetState, NET_STATE_VERSION};

/// RX queue index (device to driver).
pub const RXQ: usize = 0;
/// TX queue index (driver to device).
pub const TXQ: usize = 1;

/// VIRTIO_NET_F_MAC: the device has a MAC address in config space.
pub const VIRTIO_NET_F_MAC: u32 = 5;

/// Size of `struct virtio_net_hdr_v1` (with `num_buffers`), the header the
/// guest puts before each frame and the tap is told to use.
pub const VNET_HDR_LEN: usize = 12;

/// Largest Ethernet frame taken from the guest or the tap (a 64 KiB IP
/// packet with an Ethernet and a VLAN header).
pub const MAX_FRAME_LEN: usize = 65550;

/// The guest MAC used when `--net` gives none.
pub const DEFAULT_GUEST_MAC: Mac = Mac([0x06, 0x00, 0x0a, 0xc9, 0x00, 0x02]);

/// A MAC address, written `xx:xx:xx:xx:xx:xx`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mac(pub [u8; 6]);

/// A string that is not a MAC address.
#[derive(Debug, thiserror::Error)]
#[error("bad MAC address `{0}`: write six hex bytes separated by colons, e.g. 06:00:0a:c9:00:02")]
pub struct MacError(pub String);

impl FromStr for Mac {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, MacError> {
        let bad = || MacError(s.to_owned());
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(mac))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_print() {
        let m: Mac = "06:00:0a:C9:00:02".parse().expect("mac");
        assert_eq!(m, DEFAULT_GUEST_MAC);
        assert_eq!(m.to_string(), "06:00:0a:c9:00:02");
        for bad in [
            "",
            "06:00:0a:c9:00",
            "06:00:0a:c9:00:02:03",
            "06:00:0a:c9:00:2",
            "06:00:0a:c9:00:0g",
            "06-00-0a-c9-00-02",
            "+6:00:0a:c9:00:02",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }
}
