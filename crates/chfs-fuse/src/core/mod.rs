//! The file system proper, in its own types (no FUSE library here):
//! [`Core`] turns kernel-level operations (names under a parent inode, I/O
//! through a handle) into [`chfs_client::Client`] calls. It keeps only what
//! the kernel protocol needs on top of the client: an inode <-> path table
//! (`inodes`), file handles -> client descriptors and directory listings
//! per open directory (`handles`), and the errno mapping ([`Error`]). No
//! other file-system logic lives here; it is the client's.
//!
//! Two transports translate kernel requests into these calls and the
//! results into replies: fuser's /dev/fuse loop ([`crate::fs`]) and the
//! FUSE-over-io_uring queues (`ring`). Nothing here needs a mount, so the
//! tests drive a [`Core`] directly against a local pool (`tests/core.rs`).

mod handles;
mod inodes;
mod options;
mod requests;
mod types;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chfs_client::{Client, Stat};
use chfs_proto::path::join;
use chfs_sys::lock;
use tracing::{debug, debug_span, warn};

use handles::{DirEnt, DirH, FileH, Handle};
use inodes::Table;

pub use options::FsOptions;
pub use requests::{op, op_name, Requests};
pub use types::{Attr, Caller, Error, Fh, FileKind, FsStat, Ino, Opened, Result, SetAttr, TimeSet};

/// State and operations of the file system over a chfs-rs client (shared
/// by the transports that serve it: wrap it in an `Arc`).
pub struct Core {
    client: Client,
    opts: FsOptions,
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
    /// Kernel requests served, by opcode (counted by the transports).
    requests: Requests,
}

/// A file name as UTF-8 (the client's paths are strings).
fn name_str(name: &OsStr) -> Result<&str> {
    std::str::from_utf8(name.as_bytes()).map_err(|_| Error::EILSEQ)
}

impl Core {
    /// A file system serving `client`.
    pub fn new(client: Client, opts: FsOptions) -> Core {
        client.set_negative_ttl(opts.negative_timeout);
        Core {
            client,
            opts,
            table: Mutex::new(Table::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            doomed: Mutex::new(HashMap::new()),
            dir_attrs: Mutex::new(HashMap::new()),
            requests: Requests::default(),
        }
    }

    /// The client the file system calls.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Kernel requests served so far, by opcode.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The options it was made with.
    pub fn options(&self) -> &FsOptions {
        &self.opts
    }

    fn path(&self, ino: Ino) -> Result<String> {
        lock(&self.table)
            .nodes
            .get(&ino.0)
            .map(|n| n.path.clone())
            .ok_or(Error::ENOENT)
    }

    fn child(&self, parent: Ino, name: &OsStr) -> Result<String> {
        let name = name_str(name)?;
        if name.len() > chfs_proto::path::MAX_NAME {
            return Err(Error::ENAMETOOLONG);
        }
        Ok(join(&self.path(parent)?, name))
    }

    /// Client acting for the requesting user (owner of what it creates).
    fn user(&self, who: Caller) -> Client {
        self.client.as_user(who.uid, who.gid)
    }

    /// Looks `path` up and counts a kernel reference to its inode.
    fn entry(&self, path: &str) -> Result<Attr> {
        let s = self.client.lstat(path)?;
        let ino = lock(&self.table).intern(path, s.ino);
        Ok(Attr::from_stat(Ino(ino), &s))
    }

    fn file(&self, fh: Fh) -> Result<Arc<FileH>> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            _ => Err(Error::EBADF),
        }
    }

    fn fd(&self, fh: Fh) -> Result<i32> {
        Ok(*lock(&self.file(fh)?.fd))
    }

    fn add_handle(&self, h: Handle) -> Fh {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, h);
        Fh(fh)
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

    fn new_file(&self, ino: Ino, fd: i32, flags: i32) -> Opened {
        let append = flags & libc::O_APPEND != 0;
        let h = FileH {
            ino: ino.0,
            fd: Mutex::new(fd),
            flags,
            append,
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
        };
        let fh = self.add_handle(Handle::File(Arc::new(h)));
        // Appends are placed by the servers (atomic across nodes), so the
        // page cache cannot know where they land: bypass it for them.
        let direct_io = self.opts.direct_io || append;
        // No flush round trip at close(2) when there is nothing to flush:
        // read-only descriptors, and (direct I/O, no write buffering) writers
        // whose writes publish the size as they grow the file.
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
        let unbuffered = self.opts.direct_io
            && !self.opts.writeback_cache
            && self.client.buf_size() == 0
            && self.client.set_publish_on_write(fd, true).is_ok();
        Opened {
            fh,
            direct_io,
            noflush: read_only || unbuffered,
        }
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
            let Ok(path) = self.path(Ino(f.ino)) else {
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
    fn do_unlink(&self, p: &str) -> Result<()> {
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
        self.client.unlink(p)?;
        lock(&self.table).detach(p);
        Ok(())
    }

    fn load_dir(&self, ino: Ino) -> Result<Vec<DirEnt>> {
        let path = self.path(ino)?;
        let list = self.client.readdir(&path)?;
        let parent = if ino == Ino::ROOT {
            Ino::ROOT.0
        } else {
            let pp = chfs_proto::path::parent(&path).to_string();
            lock(&self.table).by_path.get(&pp).copied().unwrap_or(1)
        };
        let t = lock(&self.table);
        let mut out = Vec::with_capacity(list.len() + 2);
        out.push((".".to_string(), ino.0, FileKind::Directory));
        out.push(("..".to_string(), parent, FileKind::Directory));
        for e in list {
            let full = join(&path, &e.name);
            let i = t.by_path.get(&full).copied().unwrap_or(e.stat.ino);
            out.push((e.name, i, FileKind::from_mode(e.stat.mode)));
        }
        Ok(out)
    }
}

/// The operations, one per kernel request, shared by both transports
/// (fuser's /dev/fuse loop and the io_uring queues of `ring`): each decodes
/// nothing and encodes nothing, it only calls the client and keeps the
/// inode/handle tables. Every call that names an entry (`lookup`, `mkdir`,
/// `create`, ...) counts one kernel reference to its inode, which
/// [`Core::forget`] gives back.
impl Core {
    /// The entry `name` in directory `parent` (LOOKUP).
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "lookup").entered();
        let p = self.child(parent, name)?;
        let s = self.client.lookup(&p)?;
        let ino = lock(&self.table).intern(&p, s.ino);
        Ok(Attr::from_stat(Ino(ino), &s))
    }

    /// The kernel dropped `nlookup` references to `ino` (FORGET); at none
    /// left its number is free again.
    pub fn forget(&self, ino: Ino, nlookup: u64) {
        let _op = debug_span!("fuse", op = "forget").entered();
        lock(&self.table).forget(ino.0, nlookup);
    }

    /// Attributes and how long the kernel may keep them.
    pub fn getattr(&self, ino: Ino) -> Result<(Duration, Attr)> {
        let _op = debug_span!("fuse", op = "getattr").entered();
        let ttl = self.opts.attr_timeout;
        if let Some((t, s)) = lock(&self.dir_attrs).get(&ino.0) {
            if t.elapsed() < ttl {
                return Ok((ttl - t.elapsed(), Attr::from_stat(ino, s)));
            }
        }
        let s = self
            .path(ino)
            .and_then(|p| self.client.lstat(&p).map_err(Error::from))?;
        if s.is_dir() && !ttl.is_zero() {
            let mut d = lock(&self.dir_attrs);
            if d.len() > 4096 {
                d.retain(|_, (t, _)| t.elapsed() < ttl);
            }
            d.insert(ino.0, (Instant::now(), s));
        }
        Ok((ttl, Attr::from_stat(ino, &s)))
    }

    /// Changes attributes (truncate, chmod, chown, utimens): the new ones.
    pub fn setattr(&self, ino: Ino, a: SetAttr) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "setattr").entered();
        lock(&self.dir_attrs).remove(&ino.0);
        let path = self.path(ino)?;
        if let Some(size) = a.size {
            match a.fh.map(|fh| self.fd(fh)) {
                Some(Ok(fd)) => self.client.ftruncate(fd, size),
                _ => self.client.truncate(&path, size),
            }?;
        }
        let change = chfs_proto::msg::SetAttr {
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
        };
        let s = if change != chfs_proto::msg::SetAttr::default() {
            self.client.setattr(&path, change)?
        } else {
            self.client.lstat(&path)?
        };
        Ok(Attr::from_stat(ino, &s))
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ino: Ino) -> Result<String> {
        let _op = debug_span!("fuse", op = "readlink").entered();
        let p = self.path(ino)?;
        Ok(self.client.readlink(&p)?)
    }

    /// Makes a special file (or a regular one) owned by `who`.
    pub fn mknod(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "mknod").entered();
        let p = self.child(parent, name)?;
        self.user(who).mknod(&p, mode, rdev as u64)?;
        self.entry(&p)
    }

    /// Makes a directory owned by `who`.
    pub fn mkdir(&self, who: Caller, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "mkdir").entered();
        let p = self.child(parent, name)?;
        self.user(who).mkdir(&p, mode & 0o7777)?;
        self.entry(&p)
    }

    /// Removes a file; one open through this core stays readable and
    /// writable through its handles until its last [`Core::release`].
    pub fn unlink(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let _op = debug_span!("fuse", op = "unlink").entered();
        let p = self.child(parent, name)?;
        self.do_unlink(&p)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let _op = debug_span!("fuse", op = "rmdir").entered();
        let p = self.child(parent, name)?;
        self.client.rmdir(&p)?;
        lock(&self.dir_attrs).clear();
        lock(&self.table).detach(&p);
        Ok(())
    }

    /// Makes a symbolic link `link_name` -> `target`, owned by `who`.
    pub fn symlink(
        &self,
        who: Caller,
        parent: Ino,
        link_name: &OsStr,
        target: &OsStr,
    ) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "symlink").entered();
        let p = self.child(parent, link_name)?;
        let t = name_str(target)?;
        self.user(who).symlink(t, &p)?;
        self.entry(&p)
    }

    /// Renames an entry; `flags` are renameat2(2)'s (only
    /// `RENAME_NOREPLACE` is supported). Open files at or below the old
    /// name keep their inode numbers and handles.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let _op = debug_span!("fuse", op = "rename").entered();
        // RENAME_EXCHANGE / RENAME_WHITEOUT: not supported (EINVAL, as
        // renameat2(2) documents for flags a file system lacks).
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(Error::EINVAL);
        }
        let old = self.child(parent, name)?;
        let new = self.child(newparent, newname)?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        self.client.rename_flags(&old, &new, noreplace)?;
        if old != new {
            lock(&self.dir_attrs).clear();
            let inos = lock(&self.table).rename(&old, &new);
            self.reopen_moved(&inos);
        }
        Ok(())
    }

    /// Hard links are not supported (entries are keyed by path): EPERM.
    pub fn link(&self, _ino: Ino, _newparent: Ino, _newname: &OsStr) -> Result<Attr> {
        let _op = debug_span!("fuse", op = "link").entered();
        Err(Error::EPERM)
    }

    /// Opens file `ino` with open(2) `flags`.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<Opened> {
        let _op = debug_span!("fuse", op = "open").entered();
        let p = self.path(ino)?;
        let fd = self.client.open(&p, self.open_flags(flags), 0)?;
        Ok(self.new_file(ino, fd, flags))
    }

    /// Reads into `buf`; the number of bytes read.
    pub fn read(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _op = debug_span!("fuse", op = "read").entered();
        debug!(fh = fh.0, offset, size = buf.len(), "read");
        let fd = self.fd(fh)?;
        self.client
            .pread(fd, buf, offset)
            .map_err(|e| data_error("read", e))
    }

    /// Writes `data` at `offset` (at the end for an `O_APPEND` handle
    /// without the write-back cache); the number of bytes written.
    pub fn write(&self, fh: Fh, offset: u64, data: &[u8]) -> Result<usize> {
        let _op = debug_span!("fuse", op = "write").entered();
        debug!(fh = fh.0, offset, size = data.len(), "write");
        let f = self.file(fh)?;
        let fd = *lock(&f.fd);
        let n = if f.append && !self.opts.writeback_cache {
            self.client.write(fd, data)
        } else {
            self.client.pwrite(fd, data, offset)
        }
        .map_err(|e| data_error("write", e))?;
        if f.sync {
            self.client.fsync(fd)?;
        }
        Ok(n)
    }

    /// close(2): publish size and buffered data so other nodes see them.
    pub fn flush(&self, fh: Fh) -> Result<()> {
        let _op = debug_span!("fuse", op = "flush").entered();
        let fd = self.fd(fh)?;
        Ok(self.client.flush(fd)?)
    }

    /// The last close of handle `fh`: its descriptor is closed, and a file
    /// unlinked while open is removed once no handle has it open.
    pub fn release(&self, fh: Fh) -> Result<()> {
        let _op = debug_span!("fuse", op = "release").entered();
        let h = lock(&self.handles).remove(&fh.0);
        let Some(Handle::File(f)) = h else {
            return Err(Error::EBADF);
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
        r.map_err(Error::from)
    }

    /// fsync(2) of an open file.
    pub fn fsync(&self, fh: Fh) -> Result<()> {
        let _op = debug_span!("fuse", op = "fsync").entered();
        let fd = self.fd(fh)?;
        Ok(self.client.fsync(fd)?)
    }

    /// Opens a directory for [`Core::readdir`].
    pub fn opendir(&self) -> Fh {
        let _op = debug_span!("fuse", op = "opendir").entered();
        self.add_handle(Handle::Dir(Arc::new(DirH {
            entries: Mutex::new(None),
        })))
    }

    /// Lists the open directory `fh` from `offset`, handing each entry
    /// (inode, next offset, type, name) to `add` until it returns true
    /// (reply full). The listing is read at offset 0 and kept, so offsets
    /// stay valid while the directory changes.
    pub fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        mut add: impl FnMut(Ino, u64, FileKind, &str) -> bool,
    ) -> Result<()> {
        let _op = debug_span!("fuse", op = "readdir").entered();
        let d = match lock(&self.handles).get(&fh.0) {
            Some(Handle::Dir(d)) => d.clone(),
            _ => return Err(Error::EBADF),
        };
        let mut ents = lock(&d.entries);
        if offset == 0 || ents.is_none() {
            *ents = Some(self.load_dir(ino)?);
        }
        let list = ents.as_ref().expect("loaded");
        for (i, (name, eino, kind)) in list.iter().enumerate().skip(offset as usize) {
            if add(Ino(*eino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// Closes directory handle `fh`.
    pub fn releasedir(&self, fh: Fh) {
        let _op = debug_span!("fuse", op = "releasedir").entered();
        lock(&self.handles).remove(&fh.0);
    }

    /// Capacity and use of the pool.
    pub fn statfs(&self) -> Result<FsStat> {
        let _op = debug_span!("fuse", op = "statfs").entered();
        // The numbers every C view of the pool reports (StatFs::counts).
        let (blocks, free, files, _) = self.client.statfs()?.counts();
        Ok(FsStat {
            blocks,
            free,
            files,
            bsize: chfs_client::StatFs::BLOCK as u32,
            namelen: chfs_proto::path::MAX_NAME as u32,
        })
    }

    /// access(2): may `who` access `ino` as `mask` (`R_OK`, ...) asks?
    pub fn access(&self, who: Caller, ino: Ino, mask: i32) -> Result<()> {
        let _op = debug_span!("fuse", op = "access").entered();
        let p = self.path(ino)?;
        Ok(self.user(who).access(&p, mask)?)
    }

    /// Creates and opens a file owned by `who` (`O_EXCL` in `flags` fails
    /// on an existing one).
    pub fn create(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let _op = debug_span!("fuse", op = "create").entered();
        let p = self.child(parent, name)?;
        let fl = self.open_flags(flags) | libc::O_CREAT | (flags & libc::O_EXCL);
        let fd = self.user(who).open(&p, fl, mode & 0o7777)?;
        // The entry the server returned at create: no second trip.
        let a = match self.client.fstat_cached(fd) {
            Ok(s) => Attr::from_stat(Ino(lock(&self.table).intern(&p, s.ino)), &s),
            Err(e) => {
                let _ = self.client.close(fd);
                return Err(e.into());
            }
        };
        let opened = self.new_file(a.ino, fd, flags);
        debug!(ino = a.ino.0, "created");
        Ok((a, opened))
    }

    /// Publishes what open files still hold at unmount; the backend
    /// write-back (cache mode) is not the mount's to wait for (`chfs sync`,
    /// `chfsctl stop`).
    pub fn destroy(&self) {
        if let Err(e) = self.client.flush_all() {
            warn!(error = %e, "flushing open files at unmount");
        }
    }
}

/// The errno of a failed read or write. An EIO (data lost with a server
/// that restarted empty, a server that failed) is logged with the client's
/// message, which names the file and the server: the application only
/// sees "Input/output error".
fn data_error(what: &str, e: chfs_client::Error) -> Error {
    if e.errno() == libc::EIO {
        warn!(error = %e, "{what} failed");
    }
    Error::from(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_utf8() {
        let bad = OsStr::from_bytes(b"a\xff");
        assert_eq!(name_str(bad).unwrap_err(), Error::EILSEQ);
        assert_eq!(name_str(OsStr::new("ok")).unwrap(), "ok");
    }

    #[test]
    fn kinds_round_trip_through_mode_bits() {
        for k in [
            FileKind::RegularFile,
            FileKind::Directory,
            FileKind::Symlink,
            FileKind::NamedPipe,
            FileKind::CharDevice,
            FileKind::BlockDevice,
            FileKind::Socket,
        ] {
            assert_eq!(FileKind::from_mode(k.mode_bits() | 0o644), k);
        }
    }

    #[test]
    fn errors_are_positive_errnos() {
        assert_eq!(Error::from_errno(libc::ENOENT), Error::ENOENT);
        assert_eq!(Error::from_errno(0), Error::EIO);
        assert_eq!(Error::from_errno(-5), Error::EIO);
        let e = chfs_client::Error::new(libc::ENOTEMPTY, "not empty");
        assert_eq!(Error::from(&e).errno(), libc::ENOTEMPTY);
        assert_eq!(Error::from(e).errno(), libc::ENOTEMPTY);
    }
}
