//! The FUSE file system as fuser sees it: [`ChfsFs`] implements fuser's
//! [`Filesystem`] by translating fuser's types into the core's
//! ([`crate::core`]), calling [`Core`], and turning its results into
//! replies. No file-system logic lives here.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chfs_client::Client;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, warn};

use crate::core::{op, Attr, Caller, Core, Error, Fh, FileKind, Ino, Opened, SetAttr, TimeSet};

pub use crate::core::FsOptions;

/// Largest read/write request asked of the kernel (1 MiB).
pub const MAX_IO: u32 = 1 << 20;

/// The FUSE file system over a chfs-rs client (cheap to share between
/// the transports that serve it: they share its [`Core`]).
pub struct ChfsFs {
    core: Arc<Core>,
    /// The kernel accepted FUSE over io_uring at INIT.
    uring_granted: Arc<AtomicBool>,
}

/// Requests the kernel protocol options the core's behaviour relies on.
fn init_flags(opts: &FsOptions) -> InitFlags {
    let mut want = InitFlags::FUSE_ATOMIC_O_TRUNC | InitFlags::FUSE_PARALLEL_DIROPS;
    if opts.writeback_cache {
        want |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    if opts.direct_io {
        want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
    }
    want
}

fn errno(e: Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::RegularFile => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::NamedPipe => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
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

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: systime(a.atime),
        mtime: systime(a.mtime),
        ctime: systime(a.ctime),
        crtime: systime(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry (node id 0; the kernel reads none of
/// them).
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn fopen_flags(o: &Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.noflush {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    f
}

fn caller(r: &Request) -> Caller {
    Caller {
        uid: r.uid(),
        gid: r.gid(),
        pid: r.pid(),
    }
}

impl ChfsFs {
    /// A file system serving `client`.
    pub fn new(client: Client, opts: FsOptions) -> Self {
        ChfsFs {
            core: Arc::new(Core::new(client, opts)),
            uring_granted: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The core this adapter calls.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Set at INIT when the kernel accepted FUSE over io_uring.
    pub(crate) fn uring_granted(&self) -> Arc<AtomicBool> {
        self.uring_granted.clone()
    }

    fn reply_entry(&self, reply: ReplyEntry, r: crate::core::Result<Attr>) {
        let o = self.core.options();
        match r {
            Ok(a) => reply.entry_with_ttls(
                &o.attr_timeout,
                &o.entry_timeout,
                &file_attr(&a),
                Generation(0),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn reply_empty(reply: ReplyEmpty, r: crate::core::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// fuser's /dev/fuse transport: decodes with fuser, calls `Core`,
/// replies with fuser.
impl Filesystem for ChfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(64);
        let opts = self.core.options();
        for flag in init_flags(opts).iter() {
            if let Err(e) = config.add_capabilities(flag) {
                warn!(?e, "kernel lacks a FUSE capability");
            }
        }
        if opts.io_uring {
            let ok = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            self.uring_granted.store(ok, Ordering::Relaxed);
            if !ok {
                debug!("kernel does not offer FUSE over io_uring (fuse.enable_uring=N?)");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.core.requests().count(op::DESTROY);
        self.core.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.core.requests().count(op::LOOKUP);
        let neg = self.core.options().negative_timeout;
        match self.core.lookup(Ino(parent.0), name) {
            // Node id 0: the kernel keeps the name as absent for `neg`.
            Err(Error::ENOENT) if !neg.is_zero() => {
                reply.entry_with_ttls(&Duration::ZERO, &neg, &negative_attr(), Generation(0))
            }
            r => self.reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // fuser hands each inode of a BATCH_FORGET here one by one (its
        // type for the batch is private): FORGET counts inodes forgotten.
        self.core.requests().count(op::FORGET);
        self.core.forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.core.requests().count(op::GETATTR);
        match self.core.getattr(Ino(ino.0)) {
            Ok((ttl, a)) => reply.attr(&ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::SETATTR);
        let a = SetAttr {
            size,
            mode,
            uid,
            gid,
            atime: time_set(atime),
            mtime: time_set(mtime),
            fh: fh.map(|f| Fh(f.0)),
        };
        match self.core.setattr(Ino(ino.0), a) {
            Ok(a) => reply.attr(&self.core.options().attr_timeout, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.core.requests().count(op::READLINK);
        match self.core.readlink(Ino(ino.0)) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::MKNOD);
        let r = self
            .core
            .mknod(caller(req), Ino(parent.0), name, mode, rdev);
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
        self.core.requests().count(op::MKDIR);
        let r = self.core.mkdir(caller(req), Ino(parent.0), name, mode);
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.core.requests().count(op::UNLINK);
        reply_empty(reply, self.core.unlink(Ino(parent.0), name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.core.requests().count(op::RMDIR);
        reply_empty(reply, self.core.rmdir(Ino(parent.0), name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.core.requests().count(op::SYMLINK);
        let r = self
            .core
            .symlink(caller(req), Ino(parent.0), link_name, target.as_os_str());
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
        // The kernel sends RENAME2 only with flags (RENAME_NOREPLACE...).
        let opcode = if flags.bits() == 0 {
            op::RENAME
        } else {
            op::RENAME2
        };
        self.core.requests().count(opcode);
        reply_empty(
            reply,
            self.core
                .rename(Ino(parent.0), name, Ino(newparent.0), newname, flags.bits()),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.core.requests().count(op::LINK);
        let r = self.core.link(Ino(ino.0), Ino(newparent.0), newname);
        self.reply_entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.core.requests().count(op::OPEN);
        match self.core.open(Ino(ino.0), flags.0) {
            Ok(o) => reply.opened(FileHandle(o.fh.0), fopen_flags(&o)),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::READ);
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
            match self.core.read(Fh(fh.0), offset, &mut buf[..size as usize]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::WRITE);
        match self.core.write(Fh(fh.0), offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::FLUSH);
        reply_empty(reply, self.core.flush(Fh(fh.0)));
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
        self.core.requests().count(op::RELEASE);
        reply_empty(reply, self.core.release(Fh(fh.0)));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.core.requests().count(op::FSYNC);
        reply_empty(reply, self.core.fsync(Fh(fh.0)));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.core.requests().count(op::OPENDIR);
        reply.opened(FileHandle(self.core.opendir().0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.core.requests().count(op::READDIR);
        let r = self
            .core
            .readdir(Ino(ino.0), Fh(fh.0), offset, |eino, off, kind, name| {
                reply.add(INodeNo(eino.0), off, file_type(kind), name)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::RELEASEDIR);
        self.core.releasedir(Fh(fh.0));
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
        self.core.requests().count(op::FSYNCDIR);
        // Namespace changes are applied on the servers before they return.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.core.requests().count(op::STATFS);
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.free, s.free, s.files, s.free, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(e)),
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
        self.core.requests().count(op::SETXATTR);
        reply.error(errno(Error::EOPNOTSUPP));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        self.core.requests().count(op::GETXATTR);
        reply.error(errno(Error::EOPNOTSUPP));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        self.core.requests().count(op::LISTXATTR);
        reply.error(errno(Error::EOPNOTSUPP));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.core.requests().count(op::REMOVEXATTR);
        reply.error(errno(Error::EOPNOTSUPP));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.core.requests().count(op::ACCESS);
        reply_empty(
            reply,
            self.core.access(caller(req), Ino(ino.0), mask.bits()),
        );
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
        self.core.requests().count(op::CREATE);
        match self
            .core
            .create(caller(req), Ino(parent.0), name, mode, flags)
        {
            Ok((a, o)) => reply.created(
                &self.core.options().entry_timeout,
                &file_attr(&a),
                Generation(0),
                FileHandle(o.fh.0),
                fopen_flags(&o),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_before_and_after_the_epoch() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -1_500_000_000] {
            assert_eq!(time_ns(systime(ns)), ns);
        }
    }

    #[test]
    fn open_flags_map_to_fopen_bits() {
        let o = Opened {
            fh: Fh(3),
            direct_io: true,
            noflush: false,
        };
        assert_eq!(fopen_flags(&o), FopenFlags::FOPEN_DIRECT_IO);
        let o = Opened {
            direct_io: false,
            noflush: true,
            ..o
        };
        assert_eq!(fopen_flags(&o), FopenFlags::FOPEN_NOFLUSH);
    }

    #[test]
    fn errors_keep_their_errno() {
        assert_eq!(errno(Error::ENOENT), Errno::ENOENT);
        assert_eq!(
            errno(Error::from_errno(libc::ENOTEMPTY)),
            Errno::from_i32(libc::ENOTEMPTY)
        );
    }
}
