//! The interposed functions added after the first two milestones:
//! `statfs`, `link`, `mknod`/`mkfifo`, the `utime` family, `readdir_r`,
//! `scandir`, `getdents64`, in-kernel copies (`sendfile`,
//! `copy_file_range`, `splice`) and `posix_spawn`/`system`/`popen`/`_exit`.

use super::entry::{fill_dirent, listing, our_dir};
use super::*;
use chfs_client::TimeSet;

// ----- statfs ----------------------------------------------------------------

fn statfs_of(c: &Client, out: *mut libc::statfs) -> R<c_int> {
    let v = c.statfs()?.to_statfs();
    // SAFETY: the caller's struct statfs.
    unsafe { cabi::put(out, v, "struct statfs") }.map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::statfs(p, buf),
            |p| {
                let (c, _) = client()?;
                c.stat(p)?;
                statfs_of(&c, buf)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's fstatfs.
        || unsafe { real::fstatfs(fd, buf) },
        |c, _, _| statfs_of(c, buf),
    )
}

// ----- link --------------------------------------------------------------------

/// Hard links: the pool has none (EPERM, as the mount and Linux file
/// systems without them); between the prefix and elsewhere EXDEV.
///
/// # Safety
/// `from` and `to` are NULL or C strings.
unsafe fn link_any(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C strings.
    let (a, b) = unsafe { (route_at(d1, from), route_at(d2, to)) };
    match (&a, &b) {
        (Route::Chfs(x), Route::Chfs(y)) => run(|| {
            let c = client()?.0;
            if flags & libc::AT_SYMLINK_FOLLOW != 0 {
                c.stat(x)?;
            } else {
                c.lstat(x)?;
            }
            if c.lstat(y).is_ok() {
                return err(libc::EEXIST, "link: the new name exists");
            }
            err(libc::EPERM, "hard links")
        }),
        (Route::Chfs(_), _) | (_, Route::Chfs(_)) => {
            set_errno(libc::EXDEV);
            -1
        }
        _ => {
            let local = |r: &Route, d: c_int, p: *const c_char| match r {
                Route::Local(c) => (AT_FDCWD, c.as_ptr()),
                _ => (d, p),
            };
            let (d1, from) = local(&a, d1, from);
            let (d2, to) = local(&b, d2, to);
            // SAFETY: libc's linkat with the caller's names.
            unsafe { real::linkat(d1, from, d2, to, flags) }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    if mount().is_none() {
        // SAFETY: libc's link.
        return unsafe { real::link(from, to) };
    }
    // SAFETY: the caller's C strings.
    unsafe { link_any(AT_FDCWD, from, AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's C strings.
    unsafe { link_any(d1, from, d2, to, flags) }
}

// ----- mknod, mkfifo -------------------------------------------------------------

/// A regular file is created (as `open(O_CREAT|O_EXCL)` and `close`);
/// other node types are refused (EPERM): a FIFO, socket or device entry
/// in the pool could not be opened as one through this library.
fn chfs_mknod(p: &str, mode: mode_t) -> R<c_int> {
    let ty = mode & libc::S_IFMT;
    if ty != 0 && ty != libc::S_IFREG {
        return err(libc::EPERM, "mknod: only regular files");
    }
    let perm = mode & 0o7777 & !UMASK.load(Ordering::Relaxed);
    client()?.0.mknod(p, libc::S_IFREG | perm, 0).map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::mknodat(d, p, mode, dev),
            |p| chfs_mknod(p, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe { mknodat(AT_FDCWD, path, mode, dev) }
}

/// glibc before 2.33 (programs built against it call these).
#[no_mangle]
pub unsafe extern "C" fn __xmknodat(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *mut libc::dev_t,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::__xmknodat(ver, d, p, mode, dev),
            |p| chfs_mknod(p, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn __xmknod(
    ver: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *mut libc::dev_t,
) -> c_int {
    // SAFETY: the caller's C string.
    unsafe { __xmknodat(ver, AT_FDCWD, path, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::mkfifoat(d, p, mode),
            |p| chfs_mknod(p, mode | libc::S_IFIFO),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's C string.
    unsafe { mkfifoat(AT_FDCWD, path, mode) }
}

// ----- utime, utimes, lutimes, futimes, futimesat ----------------------------

/// # Safety
/// `t` is NULL or a `struct utimbuf`.
unsafe fn chfs_utime(p: &str, t: *const libc::utimbuf) -> R<c_int> {
    let (a, m) = if t.is_null() {
        (TimeSet::Now, TimeSet::Now)
    } else {
        // SAFETY: non-NULL: the caller's struct utimbuf.
        let t = unsafe { &*t };
        let tv = |s| libc::timeval {
            tv_sec: s,
            tv_usec: 0,
        };
        (
            cabi::timeval_set(&tv(t.actime))?,
            cabi::timeval_set(&tv(t.modtime))?,
        )
    };
    client()?.0.utimens(p, a, m).map(|_| 0)
}

path_fns! {
    utime(t: *const libc::utimbuf) -> c_int = |p| chfs_utime(p, t);
    utimes(t: *const libc::timeval) -> c_int = |p| chfs_utimes(p, t);
    lutimes(t: *const libc::timeval) -> c_int = |p| chfs_utimes(p, t);
}

/// `utimes`/`lutimes`/`futimesat` on a chfs-rs path (the pool's
/// `utimens` does not follow a final symbolic link, as `lutimes`).
///
/// # Safety
/// `t` is NULL or two timevals.
unsafe fn chfs_utimes(p: &str, t: *const libc::timeval) -> R<c_int> {
    // SAFETY: the caller's contract.
    let (a, m) = unsafe { cabi::timevals(t) }?;
    client()?.0.utimens(p, a, m).map(|_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, t: *const libc::timeval) -> c_int {
    by_fd(
        fd,
        // SAFETY: libc's futimes.
        || unsafe { real::futimes(fd, t) },
        // SAFETY: `t` is NULL or two timevals.
        |_, _, f| unsafe { chfs_utimes(&f.path, t) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimesat(
    dirfd: c_int,
    path: *const c_char,
    t: *const libc::timeval,
) -> c_int {
    if path.is_null() {
        // SAFETY: futimesat(fd, NULL, t) is futimes(fd, t).
        return unsafe { futimes(dirfd, t) };
    }
    // SAFETY: the caller's C string and timevals.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::futimesat(d, p, t),
            |p| chfs_utimes(p, t),
        )
    }
}

// ----- readdir_r, scandir, getdents64 ---------------------------------------------

/// readdir_r returns the error number; `*result` is NULL at the end.
#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    d: *mut DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    if !our_dir(d) {
        // SAFETY: libc's readdir_r with its own DIR.
        return unsafe { real::readdir64_r(d, entry, result) };
    }
    if entry.is_null() || result.is_null() {
        return libc::EFAULT;
    }
    // SAFETY: `d` is ours; `entry` is the caller's struct dirent.
    let more = unsafe { super::entry::next_into(d, Some(&mut *entry)) };
    // SAFETY: the caller's result pointer.
    unsafe { *result = if more { entry } else { std::ptr::null_mut() } };
    0
}

pub(crate) type Filter = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
pub(crate) type Compar =
    Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>;

/// scandir of a chfs-rs directory: glibc's scandir calls its internal
/// opendir/readdir, which this library does not see.
///
/// # Safety
/// `list` is writable; `filter` and `compar` are NULL or functions of
/// scandir's contract.
unsafe fn chfs_scandir(
    p: &str,
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> R<c_int> {
    if list.is_null() {
        return err(libc::EFAULT, "scandir: NULL list");
    }
    let entries = {
        let (c, _) = client()?;
        if !c.stat(p)?.is_dir() {
            return err(libc::ENOTDIR, "not a directory");
        }
        listing(p)?
    };
    let mut out: Vec<*mut libc::dirent64> = Vec::with_capacity(entries.len());
    let free_all = |v: &[*mut libc::dirent64]| {
        for &e in v {
            // SAFETY: each was allocated with calloc below.
            unsafe { libc::free(e.cast()) };
        }
    };
    for (i, e) in entries.iter().enumerate() {
        // SAFETY: calloc of one struct dirent64; freed by the caller (or
        // below).
        let d = unsafe { libc::calloc(1, std::mem::size_of::<libc::dirent64>()) }
            .cast::<libc::dirent64>();
        if d.is_null() {
            free_all(&out);
            return err(libc::ENOMEM, "scandir");
        }
        // SAFETY: just allocated and zeroed.
        fill_dirent(unsafe { &mut *d }, e, i + 1);
        // The filter is the program's code: it runs outside the client.
        let keep = match filter {
            // SAFETY: scandir's filter with an entry.
            Some(f) => outside(|| unsafe { f(d) }) != 0,
            None => true,
        };
        if keep {
            out.push(d);
        } else {
            // SAFETY: as allocated above.
            unsafe { libc::free(d.cast()) };
        }
    }
    let n = out.len();
    // SAFETY: malloc of the array the caller frees (at least one byte).
    let arr = unsafe { libc::malloc(n.max(1) * std::mem::size_of::<*mut libc::dirent64>()) }
        .cast::<*mut libc::dirent64>();
    if arr.is_null() {
        free_all(&out);
        return err(libc::ENOMEM, "scandir");
    }
    // SAFETY: `arr` holds `n` pointers.
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), arr, n) };
    if let Some(cmp) = compar {
        // SAFETY: qsort of the pointer array with scandir's comparison,
        // whose arguments are pointers to the elements, as qsort's are.
        outside(|| unsafe {
            libc::qsort(
                arr.cast(),
                n,
                std::mem::size_of::<*mut libc::dirent64>(),
                Some(std::mem::transmute::<
                    unsafe extern "C" fn(
                        *mut *const libc::dirent64,
                        *mut *const libc::dirent64,
                    ) -> c_int,
                    unsafe extern "C" fn(*const c_void, *const c_void) -> c_int,
                >(cmp)),
            )
        });
    }
    // SAFETY: the caller's result pointer.
    unsafe { *list = arr };
    c_int::try_from(n).map_err(|_| Error::new(libc::EOVERFLOW, "scandir".to_string()))
}

#[no_mangle]
pub unsafe extern "C" fn scandirat(
    dirfd: c_int,
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> c_int {
    // SAFETY: the caller's C string and scandir's contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |d, p| real::scandirat(d, p, list, filter, compar),
            |p| chfs_scandir(p, list, filter, compar),
        )
    }
}

path_fns! {
    scandir(list: *mut *mut *mut libc::dirent64, filter: Filter, compar: Compar) -> c_int =
        |p| chfs_scandir(p, list, filter, compar);
}

/// `getdents64` of a chfs-rs directory descriptor: `struct
/// linux_dirent64` records from a listing taken at the first call
/// (`lseek` to 0 takes a new one).
#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    by_fd(
        fd,
        // SAFETY: libc's getdents64.
        || unsafe { real::getdents64(fd, buf, n) },
        |_, _, f| {
            if !f.dir {
                return err(libc::ENOTDIR, "not a directory");
            }
            // SAFETY: `buf` is writable for `n` bytes.
            let out = unsafe { out_buf(buf, n) }?;
            let mut g = lock(&f.list);
            if g.is_none() {
                *g = Some((listing(&f.path)?, 0));
            }
            let (entries, pos) = g.as_mut().expect("listing");
            let mut at = 0usize;
            while let Some((name, ty, ino)) = entries.get(*pos) {
                // d_ino, d_off, d_reclen, d_type, then the name and NUL,
                // padded to 8 bytes.
                let len = (19 + name.as_bytes().len() + 1).next_multiple_of(8);
                if at + len > out.len() {
                    if at == 0 {
                        return err(libc::EINVAL, "getdents64: buffer too small");
                    }
                    break;
                }
                let r = &mut out[at..at + len];
                r.fill(0);
                r[0..8].copy_from_slice(&ino.to_ne_bytes());
                r[8..16].copy_from_slice(&((*pos + 1) as i64).to_ne_bytes());
                r[16..18].copy_from_slice(&(len as u16).to_ne_bytes());
                r[18] = *ty;
                r[19..19 + name.as_bytes().len()].copy_from_slice(name.as_bytes());
                at += len;
                *pos += 1;
            }
            Ok(at as ssize_t)
        },
    )
}

// ----- sendfile, copy_file_range, splice --------------------------------------------

/// Runs the program's code (a callback) as the program: interposed calls
/// it makes are routed as the program's own, not the client's.
fn outside<T>(f: impl FnOnce() -> T) -> T {
    let prev = INSIDE.try_with(|c| c.replace(false)).unwrap_or(false);
    let r = f();
    let _ = INSIDE.try_with(|c| c.set(prev));
    r
}

/// An in-kernel copy with a chfs-rs descriptor on either side, made
/// through a buffer with this library's read/write (each side goes where
/// it belongs). `in_off`/`out_off`: positional, advanced; else the
/// descriptors' positions. `once`: one read (splice, a pipe side), else
/// until `len` bytes or the end of the input. Returns the bytes copied,
/// or -1 with errno set if nothing was.
///
/// # Safety
/// `in_off` and `out_off` are NULL or writable.
unsafe fn copy_through(
    inp: c_int,
    in_off: *mut off_t,
    out: c_int,
    out_off: *mut off_t,
    len: size_t,
    once: bool,
) -> ssize_t {
    let mut buf = vec![0u8; len.clamp(1, 1 << 20)];
    let mut total = 0usize;
    while total < len {
        let want = (len - total).min(buf.len());
        let p = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: `buf` holds `want` bytes; offsets are the caller's.
        let n = unsafe {
            if in_off.is_null() {
                super::entry::read(inp, p, want)
            } else {
                super::entry::pread64(inp, p, want, *in_off)
            }
        };
        if n < 0 {
            return if total > 0 { total as ssize_t } else { -1 };
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        if !in_off.is_null() {
            // SAFETY: the caller's offset.
            unsafe { *in_off += n as off_t };
        }
        let mut done = 0usize;
        while done < n {
            let q = buf[done..n].as_ptr().cast::<c_void>();
            // SAFETY: as above.
            let m = unsafe {
                if out_off.is_null() {
                    super::entry::write(out, q, n - done)
                } else {
                    super::entry::pwrite64(out, q, n - done, *out_off)
                }
            };
            if m <= 0 {
                // What was read and not written is lost to the caller, as
                // with a failed write of the kernel's copy.
                let t = total + done;
                return if t > 0 { t as ssize_t } else { -1 };
            }
            if !out_off.is_null() {
                // SAFETY: the caller's offset.
                unsafe { *out_off += m as off_t };
            }
            done += m as usize;
        }
        total += n;
        if once || n < want {
            break;
        }
    }
    total as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    if ours(out).is_none() && ours(inp).is_none() {
        // SAFETY: libc's sendfile.
        return unsafe { real::sendfile(out, inp, off, n) };
    }
    // SAFETY: `off` is NULL or the caller's offset.
    unsafe { copy_through(inp, off, out, std::ptr::null_mut(), n, false) }
}

/// `copy_file_range` (`once` false: until `n` bytes or the end; flags
/// must be 0) and `splice` (`once`: one read and its write), whose
/// arguments are the same: libc's (`pass`), or through a buffer.
///
/// # Safety
/// `oi` and `oo` are NULL or the caller's offsets.
unsafe fn copy_or_pass(
    inp: c_int,
    oi: *mut off_t,
    out: c_int,
    oo: *mut off_t,
    n: size_t,
    once: bool,
    pass: impl FnOnce() -> ssize_t,
) -> ssize_t {
    if ours(out).is_none() && ours(inp).is_none() {
        return pass();
    }
    // SAFETY: the caller's contract.
    unsafe { copy_through(inp, oi, out, oo, n, once) }
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    inp: c_int,
    oi: *mut off_t,
    out: c_int,
    oo: *mut off_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    if flags != 0 && (ours(out).is_some() || ours(inp).is_some()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's offsets; libc's copy_file_range with its
    // arguments.
    unsafe {
        copy_or_pass(inp, oi, out, oo, n, false, || {
            real::copy_file_range(inp, oi, out, oo, n, flags)
        })
    }
}

/// splice between a pipe and a chfs-rs descriptor: one read of at most
/// `n` bytes (and 1 MiB) and its write.
#[no_mangle]
pub unsafe extern "C" fn splice(
    inp: c_int,
    oi: *mut off_t,
    out: c_int,
    oo: *mut off_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // SAFETY: the caller's offsets; libc's splice with its arguments.
    unsafe {
        copy_or_pass(inp, oi, out, oo, n, true, || {
            real::splice(inp, oi, out, oo, n, flags)
        })
    }
}

// ----- posix_spawn, _exit ---------------------------------------------------------

// The child execs (glibc's posix_spawn calls its internal exec).
publish_first! {
    posix_spawn(
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    posix_spawnp(
        pid: *mut libc::pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    // system and popen start /bin/sh through glibc's internal spawn.
    system(cmd: *const c_char) -> c_int;
    popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE;
}

/// libc's `_exit` or `_Exit` (`name` NUL-terminated); the exit_group
/// system call if there is none.
fn end(name: &'static [u8], status: c_int) -> ! {
    // SAFETY: a NUL-terminated literal.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if !p.is_null() {
        // SAFETY: libc's _exit/_Exit, whose prototype this is.
        let f: unsafe extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(p) };
        // SAFETY: ends the process.
        unsafe { f(status) }
    }
    loop {
        // SAFETY: ends the process.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// `_exit` skips the atexit handlers: open files are published here (a
/// forked child without a client of its own has nothing to publish, nor
/// has a vfork child: its parent goes on with them).
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    publish_open_files();
    end(b"_exit\0", status)
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    publish_open_files();
    end(b"_Exit\0", status)
}

twins! {
    statfs64 = statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int;
    fstatfs64 = fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int;
    readdir_r = readdir64_r(d: *mut DIR, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int;
    scandir64 = scandir(path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: Filter, compar: Compar) -> c_int;
    sendfile = sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
}
