//! Opening a store: walking the extent chain, indexing every record
//! (the later intact version of a key wins), rebuilding free space.

use super::format::{data_rel, unword, word, DATA_START, FREE, PATH_OFF, SLOT0, UNIT, USED};
use super::{Pmem, PmemStore, Rec};
use crate::crc::crc32c;
use crate::index::Found;
use crate::record::{Slot, SLOT_LEN};
use crate::{corrupt, Result};

impl PmemStore {
    /// Walks the region, indexing every record and freeing what no key
    /// holds.
    pub(super) fn recover(&mut self) -> Result<()> {
        self.walk_medium(Pmem::walk)?;
        let (records, bad) = self.rebuilt();
        let m = &mut self.medium;
        m.report.records = records;
        m.report.corrupt += bad;
        m.report.free_bytes = m.free_bytes();
        Ok(())
    }
}

impl Pmem {
    fn read_slot(&self, ext: u64, n: u8) -> Option<Slot> {
        let mut b = [0u8; SLOT_LEN];
        self.media
            .read(ext + SLOT0 + n as u64 * SLOT_LEN as u64, &mut b);
        Slot::decode(&b).filter(|s| s.uuid == self.uuid)
    }

    /// Walks the extents at open, handing every record to `index` (which
    /// returns the version of a key that lost to another) and freeing the
    /// losers and what holds no record.
    fn walk(&mut self, index: Found<'_, Rec>) -> Result<()> {
        let mut pos = DATA_START;
        let mut runs: Vec<(u64, u64, bool)> = Vec::new(); // (start, len, needs word)
        let mut losers = Vec::new();
        let mut report = std::mem::take(&mut self.report);
        while pos < self.end {
            let w = self.media.load_word(pos);
            let Some((state, len)) = unword(w) else {
                return Err(corrupt(format!(
                    "extent chain broken at offset {pos} (word {w:#018x})"
                )));
            };
            if len == 0 || len % UNIT != 0 || pos + len > self.end {
                return Err(corrupt(format!(
                    "extent at offset {pos} has bad length {len}"
                )));
            }
            let mut is_free = state == FREE;
            if state == USED {
                match self.recover_record(pos, len) {
                    Some((path, idx, rec)) => {
                        if let Some(loser) = index(path, idx, rec) {
                            losers.push((loser.ext, loser.ext_len));
                        }
                    }
                    None => {
                        report.unreadable += 1;
                        is_free = true;
                    }
                }
            }
            if is_free {
                match runs.last_mut() {
                    Some((s, l, fix)) if *s + *l == pos => {
                        *l += len;
                        *fix = true;
                    }
                    _ => runs.push((pos, len, state == USED)),
                }
            }
            pos += len;
        }
        // Every free extent gets one word covering all of it, split where
        // the arenas' slices meet (adjacent free extents are a valid state:
        // the next open merges them again).
        for (s, l, fix) in runs {
            let mut pieces = Vec::new();
            let (mut ps, end) = (s, s + l);
            while ps < end {
                let k = self.arena_of(ps) as u64;
                let slice_end = (DATA_START + (k + 1) * self.arena_len).min(end);
                let pe = if k as usize == self.free.len() - 1 {
                    end
                } else {
                    slice_end
                };
                pieces.push((ps, pe - ps));
                ps = pe;
            }
            let split = pieces.len() > 1;
            for (ps, pl) in pieces {
                if fix || split {
                    self.media.store_word(ps, word(FREE, pl));
                    self.media.persist(ps, 8)?;
                }
                let k = self.arena_of(ps);
                self.free[k]
                    .get_mut()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(ps, pl);
            }
        }
        report.superseded = losers.len() as u64;
        for (s, l) in losers {
            self.release(s, l)?;
        }
        self.report = report;
        Ok(())
    }

    /// Reads a USED extent: (path, idx, record).
    fn recover_record(&self, ext: u64, len: u64) -> Option<(String, u64, Rec)> {
        let mut slots: Vec<(u8, Slot)> = (0..2u8)
            .filter_map(|n| self.read_slot(ext, n).map(|s| (n, s)))
            .filter(|(_, s)| {
                (s.path_len as usize) <= chfs_proto::path::MAX_PATH
                    && data_rel(s.path_len as usize) + s.data_len as u64 <= len
            })
            .collect();
        slots.sort_by_key(|(_, s)| std::cmp::Reverse(s.seq));
        let (_, first) = *slots.first()?;
        let plen = first.path_len as usize;
        let mut pb = vec![0u8; plen];
        self.media.read(ext + PATH_OFF, &mut pb);
        if crc32c(&pb) != first.path_crc {
            return None;
        }
        let path = String::from_utf8(pb).ok()?;
        let drel = data_rel(plen);
        let data = ext + drel;
        let mk = |n: u8, s: &Slot, corrupt: bool| Rec {
            ext,
            ext_len: len,
            drel: drel as u16,
            len: s.data_len as u64,
            crc: s.data_crc,
            meta: s.meta,
            seq: s.seq,
            slot: n,
            corrupt,
        };
        for (n, s) in &slots {
            if s.path_len != first.path_len || s.idx != first.idx {
                continue;
            }
            if self.media.crc(data, s.data_len as u64, 0) == s.data_crc {
                return Some((path, s.idx, mk(*n, s, false)));
            }
        }
        let (n, s) = slots[0];
        Some((path, s.idx, mk(n, &s, true)))
    }
}
