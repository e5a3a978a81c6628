//! POSIX engine: one file per chunk under a scratch directory on a local
//! file system (NVMe SSD), with the chunk's header kept in the file, so a
//! restart rebuilds the whole index by reading the directory.
//!
//! # Layout
//!
//! ```text
//! DIR/chfs-posix.sb          superblock: "CHFSPOSX", version, uuid, crc
//! DIR/XX/NNNNNNNNNNNNNNNN    one chunk; NNNN a unique 64-bit id (hex),
//!                            XX its low byte
//! chunk file: slot 0 at 0, slot 1 at 512 (different sectors), the path at
//! 1024, the data at 8192 (page aligned, so chunk-sized I/O is aligned)
//! ```
//!
//! Slots are those of [`crate::record`]. The same rules as the pmem engine
//! keep every version valid: appends write past the current length and
//! then the other slot; overwrites and replacements write a new file (a new
//! id, higher `seq`) and unlink the old one afterwards (after an `fsync` of
//! the new file when the old one was already durable). At open, two files
//! for one key: the later intact one wins.
//!
//! Memory stays flat whatever the data volume: data goes from the request
//! buffer straight to `pwrite`; copies (copy-on-write, checksum
//! recomputation) use one fixed 1 MiB buffer per operation; the in-memory
//! index holds about 150 bytes per chunk plus its path.
//!
//! Durability: [`Store::sync`] fsyncs every chunk file changed since the
//! last sync and the directories whose entries changed.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;

use crate::usage::Usage;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use chfs_proto::path::is_within;
use chfs_proto::Meta;

use crate::chunkmap::ChunkMap;
use crate::crc::{crc32c, crc32c_append, crc32c_zeros};
use crate::dirindex::{lock, shard_of, DirIndex};
use crate::record::{new_uuid, Slot, MAX_SEQ, SLOT_LEN};
use crate::{Chunk, MetaFn, Result, Store, StoreError, StoreStats};

/// Superblock file name.
pub const POSIX_SUPER: &str = "chfs-posix.sb";
/// Superblock magic.
pub const POSIX_MAGIC: &[u8; 8] = b"CHFSPOSX";
/// Format version.
pub const POSIX_VERSION: u32 = 1;
/// Offset of slot `n` in a chunk file.
pub const fn slot_off(n: u8) -> u64 {
    n as u64 * 512
}
/// Offset of the path in a chunk file.
pub const PATH_OFF: u64 = 1024;
/// Offset of the data in a chunk file.
pub const DATA_OFF: u64 = 8192;
/// Size of the copy buffer.
const BUF: usize = 1 << 20;
const SHARDS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct PRec {
    id: u64,
    len: u64,
    crc: u32,
    meta: Meta,
    seq: u64,
    slot: u8,
    /// Dirty epoch of the last change (durable when < synced epoch).
    epoch: u64,
    corrupt: bool,
}

type Chunks = ChunkMap<PRec>;

#[derive(Default)]
struct Dirty {
    epoch: u64,
    files: HashSet<u64>,
    dirs: HashSet<u8>,
}

/// What opening a POSIX store found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PosixReport {
    /// Chunk files indexed.
    pub records: u64,
    /// Files whose data failed its checksum (read as EIO).
    pub corrupt: u64,
    /// Older versions found and removed (interrupted replacement).
    pub superseded: u64,
    /// Files without a valid header (never published), removed.
    pub unreadable: u64,
    /// Whether the store was created by this open.
    pub created: bool,
}

/// The POSIX engine. See the module documentation.
pub struct PosixStore {
    root: PathBuf,
    uuid: u64,
    files: Vec<crate::dirindex::Shard<HashMap<String, Chunks>>>,
    dirs: DirIndex,
    next_id: AtomicU64,
    seq: AtomicU64,
    dirty: Mutex<Dirty>,
    synced: AtomicU64,
    entries: AtomicU64,
    usage: Usage,
    report: PosixReport,
}

fn corrupt(msg: impl Into<String>) -> StoreError {
    StoreError::Corrupt(msg.into())
}

fn encode_super(uuid: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(POSIX_MAGIC);
    b[8..12].copy_from_slice(&POSIX_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&uuid.to_le_bytes());
    let c = crc32c(&b[..40]);
    b[40..44].copy_from_slice(&c.to_le_bytes());
    b
}

/// Does store directory `root` hold chunk files (in its two-hex-digit
/// subdirectories)?
fn holds_chunk_files(root: &Path) -> Result<bool> {
    for d in std::fs::read_dir(root)? {
        let d = d?;
        let name = d.file_name();
        let is_bucket = name
            .to_str()
            .is_some_and(|n| n.len() == 2 && u8::from_str_radix(n, 16).is_ok());
        if is_bucket && d.file_type()?.is_dir() && std::fs::read_dir(d.path())?.next().is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Reads the superblock of a POSIX store directory; returns its uuid.
pub fn read_posix_super(root: &Path) -> Result<u64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = root.join(POSIX_SUPER);
    // Non-blocking: opening a FIFO in its place must not wait for a writer.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)?;
    if !f.metadata()?.is_file() {
        return Err(StoreError::refused(
            libc::EINVAL,
            format!("{}: not a regular file", path.display()),
        ));
    }
    // Only the first 64 bytes: whatever else the file has grown is not read
    // (a damaged file may be huge).
    let mut b = Vec::with_capacity(64);
    f.take(64).read_to_end(&mut b)?;
    if b.len() < 64 || &b[0..8] != POSIX_MAGIC {
        return Err(StoreError::refused(
            libc::EINVAL,
            format!("{}: not a chfs posix store", root.display()),
        ));
    }
    let c = u32::from_le_bytes([b[40], b[41], b[42], b[43]]);
    if crc32c(&b[..40]) != c {
        return Err(corrupt("posix superblock checksum mismatch"));
    }
    let v = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if v != POSIX_VERSION {
        return Err(StoreError::refused(
            libc::EINVAL,
            format!("posix store format version {v}, this build reads {POSIX_VERSION}"),
        ));
    }
    let mut u = [0u8; 8];
    u.copy_from_slice(&b[16..24]);
    Ok(u64::from_le_bytes(u))
}

/// Path of chunk file `id` under `root`.
pub fn chunk_file(root: &Path, id: u64) -> PathBuf {
    root.join(format!("{:02x}", id & 0xff))
        .join(format!("{id:016x}"))
}

/// One chunk file as decoded by [`read_chunk_file`].
#[derive(Debug, Clone)]
pub struct ChunkFile {
    /// Valid slots, latest first.
    pub slots: Vec<(u8, Slot)>,
    /// Path stored in the file (when its checksum matched).
    pub path: Option<String>,
    /// Slot whose data checksum matches, if any.
    pub good_slot: Option<u8>,
    /// File length.
    pub file_len: u64,
}

/// CRC of `len` bytes of `f` from `off`, through a fixed buffer.
fn file_crc(f: &File, off: u64, len: u64, mut crc: u32, buf: &mut [u8]) -> io::Result<u32> {
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(buf.len());
        let got = f.read_at(&mut buf[..n], off + done)?;
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short chunk file",
            ));
        }
        crc = crc32c_append(crc, &buf[..got]);
        done += got as u64;
    }
    Ok(crc)
}

/// Decodes a chunk file's headers and verifies its data checksum.
pub fn read_chunk_file(f: &File, uuid: u64) -> io::Result<ChunkFile> {
    let file_len = f.metadata()?.len();
    let mut slots = Vec::new();
    for n in 0..2u8 {
        let mut b = [0u8; SLOT_LEN];
        if f.read_exact_at(&mut b, slot_off(n)).is_ok() {
            if let Some(s) = Slot::decode(&b)
                .filter(|s| s.uuid == uuid && (s.path_len as usize) <= chfs_proto::path::MAX_PATH)
            {
                slots.push((n, s));
            }
        }
    }
    slots.sort_by_key(|(_, s)| std::cmp::Reverse(s.seq));
    let mut out = ChunkFile {
        slots,
        path: None,
        good_slot: None,
        file_len,
    };
    let Some((_, first)) = out.slots.first().copied() else {
        return Ok(out);
    };
    let mut pb = vec![0u8; first.path_len as usize];
    if f.read_exact_at(&mut pb, PATH_OFF).is_ok() && crc32c(&pb) == first.path_crc {
        out.path = String::from_utf8(pb).ok();
    }
    let mut buf = vec![0u8; BUF.min(file_len as usize).max(1)];
    for (n, s) in &out.slots {
        if s.path_len != first.path_len || s.idx != first.idx {
            continue;
        }
        if DATA_OFF + s.data_len as u64 > file_len.max(DATA_OFF) && s.data_len > 0 {
            continue;
        }
        if let Ok(c) = file_crc(f, DATA_OFF, s.data_len as u64, 0, &mut buf) {
            if c == s.data_crc {
                out.good_slot = Some(*n);
                break;
            }
        }
    }
    Ok(out)
}

enum Part<'a> {
    Bytes(&'a [u8]),
    Zero(u64),
    /// Copy from the old file: (offset within its data, length).
    Copy(u64, u64),
}

impl Part<'_> {
    fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::Zero(n) | Part::Copy(_, n) => *n,
        }
    }
}

impl PosixStore {
    /// Opens (creating when needed) the store in directory `root`, holding
    /// at most `capacity` bytes of chunk data (0 = as much as the file
    /// system holds), and rebuilds its index from the chunk files.
    pub fn open(root: &Path, capacity: u64) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let sb = root.join(POSIX_SUPER);
        let created = !sb.exists();
        if created && holds_chunk_files(root)? {
            // The superblock was lost: a new store id would make every
            // chunk file foreign, and recovery would delete them all.
            return Err(StoreError::refused(
                libc::EIO,
                format!(
                    "{}: chunk files but no {POSIX_SUPER}: not starting an empty store over them (remove the directory to start empty)",
                    root.display()
                ),
            ));
        }
        if created {
            let tmp = root.join(format!("{POSIX_SUPER}.tmp"));
            let f = File::create(&tmp)?;
            f.write_all_at(&encode_super(new_uuid()), 0)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &sb)?;
            File::open(root)?.sync_all()?;
        }
        let uuid = read_posix_super(root)?;
        let mut s = Self {
            root: root.to_path_buf(),
            uuid,
            files: (0..SHARDS)
                .map(|_| crate::dirindex::Shard::new(HashMap::new()))
                .collect(),
            dirs: DirIndex::new(),
            next_id: AtomicU64::new(1),
            seq: AtomicU64::new(1),
            dirty: Mutex::new(Dirty {
                epoch: 1,
                ..Default::default()
            }),
            synced: AtomicU64::new(1),
            entries: AtomicU64::new(0),
            usage: Usage::new(capacity, 0),
            report: PosixReport {
                created,
                ..Default::default()
            },
        };
        s.recover()?;
        Ok(s)
    }

    /// What the last open found.
    pub fn recovery(&self) -> &PosixReport {
        &self.report
    }

    fn recover(&mut self) -> Result<()> {
        let mut max_id = 0u64;
        let mut max_seq = 0u64;
        let mut report = std::mem::take(&mut self.report);
        let mut losers: Vec<u64> = Vec::new();
        for d in std::fs::read_dir(&self.root)? {
            let d = d?;
            let name = d.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.len() != 2 || u8::from_str_radix(name, 16).is_err() || !d.file_type()?.is_dir()
            {
                continue;
            }
            for e in std::fs::read_dir(d.path())? {
                let e = e?;
                let fname = e.file_name();
                let Some(id) = fname
                    .to_str()
                    .filter(|n| n.len() == 16)
                    .and_then(|n| u64::from_str_radix(n, 16).ok())
                    .filter(|id| format!("{:02x}", id & 0xff) == name)
                else {
                    continue;
                };
                max_id = max_id.max(id);
                let f = OpenOptions::new().read(true).write(true).open(e.path())?;
                let cf = read_chunk_file(&f, self.uuid)?;
                let (Some(path), Some((_, top))) = (cf.path.clone(), cf.slots.first().copied())
                else {
                    report.unreadable += 1;
                    std::fs::remove_file(e.path())?;
                    continue;
                };
                max_seq = max_seq.max(top.seq);
                let (n, s, bad) = match cf.good_slot {
                    Some(g) => {
                        let s = cf
                            .slots
                            .iter()
                            .find(|(n, _)| *n == g)
                            .map(|x| x.1)
                            .unwrap_or(top);
                        (g, s, false)
                    }
                    None => (cf.slots[0].0, top, true),
                };
                if !bad && cf.file_len > DATA_OFF + s.data_len as u64 {
                    // Bytes of an interrupted append past the valid length.
                    f.set_len((DATA_OFF + s.data_len as u64).max(PATH_OFF + s.path_len as u64))?;
                }
                let rec = PRec {
                    id,
                    len: s.data_len as u64,
                    crc: s.data_crc,
                    meta: s.meta,
                    seq: s.seq,
                    slot: n,
                    epoch: 0,
                    corrupt: bad,
                };
                let shard = self.files[shard_of(&path, SHARDS)]
                    .get_mut()
                    .unwrap_or_else(|p| p.into_inner());
                let chunks = shard.entry(path).or_default();
                match chunks.get(&s.idx) {
                    Some(old) if better(old, &rec) => losers.push(id),
                    Some(old) => {
                        losers.push(old.id);
                        chunks.insert(s.idx, rec);
                    }
                    None => {
                        chunks.insert(s.idx, rec);
                    }
                }
            }
        }
        report.superseded = losers.len() as u64;
        for id in losers {
            std::fs::remove_file(chunk_file(&self.root, id))?;
        }
        let (mut entries, mut bytes) = (0, 0);
        for sh in &self.files {
            for (path, chunks) in lock(sh).iter() {
                for (idx, r) in chunks.iter() {
                    entries += 1;
                    bytes += r.len;
                    report.corrupt += r.corrupt as u64;
                    if *idx == 0 {
                        self.dirs.add(path);
                    }
                }
            }
        }
        report.records = entries;
        self.entries = AtomicU64::new(entries);
        self.usage = Usage::new(self.usage.capacity(), bytes);
        // Ids come from file names, and a foreign file may take the last
        // one: ids then start again from 0 (creating a file never replaces
        // one, so a taken id is an error, not a lost chunk).
        self.next_id = AtomicU64::new(max_id.wrapping_add(1));
        self.seq = AtomicU64::new(max_seq + 1);
        self.report = report;
        Ok(())
    }

    fn files(&self, path: &str) -> MutexGuard<'_, HashMap<String, Chunks>> {
        lock(&self.files[shard_of(path, SHARDS)])
    }

    fn mark(&self, id: u64, dir_changed: bool) -> u64 {
        let mut d = lock(&self.dirty);
        d.files.insert(id);
        if dir_changed {
            d.dirs.insert((id & 0xff) as u8);
        }
        d.epoch
    }

    fn durable(&self, r: &PRec) -> bool {
        r.epoch < self.synced.load(Ordering::Acquire)
    }

    fn open_chunk(&self, id: u64) -> Result<File> {
        Ok(OpenOptions::new()
            .read(true)
            .write(true)
            .open(chunk_file(&self.root, id))?)
    }

    fn write_slot(&self, f: &File, r: &mut PRec, path: &str, idx: u64, n: u8) -> Result<()> {
        r.seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if r.seq > MAX_SEQ {
            // Only after a damaged or forged slot: no reader would accept
            // this one, so the change would be lost at the next open.
            return Err(corrupt(format!(
                "{path} chunk {idx}: sequence numbers exhausted"
            )));
        }
        let s = Slot {
            seq: r.seq,
            uuid: self.uuid,
            idx,
            data_len: r.len as u32,
            data_crc: r.crc,
            path_len: path.len() as u32,
            path_crc: crc32c(path.as_bytes()),
            meta: r.meta,
        };
        hook::write_at(f, &s.encode(), slot_off(n))?;
        r.slot = n;
        Ok(())
    }

    /// Writes a new chunk file for a key (data from `parts`, copies from
    /// `old`'s file). Space accounting is the caller's.
    fn new_file(
        &self,
        path: &str,
        idx: u64,
        meta: Meta,
        parts: &[Part<'_>],
        old: Option<&PRec>,
    ) -> Result<PRec> {
        let len: u64 = parts.iter().map(Part::len).sum();
        if len > u32::MAX as u64 {
            return Err(StoreError::refused(libc::EFBIG, "chunk too large"));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let fp = chunk_file(&self.root, id);
        hook::gate()?;
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&fp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(fp.parent().unwrap_or(&self.root))?;
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&fp)?
            }
            Err(e) => return Err(e.into()),
        };
        let result = (|| -> Result<PRec> {
            hook::write_at(&f, path.as_bytes(), PATH_OFF)?;
            let old_f = match old {
                Some(o) if parts.iter().any(|p| matches!(p, Part::Copy(..))) => {
                    Some(self.open_chunk(o.id)?)
                }
                _ => None,
            };
            let mut buf = Vec::new();
            let mut pos = 0u64;
            let mut crc = 0u32;
            for p in parts {
                match *p {
                    Part::Bytes(b) => {
                        hook::write_at(&f, b, DATA_OFF + pos)?;
                        crc = crc32c_append(crc, b);
                    }
                    Part::Zero(n) => {
                        // A hole: reads as zeros, costs no space.
                        crc = crc32c_zeros(crc, n);
                    }
                    Part::Copy(src, n) => {
                        let of = old_f.as_ref().ok_or(StoreError::NotFound)?;
                        if buf.is_empty() {
                            buf = vec![0u8; BUF];
                        }
                        let mut done = 0u64;
                        while done < n {
                            let k = ((n - done) as usize).min(BUF);
                            of.read_exact_at(&mut buf[..k], DATA_OFF + src + done)?;
                            hook::write_at(&f, &buf[..k], DATA_OFF + pos + done)?;
                            crc = crc32c_append(crc, &buf[..k]);
                            done += k as u64;
                        }
                    }
                }
                pos += p.len();
            }
            if len > 0 {
                hook::set_len(&f, DATA_OFF + len)?;
            }
            let mut r = PRec {
                id,
                len,
                crc,
                meta,
                seq: 0,
                slot: 0,
                epoch: 0,
                corrupt: false,
            };
            self.write_slot(&f, &mut r, path, idx, 0)?;
            if old.is_some_and(|o| self.durable(o)) {
                // The old version is durable: the new one must be before
                // the old one goes.
                f.sync_all()?;
            }
            r.epoch = self.mark(id, true);
            Ok(r)
        })();
        if result.is_err() {
            let _ = hook::remove(&fp);
        }
        result
    }

    fn unlink(&self, id: u64) -> Result<()> {
        lock(&self.dirty).dirs.insert((id & 0xff) as u8);
        match hook::remove(&chunk_file(&self.root, id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Accounts a chunk changing from `old` to `new` bytes.
    fn reserve_delta(&self, old: u64, new: u64) -> Result<()> {
        if new > old {
            self.usage.reserve(new - old)
        } else {
            self.usage.release(old - new);
            Ok(())
        }
    }

    /// Undoes [`Self::reserve_delta`].
    fn undo_delta(&self, old: u64, new: u64) {
        if new > old {
            self.usage.release(new - old);
        } else {
            self.usage.reserve_unchecked(old - new);
        }
    }

    /// Installs `rec` for a key (space already accounted), removing the
    /// version it replaces.
    fn replace(&self, chunks: &mut Chunks, idx: u64, rec: PRec) -> Result<()> {
        match chunks.insert(idx, rec) {
            Some(old) => self.unlink(old.id),
            None => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn drop_rec(&self, r: &PRec) -> Result<()> {
        self.usage.release(r.len);
        self.entries.fetch_sub(1, Ordering::Relaxed);
        self.unlink(r.id)
    }

    /// A whole new version from parts, with space accounting.
    fn new_version(
        &self,
        chunks: &mut Chunks,
        path: &str,
        idx: u64,
        meta: Meta,
        parts: &[Part<'_>],
    ) -> Result<()> {
        let len: u64 = parts.iter().map(Part::len).sum();
        let old = chunks.get(&idx).copied();
        let old_len = old.map_or(0, |o| o.len);
        self.reserve_delta(old_len, len)?;
        match self.new_file(path, idx, meta, parts, old.as_ref()) {
            Ok(rec) => self.replace(chunks, idx, rec),
            Err(e) => {
                self.undo_delta(old_len, len);
                Err(e)
            }
        }
    }

    fn write_into(
        &self,
        chunks: &mut Chunks,
        path: &str,
        idx: u64,
        off: u64,
        data: &[u8],
        meta: Meta,
    ) -> Result<()> {
        let r = *chunks.get(&idx).ok_or(StoreError::NotFound)?;
        if r.corrupt {
            return Err(corrupt(format!(
                "{path} chunk {idx}: data checksum mismatch"
            )));
        }
        let end = off + data.len() as u64;
        if off >= r.len {
            // Append: bytes past the current length, then the other slot.
            self.usage.reserve(end - r.len)?;
            let res = (|| -> Result<PRec> {
                let f = self.open_chunk(r.id)?;
                hook::write_at(&f, data, DATA_OFF + off)?;
                if data.is_empty() && end > r.len {
                    hook::set_len(&f, DATA_OFF + end)?;
                }
                let mut next = r;
                next.crc = crc32c_append(crc32c_zeros(r.crc, off - r.len), data);
                next.len = end;
                next.meta = meta;
                self.write_slot(&f, &mut next, path, idx, 1 - r.slot)?;
                next.epoch = self.mark(r.id, false);
                Ok(next)
            })();
            return match res {
                Ok(next) => {
                    chunks.insert(idx, next);
                    Ok(())
                }
                Err(e) => {
                    self.usage.release(end - r.len);
                    Err(e)
                }
            };
        }
        // Overwrite: copy-on-write into a new file.
        let new_len = end.max(r.len);
        let mut parts = vec![Part::Copy(0, off), Part::Bytes(data)];
        if end < r.len {
            parts.push(Part::Copy(end, r.len - end));
        }
        self.reserve_delta(r.len, new_len)?;
        match self.new_file(path, idx, meta, &parts, Some(&r)) {
            Ok(rec) => self.replace(chunks, idx, rec),
            Err(e) => {
                self.undo_delta(r.len, new_len);
                Err(e)
            }
        }
    }

    fn read_rec(&self, r: &PRec, off: u64, len: u64) -> Result<Vec<u8>> {
        let start = off.min(r.len);
        let end = off.saturating_add(len).min(r.len);
        let mut v = vec![0u8; (end - start) as usize];
        if !v.is_empty() {
            let f = File::open(chunk_file(&self.root, r.id))?;
            f.read_exact_at(&mut v, DATA_OFF + start)?;
        }
        Ok(v)
    }
}

/// Every change a running store makes to its files goes through here, so
/// tests can stop the "process" at any of them: the write in flight lands
/// partially (a random prefix) and nothing after it reaches the files, as
/// when `chfsd` is killed.
mod hook {
    use std::fs::File;
    use std::io;
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    #[cfg(test)]
    fn killed() -> io::Error {
        io::Error::other("injected crash")
    }

    /// Before creating a file.
    pub fn gate() -> io::Result<()> {
        #[cfg(test)]
        if fault::step().is_some() {
            return Err(killed());
        }
        Ok(())
    }

    pub fn write_at(f: &File, buf: &[u8], off: u64) -> io::Result<()> {
        #[cfg(test)]
        if let Some(torn) = fault::step() {
            if torn && !buf.is_empty() {
                let n = (fault::rnd() % buf.len() as u64) as usize;
                f.write_all_at(&buf[..n], off)?;
            }
            return Err(killed());
        }
        f.write_all_at(buf, off)
    }

    pub fn set_len(f: &File, len: u64) -> io::Result<()> {
        #[cfg(test)]
        if let Some(torn) = fault::step() {
            if torn && fault::rnd() & 1 == 0 {
                f.set_len(len)?;
            }
            return Err(killed());
        }
        f.set_len(len)
    }

    pub fn remove(p: &Path) -> io::Result<()> {
        #[cfg(test)]
        if let Some(torn) = fault::step() {
            if torn && fault::rnd() & 1 == 0 {
                std::fs::remove_file(p)?;
            }
            return Err(killed());
        }
        std::fs::remove_file(p)
    }

    #[cfg(test)]
    pub(crate) mod fault {
        use std::cell::Cell;

        thread_local! {
            /// Mutations left before the crash (0 = no crash planned).
            pub static LEFT: Cell<u64> = const { Cell::new(0) };
            /// The process is "dead": no mutation reaches the files.
            pub static DEAD: Cell<bool> = const { Cell::new(false) };
            static RNG: Cell<u64> = const { Cell::new(0x2545_F491_4F6C_DD1D) };
        }

        /// Plans a crash at the `n`-th mutation from now on this thread.
        pub fn plan(n: u64, seed: u64) {
            LEFT.with(|c| c.set(n));
            DEAD.with(|c| c.set(false));
            RNG.with(|c| c.set(seed | 1));
        }

        /// Ends the crash simulation on this thread.
        pub fn clear() {
            LEFT.with(|c| c.set(0));
            DEAD.with(|c| c.set(false));
        }

        pub fn dead() -> bool {
            DEAD.with(Cell::get)
        }

        pub fn rnd() -> u64 {
            RNG.with(|c| {
                let mut x = c.get();
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.set(x);
                x
            })
        }

        /// `None`: proceed; `Some(torn)`: this is the crash point (or after).
        pub fn step() -> Option<bool> {
            if dead() {
                return Some(false);
            }
            let left = LEFT.with(Cell::get);
            if left == 0 {
                return None;
            }
            LEFT.with(|c| c.set(left - 1));
            if left == 1 {
                DEAD.with(|c| c.set(true));
                return Some(true);
            }
            None
        }
    }
}

#[cfg(test)]
pub(crate) use hook::fault;

/// Is the indexed `old` version better than `new`?
fn better(old: &PRec, new: &PRec) -> bool {
    match (old.corrupt, new.corrupt) {
        (false, true) => true,
        (true, false) => false,
        _ => old.seq > new.seq,
    }
}

impl Store for PosixStore {
    fn name(&self) -> &'static str {
        "posix"
    }

    fn create(&self, path: &str, meta: Meta, data: &[u8], excl: bool) -> Result<(Meta, bool)> {
        let mut files = self.files(path);
        if let Some(r) = files.get(path).and_then(|c| c.get(&0)) {
            return if excl {
                Err(StoreError::Exists(r.meta))
            } else {
                Ok((r.meta, false))
            };
        }
        let chunks = files.entry(path.to_string()).or_default();
        let r = self.new_version(chunks, path, 0, meta, &[Part::Bytes(data)]);
        if chunks.is_empty() {
            files.remove(path);
        }
        r?;
        drop(files);
        self.dirs.add(path);
        Ok((meta, true))
    }

    fn meta(&self, path: &str, idx: u64) -> Result<Option<Meta>> {
        Ok(self
            .files(path)
            .get(path)
            .and_then(|c| c.get(&idx))
            .map(|r| r.meta))
    }

    fn write(&self, path: &str, idx: u64, off: u32, data: &[u8], template: &Meta) -> Result<()> {
        let off = off as u64;
        let end = off + data.len() as u64;
        let mut files = self.files(path);
        if idx == 0 {
            let chunks = files.get_mut(path).ok_or(StoreError::NotFound)?;
            let r = chunks.get(&0).ok_or(StoreError::NotFound)?;
            let mut m = r.meta;
            m.size = m.size.max(end);
            m.mtime = template.mtime;
            m.ctime = template.mtime;
            return self.write_into(chunks, path, 0, off, data, m);
        }
        let chunks = files.entry(path.to_string()).or_default();
        let r = match chunks.get(&idx) {
            Some(r) if r.meta.fileid == template.fileid => {
                let m = r.meta;
                self.write_into(chunks, path, idx, off, data, m)
            }
            _ => self.new_version(
                chunks,
                path,
                idx,
                *template,
                &[Part::Zero(off), Part::Bytes(data)],
            ),
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
        let files = self.files(path);
        let Some(r) = files.get(path).and_then(|c| c.get(&idx)) else {
            return Ok(None);
        };
        if idx > 0 && r.meta.fileid != fileid {
            return Ok(None);
        }
        if r.corrupt {
            return Err(corrupt(format!(
                "{path} chunk {idx}: data checksum mismatch"
            )));
        }
        self.read_rec(r, off as u64, len as u64).map(Some)
    }

    fn update_meta(&self, path: &str, idx: u64, f: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let r = files
            .get_mut(path)
            .and_then(|c| c.get_mut(&idx))
            .ok_or(StoreError::NotFound)?;
        let mut m = r.meta;
        f(&mut m)?;
        if m != r.meta {
            let file = self.open_chunk(r.id)?;
            let mut next = *r;
            next.meta = m;
            self.write_slot(&file, &mut next, path, idx, 1 - r.slot)?;
            next.epoch = self.mark(r.id, false);
            *r = next;
        }
        Ok(m)
    }

    fn remove(&self, path: &str, idx: u64, check: MetaFn<'_>) -> Result<Meta> {
        let mut files = self.files(path);
        let chunks = files.get_mut(path).ok_or(StoreError::NotFound)?;
        let r = chunks.get(&idx).ok_or(StoreError::NotFound)?;
        let mut m = r.meta;
        check(&mut m)?;
        let r = chunks.remove(&idx).ok_or(StoreError::NotFound)?;
        if chunks.is_empty() {
            files.remove(path);
        }
        drop(files);
        if idx == 0 {
            self.dirs.remove(path);
        }
        self.drop_rec(&r)?;
        Ok(r.meta)
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
        if gone.contains_key(&0) {
            self.dirs.remove(path);
        }
        let mut first_err = None;
        for r in gone.values() {
            if let Err(e) = self.drop_rec(r) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(gone.len() as u64),
        }
    }

    fn truncate_chunk(&self, path: &str, idx: u64, len: u32) -> Result<()> {
        let len = len as u64;
        let mut files = self.files(path);
        let Some(chunks) = files.get_mut(path) else {
            return Ok(());
        };
        let Some(r) = chunks.get(&idx).copied() else {
            return Ok(());
        };
        if r.len <= len {
            return Ok(());
        }
        if r.corrupt {
            return Err(corrupt(format!(
                "{path} chunk {idx}: data checksum mismatch"
            )));
        }
        if self.durable(&r) {
            // Keep the durable version intact until the short one is.
            return self.new_version(chunks, path, idx, r.meta, &[Part::Copy(0, len)]);
        }
        let f = self.open_chunk(r.id)?;
        let mut buf = vec![0u8; BUF.min(len as usize).max(1)];
        let mut next = r;
        next.crc = file_crc(&f, DATA_OFF, len, 0, &mut buf)?;
        next.len = len;
        self.write_slot(&f, &mut next, path, idx, 1 - r.slot)?;
        hook::set_len(&f, (DATA_OFF + len).max(PATH_OFF + path.len() as u64))?;
        next.epoch = self.mark(r.id, false);
        self.usage.release(r.len - len);
        chunks.insert(idx, next);
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
        let Some(r) = chunks.get(&idx).copied() else {
            return Ok(None);
        };
        if r.corrupt {
            return Err(corrupt(format!(
                "{path} chunk {idx}: data checksum mismatch"
            )));
        }
        let data = self.read_rec(&r, 0, r.len)?;
        chunks.remove(&idx);
        if chunks.is_empty() {
            files.remove(path);
        }
        drop(files);
        if idx == 0 {
            self.dirs.remove(path);
        }
        self.drop_rec(&r)?;
        Ok(Some(Chunk { meta: r.meta, data }))
    }

    fn put(&self, path: &str, idx: u64, chunk: Chunk) -> Result<()> {
        let mut files = self.files(path);
        let chunks = files.entry(path.to_string()).or_default();
        let r = self.new_version(chunks, path, idx, chunk.meta, &[Part::Bytes(&chunk.data)]);
        if chunks.is_empty() {
            files.remove(path);
        }
        r?;
        drop(files);
        if idx == 0 {
            self.dirs.add(path);
        }
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.entries.load(Ordering::Relaxed),
            bytes: self.usage.bytes(),
            capacity: self.usage.capacity(),
        }
    }

    fn sync(&self) -> Result<()> {
        let (epoch, files, dirs) = {
            let mut d = lock(&self.dirty);
            let e = d.epoch;
            d.epoch += 1;
            (e, std::mem::take(&mut d.files), std::mem::take(&mut d.dirs))
        };
        let res = (|| -> Result<()> {
            for id in &files {
                match File::open(chunk_file(&self.root, *id)) {
                    Ok(f) => f.sync_data()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
            for d in &dirs {
                match File::open(self.root.join(format!("{d:02x}"))) {
                    Ok(f) => f.sync_all()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !dirs.is_empty() {
                File::open(&self.root)?.sync_all()?;
            }
            Ok(())
        })();
        match res {
            Ok(()) => {
                self.synced.fetch_max(epoch + 1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                // Not durable: put the work back for the next sync.
                let mut d = lock(&self.dirty);
                d.files.extend(files);
                d.dirs.extend(dirs);
                Err(e)
            }
        }
    }
}
