//! The on-media header slot shared by the persistent engines.
//!
//! A record (one chunk) has two 128-byte slots; an update writes the slot
//! that is not current, so a torn update leaves the other intact. A slot is
//! valid when its checksum matches and it names this store's `uuid`; among
//! valid slots the higher `seq` wins.
//!
//! | off | field     | type     |
//! |----:|-----------|----------|
//! | 0   | seq       | u64      |
//! | 8   | uuid      | u64      |
//! | 16  | idx       | u64      |
//! | 24  | data_len  | u32      |
//! | 28  | data_crc  | u32      |
//! | 32  | path_len  | u32      |
//! | 36  | path_crc  | u32      |
//! | 40  | meta      | [u8; 64] |
//! | 104 | reserved  | 20 bytes |
//! | 124 | slot_crc  | u32 (CRC-32C of bytes 0..124) |

use chfs_proto::Meta;

use crate::crc::crc32c;

/// Encoded size of a slot.
pub const SLOT_LEN: usize = 128;

/// Largest sequence number a slot may carry: a store would need 2^63
/// updates to reach it, so a slot beyond it is damaged (or forged), and the
/// engines can add to any valid one without overflow.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// Refuses `seq` for a new slot when it is beyond [`MAX_SEQ`]: no reader
/// would accept that slot, so the change would be lost at the next open.
/// Only after a damaged or forged slot does a store get there. Both engines
/// check the number they are about to write, with this one rule.
pub(crate) fn check_seq(seq: u64, path: &str, idx: u64) -> crate::Result<()> {
    if seq > MAX_SEQ {
        return Err(crate::corrupt(format!(
            "{path} chunk {idx}: sequence numbers exhausted (next {seq})"
        )));
    }
    Ok(())
}

/// A decoded slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Sequence number of this version of its key: every new slot or record
    /// of a key gets the previous one + 1 (all changes of a key happen under
    /// one lock, so no counter is shared between threads).
    pub seq: u64,
    /// Identity of the store the record belongs to.
    pub uuid: u64,
    /// Chunk index.
    pub idx: u64,
    /// Bytes of data.
    pub data_len: u32,
    /// CRC-32C of the data.
    pub data_crc: u32,
    /// Length of the path stored with the record.
    pub path_len: u32,
    /// CRC-32C of the path.
    pub path_crc: u32,
    /// Chunk header.
    pub meta: Meta,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl Slot {
    /// The slot of version `seq` of chunk `idx` of `path` in store `uuid`:
    /// `len` bytes of data with checksum `crc`, header `meta`.
    pub(crate) fn of(
        seq: u64,
        uuid: u64,
        path: &str,
        idx: u64,
        len: u64,
        crc: u32,
        meta: Meta,
    ) -> Self {
        Self {
            seq,
            uuid,
            idx,
            data_len: len as u32,
            data_crc: crc,
            path_len: path.len() as u32,
            path_crc: crc32c(path.as_bytes()),
            meta,
        }
    }

    /// Encodes with its checksum.
    pub fn encode(&self) -> [u8; SLOT_LEN] {
        let mut b = [0u8; SLOT_LEN];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.uuid.to_le_bytes());
        b[16..24].copy_from_slice(&self.idx.to_le_bytes());
        b[24..28].copy_from_slice(&self.data_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.data_crc.to_le_bytes());
        b[32..36].copy_from_slice(&self.path_len.to_le_bytes());
        b[36..40].copy_from_slice(&self.path_crc.to_le_bytes());
        b[40..104].copy_from_slice(&self.meta.encode());
        let c = crc32c(&b[..124]);
        b[124..128].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes; `None` when the checksum or the record version is wrong,
    /// or the sequence number is beyond [`MAX_SEQ`].
    pub fn decode(b: &[u8; SLOT_LEN]) -> Option<Self> {
        if crc32c(&b[..124]) != u32_at(b, 124) || u64_at(b, 0) > MAX_SEQ {
            return None;
        }
        Some(Self {
            seq: u64_at(b, 0),
            uuid: u64_at(b, 8),
            idx: u64_at(b, 16),
            data_len: u32_at(b, 24),
            data_crc: u32_at(b, 28),
            path_len: u32_at(b, 32),
            path_crc: u32_at(b, 36),
            meta: Meta::decode(&b[40..104]).ok()?,
        })
    }
}

/// A random-enough 64-bit identity for a new store.
pub fn new_uuid() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut b = [0u8; 32];
    b[..16].copy_from_slice(&t.to_le_bytes());
    b[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    let x = &b as *const _ as usize;
    b[20..28].copy_from_slice(&(x as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&b) | 1
}
