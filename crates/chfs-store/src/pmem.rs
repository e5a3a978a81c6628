//! Persistent-memory engine: every chunk is a record in one memory-mapped
//! region (a DAX device, a file on a DAX mount, or any file), with an
//! in-memory index rebuilt at open by walking the region.
//!
//! # Layout
//!
//! ```text
//! 0      superblock (4 KiB): "CHFSPMEM", version, unit, size, uuid,
//!        data start (4096), crc (of bytes 0..40)
//! 4096   extents, back to back, each starting with an 8-byte word:
//!        magic (16 bits) | state FREE/USED (8 bits) | length in bytes (40 bits)
//! ```
//!
//! A USED extent holds a record: word (cache line 0), two header slots
//! ([`crate::record`]) at +64 and +192, the path at +320, the data from the
//! next 64-byte boundary. Extents are 64-byte aligned.
//!
//! # Crash consistency
//!
//! Every state change ends with one failure-atomic 8-byte store (an extent
//! word) or one checksummed slot write (a torn slot fails its checksum and
//! the other slot stays current), after the bytes it publishes were made
//! durable (a persistence point, see
//! [`PersistMode`]):
//! - new record (create, copy-on-write overwrite): write path, data and slot
//!   into free space, persist, then store the USED word; the previous
//!   version is freed only afterwards (at open, two versions of a key: the
//!   higher `seq` with intact data wins);
//! - append within the record's spare capacity, header change, truncate:
//!   write the bytes past the current length, persist, then write the
//!   *other* slot and persist; the old slot still describes a valid prefix;
//! - allocation: the word of the remaining free space is stored and
//!   persisted before the allocated space is written; free: one word store.
//!
//! Bytes already covered by the current slot are never overwritten in place
//! (that would tear them): overwrites are copy-on-write. A record whose
//! header is valid but whose data fails its checksum at open reads as EIO.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use chfs_proto::Meta;

use crate::crc::{crc32c, crc32c_append, crc32c_zeros};
use crate::dirindex::{lock, Shard};
use crate::index::{parts_len, Found, Indexed, Medium, Part, Write};
use crate::media::{Media, MmapMedia, PersistMode};
use crate::record::{new_uuid, Slot, MAX_SEQ, SLOT_LEN};
use crate::usage::Usage;
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
/// File name used when `--path` is a directory.
pub const PMEM_FILE: &str = "chfs.pmem";

const WORD_MAGIC: u64 = 0xC4F5;
pub(crate) const FREE: u64 = 1;
pub(crate) const USED: u64 = 2;
const LEN_MASK: u64 = (1 << 40) - 1;
/// Most free-space arenas (see [`PmemStore::arena_count`]).
const MAX_ARENAS: u64 = 8;
/// Smallest arena: stores below twice this size keep one arena, so that a
/// record can use any free extent of a small store.
const MIN_ARENA: u64 = 64 << 20;

/// The arena the calling thread allocates from first: threads are dealt
/// arenas in turn, so concurrent writers fill different slices of the
/// medium and rarely share a lock or a cache line.
fn thread_arena(n: usize) -> usize {
    crate::usage::thread_slot() % n
}

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

fn align(n: u64) -> u64 {
    n.div_ceil(UNIT) * UNIT
}

fn data_rel(path_len: usize) -> u64 {
    align(PATH_OFF + path_len as u64)
}

/// In-memory index entry of one record.
#[derive(Debug, Clone, Copy)]
pub struct Rec {
    /// Extent start and length.
    ext: u64,
    ext_len: u64,
    len: u64,
    crc: u32,
    /// Offset of the data in the extent ([`data_rel`] of the path length;
    /// kept small: the index holds one `Rec` per chunk).
    drel: u16,
    meta: Meta,
    /// Sequence number of the current slot.
    seq: u64,
    /// Current slot (0 or 1).
    slot: u8,
    /// Header valid but data failed its checksum at open.
    corrupt: bool,
}

// The data offset of the longest path fits `Rec::drel`.
const _: () = assert!(PATH_OFF as usize + chfs_proto::path::MAX_PATH + 64 <= u16::MAX as usize);

impl Rec {
    /// Absolute offset of the data.
    fn data(&self) -> u64 {
        self.ext + self.drel as u64
    }

    /// Bytes of data the extent holds.
    fn cap(&self) -> u64 {
        self.ext_len - self.drel as u64
    }
}

crate::index::record_fields!(Rec);

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
struct FreeSpace {
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    /// [cursor, last freed run].
    hot: [Option<(u64, u64)>; 2],
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
    fn insert(&mut self, s: u64, l: u64) {
        self.by_start.insert(s, l);
        self.by_size.insert((l, s));
    }
    fn remove(&mut self, s: u64, l: u64) {
        self.by_start.remove(&s);
        self.by_size.remove(&(l, s));
    }
}

/// What opening a store found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records indexed.
    pub records: u64,
    /// Records whose data failed its checksum (read as EIO).
    pub corrupt: u64,
    /// Older versions of a key found and freed (interrupted replacement).
    pub superseded: u64,
    /// USED extents without a valid header, freed.
    pub unreadable: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Whether the store was created by this open.
    pub created: bool,
    /// How the medium persists.
    pub persist: String,
}

/// The persistent-memory medium: records in extents of one mapped region.
/// See the module documentation.
pub struct Pmem {
    media: Box<dyn Media>,
    uuid: u64,
    end: u64,
    /// Free space in arenas: arena k holds the free extents starting in the
    /// k-th slice of the data area, so threads allocating and freeing for
    /// different paths rarely wait for one another.
    free: Vec<Shard<FreeSpace>>,
    /// Bytes of the data area the arenas' slices cover each.
    arena_len: u64,
    report: RecoveryReport,
}

/// The persistent-memory engine. See the module documentation.
pub type PmemStore = Indexed<Pmem>;

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

/// Resolves `--path`: a directory means `DIR/chfs.pmem`.
pub fn pmem_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(PMEM_FILE)
    } else {
        path.to_path_buf()
    }
}

fn device_size(path: &Path, f: &File) -> io::Result<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = f.metadata()?;
    if md.file_type().is_char_device() {
        // devdax: /sys/dev/char/MAJ:MIN/size
        let rdev = md.rdev();
        let (maj, min) = (libc::major(rdev), libc::minor(rdev));
        let s =
            std::fs::read_to_string(format!("/sys/dev/char/{maj}:{min}/size")).map_err(|e| {
                io::Error::new(e.kind(), format!("{}: size of device: {e}", path.display()))
            })?;
        return s
            .trim()
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad device size"));
    }
    Ok(md.len())
}

impl PmemStore {
    /// Opens the store at `path` (a file, a DAX device, or a directory that
    /// gets `chfs.pmem`), creating and formatting it with `size` bytes when
    /// it does not exist or is empty. `size` 0 means "use the existing
    /// size"; a different size than the existing store's is refused.
    pub fn open(path: &Path, size: u64) -> Result<Self> {
        let file_path = pmem_file(path);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&file_path)?;
        let cur = device_size(&file_path, &f)?;
        let fresh = cur == 0;
        if !fresh && size != 0 && size / 4096 * 4096 != cur {
            return Err(StoreError::refused(
                libc::EINVAL,
                format!(
                    "{}: store was created with size {cur}, not {size} (give --size 0 or the same size)",
                    file_path.display()
                ),
            ));
        }
        let size = if fresh {
            if size < PMEM_MIN_SIZE {
                return Err(StoreError::refused(
                    libc::EINVAL,
                    format!(
                        "{}: a new pmem store needs a size of at least {PMEM_MIN_SIZE} bytes (--size)",
                        file_path.display()
                    ),
                ));
            }
            let size = size / 4096 * 4096;
            allocate(&f, size)?;
            size
        } else {
            cur
        };
        let media = MmapMedia::map(f, &file_path, size, false)?;
        Self::with_media(Box::new(media), fresh)
    }

    /// Builds a store on a medium, formatting it when `format`.
    pub(crate) fn with_media(media: Box<dyn Media>, format: bool) -> Result<Self> {
        let size = media.len();
        if size < PMEM_MIN_SIZE {
            // A store file cut short: not even its superblock and first
            // extent word may be there.
            return Err(StoreError::refused(
                libc::EINVAL,
                format!("{size} bytes is too small for a pmem store ({PMEM_MIN_SIZE} at least)"),
            ));
        }
        if format {
            let sb = Superblock {
                version: PMEM_VERSION,
                size,
                uuid: new_uuid(),
            };
            let start_len = (size - DATA_START) / UNIT * UNIT;
            media.store_word(DATA_START, word(FREE, start_len));
            media.persist(DATA_START, 8)?;
            media.write(0, &encode_super(&sb));
            media.persist(0, 64)?;
        }
        let mut b = [0u8; 64];
        media.read(0, &mut b);
        if !format && b.iter().all(|&x| x == 0) {
            // Formatting never completed (the superblock is written last):
            // all it leaves is nothing, or one free extent over the whole
            // data area. Anything else means the superblock was lost over
            // records, and formatting would drop them.
            let start_len = (size - DATA_START) / UNIT * UNIT;
            let w = media.load_word(DATA_START);
            if w != 0 && unword(w) != Some((FREE, start_len)) {
                return Err(corrupt(
                    "the superblock is zeroed but records follow it: not formatting over them (remove the file to start an empty store)",
                ));
            }
            return Self::with_media(media, true);
        }
        let sb = decode_super(&b)?;
        if sb.size != size {
            return Err(corrupt(format!(
                "superblock says {} bytes, medium has {size}",
                sb.size
            )));
        }
        let end = DATA_START + (size - DATA_START) / UNIT * UNIT;
        let arenas = Pmem::arena_count(end - DATA_START);
        let medium = Pmem {
            uuid: sb.uuid,
            end,
            free: (0..arenas)
                .map(|_| Shard::new(FreeSpace::default()))
                .collect(),
            arena_len: align((end - DATA_START).div_ceil(arenas)),
            report: RecoveryReport {
                created: format,
                persist: media.mode().name().to_string(),
                ..Default::default()
            },
            media,
        };
        let mut s = Indexed::over(medium, Usage::counted(end - DATA_START));
        s.recover()?;
        Ok(s)
    }

    /// What the last open found.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.medium.report
    }

    /// How the medium persists.
    pub fn persist_mode(&self) -> PersistMode {
        self.medium.media.mode()
    }

    /// Free extents (start, length) of every arena: (the hot ones, the maps').
    #[cfg(test)]
    pub(crate) fn free_extents(&self) -> Vec<ArenaExtents> {
        self.medium.free_extents()
    }

    /// Walks the region, indexing every record and freeing what no key
    /// holds.
    fn recover(&mut self) -> Result<()> {
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
    /// Arenas for a data area of `len` bytes: one per [`MIN_ARENA`], at
    /// most [`MAX_ARENAS`].
    fn arena_count(len: u64) -> u64 {
        (len / MIN_ARENA).clamp(1, MAX_ARENAS)
    }

    /// The arena holding free extents that start at `start`.
    fn arena_of(&self, start: u64) -> usize {
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
    fn free_bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|a| {
                let fs = lock(a);
                let hot: u64 = fs.hot.iter().flatten().map(|c| c.1).sum();
                fs.by_start.values().sum::<u64>() + hot
            })
            .sum()
    }

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

    /// Allocates an extent of at least `want` bytes (a multiple of UNIT),
    /// from arena `hint` first, then from the others.
    fn alloc(&self, want: u64, hint: usize) -> Result<(u64, u64)> {
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
    fn release(&self, start: u64, len: u64) -> Result<()> {
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

    /// Writes slot `n` of `rec` as the next version of its key (`seq` + 1).
    fn write_slot(&self, rec: &mut Rec, path: &str, idx: u64, n: u8) {
        rec.seq += 1;
        let s = Slot {
            seq: rec.seq,
            uuid: self.uuid,
            idx,
            data_len: rec.len as u32,
            data_crc: rec.crc,
            path_len: path.len() as u32,
            path_crc: crc32c(path.as_bytes()),
            meta: rec.meta,
        };
        self.media
            .write(rec.ext + SLOT0 + n as u64 * SLOT_LEN as u64, &s.encode());
    }

    /// Publishes a changed header/length of `rec` through its other slot.
    fn flip(&self, rec: &mut Rec, path: &str, idx: u64) -> Result<()> {
        check_seq(rec.seq, path, idx)?;
        let n = 1 - rec.slot;
        self.write_slot(rec, path, idx, n);
        self.media.persist(
            rec.ext + SLOT0 + n as u64 * SLOT_LEN as u64,
            SLOT_LEN as u64,
        )?;
        rec.slot = n;
        Ok(())
    }

    /// Writes a complete new record; returns it once durable and published.
    /// `prev_seq` is the sequence number of the version of the key it
    /// replaces (0 for none): the new one gets a higher one.
    fn new_record(
        &self,
        path: &str,
        idx: u64,
        meta: Meta,
        cap: u64,
        parts: &[Part<'_>],
        prev_seq: u64,
    ) -> Result<Rec> {
        let len = parts_len(parts)?;
        check_seq(prev_seq, path, idx)?;
        let rel = data_rel(path.len());
        let want = align(rel + cap.max(len).max(1));
        let (ext, ext_len) = self.alloc(want, thread_arena(self.free.len()))?;
        let data = ext + rel;
        self.media.write(ext + PATH_OFF, path.as_bytes());
        let mut pos = data;
        let mut crc = 0u32;
        for p in parts {
            match *p {
                Part::Bytes(b) => {
                    self.media.write(pos, b);
                    crc = crc32c_append(crc, b);
                }
                Part::Zero(n) => {
                    self.media.zero(pos, n);
                    crc = crc32c_zeros(crc, n);
                }
                Part::Copy(src, n) => {
                    self.media.copy(src, pos, n);
                    crc = self.media.crc(pos, n, crc);
                }
            }
            pos += p.len();
        }
        let mut rec = Rec {
            ext,
            ext_len,
            drel: rel as u16,
            len,
            crc,
            meta,
            seq: prev_seq,
            slot: 0,
            corrupt: false,
        };
        self.write_slot(&mut rec, path, idx, 0);
        // Slot 1 may hold a stale slot of an earlier record at this offset.
        self.media
            .zero(ext + SLOT0 + SLOT_LEN as u64, SLOT_LEN as u64);
        let publish = || -> Result<()> {
            self.media.persist(ext + SLOT0, rel - SLOT0 + len)?;
            self.media.store_word(ext, word(USED, ext_len));
            self.media.persist(ext, 8)?;
            Ok(())
        };
        if let Err(e) = publish() {
            let _ = self.release(ext, ext_len);
            return Err(e);
        }
        Ok(rec)
    }
}

/// Refuses to write a slot after one with sequence number `seq` when the
/// next one would be beyond [`MAX_SEQ`] (no slot reader would accept it, so
/// the change would be lost at the next open). Only a damaged or forged
/// slot gets there.
fn check_seq(seq: u64, path: &str, idx: u64) -> Result<()> {
    if seq >= MAX_SEQ {
        return Err(corrupt(format!(
            "{path} chunk {idx}: sequence number {seq} exhausted"
        )));
    }
    Ok(())
}

impl Medium for Pmem {
    type Rec = Rec;
    type Data = Vec<u8>;
    const NAME: &'static str = "pmem";

    fn fresh(&self, w: Write<'_>, old: Option<&Rec>) -> Result<Rec> {
        let (path, idx, off, meta) = (w.path, w.idx, w.off, w.meta);
        let data = w.data.as_slice();
        let prev = old.map_or(0, |o| o.seq);
        let end = off + data.len() as u64;
        if off == 0 {
            return self.new_record(path, idx, meta, end, &[Part::Bytes(data)], prev);
        }
        let parts = [Part::Zero(off), Part::Bytes(data)];
        self.new_record(path, idx, meta, end, &parts, prev)
    }

    /// Appends in place into spare capacity, else copies on write.
    fn write_into(&self, w: Write<'_>, rec: &mut Rec) -> Result<Option<Rec>> {
        let (path, idx, off, meta) = (w.path, w.idx, w.off, w.meta);
        let data = w.data.as_slice();
        let end = off + data.len() as u64;
        let max_cap = (meta.chunk_size as u64).max(end);
        if off >= rec.len && end <= rec.cap() {
            // Append into spare capacity: the current slot's bytes are untouched.
            let gap = off - rec.len;
            if gap > 0 {
                self.media.zero(rec.data() + rec.len, gap);
            }
            self.media.write(rec.data() + off, data);
            self.media.persist(rec.data() + rec.len, end - rec.len)?;
            let mut next = *rec;
            next.crc = crc32c_append(crc32c_zeros(rec.crc, gap), data);
            next.len = end;
            next.meta = meta;
            self.flip(&mut next, path, idx)?;
            *rec = next;
            return Ok(None);
        }
        // Copy-on-write.
        let old = *rec;
        let new_len = end.max(old.len);
        let cap = if new_len > old.cap() {
            new_len.max(old.cap().saturating_mul(2).min(max_cap))
        } else {
            old.cap().min(max_cap.max(new_len))
        };
        let mut parts = Vec::with_capacity(4);
        let keep = off.min(old.len);
        if keep > 0 {
            parts.push(Part::Copy(old.data(), keep));
        }
        if off > old.len {
            parts.push(Part::Zero(off - old.len));
        }
        parts.push(Part::Bytes(data));
        if end < old.len {
            parts.push(Part::Copy(old.data() + end, old.len - end));
        }
        self.new_record(path, idx, meta, cap, &parts, old.seq)
            .map(Some)
    }

    fn set_meta(&self, path: &str, idx: u64, rec: &mut Rec, meta: Meta) -> Result<()> {
        let mut next = *rec;
        next.meta = meta;
        self.flip(&mut next, path, idx)?;
        *rec = next;
        Ok(())
    }

    fn truncate(&self, path: &str, idx: u64, r: &mut Rec, len: u64) -> Result<Option<Rec>> {
        if r.cap() > 4096 && len < r.cap() / 4 {
            // Reclaim the space: move the short remainder to a small record.
            let (meta, data, prev) = (r.meta, r.data(), r.seq);
            let parts = [Part::Copy(data, len)];
            return self
                .new_record(path, idx, meta, len, &parts, prev)
                .map(Some);
        }
        let mut next = *r;
        next.len = len;
        next.crc = self.media.crc(r.data(), len, 0);
        self.flip(&mut next, path, idx)?;
        *r = next;
        Ok(None)
    }

    fn read(&self, r: &Rec, off: u64, len: u64) -> Result<Vec<u8>> {
        let start = off.min(r.len);
        let end = (off + len).min(r.len);
        let mut v = vec![0u8; (end - start) as usize];
        self.media.read(r.data() + start, &mut v);
        Ok(v)
    }

    fn free(&self, rec: Rec) -> Result<()> {
        self.release(rec.ext, rec.ext_len)
    }

    fn sync(&self) -> Result<()> {
        Ok(self.media.sync()?)
    }
}

fn allocate(f: &File, size: u64) -> Result<()> {
    match chfs_sys::fs::allocate(f, size) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
            Ok(f.set_len(size)?)
        }
        Err(e) => Err(e.into()),
    }
}

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
