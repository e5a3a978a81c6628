//! DRAM engine: sharded hash maps plus a per-directory name index.

use std::collections::HashMap;
use std::sync::MutexGuard;

use bytes::Bytes;
use chfs_proto::path::is_within;
use chfs_proto::Meta;

use crate::chunkmap::ChunkMap;
use crate::dirindex::{lock, shard_of, DirIndex};
use crate::usage::Usage;
use crate::{Chunk, MetaFn, Result, Store, StoreError, StoreStats};

const SHARDS: usize = 64;

type Chunks = ChunkMap<Held>;

/// A chunk as held here: its bytes in a shared buffer, so that a read can
/// hand out a slice (a write to a chunk someone still reads copies it
/// first).
struct Held {
    meta: Meta,
    data: Bytes,
}

/// The DRAM engine. Data is lost when the server stops.
pub struct MemStore {
    files: Vec<crate::dirindex::Shard<HashMap<String, Chunks>>>,
    dirs: DirIndex,
    entries: crate::usage::Striped,
    usage: Usage,
}

impl MemStore {
    /// A store holding at most `capacity` bytes of chunk data (0 = no limit
    /// but memory).
    pub fn new(capacity: u64) -> Self {
        Self {
            files: (0..SHARDS)
                .map(|_| crate::dirindex::Shard::new(HashMap::new()))
                .collect(),
            dirs: DirIndex::new(),
            entries: crate::usage::Striped::new(0),
            usage: Usage::new(capacity, 0),
        }
    }

    fn files(&self, path: &str) -> MutexGuard<'_, HashMap<String, Chunks>> {
        lock(&self.files[shard_of(path, SHARDS)])
    }

    fn write_src(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: Src<'_>,
        template: &Meta,
    ) -> Result<()> {
        let end = off as usize + data.len();
        let mut files = self.files(path);
        if idx == 0 {
            let c = files
                .get_mut(path)
                .and_then(|c| c.get_mut(&0))
                .ok_or(StoreError::NotFound)?;
            let old = c.data.len();
            if end > old {
                self.usage.reserve((end - old) as u64)?;
            }
            data.put(&mut c.data, off as usize);
            c.meta.size = c.meta.size.max(end as u64);
            c.meta.mtime = template.mtime;
            c.meta.ctime = template.mtime;
            return Ok(());
        }
        let chunks = files.entry(path.to_string()).or_default();
        match chunks.get_mut(&idx) {
            Some(c) if c.meta.fileid == template.fileid => {
                let old = c.data.len();
                if end > old {
                    self.usage.reserve((end - old) as u64)?;
                }
                data.put(&mut c.data, off as usize);
            }
            existing => {
                let old = existing.as_ref().map_or(0, |c| c.data.len() as u64);
                if end as u64 > old {
                    self.usage.reserve(end as u64 - old)?;
                } else {
                    self.usage.release(old - end as u64);
                }
                let fresh = Held {
                    meta: *template,
                    data: data.fresh(off as usize),
                };
                match existing {
                    Some(c) => *c = fresh,
                    None => {
                        chunks.insert(idx, fresh);
                        self.entries.add(1);
                    }
                }
            }
        }
        Ok(())
    }

    fn dropped(&self, chunk: &Held) {
        self.usage.release(chunk.data.len() as u64);
        self.entries.sub(1);
    }
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Store for MemStore {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn create(&self, path: &str, meta: Meta, data: &[u8], excl: bool) -> Result<(Meta, bool)> {
        let mut files = self.files(path);
        let chunks = files.entry(path.to_string()).or_default();
        if let Some(c) = chunks.get(&0) {
            return if excl {
                Err(StoreError::Exists(c.meta))
            } else {
                Ok((c.meta, false))
            };
        }
        self.usage.reserve(data.len() as u64)?;
        chunks.insert(
            0,
            Held {
                meta,
                data: Bytes::copy_from_slice(data),
            },
        );
        self.entries.add(1);
        drop(files);
        self.dirs.add(path);
        Ok((meta, true))
    }

    fn meta(&self, path: &str, idx: u64) -> Result<Option<Meta>> {
        Ok(self
            .files(path)
            .get(path)
            .and_then(|c| c.get(&idx))
            .map(|c| c.meta))
    }

    fn write(&self, path: &str, idx: u64, off: u32, data: &[u8], template: &Meta) -> Result<()> {
        self.write_src(path, idx, off, Src::Copy(data), template)
    }

    fn write_bytes(
        &self,
        path: &str,
        idx: u64,
        off: u32,
        data: Bytes,
        template: &Meta,
    ) -> Result<()> {
        self.write_src(path, idx, off, Src::Own(data), template)
    }

    fn read(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self.read_bytes(path, idx, fileid, off, len)?.map(Vec::from))
    }

    fn read_bytes(
        &self,
        path: &str,
        idx: u64,
        fileid: u32,
        off: u32,
        len: u32,
    ) -> Result<Option<Bytes>> {
        let files = self.files(path);
        let Some(c) = files.get(path).and_then(|c| c.get(&idx)) else {
            return Ok(None);
        };
        if idx > 0 && c.meta.fileid != fileid {
            return Ok(None);
        }
        let start = (off as usize).min(c.data.len());
        let end = (off as usize + len as usize).min(c.data.len());
        Ok(Some(c.data.slice(start..end)))
    }

    fn update_meta(&self, path: &str, idx: u64, f: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let c = files
            .get_mut(path)
            .and_then(|c| c.get_mut(&idx))
            .ok_or(StoreError::NotFound)?;
        let mut m = c.meta;
        f(&mut m)?;
        c.meta = m;
        Ok(m)
    }

    fn remove(&self, path: &str, idx: u64, check: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let chunks = files.get_mut(path).ok_or(StoreError::NotFound)?;
        let c = chunks.get_mut(&idx).ok_or(StoreError::NotFound)?;
        let mut m = c.meta;
        check(&mut m)?;
        let chunk = chunks.remove(&idx).ok_or(StoreError::NotFound)?;
        if chunks.is_empty() {
            files.remove(path);
        }
        drop(files);
        self.dropped(&chunk);
        if idx == 0 {
            self.dirs.remove(path);
        }
        Ok(chunk.meta)
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
        drop(files);
        for c in gone.values() {
            self.dropped(c);
        }
        if from_idx == 0 && gone.contains_key(&0) {
            self.dirs.remove(path);
        }
        Ok(gone.len() as u64)
    }

    fn truncate_chunk(&self, path: &str, idx: u64, len: u32) -> Result<()> {
        let mut files = self.files(path);
        if let Some(c) = files.get_mut(path).and_then(|c| c.get_mut(&idx)) {
            let len = len as usize;
            if c.data.len() > len {
                self.usage.release((c.data.len() - len) as u64);
                c.data.truncate(len);
            }
        }
        Ok(())
    }

    fn chunk_indices(&self, path: &str) -> Result<Vec<u64>> {
        Ok(self
            .files(path)
            .get(path)
            .map(|c| c.keys().copied().collect())
            .unwrap_or_default())
    }

    fn list_dir(&self, dir: &str, after: &str, max: usize) -> Result<(Vec<(String, Meta)>, bool)> {
        let names = self.dirs.names(dir, after, max);
        let done = names.len() <= max;
        let mut out = Vec::with_capacity(names.len().min(max));
        for name in names.into_iter().take(max) {
            let path = chfs_proto::path::join(dir, &name);
            if let Some(m) = self.meta(&path, 0)? {
                out.push((name, m));
            }
        }
        Ok((out, done))
    }

    fn has_children(&self, dir: &str) -> Result<bool> {
        Ok(self.dirs.has_children(dir))
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
        let c = chunks.remove(&idx);
        if chunks.is_empty() {
            files.remove(path);
        }
        drop(files);
        if let Some(c) = &c {
            self.dropped(c);
            if idx == 0 {
                self.dirs.remove(path);
            }
        }
        Ok(c.map(|c| Chunk {
            meta: c.meta,
            data: Vec::from(c.data),
        }))
    }

    fn put(&self, path: &str, idx: u64, chunk: Chunk) -> Result<()> {
        let mut files = self.files(path);
        let chunks = files.entry(path.to_string()).or_default();
        let old = chunks.get(&idx).map_or(0, |c| c.data.len() as u64);
        let new = chunk.data.len() as u64;
        if new > old {
            self.usage.reserve(new - old)?;
        } else {
            self.usage.release(old - new);
        }
        let held = Held {
            meta: chunk.meta,
            data: Bytes::from(chunk.data),
        };
        if chunks.insert(idx, held).is_none() {
            self.entries.add(1);
        }
        drop(files);
        if idx == 0 {
            self.dirs.add(path);
        }
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.entries.get(),
            bytes: self.usage.bytes(),
            capacity: self.usage.capacity(),
        }
    }
}

/// Data of a write: borrowed (copied in) or a buffer to keep when it makes
/// up a chunk's whole data.
enum Src<'a> {
    Copy(&'a [u8]),
    Own(bytes::Bytes),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Copy(d) => d.len(),
            Src::Own(b) => b.len(),
        }
    }

    /// Writes these bytes at `off` of `data` (see [`put`]), or replaces
    /// `data` with the buffer when it covers all of it from offset 0. The
    /// chunk's buffer is changed in place unless a reader still holds a
    /// slice of it (then it is copied first).
    fn put(self, data: &mut Bytes, off: usize) {
        match self {
            Src::Own(b) if off == 0 && b.len() >= data.len() => *data = b,
            Src::Own(b) => put_shared(data, off, &b),
            Src::Copy(d) => put_shared(data, off, d),
        }
    }

    /// The data of a fresh chunk holding these bytes at `off`.
    fn fresh(self, off: usize) -> Bytes {
        match self {
            // The buffer itself, when it starts with the data.
            Src::Own(b) if off == 0 => b,
            s => {
                let mut buf = Bytes::new();
                s.put(&mut buf, off);
                buf
            }
        }
    }
}

/// [`put`] into a chunk's shared buffer: in place when nobody else holds
/// it, else into a copy.
fn put_shared(data: &mut Bytes, off: usize, src: &[u8]) {
    let mut v = Vec::from(std::mem::take(data));
    put(&mut v, off, src);
    *data = Bytes::from(v);
}

/// Writes `src` at `off` of `data`, growing it (zero-filled gap) as needed;
/// bytes written over are not zeroed first.
fn put(data: &mut Vec<u8>, off: usize, src: &[u8]) {
    let end = off + src.len();
    if off >= data.len() {
        data.resize(off, 0);
        data.extend_from_slice(src);
    } else {
        let overlap = end.min(data.len());
        data[off..overlap].copy_from_slice(&src[..overlap - off]);
        data.extend_from_slice(&src[overlap - off..]);
    }
}

#[cfg(test)]
mod put_tests {
    use super::put;

    #[test]
    fn put_overwrites_extends_and_zero_fills() {
        let mut d = Vec::new();
        put(&mut d, 3, b"ab");
        assert_eq!(d, b"\0\0\0ab");
        put(&mut d, 1, b"xy");
        assert_eq!(d, b"\0xyab");
        put(&mut d, 4, b"123");
        assert_eq!(d, b"\0xya123");
        put(&mut d, 0, b"Z");
        assert_eq!(d, b"Zxya123");
        put(&mut d, 7, b"!");
        assert_eq!(d, b"Zxya123!");
    }
}
