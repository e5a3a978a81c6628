//! Free space: arenas of free extents, the hot extents (cursor, run freed
//! last), allocation and freeing with their extent-word stores.

use std::collections::{BTreeMap, BTreeSet};

use super::format::{word, DATA_START, FREE, UNIT};
use super::Pmem;
use crate::dirindex::lock;
use crate::{Result, StoreError};

/// Most free-space arenas (see [`Pmem::arena_count`]).
pub(super) const MAX_ARENAS: u64 = 8;
/// Smallest arena: stores below twice this size keep one arena, so that a
/// record can use any free extent of a small store.
pub(super) const MIN_ARENA: u64 = 64 << 20;

/// Free space of an arena: by start and by (length, start) for best fit,
/// plus two *hot* extents kept out of the maps: the cursor, a large free
/// extent that allocations are cut from first, front to back (dlmalloc's
/// "designated victim"), and the run freed last, which the next adjacent
/// free grows (files removed in the order they were written free
/// neighbouring extents one after another). Cutting from a hot extent or
/// growing one changes no map. Like every free extent they have their
/// FREE word on the medium. Invariant: no two free extents (map entries or
/// hot ones) are adjacent.
#[derive(Default)]
pub(super) struct FreeSpace {
    pub(super) by_start: BTreeMap<u64, u64>,
    pub(super) by_size: BTreeSet<(u64, u64)>,
    /// [cursor, last freed run].
    pub(super) hot: [Option<(u64, u64)>; 2],
}

const CURSOR: usize = 0;
const RECENT: usize = 1;

/// Free extents of an arena (start, length): the hot ones, the maps'.
#[cfg(test)]
pub(crate) type ArenaExtents = (Vec<(u64, u64)>, Vec<(u64, u64)>);

/// Remainders at least this large (or an eighth of a small arena) become
/// the cursor; smaller ones go to the maps, where best fit finds them for
/// small records.
const CURSOR_MIN: u64 = 1 << 20;

impl FreeSpace {
    pub(super) fn insert(&mut self, s: u64, l: u64) {
        self.by_start.insert(s, l);
        self.by_size.insert((l, s));
    }
    fn remove(&mut self, s: u64, l: u64) {
        self.by_start.remove(&s);
        self.by_size.remove(&(l, s));
    }
}

impl Pmem {
    /// Arenas for a data area of `len` bytes: one per [`MIN_ARENA`], at
    /// most [`MAX_ARENAS`].
    pub(super) fn arena_count(len: u64) -> u64 {
        (len / MIN_ARENA).clamp(1, MAX_ARENAS)
    }

    /// The arena holding free extents that start at `start`.
    pub(super) fn arena_of(&self, start: u64) -> usize {
        (((start - DATA_START) / self.arena_len) as usize).min(self.free.len() - 1)
    }

    /// Free extents (start, length) of every arena: (the hot ones, the maps').
    #[cfg(test)]
    pub(crate) fn free_extents(&self) -> Vec<ArenaExtents> {
        self.free
            .iter()
            .map(|a| {
                let fs = lock(a);
                let v = fs.by_start.iter().map(|(&s, &l)| (s, l)).collect();
                (fs.hot.iter().flatten().copied().collect(), v)
            })
            .collect()
    }

    /// Free bytes (all arenas).
    pub(super) fn free_bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|a| {
                let fs = lock(a);
                let hot: u64 = fs.hot.iter().flatten().map(|c| c.1).sum();
                fs.by_start.values().sum::<u64>() + hot
            })
            .sum()
    }

    /// Allocates an extent of at least `want` bytes (a multiple of UNIT),
    /// from arena `hint` first, then from the others.
    pub(super) fn alloc(&self, want: u64, hint: usize) -> Result<(u64, u64)> {
        let n = self.free.len();
        for k in (0..n).map(|i| (hint + i) % n) {
            let mut fs = lock(&self.free[k]);
            if let Some(got) = self.alloc_in(&mut fs, want)? {
                return Ok(got);
            }
        }
        Err(StoreError::NoSpace {
            used: (self.end - DATA_START).saturating_sub(self.free_bytes()),
            capacity: self.end - DATA_START,
        })
    }

    /// An extent from one arena: cut from the front of a hot extent (the
    /// cursor, then the run freed last) when one is large enough, else best
    /// fit from its maps; None if nothing there is large enough. The word
    /// of the remaining free space is stored and persisted before the
    /// extent is handed out.
    fn alloc_in(&self, fs: &mut FreeSpace, want: u64) -> Result<Option<(u64, u64)>> {
        for h in [CURSOR, RECENT] {
            let Some((cs, cl)) = fs.hot[h].filter(|c| c.1 >= want) else {
                continue;
            };
            if cl - want < UNIT {
                fs.hot[h] = None;
                return Ok(Some((cs, cl)));
            }
            self.media.store_word(cs + want, word(FREE, cl - want));
            self.media.persist(cs + want, 8)?;
            fs.hot[h] = Some((cs + want, cl - want));
            // The next record cut from here: its header lines into the
            // cache now, not at its first stores.
            self.media.prefetch(cs + want + 64, want.min(512));
            return Ok(Some((cs, want)));
        }
        let Some(&(len, start)) = fs.by_size.range((want, 0)..).next() else {
            return Ok(None);
        };
        let rest = len - want;
        if rest < UNIT {
            fs.remove(start, len);
            return Ok(Some((start, len)));
        }
        let r = start + want;
        self.media.store_word(r, word(FREE, rest));
        self.media.persist(r, 8)?;
        fs.remove(start, len);
        let cursor_min = CURSOR_MIN.min(self.arena_len / 8);
        if rest >= cursor_min && fs.hot[CURSOR].is_none_or(|c| c.1 < rest) {
            // The larger remainder becomes the cursor; the old one goes to
            // the maps (it is adjacent to no free extent).
            if let Some((cs, cl)) = fs.hot[CURSOR].replace((r, rest)) {
                fs.insert(cs, cl);
            }
        } else {
            fs.insert(r, rest);
        }
        Ok(Some((start, want)))
    }

    /// Returns an extent to free space, merged with its free neighbours by
    /// one word store: at the left neighbour's start when that one is free
    /// (the extent's own word then lies inside the grown free run, where
    /// the chain never looks: no store to the extent's cold first line),
    /// else at the extent's start, covering a free right neighbour too.
    /// Merged with a hot extent the result takes its place (the cursor's
    /// first); otherwise it becomes the run freed last, and the previous
    /// one goes to the maps.
    pub(super) fn release(&self, start: u64, len: u64) -> Result<()> {
        let mut fs = lock(&self.free[self.arena_of(start)]);
        let fs = &mut *fs;
        let hot = fs.hot;
        let right = fs.by_start.get(&(start + len)).copied();
        let hot_right = (0..2).find(|&h| hot[h].is_some_and(|c| c.0 == start + len));
        let left = fs
            .by_start
            .range(..start)
            .next_back()
            .map(|(&ls, &ll)| (ls, ll))
            .filter(|&(ls, ll)| ls + ll == start);
        let hot_left = (0..2).find(|&h| hot[h].is_some_and(|c| c.0 + c.1 == start));
        let right_len = right
            .or(hot_right.and_then(|h| hot[h]).map(|c| c.1))
            .unwrap_or(0);
        let (at, new) = match left.or(hot_left.and_then(|h| hot[h])) {
            Some((ls, ll)) => (ls, ll + len + right_len),
            None => (start, len + right_len),
        };
        self.media.store_word(at, word(FREE, new));
        self.media.persist(at, 8)?;
        if let Some(r) = right {
            fs.remove(start + len, r);
        }
        if let Some((ls, ll)) = left {
            fs.remove(ls, ll);
        }
        for h in hot_left.iter().chain(hot_right.iter()) {
            fs.hot[*h] = None;
        }
        match hot_left.into_iter().chain(hot_right).min() {
            Some(h) => fs.hot[h] = Some((at, new)),
            None => {
                if let Some((rs, rl)) = fs.hot[RECENT].replace((at, new)) {
                    fs.insert(rs, rl);
                }
            }
        }
        Ok(())
    }
}
