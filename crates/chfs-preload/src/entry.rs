//! The interposed functions (libc's names and prototypes).

use super::*;

// ----- open and close ----------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_open(
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: `path` is the caller's C string; real::open gets it unchanged.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::open(p, flags, mode),
            |p| chfs_open(p, flags, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: as in chfs_preload_open.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::openat(d, p, flags, mode),
            |p| chfs_open(p, flags, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe { chfs_preload_open(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if owned::has(fd) {
        if client_thread() {
            owned::remove(fd);
            // SAFETY: the client closes a descriptor of its own.
            return unsafe { real::close(fd) };
        }
        // The program closes the library's descriptor (a close loop):
        // it stays open, and the call succeeds.
        return 0;
    }
    if ours(fd).is_none() || foreign_child() {
        // SAFETY: libc's close with the caller's descriptor (in a vfork
        // child, its own kernel descriptor only: the table is the
        // parent's).
        return unsafe { real::close(fd) };
    }
    run(|| {
        let f = fds::take(fd);
        // SAFETY: our reserved descriptor.
        unsafe { real::close(fd) };
        match f {
            Some(f) => release(f).map(|()| 0),
            None => Ok(0),
        }
    })
}

// ----- dup and fcntl -----------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if owned::has(fd) && client_thread() {
        // SAFETY: libc's dup of the client's own descriptor.
        let n = unsafe { real::dup(fd) };
        return if n >= 0 { hold(n) } else { n };
    }
    let Some(f) = ours(fd).filter(|_| !foreign_child()) else {
        // SAFETY: libc's dup.
        return unsafe { real::dup(fd) };
    };
    run(|| {
        // SAFETY: libc's dup of our reserved descriptor.
        let n = unsafe { real::dup(fd) };
        if n < 0 {
            return Err(last_os_error("dup"));
        }
        fds::set(n, f);
        Ok(n)
    })
}

fn dup_onto(old: c_int, new: c_int, real_dup: impl FnOnce() -> c_int) -> c_int {
    if owned::has(new) && !client_thread() {
        // The number is the client's (a socket, the kept /dev/null).
        set_errno(libc::EBUSY);
        return -1;
    }
    let from = ours(old);
    if from.is_none() && ours(new).is_none() || foreign_child() {
        return real_dup();
    }
    run(|| {
        let prev = fds::take(new);
        let r = real_dup();
        if r < 0 {
            let e = last_os_error("dup2");
            if let Some(p) = prev {
                fds::set(new, p);
            }
            return Err(e);
        }
        if let Some(p) = prev {
            let _ = release(p);
        }
        if let Some(f) = from {
            fds::set(new, f);
        }
        Ok(r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // SAFETY: libc's dup2.
        return unsafe { real::dup2(old, new) };
    }
    // SAFETY: libc's dup2 with the caller's descriptors.
    dup_onto(old, new, || unsafe { real::dup2(old, new) })
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: libc's dup3 with the caller's descriptors.
    dup_onto(old, new, || unsafe { real::dup3(old, new, flags) })
}

/// Closes the program's descriptors in `first..=last` (`flags` as
/// close_range's): chfs-rs files are released as by `close`; the
/// library's own descriptors are left out.
fn close_span(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    if first > last {
        set_errno(libc::EINVAL);
        return -1;
    }
    if foreign_child() {
        // A vfork child (Python's subprocess): its own kernel descriptors.
        return close_piece(first, last, flags);
    }
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_uint == 0 && !inside() {
        // chfs-rs files in the range are closed as close would.
        let files: Vec<_> = fds::numbers()
            .into_iter()
            .filter(|&fd| (first..=last).contains(&(fd as c_uint)))
            .collect();
        if !files.is_empty() {
            run(|| {
                for fd in files {
                    if let Some(f) = fds::take(fd) {
                        let _ = release(f);
                    }
                }
                Ok(())
            });
        }
    }
    let keep = if client_thread() {
        Vec::new()
    } else {
        owned::within(first, last)
    };
    // The range without the library's descriptors, piece by piece.
    let mut from = u64::from(first);
    for k in keep {
        if k as u64 > from && close_piece(from as c_uint, k as c_uint - 1, flags) != 0 {
            return -1;
        }
        from = k as u64 + 1;
    }
    if from <= u64::from(last) {
        return close_piece(from as c_uint, last, flags);
    }
    0
}

/// libc's close_range; on a kernel without it (before 5.9), the open
/// descriptors in the range one by one, as glibc's closefrom does.
fn close_piece(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    // SAFETY: libc's close_range on numbers that are not the library's.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == 0 || errno() != libc::ENOSYS || flags != 0 {
        return r;
    }
    let open: Vec<c_int> = {
        let _in = Inside::enter();
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return r;
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd: &c_int| (first..=last).contains(&(fd as c_uint)))
            .collect()
    };
    for fd in open {
        // SAFETY: libc's close of a descriptor that is not the library's
        // (the one read_dir used is closed already).
        unsafe { real::close(fd) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    close_span(first, last, flags as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let saved = errno();
    close_span(low.max(0) as c_uint, c_uint::MAX, 0);
    set_errno(saved);
}

/// The client's sockets are the library's (see [`owned`]); the
/// program's own go to libc untouched.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: libc's socket with the caller's arguments.
    let fd = unsafe { real::socket(domain, ty, proto) };
    if fd >= 0 && client_thread() {
        return hold(fd);
    }
    fd
}

/// The other descriptors a transport makes for itself (libfabric's, opened
/// by the client when it reaches an `ofi+` server: a socket pair and an
/// epoll set per connection manager, pipes or eventfds as wait objects in
/// other providers) are the library's too: a program closing every
/// descriptor would otherwise cut the fabric off.
#[no_mangle]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    proto: c_int,
    sv: *mut c_int,
) -> c_int {
    // SAFETY: libc's socketpair with the caller's arguments.
    let rc = unsafe { real::socketpair(domain, ty, proto, sv) };
    // SAFETY: on success libc wrote two descriptors at `sv`.
    unsafe { hold_pair(rc, sv) }
}

#[no_mangle]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: libc's pipe with the caller's array.
    let rc = unsafe { real::pipe(fds) };
    // SAFETY: on success libc wrote two descriptors at `fds`.
    unsafe { hold_pair(rc, fds) }
}

#[no_mangle]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: libc's pipe2 with the caller's arguments.
    let rc = unsafe { real::pipe2(fds, flags) };
    // SAFETY: on success libc wrote two descriptors at `fds`.
    unsafe { hold_pair(rc, fds) }
}

/// The two descriptors at `fds` (written by a call that returned `rc`)
/// held when the client made them.
unsafe fn hold_pair(rc: c_int, fds: *mut c_int) -> c_int {
    if rc == 0 && client_thread() {
        for i in 0..2 {
            // SAFETY: `fds` points to the two descriptors just made.
            unsafe { *fds.add(i) = hold(*fds.add(i)) };
        }
    }
    rc
}

/// A descriptor `fd` just made, held when the client made it.
fn hold_new(fd: c_int) -> c_int {
    if fd >= 0 && client_thread() {
        return hold(fd);
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: libc's epoll_create with the caller's argument.
    hold_new(unsafe { real::epoll_create(size) })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: libc's epoll_create1 with the caller's argument.
    hold_new(unsafe { real::epoll_create1(flags) })
}

#[no_mangle]
pub unsafe extern "C" fn eventfd(initval: c_uint, flags: c_int) -> c_int {
    // SAFETY: libc's eventfd with the caller's arguments.
    hold_new(unsafe { real::eventfd(initval, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int {
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && owned::has(fd) && client_thread() {
        // The client duplicates a socket of its own (a stream's
        // try_clone): the copy is the library's too.
        // SAFETY: libc's fcntl with the client's arguments.
        let n = unsafe { real::fcntl(fd, cmd, arg) };
        return if n >= 0 { hold(n) } else { n };
    }
    let Some(f) = ours(fd) else {
        // SAFETY: libc's fcntl with the caller's arguments.
        return unsafe { real::fcntl(fd, cmd, arg) };
    };
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && foreign_child() {
        // SAFETY: as above (a vfork child's own kernel descriptor).
        return unsafe { real::fcntl(fd, cmd, arg) };
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => run(|| {
            // SAFETY: libc's fcntl on our reserved descriptor.
            let n = unsafe { real::fcntl(fd, cmd, arg) };
            if n < 0 {
                return Err(last_os_error("fcntl"));
            }
            fds::set(n, f);
            Ok(n)
        }),
        libc::F_GETFL => f.flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK),
        // O_APPEND / O_NONBLOCK changes are not passed on (yet).
        libc::F_SETFL => 0,
        // F_GETFD/F_SETFD (close-on-exec) and locks act on the reserved
        // kernel descriptor: close-on-exec is right; locks are local.
        // SAFETY: libc's fcntl on our reserved descriptor.
        _ => unsafe { real::fcntl(fd, cmd, arg) },
    }
}

// ----- data --------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's read with the caller's arguments.
        || unsafe { real::read(fd, buf, n) },
        // SAFETY: `buf` is writable for `n` bytes (read(2)'s contract).
        |c, cfd, _| Ok(c.read(cfd, unsafe { out_buf(buf, n) }?)? as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if ours(fd).is_none() {
        // SAFETY: libc's __read_chk with the caller's arguments.
        return unsafe { real::__read_chk(fd, buf, n, buflen) };
    }
    // SAFETY: the buffer holds `buflen` bytes.
    unsafe { read(fd, buf, n.min(buflen)) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's write with the caller's arguments.
        || unsafe { real::write(fd, buf, n) },
        // SAFETY: `buf` is readable for `n` bytes.
        |c, cfd, _| Ok(c.write(cfd, unsafe { in_buf(buf, n) }?)? as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's pread with the caller's arguments.
        || unsafe { real::pread64(fd, buf, n, off) },
        // SAFETY: `buf` is writable for `n` bytes.
        |c, cfd, _| Ok(c.pread(cfd, unsafe { out_buf(buf, n) }?, offset(off)?)? as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off_t,
    buflen: size_t,
) -> ssize_t {
    if ours(fd).is_none() {
        // SAFETY: libc's function with the caller's arguments.
        return unsafe { real::__pread64_chk(fd, buf, n, off, buflen) };
    }
    // SAFETY: the buffer holds `buflen` bytes.
    unsafe { pread64(fd, buf, n.min(buflen), off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's pwrite with the caller's arguments.
        || unsafe { real::pwrite64(fd, buf, n, off) },
        // SAFETY: `buf` is readable for `n` bytes.
        |c, cfd, _| Ok(c.pwrite(cfd, unsafe { in_buf(buf, n) }?, offset(off)?)? as ssize_t),
    )
}

fn iov_total(v: &[libc::iovec]) -> usize {
    v.iter().map(|e| e.iov_len).sum()
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's readv with the caller's arguments.
        || unsafe { real::readv(fd, iov, cnt) },
        |c, cfd, _| {
            // SAFETY: `iov` holds `cnt` iovecs.
            let v = unsafe { iovecs(iov, cnt) }?;
            let mut buf = vec![0u8; iov_total(v)];
            let n = c.read(cfd, &mut buf)?;
            scatter(v, &buf[..n])?;
            Ok(n as ssize_t)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's writev with the caller's arguments.
        || unsafe { real::writev(fd, iov, cnt) },
        |c, cfd, _| {
            // SAFETY: `iov` holds `cnt` iovecs.
            let v = unsafe { iovecs(iov, cnt) }?;
            Ok(c.write(cfd, &gather(v)?)? as ssize_t)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off_t,
) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's preadv with the caller's arguments.
        || unsafe { real::preadv64(fd, iov, cnt, off) },
        |c, cfd, _| {
            // SAFETY: `iov` holds `cnt` iovecs.
            let v = unsafe { iovecs(iov, cnt) }?;
            let mut buf = vec![0u8; iov_total(v)];
            let n = c.pread(cfd, &mut buf, offset(off)?)?;
            scatter(v, &buf[..n])?;
            Ok(n as ssize_t)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off_t,
) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's pwritev with the caller's arguments.
        || unsafe { real::pwritev64(fd, iov, cnt, off) },
        |c, cfd, _| {
            // SAFETY: `iov` holds `cnt` iovecs.
            let v = unsafe { iovecs(iov, cnt) }?;
            Ok(c.pwrite(cfd, &gather(v)?, offset(off)?)? as ssize_t)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, w: c_int) -> off_t {
    by_fd(
        fd,
        // SAFETY: libc's lseek.
        || unsafe { real::lseek64(fd, off, w) },
        |c, cfd, f| {
            if f.dir && off == 0 && w == libc::SEEK_SET {
                // Rewinds getdents64.
                *lock(&f.list) = None;
            }
            let p = c.seek(cfd, off, whence(w)?)?;
            off_t::try_from(p).map_err(|_| Error::new(libc::EOVERFLOW, "offset".to_string()))
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: libc's fsync.
    by_fd(
        fd,
        || unsafe { real::fsync(fd) },
        |c, cfd, _| c.fsync(cfd).map(|()| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: libc's fdatasync.
    by_fd(
        fd,
        || unsafe { real::fdatasync(fd) },
        |c, cfd, _| c.fsync(cfd).map(|()| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's ftruncate.
        || unsafe { real::ftruncate(fd, len) },
        |c, cfd, _| c.ftruncate(cfd, offset(len)?).map(|()| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's fallocate.
        || unsafe { real::fallocate(fd, mode, off, len) },
        |_, _, _| err(libc::EOPNOTSUPP, "fallocate"),
    )
}

/// posix_fallocate returns the error number instead of setting errno.
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int {
    if ours(fd).is_none() {
        // SAFETY: libc's posix_fallocate.
        return unsafe { real::posix_fallocate(fd, off, len) };
    }
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    if ours(fd).is_none() {
        // SAFETY: libc's posix_fadvise.
        return unsafe { real::posix_fadvise(fd, off, len, advice) };
    }
    0
}

/// mmap of a chfs-rs descriptor: ENODEV (as for a file system without
/// mmap support).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 && ours(fd).is_some() {
        set_errno(libc::ENODEV);
        return libc::MAP_FAILED;
    }
    // SAFETY: libc's mmap with the caller's arguments.
    unsafe { real::mmap(addr, len, prot, flags, fd, off) }
}

// ----- status --------------------------------------------------------------

fn stat_path(p: &str, follow: bool, out: *mut libc::stat) -> R<c_int> {
    let (c, _) = client()?;
    let s = if follow { c.stat(p)? } else { c.lstat(p)? };
    // SAFETY: `out` is the caller's struct stat.
    unsafe { cabi::put(out, to_c_stat(&s), "struct stat") }.map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's fstat.
        || unsafe { real::fstat(fd, st) },
        // SAFETY: `st` is the caller's struct stat.
        |c, cfd, _| unsafe { cabi::put(st, to_c_stat(&c.fstat(cfd)?), "struct stat") }.map(|()| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // An empty path with AT_EMPTY_PATH is the descriptor itself.
    // SAFETY: `path` is NULL or the caller's C string.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        // SAFETY: as fstat.
        return unsafe { fstat(dirfd, st) };
    }
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::fstatat(d, p, st, flags),
            |p| stat_path(p, flags & libc::AT_SYMLINK_NOFOLLOW == 0, st),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    st: *mut libc::statx,
) -> c_int {
    // SAFETY: `path` is NULL or the caller's C string.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        if let Some(f) = ours(dirfd) {
            return run(|| {
                let s = with(&f, |c, cfd| c.fstat(cfd))?;
                // SAFETY: `st` is the caller's struct statx.
                unsafe { cabi::put(st, to_statx(&s), "struct statx") }.map(|()| 0)
            });
        }
    }
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::statx(d, p, flags, mask, st),
            |p| {
                let (c, _) = client()?;
                let s = if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
                    c.lstat(p)?
                } else {
                    c.stat(p)?
                };
                cabi::put(st, to_statx(&s), "struct statx").map(|()| 0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn __xstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::__xstat(ver, p, st),
            |p| stat_path(p, true, st),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::__lxstat(ver, p, st),
            |p| stat_path(p, false, st),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
    if ours(fd).is_none() {
        // SAFETY: libc's __fxstat.
        return unsafe { real::__fxstat(ver, fd, st) };
    }
    // SAFETY: as fstat.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::__fxstatat(ver, d, p, st, flags),
            |p| stat_path(p, flags & libc::AT_SYMLINK_NOFOLLOW == 0, st),
        )
    }
}

fn statvfs_of(c: &Client, out: *mut libc::statvfs) -> R<c_int> {
    let v = c.statfs()?.to_statvfs();
    // SAFETY: the caller's struct statvfs.
    unsafe { cabi::put(out, v, "struct statvfs") }.map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::statvfs(p, buf),
            |p| {
                let (c, _) = client()?;
                c.stat(p)?;
                statvfs_of(&c, buf)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int {
    // SAFETY: libc's fstatvfs.
    by_fd(
        fd,
        || unsafe { real::fstatvfs(fd, buf) },
        |c, _, _| statvfs_of(c, buf),
    )
}

// ----- names ---------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::faccessat(d, p, mode, flags),
            |p| client()?.0.access(p, mode).map(|()| 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::unlink(p),
            |p| client()?.0.unlink(p).map(|()| 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::unlinkat(d, p, flags),
            |p| {
                let (c, _) = client()?;
                if flags & libc::AT_REMOVEDIR != 0 {
                    c.rmdir(p).map(|()| 0)
                } else {
                    c.unlink(p).map(|()| 0)
                }
            },
        )
    }
}

fn chfs_mkdir(p: &str, mode: mode_t) -> R<c_int> {
    let (c, _) = client()?;
    c.mkdir(p, mode & 0o7777 & !UMASK.load(Ordering::Relaxed))
        .map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::mkdirat(d, p, mode),
            |p| chfs_mkdir(p, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::rmdir(p),
            |p| client()?.0.rmdir(p).map(|()| 0),
        )
    }
}

/// rename in all its forms: both names in the pool, both outside, or
/// EXDEV (so `mv` copies).
///
/// # Safety
/// `from` and `to` are NULL or C strings.
unsafe fn rename_any(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: the caller's C strings.
    let (a, b) = unsafe { (route_at(d1, from), route_at(d2, to)) };
    let local = |r: &Route, d: c_int, p: *const c_char| match r {
        Route::Local(c) => (AT_FDCWD, c.as_ptr()),
        _ => (d, p),
    };
    match (&a, &b) {
        (Route::Chfs(x), Route::Chfs(y)) => run(|| {
            if flags & !libc::RENAME_NOREPLACE != 0 {
                return err(libc::EINVAL, "renameat2 flags");
            }
            let noreplace = flags & libc::RENAME_NOREPLACE != 0;
            client()?.0.rename_flags(x, y, noreplace).map(|()| 0)
        }),
        (Route::Chfs(_), _) | (_, Route::Chfs(_)) => {
            set_errno(libc::EXDEV);
            -1
        }
        _ => {
            let (d1, from) = local(&a, d1, from);
            let (d2, to) = local(&b, d2, to);
            if flags == 0 {
                // SAFETY: libc's renameat with the caller's names.
                unsafe { real::renameat(d1, from, d2, to) }
            } else {
                // SAFETY: libc's renameat2 with the caller's names.
                unsafe { real::renameat2(d1, from, d2, to, flags) }
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    if mount().is_none() {
        // SAFETY: libc's rename.
        return unsafe { real::rename(from, to) };
    }
    // SAFETY: the caller's C strings.
    unsafe { rename_any(AT_FDCWD, from, AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: the caller's C strings.
    unsafe { rename_any(d1, from, d2, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::truncate(p, len),
            |p| client()?.0.truncate(p, offset(len)?).map(|()| 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: the caller's C strings.
    unsafe { symlinkat(target, AT_FDCWD, path) }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    // SAFETY: the caller's C strings.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::symlinkat(target, d, p),
            |p| {
                if target.is_null() {
                    return err(libc::EFAULT, "NULL target");
                }
                let t = CStr::from_ptr(target)
                    .to_str()
                    .map_err(|_| Error::new(libc::EINVAL, "target not UTF-8".to_string()))?;
                client()?.0.symlink(t, p).map(|()| 0)
            },
        )
    }
}

fn chfs_readlink(p: &str, buf: *mut c_char, n: size_t) -> R<ssize_t> {
    let t = client()?.0.readlink(p)?;
    // SAFETY: `buf` is writable for `n` bytes (readlink's contract).
    let out = unsafe { out_buf(buf.cast(), n) }?;
    let k = t.len().min(out.len());
    out[..k].copy_from_slice(&t.as_bytes()[..k]);
    Ok(k as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::readlinkat(d, p, buf, n),
            |p| chfs_readlink(p, buf, n),
        )
    }
}

// ----- attributes ----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe { fchmodat(AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| {
                if d == AT_FDCWD && flags == 0 {
                    real::chmod(p, mode)
                } else {
                    real::fchmodat(d, p, mode, flags)
                }
            },
            |p| client()?.0.chmod(p, mode & 0o7777).map(|_| 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's fchmod.
        || unsafe { real::fchmod(fd, mode) },
        |c, _, f| c.chmod(&f.path, mode & 0o7777).map(|_| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::fchownat(d, p, uid, gid, flags),
            |p| client()?.0.chown(p, id(uid), id(gid)).map(|_| 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's fchown.
        || unsafe { real::fchown(fd, uid, gid) },
        |c, _, f| c.chown(&f.path, id(uid), id(gid)).map(|_| 0),
    )
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    t: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() {
        // utimensat(fd, NULL, ...) is futimens (glibc allows it).
        // SAFETY: as futimens.
        return unsafe { futimens(dirfd, t) };
    }
    // SAFETY: the caller's C string; `t` is NULL or two timespecs.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::utimensat(d, p, t, flags),
            |p| {
                let (a, m) = cabi::timespecs(t)?;
                client()?.0.utimens(p, a, m).map(|_| 0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, t: *const libc::timespec) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's futimens.
        || unsafe { real::futimens(fd, t) },
        |c, _, f| {
            // SAFETY: `t` is NULL or two timespecs.
            let (a, m) = unsafe { cabi::timespecs(t) }?;
            c.utimens(&f.path, a, m).map(|_| 0)
        },
    )
}

// Extended attributes: not supported by the pool (ENOTSUP, which cp,
// ls and Python's shutil take as "none").

fn no_xattr<T>() -> R<T> {
    err(libc::ENOTSUP, "extended attributes")
}

path_fns! {
    getxattr(name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t = |_p| no_xattr();
    lgetxattr(name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t = |_p| no_xattr();
    listxattr(list: *mut c_char, n: size_t) -> ssize_t = |_p| no_xattr();
    llistxattr(list: *mut c_char, n: size_t) -> ssize_t = |_p| no_xattr();
    setxattr(name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int = |_p| no_xattr();
    lsetxattr(name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int = |_p| no_xattr();
}

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const c_char,
    v: *mut c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: libc's fgetxattr.
    by_fd(
        fd,
        || unsafe { real::fgetxattr(fd, name, v, n) },
        |_, _, _| no_xattr(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: libc's flistxattr.
    by_fd(
        fd,
        || unsafe { real::flistxattr(fd, list, n) },
        |_, _, _| no_xattr(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    v: *const c_void,
    n: size_t,
    flags: c_int,
) -> c_int {
    // SAFETY: libc's fsetxattr.
    by_fd(
        fd,
        || unsafe { real::fsetxattr(fd, name, v, n, flags) },
        |_, _, _| no_xattr(),
    )
}

// ----- current directory ---------------------------------------------------

fn enter_dir(p: &str) -> R<c_int> {
    if foreign_child() {
        return err(libc::ENOTSUP, "chdir into the prefix in a vfork child");
    }
    let s = client()?.0.stat(p)?;
    if !s.is_dir() {
        return err(libc::ENOTDIR, "not a directory");
    }
    *lock(&CWD) = p.to_string();
    CWD_IN.store(true, Ordering::Release);
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| {
                let r = real::chdir(p);
                if r == 0 && CWD_IN.load(Ordering::Acquire) && !foreign_child() {
                    CWD_IN.store(false, Ordering::Release);
                }
                r
            },
            enter_dir,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    match ours(fd) {
        Some(f) => run(|| {
            if !f.dir {
                return err(libc::ENOTDIR, "not a directory");
            }
            enter_dir(&f.path)
        }),
        None => {
            // SAFETY: libc's fchdir.
            let r = unsafe { real::fchdir(fd) };
            if r == 0 && CWD_IN.load(Ordering::Acquire) && !foreign_child() {
                CWD_IN.store(false, Ordering::Release);
            }
            r
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    if inside() || !CWD_IN.load(Ordering::Acquire) {
        // SAFETY: libc's getcwd.
        return unsafe { real::getcwd(buf, size) };
    }
    run(|| {
        let m = mount().unwrap_or("/");
        let s = paths::local(m, &lock(&CWD));
        let need = s.len() + 1;
        let out = if buf.is_null() {
            let n = if size == 0 { need } else { size };
            if n < need {
                return err(libc::ERANGE, "getcwd buffer");
            }
            // SAFETY: malloc, freed by the caller (getcwd's contract).
            let p = unsafe { libc::malloc(n) }.cast::<c_char>();
            if p.is_null() {
                return err(libc::ENOMEM, "getcwd");
            }
            p
        } else {
            if size < need {
                return err(libc::ERANGE, "getcwd buffer");
            }
            buf
        };
        // SAFETY: `out` holds at least `need` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), out, s.len());
            *out.add(s.len()) = 0;
        }
        Ok(out)
    })
}

#[no_mangle]
pub unsafe extern "C" fn __getcwd_chk(
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> *mut c_char {
    if inside() || !CWD_IN.load(Ordering::Acquire) {
        // SAFETY: libc's __getcwd_chk.
        return unsafe { real::__getcwd_chk(buf, size, buflen) };
    }
    // SAFETY: the buffer holds `buflen` bytes.
    unsafe { getcwd(buf, size.min(buflen)) }
}

// ----- directory streams ---------------------------------------------------

/// Our `DIR`: a listing taken at opendir/rewinddir.
struct Dir {
    fd: c_int,
    path: String,
    entries: Vec<Entry>,
    pos: usize,
    ent: libc::dirent64,
}

static DIRS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
static NDIRS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn our_dir(d: *mut DIR) -> bool {
    NDIRS.load(Ordering::Acquire) != 0 && !inside() && lock(&DIRS).contains(&(d as usize))
}

fn d_type(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

pub(crate) fn listing(path: &str) -> R<Vec<Entry>> {
    let (c, _) = client()?;
    let here = c.stat(path)?;
    let mut v = vec![
        (c".".to_owned(), libc::DT_DIR, here.ino),
        (c"..".to_owned(), libc::DT_DIR, 1),
    ];
    for e in c.readdir(path)? {
        if e.name == "." || e.name == ".." {
            continue;
        }
        if let Ok(n) = CString::new(e.name) {
            v.push((n, d_type(e.stat.mode), e.stat.ino));
        }
    }
    Ok(v)
}

/// A `DIR` over our descriptor `fd` (owned by it from now on).
fn make_dir(fd: c_int, path: &str) -> R<*mut DIR> {
    let entries = listing(path)?;
    let d = Box::new(Dir {
        fd,
        path: path.to_string(),
        entries,
        pos: 0,
        // SAFETY: plain old data; all-zero is valid.
        ent: unsafe { std::mem::zeroed() },
    });
    let p = Box::into_raw(d).cast::<DIR>();
    lock(&DIRS).insert(p as usize);
    NDIRS.fetch_add(1, Ordering::Release);
    Ok(p)
}

/// # Safety
/// `d` is one of ours (checked with [`our_dir`]) and not used concurrently.
unsafe fn dir<'a>(d: *mut DIR) -> &'a mut Dir {
    // SAFETY: the caller's contract: made by make_dir, still registered.
    unsafe { &mut *d.cast::<Dir>() }
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::opendir(p),
            |p| {
                let fd = chfs_open(p, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
                let path = fds::get(fd).map_or_else(|| p.to_string(), |f| f.path.clone());
                make_dir(fd, &path).inspect_err(|_| {
                    if let Some(f) = fds::take(fd) {
                        real::close(fd);
                        let _ = release(f);
                    }
                })
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    let Some(f) = ours(fd) else {
        // SAFETY: libc's fdopendir.
        return unsafe { real::fdopendir(fd) };
    };
    run(|| {
        if !f.dir {
            return err(libc::ENOTDIR, "not a directory");
        }
        make_dir(fd, &f.path)
    })
}

/// `e` as a `struct dirent64` whose successor is at `next`.
pub(crate) fn fill_dirent(out: &mut libc::dirent64, e: &Entry, next: usize) {
    let (name, ty, ino) = e;
    out.d_ino = *ino;
    out.d_off = next as i64;
    out.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    out.d_type = *ty;
    let b = name.as_bytes();
    let n = b.len().min(out.d_name.len() - 1);
    for (dst, &src) in out.d_name.iter_mut().zip(&b[..n]) {
        *dst = src as c_char;
    }
    out.d_name[n] = 0;
}

/// The next entry of our stream `d` into `out` (false at the end).
///
/// # Safety
/// `d` is ours ([`our_dir`]) and not used concurrently.
pub(crate) unsafe fn next_into(d: *mut DIR, out: Option<&mut libc::dirent64>) -> bool {
    // SAFETY: the caller's contract.
    let d = unsafe { dir(d) };
    let Some(e) = d.entries.get(d.pos) else {
        return false;
    };
    d.pos += 1;
    fill_dirent(out.unwrap_or(&mut d.ent), e, d.pos);
    true
}

unsafe fn next_entry(d: *mut DIR) -> *mut libc::dirent64 {
    run(|| {
        // SAFETY: checked by the caller with our_dir.
        if unsafe { next_into(d, None) } {
            // SAFETY: as above.
            Ok(&mut unsafe { dir(d) }.ent as *mut libc::dirent64)
        } else {
            Ok(std::ptr::null_mut())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut libc::dirent64 {
    if !our_dir(d) {
        // SAFETY: libc's readdir with its own DIR.
        return unsafe { real::readdir(d) };
    }
    // SAFETY: ours.
    unsafe { next_entry(d) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut libc::dirent64 {
    if !our_dir(d) {
        // SAFETY: libc's readdir64 with its own DIR.
        return unsafe { real::readdir64(d) };
    }
    // SAFETY: ours.
    unsafe { next_entry(d) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    if !our_dir(d) {
        // SAFETY: libc's closedir with its own DIR.
        return unsafe { real::closedir(d) };
    }
    lock(&DIRS).remove(&(d as usize));
    NDIRS.fetch_sub(1, Ordering::Release);
    // SAFETY: made by make_dir with Box::into_raw, now unregistered.
    let b = unsafe { Box::from_raw(d.cast::<Dir>()) };
    // SAFETY: our descriptor, owned by the stream.
    unsafe { close(b.fd) }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut DIR) -> c_int {
    if !our_dir(d) {
        // SAFETY: libc's dirfd with its own DIR.
        return unsafe { real::dirfd(d) };
    }
    // SAFETY: ours.
    unsafe { dir(d) }.fd
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    if !our_dir(d) {
        // SAFETY: libc's rewinddir with its own DIR.
        return unsafe { real::rewinddir(d) };
    }
    run(|| {
        // SAFETY: ours.
        let d = unsafe { dir(d) };
        d.entries = listing(&d.path)?;
        d.pos = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    if !our_dir(d) {
        // SAFETY: libc's telldir with its own DIR.
        return unsafe { real::telldir(d) };
    }
    // SAFETY: ours.
    unsafe { dir(d) }.pos as c_long
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, loc: c_long) {
    if !our_dir(d) {
        // SAFETY: libc's seekdir with its own DIR.
        return unsafe { real::seekdir(d, loc) };
    }
    // SAFETY: ours.
    unsafe { dir(d) }.pos = usize::try_from(loc).unwrap_or(0);
}

// ----- exec ----------------------------------------------------------------
//
// The new image has its own preload and client: chfs-rs descriptors do not
// survive (their numbers stay the reserved /dev/null descriptors), so
// buffered writes and unpublished sizes are sent first. glibc's execl*,
// execvp and friends call its internal execve, so each is interposed
// (execl, execlp, execle in shim.c build the argv and call these).

publish_first! {
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
}

// Calls with a path first whose chfs-rs side is one expression.
path_fns! {
    stat(st: *mut libc::stat) -> c_int = |p| stat_path(p, true, st);
    lstat(st: *mut libc::stat) -> c_int = |p| stat_path(p, false, st);
    access(mode: c_int) -> c_int = |p| client()?.0.access(p, mode).map(|()| 0);
    mkdir(mode: mode_t) -> c_int = |p| chfs_mkdir(p, mode);
    readlink(buf: *mut c_char, n: size_t) -> ssize_t = |p| chfs_readlink(p, buf, n);
    chown(uid: libc::uid_t, gid: libc::gid_t) -> c_int = |p| client()?.0.chown(p, id(uid), id(gid)).map(|_| 0);
    lchown(uid: libc::uid_t, gid: libc::gid_t) -> c_int = |p| client()?.0.chown(p, id(uid), id(gid)).map(|_| 0);
}

// Second names of the functions above: the 64-bit-offset variants are
// the same functions on 64-bit Linux.
twins! {
    creat64 = creat(path: *const c_char, mode: mode_t) -> c_int;
    pread = pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    __pread_chk = __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t;
    pwrite = pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    preadv = preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t;
    pwritev = pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t;
    lseek = lseek64(fd: c_int, off: off_t, w: c_int) -> off_t;
    ftruncate = ftruncate64(fd: c_int, len: off_t) -> c_int;
    fallocate = fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int;
    posix_fallocate = posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int;
    posix_fadvise = posix_fadvise64(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int;
    mmap = mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void;
    stat64 = stat(path: *const c_char, st: *mut libc::stat) -> c_int;
    lstat64 = lstat(path: *const c_char, st: *mut libc::stat) -> c_int;
    fstat64 = fstat(fd: c_int, st: *mut libc::stat) -> c_int;
    fstatat64 = fstatat(dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int;
    __xstat64 = __xstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int;
    __lxstat64 = __lxstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int;
    __fxstat64 = __fxstat(ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int;
    __fxstatat64 = __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int;
    statvfs64 = statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int;
    fstatvfs64 = fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int;
    renameat2 = rename_any(d1: c_int, from: *const c_char, d2: c_int, to: *const c_char, flags: c_uint) -> c_int;
    truncate = truncate64(path: *const c_char, len: off_t) -> c_int;
}
