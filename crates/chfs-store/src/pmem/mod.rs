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
//!
//! # Files
//!
//! This file: the record index entry, the medium and its `Medium`
//! operations (new record, slot flip), open and format. `format.rs`: the
//! superblock, extent words and record offsets, encoded and decoded.
//! `alloc.rs`: free space (arenas, hot extents, allocate, release).
//! `recovery.rs`: the walk at open that rebuilds index and free space.
//! `inspect.rs`: the read-only walk of `chfs-store-dump`.

mod alloc;
mod format;
mod inspect;
mod recovery;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use chfs_proto::Meta;

use crate::crc::{crc32c, crc32c_append, crc32c_zeros};
use crate::dirindex::Shard;
use crate::index::{parts_len, Dst, Fill, Indexed, Medium, Part, Src, SrcBytes, Write};
use crate::media::{Media, MmapMedia, PersistMode};
use crate::record::{check_seq, new_uuid, Slot, SLOT_LEN};
use crate::usage::Usage;
use crate::{corrupt, Result, StoreError};

#[cfg(test)]
pub(crate) use alloc::ArenaExtents;
use alloc::FreeSpace;
use format::{align, data_rel};
pub(crate) use format::{
    decode_super, encode_super, unword, word, DATA_START, FREE, PATH_OFF, SLOT0, UNIT, USED,
};
pub use format::{Superblock, PMEM_MAGIC, PMEM_MIN_SIZE, PMEM_VERSION};
pub use inspect::{inspect_pmem, PmemExtent, PmemInspection};

/// File name used when `--path` is a directory.
pub const PMEM_FILE: &str = "chfs.pmem";

/// The arena the calling thread allocates from first: threads are dealt
/// arenas in turn, so concurrent writers fill different slices of the
/// medium and rarely share a lock or a cache line.
fn thread_arena(n: usize) -> usize {
    crate::usage::thread_slot() % n
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

    /// (Tests) where the record's extent starts, and its room for data.
    #[cfg(test)]
    pub(crate) fn extent(&self) -> (u64, u64) {
        (self.ext, self.cap())
    }
}

crate::index::record_fields!(Rec);

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
}

impl Pmem {
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
        check_seq(rec.seq.saturating_add(1), path, idx)?;
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
    /// replaces (0 for none): the new one gets a higher one. `fill`
    /// fetches the bytes of a `Part::Fetched`.
    #[allow(clippy::too_many_arguments)]
    fn new_record(
        &self,
        path: &str,
        idx: u64,
        meta: Meta,
        cap: u64,
        parts: &[Part<'_>],
        fill: &mut Option<Fill<'_>>,
        prev_seq: u64,
    ) -> Result<Rec> {
        let len = parts_len(parts)?;
        check_seq(prev_seq.saturating_add(1), path, idx)?;
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
                Part::Fetched(n) => {
                    let fetched = match fill.take() {
                        Some(f) => self.media.fill(pos, f),
                        None => Err(Part::no_fill()),
                    };
                    if let Err(e) = fetched {
                        let _ = self.release(ext, ext_len);
                        return Err(e);
                    }
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

/// A write's bytes: at hand, or (`None`) what its fill fetches.
fn split_src(data: Src<'_>) -> Result<(Option<SrcBytes<'_>>, Option<Fill<'_>>)> {
    Ok(match data {
        Src::Fill(f) => (None, Some(f)),
        d => (Some(d.bytes()?), None),
    })
}

/// The part of a new record holding a write's `len` bytes.
fn bytes_part<'a>(bytes: &'a Option<SrcBytes<'_>>, len: u64) -> Part<'a> {
    match bytes {
        Some(b) => Part::Bytes(b),
        None => Part::Fetched(len),
    }
}

impl Medium for Pmem {
    type Rec = Rec;
    type Data = Vec<u8>;
    const NAME: &'static str = "pmem";

    fn fresh(&self, w: Write<'_>, old: Option<&Rec>) -> Result<Rec> {
        let (path, idx, off, meta) = (w.path, w.idx, w.off, w.meta);
        let len = w.data.len() as u64;
        let (bytes, mut fill) = split_src(w.data)?;
        let data = bytes_part(&bytes, len);
        let prev = old.map_or(0, |o| o.seq);
        let end = off + len;
        // A data chunk (index 1 and up, of a file larger than a chunk) is
        // normally filled: room for all of it, so that the pieces that
        // follow (IOR-hard's records fill each in two or three) append
        // in place instead of copying the record each time.
        let cap = if idx > 0 {
            end.max(meta.chunk_size as u64)
        } else {
            end
        };
        if off == 0 {
            return self.new_record(path, idx, meta, cap, &[data], &mut fill, prev);
        }
        let parts = [Part::Zero(off), data];
        self.new_record(path, idx, meta, cap, &parts, &mut fill, prev)
    }

    /// Appends in place into spare capacity, else copies on write.
    fn write_into(&self, w: Write<'_>, rec: &mut Rec) -> Result<Option<Rec>> {
        let (path, idx, off, meta) = (w.path, w.idx, w.off, w.meta);
        let len = w.data.len() as u64;
        let (bytes, mut fill) = split_src(w.data)?;
        let end = off + len;
        let max_cap = (meta.chunk_size as u64).max(end);
        if off >= rec.len && end <= rec.cap() {
            // Append into spare capacity: the current slot's bytes are
            // untouched (a fetch that fails leaves bytes past them only).
            let gap = off - rec.len;
            if gap > 0 {
                self.media.zero(rec.data() + rec.len, gap);
            }
            let crc = crc32c_zeros(rec.crc, gap);
            let crc = match (&bytes, fill) {
                (Some(b), _) => {
                    self.media.write(rec.data() + off, b);
                    crc32c_append(crc, b)
                }
                (None, Some(f)) => {
                    self.media.fill(rec.data() + off, f)?;
                    self.media.crc(rec.data() + off, len, crc)
                }
                (None, None) => return Err(Part::no_fill()),
            };
            self.media.persist(rec.data() + rec.len, end - rec.len)?;
            let mut next = *rec;
            next.crc = crc;
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
        parts.push(bytes_part(&bytes, len));
        if end < old.len {
            parts.push(Part::Copy(old.data() + end, old.len - end));
        }
        self.new_record(path, idx, meta, cap, &parts, &mut fill, old.seq)
            .map(Some)
    }

    /// Bytes fetched from elsewhere go straight into the record's extent.
    fn fills_in_place(&self, _off: u64, _len: usize, _chunk_size: u32) -> bool {
        true
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
                .new_record(path, idx, meta, len, &parts, &mut None, prev)
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
        Ok(self
            .media
            .read_vec(r.data() + start, (end - start) as usize))
    }

    /// Copied from the record's extent straight into `dst`.
    fn read_into(&self, r: &Rec, off: u64, dst: &mut Dst<'_>) -> Result<Option<usize>> {
        let start = off.min(r.len);
        let n = (r.len - start).min(dst.len() as u64) as usize;
        self.media.read_into(r.data() + start, n, dst);
        Ok(Some(n))
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
