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
