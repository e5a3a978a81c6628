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
//! The files of the latest chunks stay open (`OpenFiles`), so that a
//! chunk's next pieces, header changes and reads skip the open.
//!
//! Memory stays flat whatever the data volume: data goes from the request
//! buffer straight to `pwrite`; copies (copy-on-write, checksum
//! recomputation) use one fixed 1 MiB buffer per operation; the in-memory
//! index holds about 190-225 bytes per data chunk and 320-480 per entry
//! with a short path (its path and its name in the directory index included;
//! measured by `tests_persist::posix_index_memory_per_chunk`).
//!
//! Durability: [`crate::Store::sync`] fsyncs every chunk file changed since the
//! last sync and the directories whose entries changed.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chfs_proto::Meta;

use crate::crc::{crc32c, crc32c_append, crc32c_zeros};
use crate::dirindex::lock;
use crate::index::{parts_len, Dst, Found, Indexed, Medium, Part, Write};
use crate::record::{check_seq, new_uuid, Slot, SLOT_LEN};
use crate::usage::Usage;
use crate::{corrupt, Result, StoreError};

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

/// The calls the POSIX engine changes its chunk files with, as pmem's
/// [`crate::media::Media`] is its medium: [`OsFiles`] makes them, and
/// tests put a fault-injecting double in its place (`crate::fault`) that
/// fails or cuts any of them (the write in flight torn, nothing after it
/// reaching the files, as when `chfsd` is killed). Reads, `fsync` and the
/// superblock's creation go to the file system directly.
pub(crate) trait FileOps: Send + Sync + 'static {
    /// Creates chunk file `path`, which must not exist, and its directory
    /// when missing; open for reading and writing.
    fn create_new(&self, path: &Path) -> io::Result<File>;
    /// Writes all of `buf` at `off` of `f`.
    fn write_at(&self, f: &File, buf: &[u8], off: u64) -> io::Result<()>;
    /// Cuts or extends `f` to `len` bytes.
    fn set_len(&self, f: &File, len: u64) -> io::Result<()>;
    /// Unlinks file `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// [`FileOps`] on the file system.
pub(crate) struct OsFiles;

impl FileOps for OsFiles {
    fn create_new(&self, path: &Path) -> io::Result<File> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
        };
        match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                open()
            }
            r => r,
        }
    }

    fn write_at(&self, f: &File, buf: &[u8], off: u64) -> io::Result<()> {
        f.write_all_at(buf, off)
    }

    fn set_len(&self, f: &File, len: u64) -> io::Result<()> {
        f.set_len(len)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// Index entry of one chunk file.
#[derive(Debug, Clone, Copy)]
pub struct PRec {
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

/// The POSIX medium: a chunk file per record. See the module documentation.
pub struct Posix {
    root: PathBuf,
    files: Box<dyn FileOps>,
    open: OpenFiles,
    uuid: u64,
    next_id: AtomicU64,
    seq: AtomicU64,
    dirty: Mutex<Dirty>,
    synced: AtomicU64,
    report: PosixReport,
}

/// The POSIX engine. See the module documentation.
pub type PosixStore = Indexed<Posix>;

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
        if is_bucket(name.to_str().unwrap_or(""))
            && d.file_type()?.is_dir()
            && std::fs::read_dir(d.path())?.next().is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Is `name` one of the store's chunk subdirectories (two hex digits)?
fn is_bucket(name: &str) -> bool {
    name.len() == 2 && u8::from_str_radix(name, 16).is_ok()
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

crate::index::record_fields!(PRec);

impl PosixStore {
    /// Opens (creating when needed) the store in directory `root`, holding
    /// at most `capacity` bytes of chunk data (0 = as much as the file
    /// system holds), and rebuilds its index from the chunk files.
    pub fn open(root: &Path, capacity: u64) -> Result<Self> {
        Self::open_with(root, capacity, Box::new(OsFiles))
    }

    /// As [`PosixStore::open`], changing the files through `files`.
    pub(crate) fn open_with(root: &Path, capacity: u64, files: Box<dyn FileOps>) -> Result<Self> {
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
        let medium = Posix {
            root: root.to_path_buf(),
            files,
            open: OpenFiles::default(),
            uuid,
            next_id: AtomicU64::new(1),
            seq: AtomicU64::new(1),
            dirty: Mutex::new(Dirty {
                epoch: 1,
                ..Default::default()
            }),
            synced: AtomicU64::new(1),
            report: PosixReport {
                created,
                ..Default::default()
            },
        };
        let mut s = Indexed::over(medium, Usage::new(capacity));
        s.recover()?;
        Ok(s)
    }

    /// What the last open found.
    pub fn recovery(&self) -> &PosixReport {
        &self.medium.report
    }

    /// Reads every chunk file, indexing the records and removing what no
    /// key holds.
    fn recover(&mut self) -> Result<()> {
        self.walk_medium(Posix::walk)?;
        let (records, bad) = self.rebuilt();
        let report = &mut self.medium.report;
        report.records = records;
        report.corrupt += bad;
        Ok(())
    }
}

impl Posix {
    /// Walks the chunk files at open, handing every record to `index`
    /// (which returns the version of a key that lost to another) and
    /// removing the losers and the files that hold no record; then sets
    /// the id and sequence counters past every one found.
    fn walk(&mut self, index: Found<'_, PRec>) -> Result<()> {
        let mut max_id = 0u64;
        let mut max_seq = 0u64;
        let mut report = std::mem::take(&mut self.report);
        let mut losers: Vec<u64> = Vec::new();
        let (root, uuid) = (self.root.clone(), self.uuid);
        for d in std::fs::read_dir(&root)? {
            let d = d?;
            let name = d.file_name();
            let Some(name) = name.to_str() else { continue };
            if !is_bucket(name) || !d.file_type()?.is_dir() {
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
                let cf = read_chunk_file(&f, uuid)?;
                let (Some(path), Some((_, top))) = (cf.path.clone(), cf.slots.first().copied())
                else {
                    report.unreadable += 1;
                    self.files.remove(&e.path())?;
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
                    let keep = (DATA_OFF + s.data_len as u64).max(PATH_OFF + s.path_len as u64);
                    self.files.set_len(&f, keep)?;
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
                if let Some(loser) = index(path, s.idx, rec) {
                    losers.push(loser.id);
                }
            }
        }
        report.superseded = losers.len() as u64;
        for id in losers {
            self.files.remove(&chunk_file(&root, id))?;
        }
        // Ids come from file names, and a foreign file may take the last
        // one: ids then start again from 0 (creating a file never replaces
        // one, so a taken id is an error, not a lost chunk).
        self.next_id = AtomicU64::new(max_id.wrapping_add(1));
        self.seq = AtomicU64::new(max_seq + 1);
        self.report = report;
        Ok(())
    }
}

impl Posix {
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

    /// The chunk file of record `id`, open for reading and writing (kept
    /// open, [`OpenFiles`]).
    fn open_chunk(&self, id: u64) -> Result<Arc<File>> {
        if let Some(f) = self.open.get(id) {
            return Ok(f);
        }
        let f = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(chunk_file(&self.root, id))?,
        );
        self.open.keep(id, &f);
        Ok(f)
    }

    fn write_slot(&self, f: &File, r: &mut PRec, path: &str, idx: u64, n: u8) -> Result<()> {
        r.seq = self.seq.fetch_add(1, Ordering::Relaxed);
        check_seq(r.seq, path, idx)?;
        let s = Slot::of(r.seq, self.uuid, path, idx, r.len, r.crc, r.meta);
        self.files.write_at(f, &s.encode(), slot_off(n))?;
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
        let len = parts_len(parts)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let fp = chunk_file(&self.root, id);
        let f = Arc::new(self.files.create_new(&fp)?);
        let result = (|| -> Result<PRec> {
            self.files.write_at(&f, path.as_bytes(), PATH_OFF)?;
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
                        self.files.write_at(&f, b, DATA_OFF + pos)?;
                        crc = crc32c_append(crc, b);
                    }
                    Part::Zero(n) => {
                        // A hole: reads as zeros, costs no space.
                        crc = crc32c_zeros(crc, n);
                    }
                    // (This engine fetches a write's bytes before it is
                    // called: `fills_in_place` is false.)
                    Part::Fetched(_) => return Err(Part::no_fill()),
                    Part::Copy(src, n) => {
                        let of = old_f.as_ref().ok_or(StoreError::NotFound)?;
                        if buf.is_empty() {
                            buf = vec![0u8; BUF];
                        }
                        let mut done = 0u64;
                        while done < n {
                            let k = ((n - done) as usize).min(BUF);
                            of.read_exact_at(&mut buf[..k], DATA_OFF + src + done)?;
                            self.files.write_at(&f, &buf[..k], DATA_OFF + pos + done)?;
                            crc = crc32c_append(crc, &buf[..k]);
                            done += k as u64;
                        }
                    }
                }
                pos += p.len();
            }
            if len > 0 {
                self.files.set_len(&f, DATA_OFF + len)?;
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
        match &result {
            Ok(_) => self.open.keep(id, &f),
            Err(_) => {
                let _ = self.files.remove(&fp);
            }
        }
        result
    }
}

/// Chunk files kept open, so that the next access to a chunk (the reads
/// of a file's records, a write appending to a chunk just created, its
/// header changed) finds its file without a path walk, an open and a
/// close: the file of record id `i` in slot `i % OPEN_SLOTS` (ids are
/// handed out in order, so the latest files stay open), closed when
/// another takes the slot or its record is freed.
struct OpenFiles {
    slots: Box<[OpenSlot]>,
}

/// A slot of [`OpenFiles`]: the record id and its file.
type OpenSlot = Mutex<Option<(u64, Arc<File>)>>;

/// Chunk files kept open at most.
const OPEN_SLOTS: usize = 256;

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles {
            slots: (0..OPEN_SLOTS).map(|_| Mutex::new(None)).collect(),
        }
    }
}

impl OpenFiles {
    fn slot(&self, id: u64) -> &OpenSlot {
        &self.slots[(id % OPEN_SLOTS as u64) as usize]
    }

    fn get(&self, id: u64) -> Option<Arc<File>> {
        match &*lock(self.slot(id)) {
            Some((i, f)) if *i == id => Some(f.clone()),
            _ => None,
        }
    }

    fn keep(&self, id: u64, f: &Arc<File>) {
        let old = lock(self.slot(id)).replace((id, f.clone()));
        // (closed, if it was the last reference, outside the lock)
        drop(old);
    }

    fn forget(&self, id: u64) {
        let mut s = lock(self.slot(id));
        let old = if s.as_ref().is_some_and(|(i, _)| *i == id) {
            s.take()
        } else {
            None
        };
        drop(s);
        drop(old);
    }
}

impl Medium for Posix {
    type Rec = PRec;
    type Data = Vec<u8>;
    const NAME: &'static str = "posix";

    fn fresh(&self, w: Write<'_>, old: Option<&PRec>) -> Result<PRec> {
        let data = w.data.bytes()?;
        let parts = [Part::Zero(w.off), Part::Bytes(&data)];
        self.new_file(w.path, w.idx, w.meta, &parts, old)
    }

    fn write_into(&self, w: Write<'_>, rec: &mut PRec) -> Result<Option<PRec>> {
        let (path, idx, off, meta) = (w.path, w.idx, w.off, w.meta);
        let r = *rec;
        let data = w.data.bytes()?;
        let data = &*data;
        let end = off + data.len() as u64;
        if off >= r.len {
            // Append: bytes past the current length, then the other slot.
            let f = self.open_chunk(r.id)?;
            self.files.write_at(&f, data, DATA_OFF + off)?;
            if data.is_empty() && end > r.len {
                self.files.set_len(&f, DATA_OFF + end)?;
            }
            let mut next = r;
            next.crc = crc32c_append(crc32c_zeros(r.crc, off - r.len), data);
            next.len = end;
            next.meta = meta;
            self.write_slot(&f, &mut next, path, idx, 1 - r.slot)?;
            next.epoch = self.mark(r.id, false);
            *rec = next;
            return Ok(None);
        }
        // Overwrite: copy-on-write into a new file.
        let mut parts = vec![Part::Copy(0, off), Part::Bytes(data)];
        if end < r.len {
            parts.push(Part::Copy(end, r.len - end));
        }
        self.new_file(path, idx, meta, &parts, Some(&r)).map(Some)
    }

    fn set_meta(&self, path: &str, idx: u64, rec: &mut PRec, meta: Meta) -> Result<()> {
        let file = self.open_chunk(rec.id)?;
        let mut next = *rec;
        next.meta = meta;
        self.write_slot(&file, &mut next, path, idx, 1 - rec.slot)?;
        next.epoch = self.mark(rec.id, false);
        *rec = next;
        Ok(())
    }

    fn truncate(&self, path: &str, idx: u64, rec: &mut PRec, len: u64) -> Result<Option<PRec>> {
        let r = *rec;
        if self.durable(&r) {
            // Keep the durable version intact until the short one is.
            let parts = [Part::Copy(0, len)];
            return self.new_file(path, idx, r.meta, &parts, Some(&r)).map(Some);
        }
        let f = self.open_chunk(r.id)?;
        let mut buf = vec![0u8; BUF.min(len as usize).max(1)];
        let mut next = r;
        next.crc = file_crc(&f, DATA_OFF, len, 0, &mut buf)?;
        next.len = len;
        self.write_slot(&f, &mut next, path, idx, 1 - r.slot)?;
        self.files
            .set_len(&f, (DATA_OFF + len).max(PATH_OFF + path.len() as u64))?;
        next.epoch = self.mark(r.id, false);
        *rec = next;
        Ok(None)
    }

    fn read(&self, r: &PRec, off: u64, len: u64) -> Result<Vec<u8>> {
        let n = off.saturating_add(len).min(r.len) - off.min(r.len);
        Dst::read_vec(n as usize, |dst| self.read_into(r, off, dst).map(drop))
    }

    /// Read from the chunk's file straight into `dst`.
    fn read_into(&self, r: &PRec, off: u64, dst: &mut Dst<'_>) -> Result<Option<usize>> {
        let start = off.min(r.len);
        let n = (r.len - start).min(dst.len() as u64) as usize;
        if n > 0 {
            let f = self.open_chunk(r.id)?;
            dst.pread(0, n, &f, DATA_OFF + start)?;
        }
        Ok(Some(n))
    }

    fn free(&self, r: PRec) -> Result<()> {
        // (Closed before it goes: an open descriptor would keep its
        // blocks.)
        self.open.forget(r.id);
        lock(&self.dirty).dirs.insert((r.id & 0xff) as u8);
        match self.files.remove(&chunk_file(&self.root, r.id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
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
