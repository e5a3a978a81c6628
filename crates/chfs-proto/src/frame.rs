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
/// Request flag, local (Unix socket) connections only: the request's data
/// is not in the frame but in the sender's memory, named by a
/// [`CmaRef`] at the end of the payload; the server copies it with
/// `process_vm_readv(2)` (cross-memory attach: one copy instead of two
/// through the socket). Allowed on `WRITE` (the data) and on `PING` (the
/// probe a client sends once per connection: the server answers `DATA`
/// with the bytes it read, so the client knows the path works).
pub const FLAG_CMA: u16 = 4;

/// Request flag, local (Unix socket) connections only: the reply's data is
/// not to be sent in the frame but placed in the sender's landing window,
/// a shared-memory window it attached with this flag on `SHM_ATTACH`
/// (which the server maps read-write), at the [`CmaRef`] at the end of
/// the payload (`len`: the room there). Allowed on `READ` and
/// `READ_SPANS`; answered `Written(n)`, `n` the bytes placed (a short
/// read's less), or with an error, after which the sender never uses that
/// room again (the server might still write it). A server past the
/// deadline no longer writes there. On `SHM_ATTACH`: the window is one
/// replies land in.
pub const FLAG_LAND: u16 = 8;

/// Where the data of a [`FLAG_CMA`] request lies in the sender's memory
/// (of a [`FLAG_LAND`] request: where its reply's data goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaRef {
    /// Address in the sender's address space.
    pub addr: u64,
    /// Length in bytes (at most [`MAX_PAYLOAD`]).
    pub len: u64,
    /// `CLOCK_MONOTONIC` time (ns) after which the sender no longer waits
    /// and may reuse the memory: the server must not read it any more.
    pub deadline_ns: u64,
}

impl CmaRef {
    /// The clock of [`CmaRef::deadline_ns`]: `CLOCK_MONOTONIC` in ns, the
    /// same for every process of a host (outside time namespaces).
    pub fn clock_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the live timespec above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Encoded size (at the end of the payload).
    pub const LEN: usize = 24;

    /// Little-endian encoding.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.deadline_ns.to_le_bytes());
        b
    }

    /// Splits the reference off the end of a payload: (rest, reference).
    pub fn split_off(payload: &[u8]) -> Result<(&[u8], CmaRef), ProtoError> {
        let at = payload
            .len()
            .checked_sub(Self::LEN)
            .ok_or_else(|| ProtoError::Truncated {
                needed: Self::LEN - payload.len(),
            })?;
        let (rest, t) = payload.split_at(at);
        let word = |i: usize| u64::from_le_bytes(t[i..i + 8].try_into().expect("8 bytes"));
        let r = CmaRef {
            addr: word(0),
            len: word(8),
            deadline_ns: word(16),
        };
        if r.len > MAX_PAYLOAD as u64 {
            return Err(ProtoError::FrameTooLarge {
                len: r.len,
                max: MAX_PAYLOAD as u64,
            });
        }
        Ok((rest, r))
    }
}

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
    fn cma_ref_round_trip_and_bad_input() {
        let r = CmaRef {
            addr: 0x7fff_0000_1000,
            len: 65536,
            deadline_ns: 123_456_789,
        };
        let mut payload = b"head".to_vec();
        payload.extend_from_slice(&r.encode());
        let (rest, got) = CmaRef::split_off(&payload).unwrap();
        assert_eq!((rest, got), (&b"head"[..], r));
        assert!(matches!(
            CmaRef::split_off(&payload[..10]),
            Err(ProtoError::Truncated { needed: 14 })
        ));
        let huge = CmaRef {
            len: MAX_PAYLOAD as u64 + 1,
            ..r
        };
        assert!(matches!(
            CmaRef::split_off(&huge.encode()),
            Err(ProtoError::FrameTooLarge { .. })
        ));
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
