//! stdio on chfs-rs files: `fopen`/`fdopen` return a `fopencookie` stream
//! whose callbacks are this library's read/write/lseek/close.

use super::*;

extern "C" {
    /// In shim.c: fopencookie with the callbacks below.
    fn chfs_preload_cookie_file(cookie: *mut c_void, mode: *const c_char) -> *mut FILE;
}

struct Cookie {
    fd: c_int,
    file: usize,
}

/// Our streams and their descriptors (for `fileno`).
static FILES: Mutex<BTreeMap<usize, c_int>> = Mutex::new(BTreeMap::new());
static NFILES: AtomicUsize = AtomicUsize::new(0);

/// open(2) flags of an fopen mode.
fn mode_flags(mode: &[u8]) -> R<c_int> {
    let mut f = match mode.first() {
        Some(b'r') => libc::O_RDONLY,
        Some(b'w') => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        Some(b'a') => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return err(libc::EINVAL, "fopen mode"),
    };
    for &c in &mode[1..] {
        match c {
            b'+' => f = (f & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => f |= libc::O_EXCL,
            b'e' => f |= libc::O_CLOEXEC,
            b',' => break,
            _ => {}
        }
    }
    Ok(f)
}

/// A stream over our descriptor `fd` (closed by fclose).
fn cookie_file(fd: c_int, mode: *const c_char) -> R<*mut FILE> {
    let ck = Box::into_raw(Box::new(Cookie { fd, file: 0 }));
    // SAFETY: `mode` is the caller's C string; `ck` lives until the
    // close callback frees it.
    let fp = unsafe { chfs_preload_cookie_file(ck.cast(), mode) };
    if fp.is_null() {
        let e = last_os_error("fopencookie");
        // SAFETY: not handed to a stream.
        drop(unsafe { Box::from_raw(ck) });
        return Err(e);
    }
    // SAFETY: still ours until the stream's close callback.
    unsafe { (*ck).file = fp as usize };
    lock(&FILES).insert(fp as usize, fd);
    NFILES.fetch_add(1, Ordering::Release);
    Ok(fp)
}

/// # Safety
/// `mode` is a C string.
unsafe fn chfs_fopen(p: &str, mode: *const c_char) -> R<*mut FILE> {
    if mode.is_null() {
        return err(libc::EFAULT, "NULL mode");
    }
    // SAFETY: the caller's C string.
    let flags = mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes())?;
    let fd = chfs_open(p, flags, 0o666)?;
    cookie_file(fd, mode).inspect_err(|_| {
        if let Some(f) = fds::take(fd) {
            // SAFETY: our reserved descriptor.
            unsafe { real::close(fd) };
            let _ = release(f);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's C strings.
    unsafe {
        by_path(
            AT_FDCWD,
            path,
            |_, p| real::fopen(p, mode),
            |p| chfs_fopen(p, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if ours(fd).is_none() {
        // SAFETY: libc's fdopen.
        return unsafe { real::fdopen(fd, mode) };
    }
    run(|| {
        if mode.is_null() {
            return err(libc::EFAULT, "NULL mode");
        }
        cookie_file(fd, mode)
    })
}

/// freopen onto or from a chfs-rs stream is not supported (EOPNOTSUPP):
/// libc would reuse the FILE with its own, uninterposed I/O.
#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    let stream_ours =
        NFILES.load(Ordering::Acquire) != 0 && lock(&FILES).contains_key(&(f as usize));
    // SAFETY: the caller's C string.
    let r = unsafe { route(path) };
    if stream_ours || matches!(r, Route::Chfs(_)) {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    match r {
        // SAFETY: libc's freopen.
        Route::Local(p) => unsafe { real::freopen(p.as_ptr(), mode, f) },
        // SAFETY: libc's freopen with the caller's arguments.
        _ => unsafe { real::freopen(path, mode, f) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fileno(f: *mut FILE) -> c_int {
    if NFILES.load(Ordering::Acquire) != 0 {
        if let Some(&fd) = lock(&FILES).get(&(f as usize)) {
            return fd;
        }
    }
    // SAFETY: libc's fileno with the caller's stream.
    unsafe { real::fileno(f) }
}

/// # Safety
/// `c` is a cookie made by cookie_file.
unsafe fn cookie<'a>(c: *mut c_void) -> &'a Cookie {
    // SAFETY: the caller's contract.
    unsafe { &*c.cast::<Cookie>() }
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_cookie_read(
    c: *mut c_void,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    // SAFETY: stdio passes our cookie and its buffer.
    unsafe { entry::read(cookie(c).fd, buf.cast(), n) }
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_cookie_write(
    c: *mut c_void,
    buf: *const c_char,
    n: size_t,
) -> ssize_t {
    // SAFETY: stdio passes our cookie and its buffer.
    let r = unsafe { entry::write(cookie(c).fd, buf.cast(), n) };
    // fopencookie wants 0, not -1, for a failed write.
    r.max(0)
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_cookie_seek(
    c: *mut c_void,
    off: *mut i64,
    whence: c_int,
) -> c_int {
    if off.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: stdio passes our cookie and a valid offset pointer.
    let r = unsafe { entry::lseek64(cookie(c).fd, *off, whence) };
    if r < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *off = r };
    0
}

#[no_mangle]
pub unsafe extern "C" fn chfs_preload_cookie_close(c: *mut c_void) -> c_int {
    // SAFETY: stdio's last call with our cookie: take it back.
    let ck = unsafe { Box::from_raw(c.cast::<Cookie>()) };
    if lock(&FILES).remove(&ck.file).is_some() {
        NFILES.fetch_sub(1, Ordering::Release);
    }
    // SAFETY: our descriptor, owned by the stream.
    unsafe { entry::close(ck.fd) }
}

twins! {
    fopen64 = fopen(path: *const c_char, mode: *const c_char) -> *mut FILE;
    freopen64 = freopen(path: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE;
}
