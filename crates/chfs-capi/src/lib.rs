//! libchfs: the CHFS-compatible C API.
//!
//! This crate builds `libchfs.so` (soname `libchfs.so.0`, like the original
//! CHFS library) exporting the functions declared in `include/chfs.h`. It
//! only translates: C strings, `struct stat`, flags and `errno` on one side,
//! [`chfs_client::Client`] on the other. One process-global client is
//! created by `chfs_init` and shared by every thread.
//!
//! Rules kept at this boundary: every function returns -1 (or NULL) and sets
//! `errno` on error and leaves `errno` alone on success; the text of the
//! error is kept for `chfs_last_error` (per thread, like `errno`); nothing is
//! printed unless `CHFS_LOG_PRIORITY` asks for it; a Rust panic is caught and
//! turned into `EIO`, never an abort; no signal handlers; after `fork` the
//! child transparently opens its own connections on first use (descriptors
//! opened by the parent are not valid in the child).
//!
//! Calling conventions are CHFS's, not POSIX's, where programs written for
//! CHFS depend on them: `chfs_open` ignores its flags (every descriptor reads
//! and writes; benchmark backends pass their own flag constants) and
//! `chfs_create` creates or truncates. `CHFS_POSIX_FLAGS=1` makes both take
//! open(2) flags instead.

// The exported functions are `unsafe extern "C"`; their contract (valid
// pointers, NUL-terminated strings, buffer sizes) is documented once, in
// include/chfs.h, as for any C library.
#![allow(clippy::missing_safety_doc)]

mod settings;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, Once, RwLock};

use chfs_client::{cabi, Client, Error, Stat, Whence};
use libc::{mode_t, off_t, size_t, ssize_t};

use settings::{Overrides, Settings};

/// Open flag: the file is a cached copy of backend data (accepted; chfs-rs
/// servers decide about flushing, so it changes nothing here).
pub const CHFS_O_CACHE: i32 = 1 << 28;
/// Mode bit CHFS uses internally for replicated entries (masked off).
pub const CHFS_S_IFREP: u32 = 4 << 28;

type R<T> = Result<T, Error>;

/// The live client and what it was made from.
struct Live {
    client: Client,
    /// Process that created `client` (a forked child makes its own).
    pid: u32,
    settings: Settings,
}

static LIVE: RwLock<Option<Live>> = RwLock::new(None);
static OVERRIDES: Mutex<Overrides> = Mutex::new(Overrides::NONE);
/// Highest syslog priority printed to stderr; -1 = silent.
static LOG_LEVEL: AtomicI32 = AtomicI32::new(-1);
static PANIC_HOOK: Once = Once::new();
/// `CHFS_POSIX_FLAGS=1` at `chfs_init`: open(2) flags instead of CHFS's.
static POSIX_FLAGS: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Text of the last error of this thread (`chfs_last_error`).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // At thread exit the slot may be gone already; nothing to keep then.
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = c);
}

// ----- plumbing --------------------------------------------------------

fn log(level: u8, msg: std::fmt::Arguments<'_>) {
    if i32::from(level) <= LOG_LEVEL.load(Ordering::Relaxed) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "chfs[{}] {}: {msg}",
            chfs_client::process_id(),
            settings::priority_name(level)
        );
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// Runs one exported call: errors set `errno` and return `fail`; a panic
/// becomes `EIO`.
fn ffi<T>(name: &str, fail: T, f: impl FnOnce() -> R<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            log(7, format_args!("{name}: {e}"));
            set_last_error(format!("{name}: {e}"));
            set_errno(e.errno());
            fail
        }
        Err(_) => {
            log(
                3,
                format_args!("{name}: internal error (panic), returning EIO"),
            );
            set_last_error(format!("{name}: internal error (EIO)"));
            set_errno(libc::EIO);
            fail
        }
    }
}

fn read_live() -> std::sync::RwLockReadGuard<'static, Option<Live>> {
    LIVE.read().unwrap_or_else(|e| e.into_inner())
}

fn write_live() -> std::sync::RwLockWriteGuard<'static, Option<Live>> {
    LIVE.write().unwrap_or_else(|e| e.into_inner())
}

fn overrides() -> std::sync::MutexGuard<'static, Overrides> {
    OVERRIDES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process-global client (reconnecting once in a forked child).
fn client() -> R<Client> {
    {
        let g = read_live();
        match &*g {
            None => return Err(Error::new(libc::ENOTCONN, "chfs_init has not been called")),
            Some(l) if l.pid == chfs_client::process_id() => return Ok(l.client.clone()),
            Some(_) => {}
        }
    }
    let mut g = write_live();
    let pid = chfs_client::process_id();
    match g.take() {
        None => Err(Error::new(libc::ENOTCONN, "chfs_init has not been called")),
        Some(l) if l.pid == pid => {
            let c = l.client.clone();
            *g = Some(l);
            Ok(c)
        }
        Some(l) => {
            // The parent's connections are shared sockets: closing or
            // shutting them down here would cut the parent off. Leak them.
            std::mem::forget(l.client);
            log(6, format_args!("fork detected: reconnecting"));
            let client = Client::connect(l.settings.client.clone())?;
            *g = Some(Live {
                client: client.clone(),
                pid,
                settings: l.settings,
            });
            Ok(client)
        }
    }
}

use chfs_client::cabi::{cstr, in_buf, out_buf};

fn to_c_stat(s: &Stat) -> libc::stat {
    s.to_libc()
}

/// Writes `s` to a caller's `struct stat`.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `struct stat`.
unsafe fn put_stat(out: *mut libc::stat, s: &Stat) -> R<()> {
    // SAFETY: the caller's contract.
    unsafe { chfs_client::cabi::put(out, to_c_stat(s), "struct stat") }
}

fn offset(off: off_t) -> R<u64> {
    u64::try_from(off).map_err(|_| Error::new(libc::EINVAL, format!("negative offset {off}")))
}

/// Removes the CHFS-specific bits from open flags.
fn os_flags(flags: i32) -> i32 {
    flags & !(CHFS_O_CACHE | CHFS_S_IFREP as i32)
}

fn posix_flags() -> bool {
    POSIX_FLAGS.load(Ordering::Relaxed)
}

/// The open(2) flags of `chfs_create(path, flags, mode)`: as CHFS, create
/// or truncate whatever `flags` say (only `CHFS_O_CACHE` has a meaning
/// there, and it changes nothing here); with `CHFS_POSIX_FLAGS=1`, `flags`
/// themselves plus `O_CREAT`.
fn create_flags(flags: i32) -> i32 {
    if posix_flags() {
        os_flags(flags) | libc::O_CREAT
    } else {
        libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC
    }
}

/// `chfs_open(path, flags)`: as CHFS, the flags restrict nothing (the
/// descriptor reads and writes; unknown bits are ignored) and only
/// `O_DIRECTORY` / `O_PATH` allow opening a directory; with
/// `CHFS_POSIX_FLAGS=1`, open(2) flags.
fn open_with(c: &Client, path: &str, flags: i32) -> R<c_int> {
    if posix_flags() {
        return c.open(path, os_flags(flags), 0o644);
    }
    match c.open(path, libc::O_RDWR, 0) {
        Err(e) if e.errno() == libc::EISDIR && flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 => {
            c.open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        }
        r => r,
    }
}

// ----- initialisation --------------------------------------------------

/// Connects to the servers (`server`, or `CHFS_SERVER` when NULL or empty).
#[no_mangle]
pub unsafe extern "C" fn chfs_init(server: *const c_char) -> c_int {
    PANIC_HOOK.call_once(|| {
        // Panics are caught at the boundary and reported as EIO; the
        // default hook would print to the host's stderr.
        std::panic::set_hook(Box::new(|info| {
            log(3, format_args!("internal error: {info}"));
        }));
    });
    ffi("chfs_init", -1, || {
        let server = if server.is_null() {
            None
        } else {
            // SAFETY: non-NULL C string by the caller's contract.
            Some(unsafe { cstr(server, "server") }?)
        };
        let pid = chfs_client::process_id();
        if let Some(l) = &*read_live() {
            if l.pid == pid {
                // Already initialised in this process: keep the client.
                return Ok(0);
            }
        }
        let ov = overrides().clone();
        let s = Settings::from_lookup(|k| std::env::var(k).ok(), &ov, server);
        let s = match s {
            Ok(s) => s,
            Err(e) => {
                // Logging may have been asked for by a valid priority.
                if let Ok(v) = std::env::var("CHFS_LOG_PRIORITY") {
                    if let Ok(st) = Settings::from_lookup(
                        |k| (k == "CHFS_LOG_PRIORITY").then(|| v.clone()),
                        &Overrides::NONE,
                        Some("x:1"),
                    ) {
                        set_log_level(st.log_level);
                    }
                }
                log(3, format_args!("chfs_init: {e}"));
                return Err(e);
            }
        };
        set_log_level(s.log_level);
        POSIX_FLAGS.store(s.posix_flags, Ordering::Relaxed);
        for v in settings::ENV_VARS {
            if let Ok(val) = std::env::var(v.name) {
                log(
                    7,
                    format_args!("chfs_init: {}={val:?}: {}", v.name, v.effect),
                );
            }
        }
        log(
            7,
            format_args!(
                "chfs_init: rdma_thresh {}, lookup {:?} (contact cache {:?}), backend {:?}, subdir {}",
                s.rdma_thresh,
                s.client.lookup,
                s.client.lookup_cache,
                s.backend_path,
                s.subdir_path
            ),
        );
        let client = Client::connect(s.client.clone()).inspect_err(|e| {
            log(3, format_args!("chfs_init: {e}"));
        })?;
        log(
            6,
            format_args!(
                "chfs_init: {} servers, chunk_size {}, buf_size {}, async {}",
                client.server_count(),
                s.client.chunk_size,
                s.client.buf_size,
                s.client.async_access
            ),
        );
        let mut g = write_live();
        if let Some(old) = g.take() {
            if old.pid != pid {
                std::mem::forget(old.client);
            }
        }
        *g = Some(Live {
            client,
            pid,
            settings: s,
        });
        Ok(0)
    })
}

fn set_log_level(l: Option<u8>) {
    LOG_LEVEL.store(l.map_or(-1, i32::from), Ordering::Relaxed);
}

/// 1 if `chfs_init` succeeded and `chfs_term` was not called since, else 0.
#[no_mangle]
pub extern "C" fn chfs_initialized() -> c_int {
    ffi("chfs_initialized", 0, || {
        Ok(c_int::from(read_live().is_some()))
    })
}

fn term(sync: bool) -> R<c_int> {
    let old = write_live().take();
    let Some(l) = old else { return Ok(0) };
    if l.pid != chfs_client::process_id() {
        std::mem::forget(l.client);
        return Ok(0);
    }
    if sync {
        l.client.sync()?;
    }
    Ok(0)
}

/// Flushes every open descriptor, then drops the client.
#[no_mangle]
pub extern "C" fn chfs_term() -> c_int {
    ffi("chfs_term", -1, || term(true))
}

/// Drops the client without flushing buffered writes.
#[no_mangle]
pub extern "C" fn chfs_term_without_sync() -> c_int {
    ffi("chfs_term_without_sync", -1, || term(false))
}

/// Number of servers.
#[no_mangle]
pub extern "C" fn chfs_size() -> c_int {
    ffi("chfs_size", -1, || Ok(client()?.server_count() as c_int))
}

/// Text of the last failed call of this thread ("" if none): the function,
/// the cause and the errno name. Valid until the next failing call of the
/// same thread.
#[no_mangle]
pub extern "C" fn chfs_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|l| l.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Library version (static string).
#[no_mangle]
pub extern "C" fn chfs_version() -> *const c_char {
    const V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

fn live_client() -> Option<Client> {
    read_live()
        .as_ref()
        .filter(|l| l.pid == chfs_client::process_id())
        .map(|l| l.client.clone())
}

/// Chunk size of files created from now on (ignored if <= 0; above the
/// protocol maximum it is ignored and `errno` is set to `EINVAL`).
#[no_mangle]
pub extern "C" fn chfs_set_chunk_size(chunk_size: c_int) {
    ffi("chfs_set_chunk_size", (), || {
        if chunk_size <= 0 {
            return Ok(());
        }
        if chunk_size as u64 > u64::from(chfs_proto::MAX_CHUNK_SIZE) {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "chunk size {chunk_size} above {}",
                    chfs_proto::MAX_CHUNK_SIZE
                ),
            ));
        }
        overrides().chunk_size = Some(chunk_size as u32);
        if let Some(c) = live_client() {
            c.set_chunk_size(chunk_size as u32)?;
        }
        Ok(())
    })
}

/// Client write buffer per descriptor (0 or less = off, as in CHFS).
#[no_mangle]
pub extern "C" fn chfs_set_buf_size(buf_size: c_int) {
    ffi("chfs_set_buf_size", (), || {
        let b = buf_size.max(0) as usize;
        overrides().buf_size = Some(b);
        if let Some(c) = live_client() {
            c.set_buf_size(b);
        }
        Ok(())
    })
}

/// Concurrent chunk RPCs (takes effect at the next `chfs_init`).
#[no_mangle]
pub extern "C" fn chfs_set_async_access(enable: c_int) {
    ffi("chfs_set_async_access", (), || {
        overrides().async_access = Some(enable != 0);
        Ok(())
    })
}

/// RDMA threshold (accepted; no effect: transfers use TCP).
#[no_mangle]
pub extern "C" fn chfs_set_rdma_thresh(thresh: size_t) {
    ffi("chfs_set_rdma_thresh", (), || {
        overrides().rdma_thresh = Some(thresh as u64);
        Ok(())
    })
}

/// RPC timeout in ms (takes effect at the next `chfs_init`; ignored if < 0).
#[no_mangle]
pub extern "C" fn chfs_set_rpc_timeout_msec(timeout: c_int) {
    ffi("chfs_set_rpc_timeout_msec", (), || {
        if timeout >= 0 {
            overrides().rpc_timeout_msec = Some(timeout as u64);
        }
        Ok(())
    })
}

/// Server list cache time in s (takes effect at the next `chfs_init`).
#[no_mangle]
pub extern "C" fn chfs_set_node_list_cache_timeout(timeout: c_int) {
    ffi("chfs_set_node_list_cache_timeout", (), || {
        if timeout >= 0 {
            overrides().node_list_cache_timeout = Some(timeout as u64);
        }
        Ok(())
    })
}

/// Accepted for compatibility; `chfs_stagein` copies in 1 MiB pieces
/// (the original's default) whatever it is given.
#[no_mangle]
pub extern "C" fn chfs_set_stagein_buf_size(_buf_size: c_int) {}

// ----- files -------------------------------------------------------------

/// Creates (or opens) a regular file with the default chunk size.
#[no_mangle]
pub unsafe extern "C" fn chfs_create(path: *const c_char, flags: i32, mode: mode_t) -> c_int {
    ffi("chfs_create", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.open_chunk_size(p, create_flags(flags), mode & 0o7777, 0)
    })
}

/// Creates (or opens) a regular file with chunk size `chunk_size` (> 0).
#[no_mangle]
pub unsafe extern "C" fn chfs_create_chunk_size(
    path: *const c_char,
    flags: i32,
    mode: mode_t,
    chunk_size: c_int,
) -> c_int {
    ffi("chfs_create_chunk_size", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        if chunk_size <= 0 {
            return Err(Error::new(libc::EINVAL, format!("chunk size {chunk_size}")));
        }
        client()?.open_chunk_size(p, create_flags(flags), mode & 0o7777, chunk_size as u32)
    })
}

/// Opens an existing file (flags as described at [`open_with`]).
#[no_mangle]
pub unsafe extern "C" fn chfs_open(path: *const c_char, flags: i32) -> c_int {
    ffi("chfs_open", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        open_with(&client()?, p, flags)
    })
}

/// Closes a descriptor, flushing its buffer.
#[no_mangle]
pub extern "C" fn chfs_close(fd: c_int) -> c_int {
    ffi("chfs_close", -1, || client()?.close(fd).map(|()| 0))
}

/// Writes at `offset`.
#[no_mangle]
pub unsafe extern "C" fn chfs_pwrite(
    fd: c_int,
    buf: *const c_void,
    size: size_t,
    offset: off_t,
) -> ssize_t {
    ffi("chfs_pwrite", -1, || {
        // SAFETY: buffer contract of chfs_pwrite.
        let b = unsafe { in_buf(buf, size) }?;
        Ok(client()?.pwrite(fd, b, self::offset(offset)?)? as ssize_t)
    })
}

/// Writes at the file position.
#[no_mangle]
pub unsafe extern "C" fn chfs_write(fd: c_int, buf: *const c_void, size: size_t) -> ssize_t {
    ffi("chfs_write", -1, || {
        // SAFETY: buffer contract of chfs_write.
        let b = unsafe { in_buf(buf, size) }?;
        Ok(client()?.write(fd, b)? as ssize_t)
    })
}

/// Reads at `offset`.
#[no_mangle]
pub unsafe extern "C" fn chfs_pread(
    fd: c_int,
    buf: *mut c_void,
    size: size_t,
    offset: off_t,
) -> ssize_t {
    ffi("chfs_pread", -1, || {
        // SAFETY: buffer contract of chfs_pread.
        let b = unsafe { out_buf(buf, size) }?;
        Ok(client()?.pread(fd, b, self::offset(offset)?)? as ssize_t)
    })
}

/// Reads at the file position.
#[no_mangle]
pub unsafe extern "C" fn chfs_read(fd: c_int, buf: *mut c_void, size: size_t) -> ssize_t {
    ffi("chfs_read", -1, || {
        // SAFETY: buffer contract of chfs_read.
        let b = unsafe { out_buf(buf, size) }?;
        Ok(client()?.read(fd, b)? as ssize_t)
    })
}

/// Moves the file position (`SEEK_SET`, `SEEK_CUR`, `SEEK_END`).
#[no_mangle]
pub extern "C" fn chfs_seek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    ffi("chfs_seek", -1, || {
        let w = match whence {
            libc::SEEK_SET => Whence::Set,
            libc::SEEK_CUR => Whence::Cur,
            libc::SEEK_END => Whence::End,
            _ => return Err(Error::new(libc::EINVAL, format!("whence {whence}"))),
        };
        let pos = client()?.seek(fd, off, w)?;
        off_t::try_from(pos).map_err(|_| Error::new(libc::EOVERFLOW, "position overflows off_t"))
    })
}

/// Flushes the descriptor's buffer and publishes its size.
#[no_mangle]
pub extern "C" fn chfs_fsync(fd: c_int) -> c_int {
    ffi("chfs_fsync", -1, || client()?.fsync(fd).map(|()| 0))
}

/// Sets the size of a file.
#[no_mangle]
pub unsafe extern "C" fn chfs_truncate(path: *const c_char, len: off_t) -> c_int {
    ffi("chfs_truncate", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.truncate(p, offset(len)?).map(|()| 0)
    })
}

/// Sets the size of an open file.
#[no_mangle]
pub extern "C" fn chfs_ftruncate(fd: c_int, len: off_t) -> c_int {
    ffi("chfs_ftruncate", -1, || {
        client()?.ftruncate(fd, offset(len)?).map(|()| 0)
    })
}

/// Removes a file.
#[no_mangle]
pub unsafe extern "C" fn chfs_unlink(path: *const c_char) -> c_int {
    ffi("chfs_unlink", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.unlink(p).map(|()| 0)
    })
}

/// Creates a directory.
#[no_mangle]
pub unsafe extern "C" fn chfs_mkdir(path: *const c_char, mode: mode_t) -> c_int {
    ffi("chfs_mkdir", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.mkdir(p, mode & 0o7777).map(|()| 0)
    })
}

/// Removes an empty directory.
#[no_mangle]
pub unsafe extern "C" fn chfs_rmdir(path: *const c_char) -> c_int {
    ffi("chfs_rmdir", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.rmdir(p).map(|()| 0)
    })
}

/// The entry at `path` itself, a final symbolic link not followed (as in
/// CHFS, whose FUSE client and syscall hooks use it for `lstat` too).
#[no_mangle]
pub unsafe extern "C" fn chfs_stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    ffi("chfs_stat", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        let s = client()?.lstat(p)?;
        // SAFETY: `st` points to a struct stat by contract.
        unsafe { put_stat(st, &s) }?;
        Ok(0)
    })
}

/// `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn chfs_lstat(path: *const c_char, st: *mut libc::stat) -> c_int {
    ffi("chfs_lstat", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        let s = client()?.lstat(p)?;
        // SAFETY: `st` points to a struct stat by contract.
        unsafe { put_stat(st, &s) }?;
        Ok(0)
    })
}

/// `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn chfs_fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    ffi("chfs_fstat", -1, || {
        let s = client()?.fstat(fd)?;
        // SAFETY: `st` points to a struct stat by contract.
        unsafe { put_stat(st, &s) }?;
        Ok(0)
    })
}

/// The readdir callback type of CHFS (and FUSE 2).
pub type Filler =
    Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const libc::stat, off_t) -> c_int>;

fn fill(entries: Vec<chfs_client::DirEntry>, buf: *mut c_void, filler: Filler) {
    let Some(f) = filler else { return };
    for e in entries {
        let Ok(name) = CString::new(e.name) else {
            continue;
        };
        let st = to_c_stat(&e.stat);
        // SAFETY: the caller supplied `f` and `buf` for this purpose; the
        // name and stat live across the call.
        if unsafe { f(buf, name.as_ptr(), &st, 0) } != 0 {
            break;
        }
    }
}

/// Lists a directory: `filler(buf, name, &st, 0)` per entry, stopping
/// when it returns non-zero.
#[no_mangle]
pub unsafe extern "C" fn chfs_readdir(
    path: *const c_char,
    buf: *mut c_void,
    filler: Filler,
) -> c_int {
    ffi("chfs_readdir", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        let entries = client()?.readdir(p)?;
        fill(entries, buf, filler);
        Ok(0)
    })
}

/// Lists the entries of a directory held by server `index`.
#[no_mangle]
pub unsafe extern "C" fn chfs_readdir_index(
    path: *const c_char,
    index: c_int,
    buf: *mut c_void,
    filler: Filler,
) -> c_int {
    ffi("chfs_readdir_index", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        let i = usize::try_from(index)
            .map_err(|_| Error::new(libc::EINVAL, format!("server index {index}")))?;
        let entries = client()?.readdir_index(p, i)?;
        fill(entries, buf, filler);
        Ok(0)
    })
}

/// Creates a symbolic link `path` pointing to `target`.
#[no_mangle]
pub unsafe extern "C" fn chfs_symlink(target: *const c_char, path: *const c_char) -> c_int {
    ffi("chfs_symlink", -1, || {
        // SAFETY: C strings by contract.
        let t = unsafe { cstr(target, "target") }?;
        // SAFETY: as above.
        let p = unsafe { cstr(path, "path") }?;
        client()?.symlink(t, p).map(|()| 0)
    })
}

/// Reads a symbolic link (no NUL added; returns the number of bytes).
#[no_mangle]
pub unsafe extern "C" fn chfs_readlink(
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> c_int {
    ffi("chfs_readlink", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        if size == 0 {
            return Err(Error::new(libc::EINVAL, "buffer size 0"));
        }
        // SAFETY: `buf` is writable for `size` bytes by contract.
        let out = unsafe { out_buf(buf.cast(), size) }?;
        let t = client()?.readlink(p)?;
        let n = t.len().min(out.len()).min(c_int::MAX as usize);
        out[..n].copy_from_slice(&t.as_bytes()[..n]);
        Ok(n as c_int)
    })
}

/// Flushes every open descriptor of this process.
#[no_mangle]
pub extern "C" fn chfs_sync() {
    ffi("chfs_sync", (), || client()?.sync())
}

// ----- beyond CHFS ---------------------------------------------------------

/// `rename(2)`.
#[no_mangle]
pub unsafe extern "C" fn chfs_rename(from: *const c_char, to: *const c_char) -> c_int {
    ffi("chfs_rename", -1, || {
        // SAFETY: C strings by contract.
        let f = unsafe { cstr(from, "from") }?;
        // SAFETY: as above.
        let t = unsafe { cstr(to, "to") }?;
        client()?.rename(f, t).map(|()| 0)
    })
}

/// `chmod(2)`.
#[no_mangle]
pub unsafe extern "C" fn chfs_chmod(path: *const c_char, mode: mode_t) -> c_int {
    ffi("chfs_chmod", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.chmod(p, mode & 0o7777).map(|_| 0)
    })
}

/// `lchown(2)`-like: `(uid_t)-1` / `(gid_t)-1` leave an id unchanged.
#[no_mangle]
pub unsafe extern "C" fn chfs_chown(
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> c_int {
    ffi("chfs_chown", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.chown(p, cabi::id(uid), cabi::id(gid)).map(|_| 0)
    })
}

/// `utimensat(2)` without following links: `times` NULL sets both to now.
#[no_mangle]
pub unsafe extern "C" fn chfs_utimens(path: *const c_char, times: *const libc::timespec) -> c_int {
    ffi("chfs_utimens", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        // SAFETY: `times` is NULL or points to two timespecs by contract.
        let (a, m) = unsafe { cabi::timespecs(times) }?;
        client()?.utimens(p, a, m).map(|_| 0)
    })
}

/// `statvfs(3)` of the whole file system (`path` must exist).
#[no_mangle]
pub unsafe extern "C" fn chfs_statfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
    ffi("chfs_statfs", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        let c = client()?;
        c.stat(p)?;
        let v = c.statfs()?.to_statvfs();
        // SAFETY: writable by contract.
        unsafe { cabi::put(buf, v, "struct statvfs") }?;
        Ok(0)
    })
}

/// `mknod(2)`: regular files, FIFOs, sockets, device nodes (as entries).
#[no_mangle]
pub unsafe extern "C" fn chfs_mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    ffi("chfs_mknod", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.mknod(p, mode, dev).map(|()| 0)
    })
}

/// `access(2)` (`F_OK`, `R_OK`, `W_OK`, `X_OK`) with the effective ids.
#[no_mangle]
pub unsafe extern "C" fn chfs_access(path: *const c_char, mode: c_int) -> c_int {
    ffi("chfs_access", -1, || {
        // SAFETY: C string by contract.
        let p = unsafe { cstr(path, "path") }?;
        client()?.access(p, mode).map(|()| 0)
    })
}

// ----- stage-in ----------------------------------------------------------

/// Stages `path` in, by the rule of `chstagein` ([`Client::stagein`]): a
/// local file, directory (with everything below it) or link is copied into
/// CHFS at `CHFS_SUBDIR_PATH/path`, creating missing parents; a local path
/// inside the pool's backend directory, or a path that does not exist
/// locally, is fetched by the servers from their backend (cache mode;
/// without a backend that is `ENOENT`).
#[no_mangle]
pub unsafe extern "C" fn chfs_stagein(path: *const c_char) -> c_int {
    ffi("chfs_stagein", -1, || {
        // SAFETY: C string by contract.
        let src = unsafe { cstr(path, "path") }?;
        let c = client()?;
        let subdir = read_live()
            .as_ref()
            .map_or_else(|| "/".to_string(), |l| l.settings.subdir_path.clone());
        if chfs_proto::path::normalize(&format!("{subdir}/{src}"))? == "/" {
            return Ok(0);
        }
        c.stagein_under(src, &subdir).map(|_| 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_before_init_fail_with_enotconn_not_a_crash() {
        assert_eq!(chfs_initialized(), 0);
        assert_eq!(chfs_close(3), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTCONN)
        );
        // SAFETY: a NULL path is allowed and must give EFAULT.
        assert_eq!(unsafe { chfs_unlink(std::ptr::null()) }, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
    }

    #[test]
    fn panics_become_eio() {
        let r = ffi("t", -1, || -> R<i32> { panic!("boom") });
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EIO)
        );
    }
}
