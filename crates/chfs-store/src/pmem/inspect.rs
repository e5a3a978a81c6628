//! Read-only inspection of a pmem store (the `chfs-store-dump` tool).

use std::fs::File;
use std::path::Path;

use super::format::{
    data_rel, decode_super, unword, Superblock, DATA_START, PATH_OFF, SLOT0, UNIT, USED,
};
use super::{device_size, pmem_file};
use crate::crc::crc32c;
use crate::media::{Media, MmapMedia};
use crate::record::{Slot, SLOT_LEN};
use crate::{Result, StoreError};

/// One extent as seen by [`inspect_pmem`].
#[derive(Debug, Clone)]
pub struct PmemExtent {
    /// Offset in the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// `true` when it holds a record.
    pub used: bool,
    /// Valid header slots (slot number, decoded slot).
    pub slots: Vec<(u8, Slot)>,
    /// Path of the record (when its checksum matched).
    pub path: Option<String>,
    /// Slot whose data checksum matches (the current version), if any.
    pub good_slot: Option<u8>,
}

/// Result of [`inspect_pmem`].
#[derive(Debug, Clone)]
pub struct PmemInspection {
    /// Superblock.
    pub superblock: Superblock,
    /// Every extent in order.
    pub extents: Vec<PmemExtent>,
    /// Set when the extent chain is broken at this offset.
    pub broken_at: Option<(u64, String)>,
}

/// Walks a pmem store read-only, decoding every header and verifying every
/// checksum (the `chfs-store-dump` tool).
pub fn inspect_pmem(path: &Path) -> Result<PmemInspection> {
    let file_path = pmem_file(path);
    let f = File::open(&file_path)?;
    let size = device_size(&file_path, &f)?;
    if size < DATA_START {
        return Err(StoreError::refused(
            libc::EINVAL,
            "file too small for a pmem store",
        ));
    }
    let m = MmapMedia::map(f, &file_path, size, true)?;
    let mut b = [0u8; 64];
    m.read(0, &mut b);
    let sb = decode_super(&b)?;
    let end = DATA_START + (size.min(sb.size) - DATA_START) / UNIT * UNIT;
    let mut out = PmemInspection {
        superblock: sb,
        extents: Vec::new(),
        broken_at: None,
    };
    let mut pos = DATA_START;
    while pos < end {
        let w = m.load_word(pos);
        let Some((state, len)) =
            unword(w).filter(|(_, l)| *l > 0 && l % UNIT == 0 && pos + l <= end)
        else {
            out.broken_at = Some((pos, format!("bad extent word {w:#018x}")));
            break;
        };
        let mut e = PmemExtent {
            offset: pos,
            len,
            used: state == USED,
            slots: Vec::new(),
            path: None,
            good_slot: None,
        };
        if e.used {
            for n in 0..2u8 {
                let mut sb = [0u8; SLOT_LEN];
                m.read(pos + SLOT0 + n as u64 * SLOT_LEN as u64, &mut sb);
                if let Some(s) = Slot::decode(&sb).filter(|s| {
                    s.uuid == out.superblock.uuid
                        && (s.path_len as usize) <= chfs_proto::path::MAX_PATH
                        && data_rel(s.path_len as usize) + s.data_len as u64 <= len
                }) {
                    e.slots.push((n, s));
                }
            }
            e.slots.sort_by_key(|(_, s)| std::cmp::Reverse(s.seq));
            if let Some((_, s)) = e.slots.first() {
                let mut pb = vec![0u8; s.path_len as usize];
                m.read(pos + PATH_OFF, &mut pb);
                if crc32c(&pb) == s.path_crc {
                    e.path = String::from_utf8(pb).ok();
                }
                let data = pos + data_rel(s.path_len as usize);
                e.good_slot = e
                    .slots
                    .iter()
                    .find(|(_, s)| m.crc(data, s.data_len as u64, 0) == s.data_crc)
                    .map(|(n, _)| *n);
            }
        }
        out.extents.push(e);
        pos += len;
    }
    Ok(out)
}
