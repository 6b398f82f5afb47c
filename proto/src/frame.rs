//! Length-delimited framing: `u32` little-endian payload length, then a postcard payload.

use serde::{de::DeserializeOwned, Serialize};

use crate::MAX_FRAME;

const HEADER: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Encodes one message as a complete frame.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = postcard::to_extend(message, vec![0u8; HEADER])
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = out.len() - HEADER;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    out[..HEADER].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Decodes one frame payload (without its header).
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(payload).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Accumulates bytes from a stream and yields whole frame payloads.
///
/// A length over [`MAX_FRAME`] is an error as soon as its header arrives, so a
/// peer cannot make the reader buffer more than one bounded frame.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Next complete payload, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let mut header = [0u8; HEADER];
        header.copy_from_slice(&self.buf[..HEADER]);
        let len = u32::from_le_bytes(header) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Ok(Some(payload))
    }

    /// Bytes received but not yet returned as a frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentMessage, ExitStatus, Request, RequestBody, Stream};

    #[test]
    fn round_trip_across_split_reads() {
        let messages = vec![
            AgentMessage::Hello { version: 1 },
            AgentMessage::Output {
                proc: 7,
                stream: Stream::Stderr,
                data: vec![0, 255, 10],
            },
            AgentMessage::Exit {
                proc: 7,
                status: ExitStatus {
                    code: Some(3),
                    signal: None,
                    oom_killed: false,
                },
            },
        ];
        let wire: Vec<u8> = messages
            .iter()
            .flat_map(|m| encode(m).expect("encode"))
            .collect();
        let mut decoder = FrameDecoder::new();
        let mut got = Vec::new();
        for byte in wire.chunks(3) {
            decoder.push(byte);
            while let Some(frame) = decoder.next_frame().expect("frame") {
                got.push(decode::<AgentMessage>(&frame).expect("decode"));
            }
        }
        assert_eq!(got, messages);
        assert_eq!(decoder.pending(), 0);
    }

    #[test]
    fn oversized_header_is_refused_before_buffering() {
        let mut decoder = FrameDecoder::new();
        decoder.push(&((MAX_FRAME as u32) + 1).to_le_bytes());
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge(MAX_FRAME + 1))
        );
    }

    #[test]
    fn garbage_payload_is_an_error_not_a_panic() {
        let mut decoder = FrameDecoder::new();
        decoder.push(&[3, 0, 0, 0, 0xff, 0xff, 0xff]);
        let frame = decoder.next_frame().expect("frame").expect("complete");
        assert!(decode::<Request>(&frame).is_err());
        let ok = encode(&Request {
            id: 1,
            body: RequestBody::Health,
        })
        .expect("encode");
        assert_eq!(
            decode::<Request>(&ok[4..]).expect("decode"),
            Request {
                id: 1,
                body: RequestBody::Health
            }
        );
    }
}
