//! The FUSE file system: translates kernel requests into
//! [`chfs_client::Client`] calls. It keeps only what the kernel protocol
//! needs on top of the client: an inode <-> path table, file handles ->
//! client descriptors, directory listings per open directory, and the
//! errno mapping. No file-system logic lives here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chfs_client::{Client, Stat, TimeSet};
use chfs_proto::msg::SetAttr;
use chfs_proto::path::{is_within, join};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, warn};

/// Largest read/write request asked of the kernel (1 MiB).
pub const MAX_IO: u32 = 1 << 20;

/// Behaviour of the mount that is not file-system logic.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// How long the kernel may cache attributes (size, mode, times) before
    /// asking again. Longer = fewer requests, staler view of other nodes.
    pub attr_timeout: Duration,
    /// How long the kernel may cache a name -> inode binding. Longer =
    /// faster path walks; a file removed or renamed on another node stays
    /// visible here for up to this long.
    pub entry_timeout: Duration,
    /// How long a name may be reported absent from a listing of its
    /// directory instead of asking its server (the client's negative lookup
    /// cache; entries created through this mount are always seen). A file
    /// created on another node may stay invisible here for up to this
    /// long. Zero asks the servers for every missing name.
    pub negative_timeout: Duration,
    /// Kernel write-back cache: small writes are gathered in the page cache
    /// and sent later (faster small writes; data reaches the servers at
    /// flush/fsync/close, and O_APPEND is no longer atomic across nodes).
    pub writeback_cache: bool,
    /// Bypass the page cache for file data (`FOPEN_DIRECT_IO`, the
    /// default): a read(2) or write(2) of 1 MiB is one request of 1 MiB,
    /// every read sees the servers' current data, and mmap still works
    /// (`FUSE_DIRECT_IO_ALLOW_MMAP`). Off: the kernel page cache and
    /// read-ahead serve repeated and small reads.
    pub direct_io: bool,
    /// Serve kernel requests through FUSE over io_uring when the kernel
    /// offers it (Linux 6.14+ with `fuse.enable_uring=1`): one queue per
    /// CPU, each request handled by a thread on the CPU that issued it, so
    /// a request costs no wake-up across CPUs. Falls back to reading
    /// /dev/fuse when the kernel does not offer it.
    pub io_uring: bool,
    /// With io_uring, each ring thread (pinned to its queue's CPU) reaches
    /// the servers on this host over its own connections, which they serve
    /// on a thread pinned to the same CPU (CPU lanes): a request and its
    /// reply hand over on one CPU instead of waking a thread on another.
    /// Off: one shared connection per server for every thread.
    pub cpu_lanes: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::from_secs(1),
            writeback_cache: false,
            direct_io: true,
            io_uring: true,
            cpu_lanes: true,
        }
    }
}

/// One inode known to the kernel.
struct Node {
    path: String,
    nlookup: u64,
}

/// Inode numbers <-> paths. Inode numbers are the client's `st_ino` (a hash
/// of the path at first lookup), probed on a collision; the root is 1.
struct Table {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
}

impl Table {
    fn new() -> Self {
        let mut t = Table {
            nodes: HashMap::new(),
            by_path: HashMap::new(),
        };
        t.nodes.insert(
            1,
            Node {
                path: "/".into(),
                nlookup: 1,
            },
        );
        t.by_path.insert("/".into(), 1);
        t
    }

    /// The inode of `path` (counting one more kernel lookup).
    fn intern(&mut self, path: &str, hint: u64) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.nlookup += 1;
            }
            return ino;
        }
        let mut ino = hint.max(2);
        while self.nodes.contains_key(&ino) {
            ino = ino.wrapping_add(2).max(2);
        }
        self.nodes.insert(
            ino,
            Node {
                path: path.to_string(),
                nlookup: 1,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 {
                let node = self.nodes.remove(&ino).expect("present");
                if self.by_path.get(&node.path) == Some(&ino) {
                    self.by_path.remove(&node.path);
                }
            }
        }
    }

    /// The name no longer refers to its inode (unlink, rmdir, replaced by
    /// a rename).
    fn detach(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// Rewrites the paths of `old` and everything below it.
    fn rename(&mut self, old: &str, new: &str) -> Vec<u64> {
        self.detach(new);
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| is_within(p, old))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        let mut inos = Vec::new();
        for (p, ino) in moved {
            self.by_path.remove(&p);
            let np = format!("{new}{}", &p[old.len()..]);
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.path = np.clone();
            }
            self.by_path.insert(np, ino);
            inos.push(ino);
        }
        inos
    }
}

/// An open file: the client descriptor (replaced if the file is renamed).
struct FileH {
    ino: u64,
    fd: Mutex<i32>,
    flags: i32,
    append: bool,
    sync: bool,
}

/// An open directory: the listing read at offset 0, so offsets stay valid
/// while the directory changes.
struct DirH {
    entries: Mutex<Option<Vec<(String, u64, FileType)>>>,
}

enum Handle {
    File(Arc<FileH>),
    Dir(Arc<DirH>),
}

/// The FUSE file system over a chfs-rs client (cheap to share between
/// the transports that serve it).
pub struct ChfsFs(pub(crate) Arc<Core>);

/// State and operations behind [`ChfsFs`].
pub(crate) struct Core {
    pub(crate) client: Client,
    pub(crate) opts: FsOptions,
    /// The kernel accepted FUSE over io_uring at INIT.
    pub(crate) uring_granted: std::sync::atomic::AtomicBool,
    table: Mutex<Table>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Inodes unlinked while open here: renamed to a hidden name, removed
    /// at their last release (as libfuse's high-level API does).
    doomed: Mutex<HashMap<u64, String>>,
    /// Directory attributes recently fetched. The kernel drops its cached
    /// attributes of a directory whenever an entry is created or removed in
    /// it (it assumes the directory's mtime changed, which chfs does not
    /// do) and must then re-check permissions: answering from here for
    /// `attr_timeout` gives the same freshness as the kernel's own cache.
    dir_attrs: Mutex<HashMap<u64, (Instant, Stat)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &chfs_client::Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// A file name as UTF-8 (the client's paths are strings).
fn name_str(name: &OsStr) -> Result<&str, Errno> {
    std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::from_i32(libc::EILSEQ))
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn systime(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn time_set(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(t)) => TimeSet::At(time_ns(t)),
    }
}

fn attr(ino: u64, s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: s.size,
        blocks: s.blocks,
        atime: systime(s.atime),
        mtime: systime(s.mtime),
        ctime: systime(s.ctime),
        crtime: systime(s.ctime),
        kind: kind_of(s.mode),
        perm: (s.mode & 0o7777) as u16,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: s.rdev as u32,
        blksize: s.blksize,
        flags: 0,
    }
}

type R<T> = Result<T, Errno>;

impl ChfsFs {
    /// A file system serving `client`.
    pub fn new(client: Client, opts: FsOptions) -> Self {
        client.set_negative_ttl(opts.negative_timeout);
        ChfsFs(Arc::new(Core {
            client,
            opts,
            uring_granted: std::sync::atomic::AtomicBool::new(false),
            table: Mutex::new(Table::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            doomed: Mutex::new(HashMap::new()),
            dir_attrs: Mutex::new(HashMap::new()),
        }))
    }

    fn reply_entry(&self, reply: ReplyEntry, r: R<FileAttr>) {
        match r {
            Ok(a) => reply.entry_with_ttls(
                &self.0.opts.attr_timeout,
                &self.0.opts.entry_timeout,
                &a,
                Generation(0),
            ),
            Err(e) => reply.error(e),
        }
    }
}

impl Core {
    fn path(&self, ino: INodeNo) -> R<String> {
        lock(&self.table)
            .nodes
            .get(&ino.0)
            .map(|n| n.path.clone())
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> R<String> {
        let name = name_str(name)?;
        if name.len() > chfs_proto::path::MAX_NAME {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        Ok(join(&self.path(parent)?, name))
    }

    /// Client acting for the requesting user (owner of what it creates).
    fn user(&self, who: Caller) -> Client {
        self.client.as_user(who.uid, who.gid)
    }

    /// Looks `path` up and counts a kernel reference to its inode.
    fn entry(&self, path: &str) -> R<FileAttr> {
        let s = self.client.lstat(path).map_err(|e| errno(&e))?;
        let ino = lock(&self.table).intern(path, s.ino);
        Ok(attr(ino, &s))
    }

    fn file(&self, fh: FileHandle) -> R<Arc<FileH>> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            _ => Err(Errno::EBADF),
        }
    }

    fn fd(&self, fh: FileHandle) -> R<i32> {
        Ok(*lock(&self.file(fh)?.fd))
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, h);
        fh
    }

    /// Client open flags for a kernel open: access mode and the flags the
    /// client acts on. With the write-back cache the kernel may read
    /// through a write-only file and computes append offsets itself.
    fn open_flags(&self, flags: i32) -> i32 {
        let mut f = flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC);
        if self.opts.writeback_cache {
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        f
    }

    fn new_file(&self, ino: u64, fd: i32, flags: i32) -> (u64, FopenFlags) {
        let append = flags & libc::O_APPEND != 0;
        let h = FileH {
            ino,
            fd: Mutex::new(fd),
            flags,
            append,
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
        };
        let fh = self.add_handle(Handle::File(Arc::new(h)));
        // Appends are placed by the servers (atomic across nodes), so the
        // page cache cannot know where they land: bypass it for them.
        let mut fopen = if self.opts.direct_io || append {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        // No flush round trip at close(2) when there is nothing to flush:
        // read-only descriptors, and (direct I/O, no write buffering) writers
        // whose writes publish the size as they grow the file.
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
        let unbuffered = self.opts.direct_io
            && !self.opts.writeback_cache
            && self.client.buf_size() == 0
            && self.client.set_publish_on_write(fd, true).is_ok();
        if read_only || unbuffered {
            fopen |= FopenFlags::FOPEN_NOFLUSH;
        }
        (fh, fopen)
    }

    /// After a rename, open files below `new` get descriptors for their
    /// new paths (the client names open files by path).
    fn reopen_moved(&self, inos: &[u64]) {
        let files: Vec<Arc<FileH>> = lock(&self.handles)
            .values()
            .filter_map(|h| match h {
                Handle::File(f) if inos.contains(&f.ino) => Some(f.clone()),
                _ => None,
            })
            .collect();
        for f in files {
            let Ok(path) = self.path(INodeNo(f.ino)) else {
                continue;
            };
            let fl = self.open_flags(f.flags) & !libc::O_TRUNC;
            match self.client.open(&path, fl, 0) {
                Ok(nfd) => {
                    let old = std::mem::replace(&mut *lock(&f.fd), nfd);
                    if let Err(e) = self.client.close(old) {
                        warn!(%path, error = %e, "closing the pre-rename descriptor");
                    }
                }
                Err(e) => warn!(%path, error = %e, "reopening a renamed open file"),
            }
        }
    }

    fn is_open(&self, ino: u64) -> bool {
        lock(&self.handles)
            .values()
            .any(|h| matches!(h, Handle::File(f) if f.ino == ino))
    }

    /// unlink(2) of `p`: an entry open through this mount is renamed to a
    /// hidden name instead, so its open descriptors keep working, and is
    /// removed at its last release.
    fn do_unlink(&self, p: &str) -> R<()> {
        let known = lock(&self.table).by_path.get(p).copied();
        let open = known.filter(|&i| self.is_open(i));
        if let Some(ino) = open {
            let hidden = join(
                chfs_proto::path::parent(p),
                &format!(
                    ".chfuse_hidden_{ino:016x}_{}",
                    self.next_fh.fetch_add(1, Ordering::Relaxed)
                ),
            );
            if self.client.rename_flags(p, &hidden, true).is_ok() {
                let inos = lock(&self.table).rename(p, &hidden);
                self.reopen_moved(&inos);
                lock(&self.doomed).insert(ino, hidden);
                return Ok(());
            }
        }
        self.client.unlink(p).map_err(|e| errno(&e))?;
        lock(&self.table).detach(p);
        Ok(())
    }

    fn do_setattr(
        &self,
        ino: INodeNo,
        size: Option<u64>,
        a: SetAttr,
        fh: Option<FileHandle>,
    ) -> R<FileAttr> {
        let path = self.path(ino)?;
        if let Some(size) = size {
            let r = match fh.map(|fh| self.fd(fh)) {
                Some(Ok(fd)) => self.client.ftruncate(fd, size),
                _ => self.client.truncate(&path, size),
            };
            r.map_err(|e| errno(&e))?;
        }
        let s = if a != SetAttr::default() {
            self.client.setattr(&path, a).map_err(|e| errno(&e))?
        } else {
            self.client.lstat(&path).map_err(|e| errno(&e))?
        };
        Ok(attr(ino.0, &s))
    }

    fn load_dir(&self, ino: INodeNo) -> R<Vec<(String, u64, FileType)>> {
        let path = self.path(ino)?;
        let list = self.client.readdir(&path).map_err(|e| errno(&e))?;
        let parent = if ino.0 == 1 {
            1
        } else {
            let pp = chfs_proto::path::parent(&path).to_string();
            lock(&self.table).by_path.get(&pp).copied().unwrap_or(1)
        };
        let t = lock(&self.table);
        let mut out = Vec::with_capacity(list.len() + 2);
        out.push((".".to_string(), ino.0, FileType::Directory));
        out.push(("..".to_string(), parent, FileType::Directory));
        for e in list {
            let full = join(&path, &e.name);
            let i = t.by_path.get(&full).copied().unwrap_or(e.stat.ino);
            out.push((e.name, i, kind_of(e.stat.mode)));
        }
        Ok(out)
    }
}

/// Who asks: the requesting process's ids (new entries are theirs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub uid: u32,
    pub gid: u32,
}

impl From<&Request> for Caller {
    fn from(r: &Request) -> Self {
        Caller {
            uid: r.uid(),
            gid: r.gid(),
        }
    }
}

/// What `statfs` reports, in 4 KiB blocks.
pub(crate) struct FsStat {
    pub blocks: u64,
    pub free: u64,
    pub files: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// The operations, one per kernel request, shared by both transports
/// (fuser's /dev/fuse loop and the io_uring queues of `ring`): each decodes
/// nothing and encodes nothing, it only calls the client and keeps the
/// inode/handle tables.
impl Core {
    pub(crate) fn init_flags(&self) -> InitFlags {
        let mut want = InitFlags::FUSE_ATOMIC_O_TRUNC | InitFlags::FUSE_PARALLEL_DIROPS;
        if self.opts.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.opts.direct_io {
            want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        want
    }

    pub(crate) fn lookup(&self, parent: u64, name: &OsStr) -> R<FileAttr> {
        let p = self.child(INodeNo(parent), name)?;
        let s = self.client.lookup(&p).map_err(|e| errno(&e))?;
        let ino = lock(&self.table).intern(&p, s.ino);
        Ok(attr(ino, &s))
    }

    pub(crate) fn forget(&self, ino: u64, nlookup: u64) {
        lock(&self.table).forget(ino, nlookup);
    }

    /// Attributes and how long the kernel may keep them.
    pub(crate) fn getattr(&self, ino: u64) -> R<(Duration, FileAttr)> {
        let ttl = self.opts.attr_timeout;
        if let Some((t, s)) = lock(&self.dir_attrs).get(&ino) {
            if t.elapsed() < ttl {
                return Ok((ttl - t.elapsed(), attr(ino, s)));
            }
        }
        let s = self
            .path(INodeNo(ino))
            .and_then(|p| self.client.lstat(&p).map_err(|e| errno(&e)))?;
        if s.is_dir() && !ttl.is_zero() {
            let mut d = lock(&self.dir_attrs);
            if d.len() > 4096 {
                d.retain(|_, (t, _)| t.elapsed() < ttl);
            }
            d.insert(ino, (Instant::now(), s));
        }
        Ok((ttl, attr(ino, &s)))
    }

    pub(crate) fn setattr(
        &self,
        ino: u64,
        size: Option<u64>,
        a: SetAttr,
        fh: Option<u64>,
    ) -> R<FileAttr> {
        lock(&self.dir_attrs).remove(&ino);
        self.do_setattr(INodeNo(ino), size, a, fh.map(FileHandle))
    }

    pub(crate) fn readlink(&self, ino: u64) -> R<String> {
        self.path(INodeNo(ino))
            .and_then(|p| self.client.readlink(&p).map_err(|e| errno(&e)))
    }

    pub(crate) fn mknod(
        &self,
        who: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> R<FileAttr> {
        let p = self.child(INodeNo(parent), name)?;
        self.user(who)
            .mknod(&p, mode, rdev as u64)
            .map_err(|e| errno(&e))?;
        self.entry(&p)
    }

    pub(crate) fn mkdir(&self, who: Caller, parent: u64, name: &OsStr, mode: u32) -> R<FileAttr> {
        let p = self.child(INodeNo(parent), name)?;
        self.user(who)
            .mkdir(&p, mode & 0o7777)
            .map_err(|e| errno(&e))?;
        self.entry(&p)
    }

    pub(crate) fn unlink(&self, parent: u64, name: &OsStr) -> R<()> {
        let p = self.child(INodeNo(parent), name)?;
        self.do_unlink(&p)
    }

    pub(crate) fn rmdir(&self, parent: u64, name: &OsStr) -> R<()> {
        let p = self.child(INodeNo(parent), name)?;
        self.client.rmdir(&p).map_err(|e| errno(&e))?;
        lock(&self.dir_attrs).clear();
        lock(&self.table).detach(&p);
        Ok(())
    }

    pub(crate) fn symlink(
        &self,
        who: Caller,
        parent: u64,
        link_name: &OsStr,
        target: &OsStr,
    ) -> R<FileAttr> {
        let p = self.child(INodeNo(parent), link_name)?;
        let t = name_str(target)?;
        self.user(who).symlink(t, &p).map_err(|e| errno(&e))?;
        self.entry(&p)
    }

    pub(crate) fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> R<()> {
        // RENAME_EXCHANGE / RENAME_WHITEOUT: not supported (EINVAL, as
        // renameat2(2) documents for flags a file system lacks).
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        let old = self.child(INodeNo(parent), name)?;
        let new = self.child(INodeNo(newparent), newname)?;
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        self.client
            .rename_flags(&old, &new, noreplace)
            .map_err(|e| errno(&e))?;
        if old != new {
            lock(&self.dir_attrs).clear();
            let inos = lock(&self.table).rename(&old, &new);
            self.reopen_moved(&inos);
        }
        Ok(())
    }

    pub(crate) fn open(&self, ino: u64, flags: i32) -> R<(u64, FopenFlags)> {
        let p = self.path(INodeNo(ino))?;
        let fd = self
            .client
            .open(&p, self.open_flags(flags), 0)
            .map_err(|e| errno(&e))?;
        Ok(self.new_file(ino, fd, flags))
    }

    /// Reads into `buf`; the number of bytes read.
    pub(crate) fn read(&self, fh: u64, offset: u64, buf: &mut [u8]) -> R<usize> {
        debug!(fh, offset, size = buf.len(), "read");
        let fd = self.fd(FileHandle(fh))?;
        self.client.pread(fd, buf, offset).map_err(|e| errno(&e))
    }

    pub(crate) fn write(&self, fh: u64, offset: u64, data: &[u8]) -> R<usize> {
        debug!(fh, offset, size = data.len(), "write");
        let f = self.file(FileHandle(fh))?;
        let fd = *lock(&f.fd);
        let n = if f.append && !self.opts.writeback_cache {
            self.client.write(fd, data)
        } else {
            self.client.pwrite(fd, data, offset)
        }
        .map_err(|e| errno(&e))?;
        if f.sync {
            self.client.fsync(fd).map_err(|e| errno(&e))?;
        }
        Ok(n)
    }

    /// close(2): publish size and buffered data so other nodes see them.
    pub(crate) fn flush(&self, fh: u64) -> R<()> {
        let fd = self.fd(FileHandle(fh))?;
        self.client.flush(fd).map_err(|e| errno(&e))
    }

    pub(crate) fn release(&self, fh: u64) -> R<()> {
        let h = lock(&self.handles).remove(&fh);
        let Some(Handle::File(f)) = h else {
            return Err(Errno::EBADF);
        };
        let r = self.client.close(*lock(&f.fd));
        if !self.is_open(f.ino) {
            let hidden = lock(&self.doomed).remove(&f.ino);
            if let Some(h) = hidden {
                if let Err(e) = self.client.unlink(&h) {
                    warn!(path = %h, error = %e, "removing an unlinked file at its last close");
                }
                lock(&self.table).detach(&h);
            }
        }
        r.map_err(|e| errno(&e))
    }

    pub(crate) fn fsync(&self, fh: u64) -> R<()> {
        let fd = self.fd(FileHandle(fh))?;
        self.client.fsync(fd).map_err(|e| errno(&e))
    }

    pub(crate) fn opendir(&self) -> u64 {
        self.add_handle(Handle::Dir(Arc::new(DirH {
            entries: Mutex::new(None),
        })))
    }

    /// Lists the open directory `fh` from `offset`, handing each entry
    /// (inode, next offset, type, name) to `add` until it returns true
    /// (reply full). The listing is read at offset 0 and kept, so offsets
    /// stay valid while the directory changes.
    pub(crate) fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileType, &str) -> bool,
    ) -> R<()> {
        let d = match lock(&self.handles).get(&fh) {
            Some(Handle::Dir(d)) => d.clone(),
            _ => return Err(Errno::EBADF),
        };
        let mut ents = lock(&d.entries);
        if offset == 0 || ents.is_none() {
            *ents = Some(self.load_dir(INodeNo(ino))?);
        }
        let list = ents.as_ref().expect("loaded");
        for (i, (name, eino, kind)) in list.iter().enumerate().skip(offset as usize) {
            if add(*eino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn releasedir(&self, fh: u64) {
        lock(&self.handles).remove(&fh);
    }

    pub(crate) fn statfs(&self) -> R<FsStat> {
        const BS: u64 = 4096;
        let s = self.client.statfs().map_err(|e| errno(&e))?;
        let free = s.free / BS;
        Ok(FsStat {
            blocks: s.total / BS,
            free,
            files: s.entries + free,
            bsize: BS as u32,
            namelen: chfs_proto::path::MAX_NAME as u32,
        })
    }

    pub(crate) fn access(&self, who: Caller, ino: u64, mask: i32) -> R<()> {
        let p = self.path(INodeNo(ino))?;
        self.user(who).access(&p, mask).map_err(|e| errno(&e))
    }

    pub(crate) fn create(
        &self,
        who: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> R<(FileAttr, u64, FopenFlags)> {
        let p = self.child(INodeNo(parent), name)?;
        let fl = self.open_flags(flags) | libc::O_CREAT | (flags & libc::O_EXCL);
        let fd = self
            .user(who)
            .open(&p, fl, mode & 0o7777)
            .map_err(|e| errno(&e))?;
        // The entry the server returned at create: no second trip.
        let a = match self.client.fstat_cached(fd) {
            Ok(s) => attr(lock(&self.table).intern(&p, s.ino), &s),
            Err(e) => {
                let _ = self.client.close(fd);
                return Err(errno(&e));
            }
        };
        let (fh, fl) = self.new_file(a.ino.0, fd, flags);
        debug!(ino = a.ino.0, "created");
        Ok((a, fh, fl))
    }

    /// Publishes what open files still hold at unmount; the backend
    /// write-back (cache mode) is not the mount's to wait for (`chfs sync`,
    /// `chfsctl stop`).
    pub(crate) fn destroy(&self) {
        if let Err(e) = self.client.flush_all() {
            warn!(error = %e, "flushing open files at unmount");
        }
    }
}

fn reply_empty(reply: ReplyEmpty, r: R<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// fuser's /dev/fuse transport: decodes with fuser, calls `Core`,
/// replies with fuser.
impl Filesystem for ChfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(64);
        for flag in self.0.init_flags().iter() {
            if let Err(e) = config.add_capabilities(flag) {
                warn!(?e, "kernel lacks a FUSE capability");
            }
        }
        if self.0.opts.io_uring {
            let ok = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            self.0.uring_granted.store(ok, Ordering::Relaxed);
            if !ok {
                debug!("kernel does not offer FUSE over io_uring (fuse.enable_uring=N?)");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.0.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_entry(reply, self.0.lookup(parent.0, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.getattr(ino.0) {
            Ok((ttl, a)) => reply.attr(&ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttr {
            mode,
            uid,
            gid,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        match self.0.setattr(ino.0, size, a, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.0.opts.attr_timeout, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.readlink(ino.0) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.0.mknod(req.into(), parent.0, name, mode, rdev);
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.0.mkdir(req.into(), parent.0, name, mode);
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.0.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.0.rmdir(parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self
            .0
            .symlink(req.into(), parent.0, link_name, target.as_os_str());
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.0.rename(parent.0, name, newparent.0, newname, flags),
        );
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // Hard links are not supported (entries are keyed by path).
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.0.open(ino.0, flags.0) {
            Ok((fh, fl)) => reply.opened(FileHandle(fh), fl),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            // One reusable buffer per serving thread: a fresh 1 MiB
            // allocation per read would page-fault on every request.
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            match self.0.read(fh.0, offset, &mut buf[..size as usize]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.0.write(fh.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.0.flush(fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.0.release(fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.0.fsync(fh.0));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(self.0.opendir()), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self
            .0
            .readdir(ino.0, fh.0, offset, |eino, off, kind, name| {
                reply.add(INodeNo(eino), off, kind, name)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are applied on the servers before they return.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.0.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.free, s.free, s.files, s.free, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.0.access(req.into(), ino.0, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.0.create(req.into(), parent.0, name, mode, flags) {
            Ok((a, fh, fl)) => reply.created(
                &self.0.opts.entry_timeout,
                &a,
                Generation(0),
                FileHandle(fh),
                fl,
            ),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_interns_counts_and_forgets() {
        let mut t = Table::new();
        let a = t.intern("/a", 77);
        assert_eq!(a, 77);
        assert_eq!(t.intern("/a", 77), a);
        // A colliding hint gets another number; the root keeps 1.
        let b = t.intern("/b", 77);
        assert_ne!(b, a);
        assert_ne!(t.intern("/c", 1), 1);
        t.forget(a, 1);
        assert!(t.nodes.contains_key(&a));
        t.forget(a, 1);
        assert!(!t.nodes.contains_key(&a));
        assert!(!t.by_path.contains_key("/a"));
        t.forget(1, 100);
        assert!(t.nodes.contains_key(&1));
    }

    #[test]
    fn table_rename_moves_descendants_only() {
        let mut t = Table::new();
        let d = t.intern("/d", 10);
        let f = t.intern("/d/f", 20);
        let g = t.intern("/d/sub/g", 30);
        let other = t.intern("/dx", 40);
        let victim = t.intern("/e", 50);
        let mut moved = t.rename("/d", "/e");
        moved.sort();
        assert_eq!(moved, vec![d, f, g]);
        assert_eq!(t.nodes[&f].path, "/e/f");
        assert_eq!(t.nodes[&g].path, "/e/sub/g");
        assert_eq!(t.nodes[&other].path, "/dx");
        assert_eq!(t.by_path["/e"], d);
        // The replaced entry keeps its inode (open files) but not its name.
        assert!(t.nodes.contains_key(&victim));
        assert!(!t.by_path.contains_key("/d"));
    }

    #[test]
    fn names_must_be_utf8() {
        let bad = OsStr::from_bytes(b"a\xff");
        assert_eq!(name_str(bad).unwrap_err(), Errno::from_i32(libc::EILSEQ));
        assert_eq!(name_str(OsStr::new("ok")).unwrap(), "ok");
    }

    #[test]
    fn times_round_trip_before_and_after_the_epoch() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -1_500_000_000] {
            assert_eq!(time_ns(systime(ns)), ns);
        }
    }
}
