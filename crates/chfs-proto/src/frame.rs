//! Frame layout.
//!
//! After the handshake every message is one frame:
//!
//! ```text
//! +---------+---------+---------+---------+----------------+
//! | len u32 | id u64  | op u16  | flags16 | payload (len)  |
//! +---------+---------+---------+---------+----------------+
//! ```
//!
//! All integers are little-endian. `id` is chosen by the requester and echoed
//! in the response, so many requests may be in flight on one connection and
//! complete in any order. `op` is the request opcode (echoed in the response).
//! A payload longer than [`MAX_PAYLOAD`] is a protocol violation: the receiver
//! closes the connection.

use crate::ProtoError;

/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 16;

/// Hard maximum payload: the largest chunk plus room for the other fields.
pub const MAX_PAYLOAD: u32 = crate::MAX_CHUNK_SIZE + 64 * 1024;

/// Response flag: the payload is an [`crate::ErrorReply`], not a result.
pub const FLAG_ERROR: u16 = 1;
/// Request flag: sent by a server forwarding a request it does not own; the
/// receiver serves it locally and never forwards again.
pub const FLAG_FORWARDED: u16 = 2;

/// Decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length in bytes.
    pub len: u32,
    /// Request id chosen by the requester.
    pub id: u64,
    /// Opcode.
    pub op: u16,
    /// Flag bits (`FLAG_*`).
    pub flags: u16,
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..14].copy_from_slice(&self.op.to_le_bytes());
        b[14..16].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// Decodes and validates a header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, ProtoError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if len > MAX_PAYLOAD {
            return Err(ProtoError::FrameTooLarge {
                len: len as u64,
                max: MAX_PAYLOAD as u64,
            });
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[4..12]);
        Ok(Self {
            len,
            id: u64::from_le_bytes(id),
            op: u16::from_le_bytes([b[12], b[13]]),
            flags: u16::from_le_bytes([b[14], b[15]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            len: 1234,
            id: u64::MAX - 3,
            op: 12,
            flags: FLAG_ERROR,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn oversized_header_is_refused() {
        let h = Header {
            len: MAX_PAYLOAD + 1,
            id: 1,
            op: 1,
            flags: 0,
        };
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(ProtoError::FrameTooLarge { .. })
        ));
    }
}
