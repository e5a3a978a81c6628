//! The backend directory of cache mode: every access resolves beneath the
//! backend root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so
//! neither `..` nor a symbolic link inside the backend can reach a file
//! outside it. All calls are blocking; the server runs them on tokio's
//! blocking pool.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use chfs_proto::Meta;

/// Status of a backend entry.
pub type BStat = libc::stat;

/// A backend directory.
pub struct Backend {
    root: OwnedFd,
    path: PathBuf,
    /// Entries looked up (tests count them).
    #[cfg(test)]
    lookups: std::sync::atomic::AtomicU64,
    /// Paths opened beneath the root (tests count them).
    #[cfg(test)]
    opens: std::sync::atomic::AtomicU64,
    /// Directory entries read (tests count them).
    #[cfg(test)]
    names_read: std::sync::atomic::AtomicU64,
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Path relative to the backend root ("." for the root).
fn rel(path: &str) -> &str {
    let r = path.trim_start_matches('/');
    if r.is_empty() {
        "."
    } else {
        r
    }
}

/// Splits a relative path into its parent ("." at top) and name.
fn split(r: &str) -> (&str, &str) {
    match r.rfind('/') {
        Some(i) => (&r[..i], &r[i + 1..]),
        None => (".", r),
    }
}

fn ns_to_timespec(ns: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000),
    }
}

/// Modification time of a backend status, ns since the epoch.
pub fn mtime_ns(st: &BStat) -> i64 {
    st.st_mtime * 1_000_000_000 + st.st_mtime_nsec
}

impl Backend {
    /// Opens the backend root (which must be a directory).
    pub fn open(path: &Path) -> io::Result<Backend> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: c is a valid NUL-terminated string; open returns a new fd or -1.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: fd was just returned by open and is owned by nobody else.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Backend {
            root,
            path: path.to_path_buf(),
            #[cfg(test)]
            lookups: Default::default(),
            #[cfg(test)]
            opens: Default::default(),
            #[cfg(test)]
            names_read: Default::default(),
        })
    }

    /// The backend directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `path` (a normalised chfs path) beneath the root.
    fn open_at(&self, path: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let c = cstr(rel(path))?;
        #[cfg(test)]
        self.opens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: open_how is plain data; all-zero is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.mode = mode as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: openat2 reads `how` (valid, correctly sized) and the
        // NUL-terminated path; it returns a new fd or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor owned by us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn fstat(fd: &OwnedFd) -> io::Result<BStat> {
        // SAFETY: st is plain data; fstat fills it on success.
        let mut st: BStat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open; &mut st is valid for writes.
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        Ok(st)
    }

    /// `lstat` of a backend entry; `None` if it does not exist.
    pub fn lstat(&self, path: &str) -> io::Result<Option<BStat>> {
        match self.open_at(path, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Ok(fd) => Ok(Some(Self::fstat(&fd)?)),
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Target of a backend symbolic link.
    pub fn readlink(&self, path: &str) -> io::Result<Vec<u8>> {
        let fd = self.open_at(path, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        let empty = cstr("")?;
        // SAFETY: fd is open; buf is valid for buf.len() bytes.
        let n = unsafe {
            libc::readlinkat(
                fd.as_raw_fd(),
                empty.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Reads up to `len` bytes at `off` of a backend file.
    pub fn read(&self, path: &str, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let fd = self.open_at(path, libc::O_RDONLY, 0)?;
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            // SAFETY: buf[got..] is valid for len - got bytes.
            let n = unsafe {
                libc::pread(
                    fd.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    len - got,
                    (off + got as u64) as i64,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                break;
            }
            got += n as usize;
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Opens backend directory `path` to read its names and look its
    /// entries up through one descriptor; `None` if it does not exist.
    pub fn dir(&self, path: &str) -> io::Result<Option<Dir<'_>>> {
        let fd = match self.open_at(path, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        // SAFETY: fd is an open directory; on success the stream owns it.
        let stream = unsafe { libc::fdopendir(fd.as_raw_fd()) };
        let Some(stream) = std::ptr::NonNull::new(stream) else {
            return Err(io::Error::last_os_error());
        };
        std::mem::forget(fd);
        Ok(Some(Dir {
            backend: self,
            stream,
        }))
    }

    /// Entries looked up by [`Dir::lookup`] so far.
    #[cfg(test)]
    pub fn lookups(&self) -> u64 {
        self.lookups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Paths opened beneath the root so far.
    #[cfg(test)]
    pub fn opens(&self) -> u64 {
        self.opens.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Directory entries read so far.
    #[cfg(test)]
    pub fn names_read(&self) -> u64 {
        self.names_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Creates the missing directories above `path` (mode 0755).
    fn make_parents(&self, path: &str) -> io::Result<()> {
        let r = rel(path);
        let mut at = 0;
        while let Some(i) = r[at..].find('/') {
            let dir = &r[..at + i];
            self.mkdir_one(dir, 0o755)?;
            at += i + 1;
        }
        Ok(())
    }

    fn mkdir_one(&self, r: &str, mode: u32) -> io::Result<()> {
        let (parent, name) = split(r);
        let pfd = self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let c = cstr(name)?;
        // SAFETY: pfd is an open directory; c is a valid name.
        match cvt(unsafe { libc::mkdirat(pfd.as_raw_fd(), c.as_ptr(), mode) }) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn open_for_write(&self, path: &str, mode: u32) -> io::Result<OwnedFd> {
        match self.open_at(path, libc::O_WRONLY | libc::O_CREAT, mode & 0o7777) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                self.make_parents(path)?;
                self.open_at(path, libc::O_WRONLY | libc::O_CREAT, mode & 0o7777)
            }
            r => r,
        }
    }

    fn pwrite_all(fd: &OwnedFd, data: &[u8], off: u64) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            // SAFETY: data[done..] is valid for reading data.len() - done bytes.
            let n = unsafe {
                libc::pwrite(
                    fd.as_raw_fd(),
                    data[done..].as_ptr().cast(),
                    data.len() - done,
                    (off + done as u64) as i64,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            done += n as usize;
        }
        Ok(())
    }

    fn set_times(fd: &OwnedFd, atime: Option<i64>, mtime: i64) -> io::Result<()> {
        let omit = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        };
        let ts = [atime.map_or(omit, ns_to_timespec), ns_to_timespec(mtime)];
        // SAFETY: fd is open; ts holds two valid timespecs.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), ts.as_ptr()) })?;
        Ok(())
    }

    /// Writes the bytes of a data chunk at `off` of a backend file, creating
    /// it (and missing parents) if needed. The file's mtime ends as the
    /// later of the chunk's and what the backend file had before this write
    /// (which chunk 0 may have set to the file's own mtime already), never
    /// the time of the write-back: the chunks of a file are flushed by
    /// several servers in any order.
    pub fn write_chunk(&self, path: &str, off: u64, data: &[u8], meta: &Meta) -> io::Result<()> {
        let fd = self.open_for_write(path, meta.mode)?;
        let before = mtime_ns(&Self::fstat(&fd)?);
        Self::pwrite_all(&fd, data, off)?;
        Self::set_times(&fd, None, before.max(meta.mtime))
    }

    /// Makes the backend entry match a chfs entry (chunk 0): type, chunk-0
    /// bytes (unless `data` is `None`), size, mode and times.
    pub fn write_entry(&self, path: &str, meta: &Meta, data: Option<&[u8]>) -> io::Result<()> {
        let r = rel(path);
        match meta.file_type() {
            libc::S_IFDIR => {
                if r != "." {
                    self.make_parents(path)?;
                    self.mkdir_one(r, meta.mode & 0o7777)?;
                }
                let fd = self.open_at(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                // SAFETY: fd is an open directory.
                cvt(unsafe { libc::fchmod(fd.as_raw_fd(), meta.mode & 0o7777) })?;
                Self::set_times(&fd, Some(meta.atime), meta.mtime)
            }
            libc::S_IFREG => {
                let fd = self.open_for_write(path, meta.mode)?;
                if let Some(d) = data {
                    Self::pwrite_all(&fd, d, 0)?;
                }
                // SAFETY: fd is open for writing.
                cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), meta.size as i64) })?;
                // SAFETY: fd is open.
                cvt(unsafe { libc::fchmod(fd.as_raw_fd(), meta.mode & 0o7777) })?;
                Self::set_times(&fd, Some(meta.atime), meta.mtime)
            }
            libc::S_IFLNK => {
                let target = data.unwrap_or_default();
                self.make_parents(path)?;
                if let Ok(Some(st)) = self.lstat(path) {
                    if st.st_mode & libc::S_IFMT == libc::S_IFLNK && self.readlink(path)? == target
                    {
                        return Ok(());
                    }
                    self.unlink(path)?;
                }
                let (parent, name) = split(r);
                let pfd = self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
                let (t, n) = (
                    CString::new(target).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
                    cstr(name)?,
                );
                // SAFETY: valid strings and an open directory fd.
                cvt(unsafe { libc::symlinkat(t.as_ptr(), pfd.as_raw_fd(), n.as_ptr()) })?;
                Ok(())
            }
            libc::S_IFIFO => {
                self.make_parents(path)?;
                let (parent, name) = split(r);
                let pfd = self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
                let n = cstr(name)?;
                // SAFETY: valid name and open directory fd.
                match cvt(unsafe {
                    libc::mknodat(
                        pfd.as_raw_fd(),
                        n.as_ptr(),
                        libc::S_IFIFO | (meta.mode & 0o7777),
                        0,
                    )
                }) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => Err(e),
                    _ => Ok(()),
                }
            }
            // Sockets and device nodes stay in the cache only.
            _ => Ok(()),
        }
    }

    /// Removes a backend file (`ENOENT` is not an error).
    pub fn unlink(&self, path: &str) -> io::Result<()> {
        self.remove(path, 0)
    }

    /// Removes an empty backend directory (`ENOENT` is not an error).
    pub fn rmdir(&self, path: &str) -> io::Result<()> {
        self.remove(path, libc::AT_REMOVEDIR)
    }

    fn remove(&self, path: &str, flags: i32) -> io::Result<()> {
        let (parent, name) = split(rel(path));
        let pfd = match self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let n = cstr(name)?;
        // SAFETY: open directory fd and a valid name.
        match cvt(unsafe { libc::unlinkat(pfd.as_raw_fd(), n.as_ptr(), flags) }) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
            _ => Ok(()),
        }
    }

    /// Renames a backend entry (`ENOENT` of the source is not an error).
    pub fn rename(&self, old: &str, new: &str) -> io::Result<()> {
        let (op, on) = split(rel(old));
        let (np, nn) = split(rel(new));
        let ofd = match self.open_at(op, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.lstat(old)?.is_none() {
            return Ok(());
        }
        self.make_parents(new)?;
        let nfd = self.open_at(np, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let (a, b) = (cstr(on)?, cstr(nn)?);
        // SAFETY: open directory fds and valid names.
        cvt(unsafe { libc::renameat(ofd.as_raw_fd(), a.as_ptr(), nfd.as_raw_fd(), b.as_ptr()) })?;
        Ok(())
    }
}

/// An open backend directory ([`Backend::dir`]).
pub struct Dir<'a> {
    /// Its backend (whose counters tests read).
    #[cfg_attr(not(test), allow(dead_code))]
    backend: &'a Backend,
    stream: std::ptr::NonNull<libc::DIR>,
}

impl Dir<'_> {
    /// Calls `f` with the name of each entry (not `.` and `..`; names
    /// that are not UTF-8 are skipped) until it returns false.
    fn each(&mut self, mut f: impl FnMut(&str) -> bool) -> io::Result<()> {
        loop {
            // SAFETY: errno is this thread's; readdir sets it only on error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: the stream is open and used by this thread only.
            let e = unsafe { libc::readdir(self.stream.as_ptr()) };
            if e.is_null() {
                return match io::Error::last_os_error() {
                    err if err.raw_os_error() == Some(0) => Ok(()),
                    err => Err(err),
                };
            }
            // SAFETY: d_name of an entry readdir returned is NUL-terminated
            // and valid until the next readdir on the stream.
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
            let name = name.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            #[cfg(test)]
            self.backend
                .names_read
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Ok(name) = std::str::from_utf8(name) {
                if !f(name) {
                    return Ok(());
                }
            }
        }
    }

    /// The names of the entries that `keep` accepts, in no order. Reads
    /// the directory only: no entry is looked up.
    pub fn names(&mut self, keep: impl Fn(&str) -> bool) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        self.each(|name| {
            if keep(name) {
                names.push(name.to_string());
            }
            true
        })?;
        Ok(names)
    }

    /// Has the directory an entry? Reads up to the first.
    pub fn has_entries(&mut self) -> io::Result<bool> {
        let mut any = false;
        self.each(|_| {
            any = true;
            false
        })?;
        Ok(any)
    }

    /// The status of entries `names`; a name that vanished meanwhile is
    /// left out.
    pub fn lookup(&self, names: Vec<String>) -> io::Result<Vec<(String, BStat)>> {
        // SAFETY: the stream is open; its descriptor stays valid while it is.
        let fd = unsafe { libc::dirfd(self.stream.as_ptr()) };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let c = cstr(&name)?;
            // SAFETY: plain data filled by fstatat on success.
            let mut st: BStat = unsafe { std::mem::zeroed() };
            #[cfg(test)]
            self.backend
                .lookups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: fd is an open directory, c a valid name, st writable.
            if unsafe { libc::fstatat(fd, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0 {
                out.push((name, st));
            }
        }
        Ok(out)
    }
}

impl Drop for Dir<'_> {
    fn drop(&mut self) {
        // SAFETY: the stream is open and closed only here (with its fd).
        unsafe { libc::closedir(self.stream.as_ptr()) };
    }
}

/// Metadata of a chfs entry made from a backend status (a cached copy).
pub fn meta_from_stat(st: &BStat, chunk_size: u32, fileid: u32) -> Meta {
    let ft = st.st_mode & libc::S_IFMT;
    let mut flags = chfs_proto::meta::FLAG_CACHED;
    if ft == libc::S_IFREG {
        flags |= chfs_proto::meta::FLAG_PARTIAL;
    }
    Meta {
        flags,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        size: if ft == libc::S_IFREG || ft == libc::S_IFLNK {
            st.st_size as u64
        } else {
            0
        },
        chunk_size,
        rdev: st.st_rdev as u32,
        mtime: mtime_ns(st),
        ctime: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        atime: st.st_atime * 1_000_000_000 + st.st_atime_nsec,
        fileid,
        crc: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_meta(mtime: i64) -> Meta {
        Meta {
            mode: libc::S_IFREG | 0o644,
            size: 8,
            mtime,
            atime: mtime,
            ctime: mtime,
            ..Default::default()
        }
    }

    fn backend_mtime(b: &Backend, path: &str) -> i64 {
        mtime_ns(&b.lstat(path).unwrap().unwrap())
    }

    /// A file's chunks reach the backend from several servers in any order;
    /// its mtime must end as the file's, not as the time of the write-back.
    #[test]
    fn a_chunk_written_back_after_chunk_zero_keeps_the_files_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(dir.path()).unwrap();
        let file = 1_600_000_000_123_456_789; // the file's mtime (chunk 0)
        let older = file - 5_000_000_000; // chunk 1 was written before
        b.write_entry("/f", &file_meta(file), Some(b"abcd"))
            .unwrap();
        b.write_chunk("/f", 4, b"efgh", &file_meta(older)).unwrap();
        assert_eq!(backend_mtime(&b, "/f"), file);
        // The other order: the chunk first (creating the file), then chunk 0.
        b.write_chunk("/g", 4, b"efgh", &file_meta(older)).unwrap();
        b.write_entry("/g", &file_meta(file), Some(b"abcd"))
            .unwrap();
        assert_eq!(backend_mtime(&b, "/g"), file);
        assert_eq!(std::fs::read(dir.path().join("g")).unwrap(), b"abcdefgh");
        // A chunk newer than what the backend has moves the mtime forward.
        let newer = file + 7_000_000_000;
        b.write_chunk("/f", 0, b"ABCD", &file_meta(newer)).unwrap();
        assert_eq!(backend_mtime(&b, "/f"), newer);
    }
}
