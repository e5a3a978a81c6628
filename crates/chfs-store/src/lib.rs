//! Node-local key-value engines.
//!
//! A key is `(path, chunk index)`; a value is a 64-byte [`Meta`] header and
//! the chunk's bytes. Chunk 0 of a path is its *entry*: it exists for every
//! file, directory, symlink and special file, carries the file size, and is
//! what directory listings return. Data chunks (index > 0) carry the file's
//! `fileid`; a data chunk whose `fileid` differs from the caller's is stale
//! (left by an earlier file of the same name) and reads as a hole.
//!
//! Every method is atomic per key, so concurrent writers of disjoint ranges
//! of one chunk never lose each other's bytes. The server holds an
//! `Arc<dyn Store>` and knows nothing of how an engine keeps its data.

mod chunkmap;
pub mod crc;
mod dirindex;
mod index;
mod media;
mod mem;
pub mod pmem;
pub mod posix;
pub mod record;
mod tree;
mod usage;

pub use dirindex::DirVersion;
pub use index::{Dst, Fill, FillFn, Src, SrcBytes};
pub use media::PersistMode;
pub use mem::MemStore;
pub use pmem::PmemStore;
pub use posix::PosixStore;

use chfs_proto::Meta;

/// Errors of a storage engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No such key.
    #[error("no such entry")]
    NotFound,
    /// The key exists (exclusive create).
    #[error("entry exists")]
    Exists(Meta),
    /// The store is full.
    #[error("store is full ({used} of {capacity} bytes used)")]
    NoSpace {
        /// Bytes in use.
        used: u64,
        /// Capacity.
        capacity: u64,
    },
    /// A request the engine refuses, with the errno the user sees.
    #[error("{message}")]
    Refused {
        /// errno value.
        errno: i32,
        /// Explanation.
        message: String,
    },
    /// Stored bytes failed verification.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// I/O error of the underlying medium.
    #[error("store I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl StoreError {
    /// The errno a user sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::NotFound => libc::ENOENT,
            StoreError::Exists(_) => libc::EEXIST,
            StoreError::NoSpace { .. } => libc::ENOSPC,
            StoreError::Refused { errno, .. } => *errno,
            StoreError::Corrupt(_) => libc::EIO,
            StoreError::Io(e) => chfs_proto::error::io_errno(e),
        }
    }

    /// Builds a [`StoreError::Refused`].
    pub fn refused(errno: i32, message: impl Into<String>) -> Self {
        StoreError::Refused {
            errno,
            message: message.into(),
        }
    }
}

/// A [`StoreError::Corrupt`].
pub(crate) fn corrupt(msg: impl Into<String>) -> StoreError {
    StoreError::Corrupt(msg.into())
}

/// Result of engine operations.
pub type Result<T> = std::result::Result<T, StoreError>;

/// A whole chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Header.
    pub meta: Meta,
    /// Bytes (shared: moving a chunk between stores or onto the wire
    /// copies none of them).
    pub data: bytes::Bytes,
}

/// Usage figures of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Number of chunks stored.
    pub entries: u64,
    /// Bytes of chunk data stored.
    pub bytes: u64,
    /// Capacity in bytes (0 = bounded only by memory).
    pub capacity: u64,
}

/// A callback that inspects or changes a header and may refuse with an error.
pub type MetaFn<'a> = &'a mut dyn FnMut(&mut Meta) -> Result<()>;

/// A node-local key-value engine.
pub trait Store: Send + Sync + 'static {
    /// Engine name for status reports (`mem`, `pmem`, `posix`).
    fn name(&self) -> &'static str;

    /// Creates the entry (chunk 0) of `path` with `meta` and initial `data`.
    /// When it exists: with `excl` fails with [`StoreError::Exists`],
    /// otherwise returns the existing header. Returns (header, created).
    fn create(&self, path: &str, meta: Meta, data: &[u8], excl: bool) -> Result<(Meta, bool)>;

    /// Header of chunk `idx` of `path`.
    fn meta(&self, path: &str, idx: u64) -> Result<Option<Meta>>;

    /// Writes `data` at `off` within chunk `idx`, zero-filling any gap.
    /// A missing data chunk, or one with another `fileid`, is started afresh
    /// with header `template`. Chunk 0 must exist ([`StoreError::NotFound`]);
    /// for it the entry's `size` grows to cover the write and `mtime` is set
    /// to `template.mtime`.
    fn write(&self, path: &str, idx: u64, off: u32, data: &[u8], template: &Meta) -> Result<()>;

    /// As [`Store::write`], with a buffer the caller no longer needs: an
    /// engine holding chunks in heap buffers keeps it instead of copying
    /// it when it makes up the chunk's whole data (a fresh chunk, or one
    /// written over from its start to at least its end).
    fn write_bytes(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: bytes::Bytes,
        template: &Meta,
    ) -> Result<()> {
        self.write(path, idx, off, &data, template)
    }

    /// As [`Store::write`], with the bytes from `data`. A [`Src::Fill`]
    /// fetches them straight into the chunk where the engine can (one
    /// copy instead of two: the DRAM engine for a write of less than a
    /// whole chunk, the pmem engine always), else into a buffer first. A
    /// fetch that fails fails the write, which leaves the chunk's length
    /// and header as they were but may have changed some of the bytes it
    /// covers within that length (as a failed `write(2)` may).
    fn write_from(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: Src<'_>,
        template: &Meta,
    ) -> Result<()>;

    /// Reads up to `len` bytes at `off` of chunk `idx` whose fileid is
    /// `fileid`; `None` when the chunk is missing or stale.
    fn read(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<Vec<u8>>>;

    /// As [`Store::read`], as a shared buffer: an engine holding chunks in
    /// heap buffers hands out a slice of the chunk instead of a copy (a
    /// later write to the chunk leaves the slice as it was).
    fn read_bytes(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<bytes::Bytes>> {
        Ok(self
            .read(path, idx, fileid, off, len)?
            .map(bytes::Bytes::from))
    }

    /// As [`Store::read`], up to `dst.len()` bytes placed at the start of
    /// `dst`: their count. An engine that can copies them there from
    /// where they lie (a file, a persistent mapping) without a buffer of
    /// its own in between.
    fn read_into(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        dst: &mut Dst<'_>,
    ) -> Result<Option<usize>>;

    /// Atomically changes the header of chunk `idx` (missing: NotFound).
    fn update_meta(&self, path: &str, idx: u64, f: MetaFn<'_>) -> Result<Meta>;

    /// Removes chunk `idx` if `check` accepts its header; returns the header.
    fn remove(&self, path: &str, idx: u64, check: MetaFn<'_>) -> Result<Meta>;

    /// Removes every chunk of `path` with index >= `from_idx`; returns how
    /// many were removed.
    fn remove_chunks(&self, path: &str, from_idx: u64) -> Result<u64>;

    /// Cuts the data of chunk `idx` to at most `len` bytes.
    fn truncate_chunk(&self, path: &str, idx: u64, len: u32) -> Result<()>;

    /// Indices of the chunks of `path` held here, ascending.
    fn chunk_indices(&self, path: &str) -> Result<Vec<u64>>;

    /// Entries (chunk 0) whose parent directory is `dir`, in name order,
    /// with names greater than `after`, at most `max`; and whether the
    /// listing is complete.
    fn list_dir(&self, dir: &str, after: &str, max: usize) -> Result<(Vec<(String, Meta)>, bool)>;

    /// Entries (chunk 0) below directory `dir` at any depth (not `dir`
    /// itself), as full paths in byte order, after the path `after`
    /// (empty: from the start), leaving out those below `skip`:
    /// `emit(path, file type, header)` for each, at most `max`; the file
    /// type is the mode's `S_IFMT` bits >> 12, and the header comes with
    /// `with_meta` only (without it the directory index alone answers: no
    /// lookup per entry). With `dirs_only` only directories are emitted
    /// (and counted against `max`); the other entries are passed over.
    /// Returns whether the listing is complete. A call
    /// costs what it lists (plus log factors), not the directories held
    /// outside `dir`'s tree: those below `dir` are a range of the
    /// directory index's ordered keys, read as reached; a directory's names are
    /// read a batch at a time, so entries created or removed meanwhile
    /// are listed or not, but none twice.
    #[allow(clippy::too_many_arguments)]
    fn list_tree(
        &self,
        dir: &str,
        skip: Option<&str>,
        after: &str,
        max: usize,
        with_meta: bool,
        dirs_only: bool,
        emit: &mut dyn FnMut(&str, u8, Option<&Meta>),
    ) -> Result<bool>;

    /// Does any entry have `dir` as its parent?
    fn has_children(&self, dir: &str) -> Result<bool>;

    /// The version of the set of names of the entries held here with
    /// parent `dir` (None: no entries): see [`DirVersion`].
    fn dir_version(&self, dir: &str) -> Option<DirVersion>;

    /// Every path strictly below directory `dir` with a chunk held here.
    fn paths_below(&self, dir: &str) -> Result<Vec<String>>;

    /// Removes and returns chunk `idx` of `path`.
    fn take(&self, path: &str, idx: u64) -> Result<Option<Chunk>>;

    /// Stores a chunk as is, replacing any previous one.
    fn put(&self, path: &str, idx: u64, chunk: Chunk) -> Result<()>;

    /// Usage figures.
    fn stats(&self) -> StoreStats;

    /// Makes everything written so far durable (no-op for DRAM).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod fault;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fuzz;
#[cfg(test)]
mod tests_golden;
#[cfg(test)]
mod tests_persist;
#[cfg(test)]
mod tests_tree;
