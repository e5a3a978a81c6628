//! The key semantics of every engine, written once: [`Indexed`] keeps the
//! in-memory index (path → chunk index → record, sharded by path), the
//! directory index, the entry count and the byte usage, and implements
//! [`Store`] over a [`Medium`], which only knows how to make, change, read
//! and free one record.
//!
//! The rules kept here: chunk 0 is the entry (it must exist for a write,
//! and a write grows its `size` and sets its times); a data chunk whose
//! `fileid` differs from the writer's is stale: it reads as a hole and a
//! write replaces it with a fresh record; a record whose data failed its
//! checksum at open reads (and is written, cut and taken) as EIO; space is
//! reserved before a record grows and given back when a change fails;
//! directory listings come from the [`DirIndex`] of the entries.

use std::sync::MutexGuard;

use bytes::Bytes;
use chfs_proto::path::is_within;
use chfs_proto::Meta;

use crate::chunkmap::ChunkMap;
use crate::dirindex::{kind_of, lock, shard_of, DirIndex, NameBatch, PathMap, Shard, SHARDS};
use crate::tree;
use crate::usage::{Striped, Usage};
use crate::{corrupt, Chunk, MetaFn, Result, Store, StoreError, StoreStats};

/// What the index keeps of one chunk: its header, its length, and what the
/// medium needs to find its bytes.
pub trait Record: Send + 'static {
    /// Chunk header.
    fn meta(&self) -> &Meta;
    /// Bytes of data.
    fn len(&self) -> u64;
    /// Header valid but data failed its checksum at open.
    fn corrupt(&self) -> bool {
        false
    }
    /// Sequence number of this version of its key (persistent media).
    fn seq(&self) -> u64 {
        0
    }
}

/// Implements [`Record`] for an index entry with fields `meta`, `len`,
/// `corrupt` and `seq` (the persistent media's).
macro_rules! record_fields {
    ($t:ty) => {
        impl $crate::index::Record for $t {
            fn meta(&self) -> &chfs_proto::Meta {
                &self.meta
            }

            fn len(&self) -> u64 {
                self.len
            }

            fn corrupt(&self) -> bool {
                self.corrupt
            }

            fn seq(&self) -> u64 {
                self.seq
            }
        }
    };
}
pub(crate) use record_fields;

/// Where the records live: the few operations that differ between DRAM,
/// persistent memory and files. Every call but `free` (made once the
/// record is out of the index) is made under the lock of the record's
/// key; `path` and `idx` name the key. An operation that fails
/// leaves `rec` as it was.
pub trait Medium: Send + Sync + 'static {
    /// Index entry of one record.
    type Rec: Record;
    /// Bytes read out of a record.
    type Data: Into<Vec<u8>> + Into<Bytes>;
    /// Engine name for status reports.
    const NAME: &'static str;

    /// A new record with header `w.meta` holding `w.off` zero bytes then
    /// `w.data`, to replace `old` (the key's current version, if any; the
    /// caller frees it once the new one is in the index).
    fn fresh(&self, w: Write<'_>, old: Option<&Self::Rec>) -> Result<Self::Rec>;

    /// Writes `w.data` at `w.off` of `rec` with `w.meta` as its new header:
    /// changes `rec` (`None`) or returns a new record to replace it.
    fn write_into(&self, w: Write<'_>, rec: &mut Self::Rec) -> Result<Option<Self::Rec>>;

    /// Gives `rec` the header `meta`.
    fn set_meta(&self, path: &str, idx: u64, rec: &mut Self::Rec, meta: Meta) -> Result<()>;

    /// Cuts `rec` to `len` (< its length) bytes: changes `rec` (`None`) or
    /// returns a new record to replace it.
    fn truncate(
        &self,
        path: &str,
        idx: u64,
        rec: &mut Self::Rec,
        len: u64,
    ) -> Result<Option<Self::Rec>>;

    /// Up to `len` bytes at `off` (cut at the record's end).
    fn read(&self, rec: &Self::Rec, off: u64, len: u64) -> Result<Self::Data>;

    /// Places up to `dst.len()` bytes at `off` of `rec` (cut at the
    /// record's end) at the start of `dst` and returns their count, where
    /// the medium can without a buffer of its own. `None` (the default):
    /// [`Medium::read`], whose bytes are copied to `dst` once the key's
    /// lock is released (a DRAM chunk's slice).
    fn read_into(&self, _rec: &Self::Rec, _off: u64, _dst: &mut Dst<'_>) -> Result<Option<usize>> {
        Ok(None)
    }

    /// Frees a record that left the index.
    fn free(&self, rec: Self::Rec) -> Result<()>;

    /// Makes everything written so far durable.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Does this medium take a [`Src::Fill`] of `len` bytes at `off` of a
    /// chunk of `chunk_size` bytes and fetch them straight into the
    /// record? Else (`false`, the default) the bytes are fetched into a
    /// buffer before the record's key is locked.
    fn fills_in_place(&self, _off: u64, _len: usize, _chunk_size: u32) -> bool {
        false
    }
}

/// A write of `data` at `off` of chunk `idx` of `path`, with header `meta`.
pub struct Write<'a> {
    /// Path of the chunk.
    pub path: &'a str,
    /// Chunk index.
    pub idx: u64,
    /// Offset of the data.
    pub off: u64,
    /// The bytes.
    pub data: Src<'a>,
    /// The record's header after the write.
    pub meta: Meta,
}

/// Data of a write: borrowed, a buffer the caller no longer needs (a
/// medium holding chunks in heap buffers may keep it), or bytes fetched
/// from elsewhere (another process's memory) by a [`Fill`], which a
/// medium that can (`Medium::fills_in_place`) runs on the record's own
/// memory instead of on a buffer of ours that it then copies.
pub enum Src<'a> {
    /// Bytes to copy.
    Copy(&'a [u8]),
    /// A buffer to keep or copy.
    Own(Bytes),
    /// Bytes to fetch.
    Fill(Fill<'a>),
}

/// What fetches the bytes of a [`Src::Fill`]: called at most once (by
/// [`Fill::fetch_into`], which takes the `Fill`), on memory of the
/// write's length; `Ok` says it wrote all of it. A fetch that fails fails
/// the write (see [`Store::write_from`] for what it may have changed).
pub type FillFn<'a> = dyn Fn(&mut [std::mem::MaybeUninit<u8>]) -> Result<()> + Sync + 'a;

/// `len` bytes a [`FillFn`] fetches.
pub struct Fill<'a> {
    len: usize,
    fetch: &'a FillFn<'a>,
}

impl<'a> Fill<'a> {
    /// `len` bytes that `fetch` writes.
    pub fn new(len: usize, fetch: &'a FillFn<'a>) -> Self {
        Self { len, fetch }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Is it empty?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fetches the bytes into `dst` (of [`Fill::len`] bytes).
    pub fn fetch_into(self, dst: &mut [std::mem::MaybeUninit<u8>]) -> Result<()> {
        debug_assert_eq!(dst.len(), self.len);
        (self.fetch)(dst)
    }

    /// Fetches the bytes into a new buffer.
    pub fn fetch(self) -> Result<Bytes> {
        let mut v = Vec::<u8>::with_capacity(self.len);
        let n = self.len;
        self.fetch_into(&mut v.spare_capacity_mut()[..n])?;
        // SAFETY: the fetch wrote all `n` bytes (its `Ok`, FillFn's contract).
        unsafe { v.set_len(n) };
        Ok(Bytes::from(v))
    }
}

/// The bytes of a [`Src`] once fetched ([`Src::bytes`]).
pub enum SrcBytes<'a> {
    /// Borrowed.
    Borrowed(&'a [u8]),
    /// A buffer.
    Owned(Bytes),
}

impl std::ops::Deref for SrcBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SrcBytes::Borrowed(d) => d,
            SrcBytes::Owned(b) => b,
        }
    }
}

impl<'a> Src<'a> {
    /// Number of bytes.
    pub fn len(&self) -> usize {
        match self {
            Src::Copy(d) => d.len(),
            Src::Own(b) => b.len(),
            Src::Fill(f) => f.len(),
        }
    }

    /// No bytes?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes (a [`Src::Fill`]'s fetched into a new buffer).
    pub fn bytes(self) -> Result<SrcBytes<'a>> {
        Ok(match self {
            Src::Copy(d) => SrcBytes::Borrowed(d),
            Src::Own(b) => SrcBytes::Owned(b),
            Src::Fill(f) => SrcBytes::Owned(f.fetch()?),
        })
    }
}

/// Memory a read places its bytes in ([`Store::read_into`]): `len` bytes
/// only ever written, by copies into it (by the kernel too), and never
/// seen as a slice, so that it may be memory another process shares
/// with this one, such as a client's landing window.
pub struct Dst<'a> {
    ptr: *mut u8,
    len: usize,
    _mem: std::marker::PhantomData<&'a mut [std::mem::MaybeUninit<u8>]>,
}

// SAFETY: a `Dst` is the sole writer of its memory in this process for
// `'a` (`from_raw`'s contract, or a borrowed `&mut`); moving or sharing
// it between threads changes nothing about that (its methods that write
// take `&mut self`).
unsafe impl Send for Dst<'_> {}
// SAFETY: as above; `&Dst` gives only its length.
unsafe impl Sync for Dst<'_> {}

impl<'a> Dst<'a> {
    /// `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` is valid for writes of `len` bytes during `'a`, and nothing in
    /// this process reads or writes them meanwhile but through the `Dst`
    /// (another process may: it then sees the bytes as they land).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr,
            len,
            _mem: std::marker::PhantomData,
        }
    }

    /// A buffer of this process's.
    pub fn from_uninit(buf: &'a mut [std::mem::MaybeUninit<u8>]) -> Self {
        // SAFETY: the exclusive borrow makes the `Dst` the only access
        // to the buffer for `'a`.
        unsafe { Self::from_raw(buf.as_mut_ptr().cast(), buf.len()) }
    }

    /// A new buffer of `n` bytes, all of which `place` writes (its `Ok`).
    pub(crate) fn read_vec(
        n: usize,
        place: impl FnOnce(&mut Dst<'_>) -> Result<()>,
    ) -> Result<Vec<u8>> {
        let mut v = Vec::<u8>::with_capacity(n);
        place(&mut Dst::from_uninit(&mut v.spare_capacity_mut()[..n]))?;
        // SAFETY: `place` wrote all `n` bytes (its contract, its `Ok`).
        unsafe { v.set_len(n) };
        Ok(v)
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No bytes?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `at`, as a `Dst` of their own. Panics past the
    /// end.
    pub fn part(&mut self, at: usize, len: usize) -> Dst<'_> {
        assert!(at.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: a range of this `Dst`'s memory (checked), which the
        // borrow of `self` leaves to the part alone while it lives.
        unsafe { Dst::from_raw(self.ptr.add(at), len) }
    }

    /// Copies `src` to `at`. Panics past the end (the engines' bounds).
    pub fn put(&mut self, at: usize, src: &[u8]) {
        assert!(at.checked_add(src.len()).is_some_and(|e| e <= self.len));
        // SAFETY: `[at, at + src.len())` lies in the memory (checked),
        // valid for writes and written by no one else here (`from_raw`);
        // `src` is not that memory (it is never seen as a slice).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) }
    }

    /// Zeros `n` bytes at `at`. Panics past the end.
    pub fn zero(&mut self, at: usize, n: usize) {
        assert!(at.checked_add(n).is_some_and(|e| e <= self.len));
        // SAFETY: in range (checked), ours to write (`from_raw`).
        unsafe { std::ptr::write_bytes(self.ptr.add(at), 0, n) }
    }

    /// Reads `n` bytes at `off` of `f` to `at` (all of them, else an
    /// error; `UnexpectedEof` when the file ends first). Panics past the
    /// end of the memory.
    pub fn pread(
        &mut self,
        at: usize,
        n: usize,
        f: &std::fs::File,
        off: u64,
    ) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        assert!(at.checked_add(n).is_some_and(|e| e <= self.len));
        // SAFETY: `[at, at + n)` lies in the memory (checked), valid for
        // writes and written by no one else here (`from_raw`).
        unsafe { chfs_sys::fs::pread_exact(f.as_fd(), self.ptr.add(at), n, off) }
    }
}

/// Data of a record under construction.
pub(crate) enum Part<'a> {
    /// Bytes given.
    Bytes(&'a [u8]),
    /// Zeros.
    Zero(u64),
    /// Bytes of the record it replaces: (where, as the medium counts, length).
    Copy(u64, u64),
    /// Bytes the write's [`Fill`] fetches (length), for a medium that
    /// fills in place.
    Fetched(u64),
}

impl Part<'_> {
    /// The error of a [`Part::Fetched`] met without its fill (a medium
    /// that does not fill in place, or a second such part).
    pub fn no_fill() -> StoreError {
        StoreError::refused(libc::EINVAL, "fetched bytes without a fetch")
    }

    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::Zero(n) | Part::Copy(_, n) | Part::Fetched(n) => *n,
        }
    }
}

/// Total length of `parts`; EFBIG beyond what a record header counts.
pub(crate) fn parts_len(parts: &[Part<'_>]) -> Result<u64> {
    let len: u64 = parts.iter().map(Part::len).sum();
    if len > u32::MAX as u64 {
        return Err(StoreError::refused(libc::EFBIG, "chunk too large"));
    }
    Ok(len)
}

type Files<R> = PathMap<ChunkMap<R>>;

/// Indexes a record found at open: (path, chunk index, record) → the
/// version of the key that lost to another, to be freed.
pub(crate) type Found<'a, R> = &'a mut dyn FnMut(String, u64, R) -> Option<R>;

/// An engine: the index of a medium's records. See the module docs.
pub struct Indexed<M: Medium> {
    files: Vec<Shard<Files<M::Rec>>>,
    dirs: DirIndex,
    entries: Striped,
    usage: Usage,
    pub(crate) medium: M,
}

/// Is the indexed `old` version of a key better than `new` (at open, two
/// versions of one key)? Intact data beats a checksum failure; then the
/// later version wins.
fn better<R: Record>(old: &R, new: &R) -> bool {
    match (old.corrupt(), new.corrupt()) {
        (false, true) => true,
        (true, false) => false,
        _ => old.seq() > new.seq(),
    }
}

/// Indexes a record found at open in `files`; returns the version of its
/// key that lost to another, if any.
fn recovered<R: Record>(
    files: &mut [Shard<Files<R>>],
    path: String,
    idx: u64,
    rec: R,
) -> Option<R> {
    let shard = files[shard_of(&path, SHARDS)]
        .get_mut()
        .unwrap_or_else(|p| p.into_inner());
    let chunks = shard.entry(path).or_default();
    match chunks.get(&idx) {
        Some(old) if better(old, &rec) => Some(rec),
        _ => chunks.insert(idx, rec),
    }
}

/// EIO for a record whose data failed its checksum.
fn intact<R: Record>(r: &R, path: &str, idx: u64) -> Result<()> {
    if r.corrupt() {
        return Err(corrupt(format!(
            "{path} chunk {idx}: data checksum mismatch"
        )));
    }
    Ok(())
}

impl<M: Medium> Indexed<M> {
    /// An empty index over `medium`, counting bytes in `usage`.
    pub(crate) fn over(medium: M, usage: Usage) -> Self {
        Self {
            files: (0..SHARDS)
                .map(|_| Shard::new(PathMap::default()))
                .collect(),
            dirs: DirIndex::new(),
            entries: Striped::new(0),
            usage,
            medium,
        }
    }

    /// Runs `f` on the record of chunk `idx` of `path`, if any (tests
    /// looking at what a medium made).
    #[cfg(test)]
    pub(crate) fn with_record<T>(
        &self,
        path: &str,
        idx: u64,
        f: impl FnOnce(&M::Rec) -> T,
    ) -> Option<T> {
        self.files(path).get(path).and_then(|c| c.get(&idx)).map(f)
    }

    fn files(&self, path: &str) -> MutexGuard<'_, Files<M::Rec>> {
        lock(&self.files[shard_of(path, SHARDS)])
    }

    /// Runs `walk` over the medium at open with a function that indexes
    /// each record it finds and returns the version of the record's key
    /// that lost to another (to be freed), if any.
    pub(crate) fn walk_medium<T>(
        &mut self,
        walk: impl FnOnce(&mut M, Found<'_, M::Rec>) -> T,
    ) -> T {
        let files = &mut self.files;
        walk(&mut self.medium, &mut |path, idx, rec| {
            recovered(files, path, idx, rec)
        })
    }

    /// After open: lists the entries in the directory index and counts the
    /// records and bytes; returns (records, corrupt records).
    pub(crate) fn rebuilt(&mut self) -> (u64, u64) {
        let (mut entries, mut bytes, mut bad) = (0u64, 0u64, 0u64);
        for sh in &self.files {
            for (path, chunks) in lock(sh).iter() {
                for (idx, r) in chunks.iter() {
                    entries += 1;
                    bytes += r.len();
                    bad += r.corrupt() as u64;
                    if *idx == 0 {
                        self.dirs.add(path, kind_of(r.meta().mode));
                    }
                }
            }
        }
        self.entries = Striped::new(entries);
        self.usage.reserve_unchecked(bytes);
        (entries, bad)
    }

    /// Puts `rec` in the index, freeing the version it replaces.
    fn install(&self, chunks: &mut ChunkMap<M::Rec>, idx: u64, rec: M::Rec) -> Result<()> {
        match chunks.insert(idx, rec) {
            Some(old) => self.medium.free(old),
            None => {
                self.entries.add(1);
                Ok(())
            }
        }
    }

    /// A whole new version of a key: `zeros` zero bytes, then `data`.
    fn new_version(
        &self,
        chunks: &mut ChunkMap<M::Rec>,
        path: &str,
        idx: u64,
        meta: Meta,
        zeros: u64,
        data: Src<'_>,
    ) -> Result<()> {
        let old = chunks.get(&idx);
        let old_len = old.map_or(0, Record::len);
        let new_len = zeros + data.len() as u64;
        self.usage.change(old_len, new_len)?;
        let w = Write {
            path,
            idx,
            off: zeros,
            data,
            meta,
        };
        match self.medium.fresh(w, old) {
            Ok(rec) => self.install(chunks, idx, rec),
            Err(e) => {
                self.usage.undo(old_len, new_len);
                Err(e)
            }
        }
    }

    /// Changes `r` to `new_len` bytes by `op`, with space accounting.
    fn apply(
        &self,
        r: &mut M::Rec,
        new_len: u64,
        op: impl FnOnce(&mut M::Rec) -> Result<Option<M::Rec>>,
    ) -> Result<()> {
        let old_len = r.len();
        self.usage.change(old_len, new_len)?;
        match op(r) {
            Ok(None) => Ok(()),
            Ok(Some(rec)) => self.medium.free(std::mem::replace(r, rec)),
            Err(e) => {
                self.usage.undo(old_len, new_len);
                Err(e)
            }
        }
    }

    /// Accounts and frees a record removed from the index.
    fn dropped(&self, r: M::Rec) -> Result<()> {
        self.usage.release(r.len());
        self.entries.sub(1);
        self.medium.free(r)
    }

    /// Stores a whole chunk as the new version of a key (chunk 0: listed
    /// in its directory). `excl`: only when chunk `idx` is missing, else
    /// [`StoreError::Exists`] (`Some(true)`) or its header (`Some(false)`).
    fn store_new(
        &self,
        path: &str,
        idx: u64,
        meta: Meta,
        data: Src<'_>,
        excl: Option<bool>,
    ) -> Result<(Meta, bool)> {
        let mut files = self.files(path);
        let chunks = files.entry(path.to_string()).or_default();
        if let (Some(excl), Some(r)) = (excl, chunks.get(&idx)) {
            return if excl {
                Err(StoreError::Exists(*r.meta()))
            } else {
                Ok((*r.meta(), false))
            };
        }
        let r = self.new_version(chunks, path, idx, meta, 0, data);
        if chunks.is_empty() {
            files.remove(path);
        }
        r?;
        // The name is listed before the shard's lock is let go (as in
        // `removed`): with the lock dropped first, a remove and a create
        // of one path racing could leave the entry without its name (a
        // file readdir never lists) or a name without its entry.
        if idx == 0 {
            self.dirs.add(path, kind_of(meta.mode));
        }
        drop(files);
        Ok((meta, true))
    }

    /// After chunk `idx` of `path` left `files` (locked; `emptied`: it was
    /// the path's last): forgets an emptied path and an entry's name, and
    /// frees the record. Returns its header.
    fn removed(
        &self,
        mut files: MutexGuard<'_, Files<M::Rec>>,
        path: &str,
        idx: u64,
        r: M::Rec,
        emptied: bool,
    ) -> Result<Meta> {
        if emptied {
            files.remove(path);
        }
        // Under the shard's lock (files, then the directory index: the
        // order `rebuilt` takes too), so that a create of the same path
        // cannot list its name in between and lose it here.
        if idx == 0 {
            self.dirs.remove(path);
        }
        drop(files);
        let meta = *r.meta();
        self.dropped(r)?;
        Ok(meta)
    }

    /// Writes into `r`, the indexed record of chunk `idx` of `path`.
    fn write_into(
        &self,
        r: &mut M::Rec,
        path: &str,
        idx: u64,
        off: u64,
        data: Src<'_>,
        meta: Meta,
    ) -> Result<()> {
        intact(r, path, idx)?;
        let new_len = (off + data.len() as u64).max(r.len());
        self.apply(r, new_len, |r| {
            let w = Write {
                path,
                idx,
                off,
                data,
                meta,
            };
            self.medium.write_into(w, r)
        })
    }

    fn read_data(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<M::Data>> {
        self.with_held(path, idx, fileid, |r| {
            self.medium.read(r, off as u64, len as u64)
        })
    }

    /// `f` on chunk `idx` of `path` whose fileid is `fileid`, under its
    /// key's lock; `None` when the chunk is missing or stale.
    fn with_held<T>(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        f: impl FnOnce(&M::Rec) -> Result<T>,
    ) -> Result<Option<T>> {
        let files = self.files(path);
        let Some(r) = files.get(path).and_then(|c| c.get(&idx)) else {
            return Ok(None);
        };
        if idx > 0 && r.meta().fileid != fileid {
            return Ok(None);
        }
        intact(r, path, idx)?;
        f(r).map(Some)
    }
}

impl<M: Medium> Indexed<M> {
    /// Up to `max` keys of the directories with entries here from `from`
    /// on, starting with `prefix` and not with `skip` (see
    /// [`DirIndex::keys_from`], [`Store::list_tree`]).
    pub(crate) fn dir_keys(
        &self,
        from: std::ops::Bound<&str>,
        prefix: &str,
        skip: Option<&str>,
        max: usize,
        out: &mut std::collections::VecDeque<String>,
    ) -> bool {
        self.dirs.keys_from(from, prefix, skip, max, out)
    }

    /// Whether the directory with key `key` has entries here.
    pub(crate) fn has_dir_key(&self, key: &str) -> bool {
        self.dirs.has_key(key)
    }

    /// Up to `max` names of directory `dir` after `after`, with their
    /// types, into `out`; whether more follow.
    pub(crate) fn names_into(
        &self,
        dir: &str,
        after: &[u8],
        max: usize,
        out: &mut NameBatch,
    ) -> bool {
        self.dirs.names_into(dir, after, max, out)
    }

    /// The entry header of each name of `names` in the directory whose
    /// paths start with `key` (its path and `/`), looked up one index
    /// shard at a time (see `list_dir`); `None` for one gone meanwhile.
    pub(crate) fn entries_of(&self, key: &str, names: &NameBatch) -> Vec<Option<Meta>> {
        let n = names.len();
        let mut paths = Vec::with_capacity(names.bytes.len() + n * key.len());
        let mut spans = Vec::with_capacity(n);
        let mut shards = Vec::with_capacity(n);
        let mut count = [0usize; SHARDS + 1];
        for i in 0..n {
            let start = paths.len();
            paths.extend_from_slice(key.as_bytes());
            paths.extend_from_slice(names.name(i));
            let p = std::str::from_utf8(&paths[start..]).unwrap_or("");
            let sh = shard_of(p, SHARDS);
            spans.push(start..paths.len());
            shards.push(sh as u8);
            count[sh + 1] += 1;
        }
        for s in 1..=SHARDS {
            count[s] += count[s - 1];
        }
        let mut order = vec![0u32; n];
        for (i, &sh) in shards.iter().enumerate() {
            order[count[sh as usize]] = i as u32;
            count[sh as usize] += 1;
        }
        let mut metas: Vec<Option<Meta>> = vec![None; n];
        let mut k = 0;
        while k < order.len() {
            let sh = shards[order[k] as usize];
            let files = lock(&self.files[sh as usize]);
            while let Some(&i) = order.get(k).filter(|&&i| shards[i as usize] == sh) {
                let i = i as usize;
                let p = std::str::from_utf8(&paths[spans[i].clone()]).unwrap_or("");
                metas[i] = files.get(p).and_then(|c| c.get(&0)).map(|r| *r.meta());
                k += 1;
            }
        }
        metas
    }
}

impl<M: Medium> Store for Indexed<M> {
    fn name(&self) -> &'static str {
        M::NAME
    }

    fn create(&self, path: &str, meta: Meta, data: &[u8], excl: bool) -> Result<(Meta, bool)> {
        self.store_new(path, 0, meta, Src::Copy(data), Some(excl))
    }

    fn meta(&self, path: &str, idx: u64) -> Result<Option<Meta>> {
        Ok(self
            .files(path)
            .get(path)
            .and_then(|c| c.get(&idx))
            .map(|r| *r.meta()))
    }

    fn write(&self, path: &str, idx: u64, off: u32, data: &[u8], template: &Meta) -> Result<()> {
        self.write_from(path, idx, off, Src::Copy(data), template)
    }

    fn write_bytes(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: Bytes,
        template: &Meta,
    ) -> Result<()> {
        self.write_from(path, idx, off, Src::Own(data), template)
    }

    fn write_from(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: Src<'_>,
        template: &Meta,
    ) -> Result<()> {
        let data = match data {
            Src::Fill(f)
                if !self
                    .medium
                    .fills_in_place(off as u64, f.len(), template.chunk_size) =>
            {
                Src::Own(f.fetch()?)
            }
            d => d,
        };
        let off = off as u64;
        let end = off + data.len() as u64;
        let mut files = self.files(path);
        if idx == 0 {
            let r = files
                .get_mut(path)
                .and_then(|c| c.get_mut(&0))
                .ok_or(StoreError::NotFound)?;
            let mut m = *r.meta();
            m.size = m.size.max(end);
            m.mtime = template.mtime;
            m.ctime = template.mtime;
            return self.write_into(r, path, 0, off, data, m);
        }
        let chunks = files.entry(path.to_string()).or_default();
        let r = match chunks.get_mut(&idx) {
            Some(r) if r.meta().fileid == template.fileid => {
                let m = *r.meta();
                self.write_into(r, path, idx, off, data, m)
            }
            _ => self.new_version(chunks, path, idx, *template, off, data),
        };
        if chunks.is_empty() {
            files.remove(path);
        }
        r
    }

    fn read(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self.read_data(path, idx, fileid, off, len)?.map(Into::into))
    }

    fn read_bytes(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<Bytes>> {
        Ok(self.read_data(path, idx, fileid, off, len)?.map(Into::into))
    }

    fn read_into(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        dst: &mut Dst<'_>,
    ) -> Result<Option<usize>> {
        let len = dst.len() as u64;
        // Placed by the medium under the lock, or read (a DRAM chunk's
        // slice) and copied once the lock is released.
        let got = self.with_held(path, idx, fileid, |r| {
            Ok(match self.medium.read_into(r, off as u64, dst)? {
                Some(n) => (n, None),
                None => (0, Some(self.medium.read(r, off as u64, len)?)),
            })
        })?;
        Ok(got.map(|(n, data)| match data {
            None => n,
            Some(d) => {
                let d: Bytes = d.into();
                dst.put(0, &d);
                d.len()
            }
        }))
    }

    fn update_meta(&self, path: &str, idx: u64, f: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let r = files
            .get_mut(path)
            .and_then(|c| c.get_mut(&idx))
            .ok_or(StoreError::NotFound)?;
        let mut m = *r.meta();
        f(&mut m)?;
        if m != *r.meta() {
            self.medium.set_meta(path, idx, r, m)?;
        }
        Ok(m)
    }

    fn remove(&self, path: &str, idx: u64, check: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let chunks = files.get_mut(path).ok_or(StoreError::NotFound)?;
        let r = chunks.get(&idx).ok_or(StoreError::NotFound)?;
        let mut m = *r.meta();
        check(&mut m)?;
        let r = chunks.remove(&idx).ok_or(StoreError::NotFound)?;
        let emptied = chunks.is_empty();
        self.removed(files, path, idx, r, emptied)
    }

    fn remove_chunks(&self, path: &str, from_idx: u64) -> Result<u64> {
        let mut files = self.files(path);
        let Some(chunks) = files.get_mut(path) else {
            return Ok(0);
        };
        let gone = chunks.split_off(&from_idx);
        if chunks.is_empty() {
            files.remove(path);
        }
        if gone.contains_key(&0) {
            self.dirs.remove(path);
        }
        drop(files);
        let n = gone.len() as u64;
        let mut first_err = None;
        for r in gone.into_values() {
            if let Err(e) = self.dropped(r) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    fn truncate_chunk(&self, path: &str, idx: u64, len: u32) -> Result<()> {
        let len = len as u64;
        let mut files = self.files(path);
        let Some(r) = files.get_mut(path).and_then(|c| c.get_mut(&idx)) else {
            return Ok(());
        };
        if r.len() <= len {
            return Ok(());
        }
        intact(r, path, idx)?;
        self.apply(r, len, |r| self.medium.truncate(path, idx, r, len))
    }

    fn chunk_indices(&self, path: &str) -> Result<Vec<u64>> {
        Ok(self
            .files(path)
            .get(path)
            .map(|c| c.keys().copied().collect())
            .unwrap_or_default())
    }

    fn list_dir(&self, dir: &str, after: &str, max: usize) -> Result<(Vec<(String, Meta)>, bool)> {
        let mut names = self.dirs.names(dir, after, max);
        let done = names.len() <= max;
        names.truncate(max);
        // Each name's entry is looked up in the path index with its shard's
        // lock taken once for all the names of the page in that shard, and
        // the paths are made in one buffer: no allocation and no lock per
        // entry. The lookups of a shard follow one another without atomic
        // operations in between, so the CPU overlaps their cache misses
        // (each lookup misses on its bucket and key: the page's entries lie
        // all over the index).
        let prefix = if dir == "/" { "" } else { dir };
        let mut paths = String::with_capacity(
            names
                .iter()
                .map(|n| prefix.len() + 1 + n.len())
                .sum::<usize>(),
        );
        let mut spans = Vec::with_capacity(names.len());
        let mut shards = Vec::with_capacity(names.len());
        let mut count = [0usize; SHARDS + 1];
        for n in &names {
            let start = paths.len();
            paths.push_str(prefix);
            paths.push('/');
            paths.push_str(n);
            let sh = shard_of(&paths[start..], SHARDS);
            spans.push(start..paths.len());
            shards.push(sh as u8);
            count[sh + 1] += 1;
        }
        // The page's positions grouped by shard (a counting sort).
        for s in 1..=SHARDS {
            count[s] += count[s - 1];
        }
        let mut order = vec![0u32; names.len()];
        for (i, &sh) in shards.iter().enumerate() {
            order[count[sh as usize]] = i as u32;
            count[sh as usize] += 1;
        }
        let mut metas: Vec<Option<Meta>> = vec![None; names.len()];
        let mut k = 0;
        while k < order.len() {
            let sh = shards[order[k] as usize];
            let files = lock(&self.files[sh as usize]);
            while let Some(&i) = order.get(k).filter(|&&i| shards[i as usize] == sh) {
                let i = i as usize;
                metas[i] = files
                    .get(&paths[spans[i].clone()])
                    .and_then(|c| c.get(&0))
                    .map(|r| *r.meta());
                k += 1;
            }
        }
        let out = names
            .into_iter()
            .zip(metas)
            .filter_map(|(n, m)| Some((n, m?)))
            .collect();
        Ok((out, done))
    }

    fn list_tree(
        &self,
        dir: &str,
        skip: Option<&str>,
        after: &str,
        max: usize,
        with_meta: bool,
        dirs_only: bool,
        emit: &mut dyn FnMut(&str, u8, Option<&Meta>),
    ) -> Result<bool> {
        Ok(tree::list(
            self, dir, skip, after, max, with_meta, dirs_only, emit,
        ))
    }

    fn has_children(&self, dir: &str) -> Result<bool> {
        Ok(self.dirs.has_children(dir))
    }

    fn dir_version(&self, dir: &str) -> Option<crate::DirVersion> {
        self.dirs.version(dir)
    }

    fn paths_below(&self, dir: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for s in &self.files {
            for p in lock(s).keys() {
                if p != dir && is_within(p, dir) {
                    out.push(p.clone());
                }
            }
        }
        Ok(out)
    }

    fn take(&self, path: &str, idx: u64) -> Result<Option<Chunk>> {
        let mut files = self.files(path);
        let Some(chunks) = files.get_mut(path) else {
            return Ok(None);
        };
        let Some(r) = chunks.get(&idx) else {
            return Ok(None);
        };
        intact(r, path, idx)?;
        let data = self.medium.read(r, 0, r.len())?;
        let r = chunks.remove(&idx).ok_or(StoreError::NotFound)?;
        let emptied = chunks.is_empty();
        let meta = self.removed(files, path, idx, r, emptied)?;
        Ok(Some(Chunk {
            meta,
            data: data.into(),
        }))
    }

    fn put(&self, path: &str, idx: u64, chunk: Chunk) -> Result<()> {
        let data = Src::Own(chunk.data);
        self.store_new(path, idx, chunk.meta, data, None).map(drop)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.entries.get(),
            bytes: self.usage.bytes(),
            capacity: self.usage.capacity(),
        }
    }

    fn sync(&self) -> Result<()> {
        self.medium.sync()
    }
}
