//! The pmem format: superblock, extent words, record layout (see the
//! parent module's docs), and their encoding.

use crate::crc::crc32c;
use crate::record::SLOT_LEN;
use crate::{corrupt, Result, StoreError};

/// Superblock magic.
pub const PMEM_MAGIC: &[u8; 8] = b"CHFSPMEM";
/// Format version.
pub const PMEM_VERSION: u32 = 1;
/// Allocation unit and alignment.
pub(crate) const UNIT: u64 = 64;
/// Start of the extent area.
pub(crate) const DATA_START: u64 = 4096;
pub(crate) const SLOT0: u64 = 64;
pub(crate) const PATH_OFF: u64 = 64 + 2 * SLOT_LEN as u64;
/// Smallest store accepted.
pub const PMEM_MIN_SIZE: u64 = 64 << 10;

pub(super) const WORD_MAGIC: u64 = 0xC4F5;
pub(crate) const FREE: u64 = 1;
pub(crate) const USED: u64 = 2;
pub(super) const LEN_MASK: u64 = (1 << 40) - 1;

pub(crate) fn word(state: u64, len: u64) -> u64 {
    (WORD_MAGIC << 48) | (state << 40) | (len & LEN_MASK)
}

pub(crate) fn unword(w: u64) -> Option<(u64, u64)> {
    if w >> 48 != WORD_MAGIC {
        return None;
    }
    let state = (w >> 40) & 0xff;
    matches!(state, FREE | USED).then_some((state, w & LEN_MASK))
}

pub(super) fn align(n: u64) -> u64 {
    n.div_ceil(UNIT) * UNIT
}

pub(super) fn data_rel(path_len: usize) -> u64 {
    align(PATH_OFF + path_len as u64)
}

/// Superblock fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Format version.
    pub version: u32,
    /// Total size of the region in bytes.
    pub size: u64,
    /// Store identity.
    pub uuid: u64,
}

pub(crate) fn encode_super(sb: &Superblock) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(PMEM_MAGIC);
    b[8..12].copy_from_slice(&sb.version.to_le_bytes());
    b[12..16].copy_from_slice(&(UNIT as u32).to_le_bytes());
    b[16..24].copy_from_slice(&sb.size.to_le_bytes());
    b[24..32].copy_from_slice(&sb.uuid.to_le_bytes());
    b[32..40].copy_from_slice(&DATA_START.to_le_bytes());
    let c = crc32c(&b[..40]);
    b[40..44].copy_from_slice(&c.to_le_bytes());
    b
}

pub(crate) fn decode_super(b: &[u8; 64]) -> Result<Superblock> {
    if &b[0..8] != PMEM_MAGIC {
        return Err(StoreError::refused(
            libc::EINVAL,
            "not a chfs pmem store (bad magic)",
        ));
    }
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    if crc32c(&b[..40]) != u32_at(40) {
        return Err(corrupt("superblock checksum mismatch"));
    }
    let version = u32_at(8);
    if version != PMEM_VERSION {
        return Err(StoreError::refused(
            libc::EINVAL,
            format!("pmem store format version {version}, this build reads {PMEM_VERSION}"),
        ));
    }
    if u32_at(12) as u64 != UNIT || u64_at(32) != DATA_START {
        return Err(corrupt("superblock geometry mismatch"));
    }
    let size = u64_at(16);
    if size < PMEM_MIN_SIZE {
        // No store is made this small; the extent area would not even
        // start below it.
        return Err(corrupt(format!("superblock size {size} out of range")));
    }
    Ok(Superblock {
        version,
        size,
        uuid: u64_at(24),
    })
}
