//! The TCP sockets listening in the sandbox's network namespace, read from
//! the kernel's tables (`/proc/net/tcp`, `/proc/net/tcp6`), so the host can
//! tell which ports an app serves before anyone exposes them.

use std::net::{Ipv4Addr, Ipv6Addr};

use sandbox_proto::ListeningSocket;

use crate::files::FileError;

/// `st` of a socket in the LISTEN state.
const TCP_LISTEN: &str = "0A";

pub fn sockets() -> Result<Vec<ListeningSocket>, FileError> {
    let mut found = Vec::new();
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let table = match std::fs::read_to_string(path) {
            Ok(t) => t,
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if v6 && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(FileError::Io {
                    path: path.into(),
                    source,
                })
            }
        };
        found.extend(table.lines().skip(1).filter_map(|l| listening(l, v6)));
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// One table line, if it is a listening socket.
fn listening(line: &str, v6: bool) -> Option<ListeningSocket> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    let state = fields.nth(1)?;
    if state != TCP_LISTEN {
        return None;
    }
    let (address, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let address = if v6 {
        address_v6(address)?.to_string()
    } else {
        address_v4(address)?.to_string()
    };
    Some(ListeningSocket { port, address })
}

/// The kernel prints the address as the u32 it holds, in host byte order.
fn address_v4(hex: &str) -> Option<Ipv4Addr> {
    let raw = u32::from_str_radix(hex, 16).ok()?;
    Some(Ipv4Addr::from(u32::from_be(raw.to_le())))
}

/// Four u32 words, each printed in host byte order.
fn address_v6(hex: &str) -> Option<Ipv6Addr> {
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (word, chunk) in bytes.chunks_mut(4).enumerate() {
        let raw = u32::from_str_radix(hex.get(word * 8..word * 8 + 8)?, 16).ok()?;
        chunk.copy_from_slice(&raw.to_le_bytes());
    }
    Some(Ipv6Addr::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_listening_sockets_and_skips_the_rest() {
        let v4 = "  0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let established = "  1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1";
        assert_eq!(
            listening(v4, false),
            Some(ListeningSocket {
                port: 8080,
                address: "127.0.0.1".into()
            })
        );
        assert_eq!(listening(established, false), None);
        let any6 = "  0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0";
        assert_eq!(
            listening(any6, true),
            Some(ListeningSocket {
                port: 3000,
                address: "::".into()
            })
        );
        let lo6 = "  1: 00000000000000000000000001000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0";
        assert_eq!(listening(lo6, true).map(|s| s.address), Some("::1".into()));
    }
}
