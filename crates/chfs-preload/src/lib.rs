//! libchfs_preload.so: an `LD_PRELOAD` interposer that sends paths under
//! `CHFS_MOUNTPOINT` (and descriptors opened there) to the chfs-rs pool
//! named by `CHFS_SERVER`, and everything else to libc unchanged.
//!
//! It only translates: C strings, `struct stat`, flags and `errno` on one
//! side, [`chfs_client::Client`] on the other. Rules kept here:
//! - a path or descriptor that is not ours costs a prefix compare or one
//!   atomic load before libc's function (found once with
//!   `dlsym(RTLD_NEXT)`) is called;
//! - while this library is inside the client (which calls libc itself:
//!   sockets, files under /proc), every interposed call of that thread goes
//!   straight to libc (a thread-local flag);
//! - the client is created on the first chfs-rs path, from the environment
//!   as libchfs does (`ClientConfig::from_env`); a failure is the errno of
//!   that call, never a message or an exit; panics are caught and become
//!   `EIO`;
//! - a chfs-rs file gets a real kernel descriptor (of `/dev/null`), so its
//!   number cannot be handed out by the kernel to anything else; a table
//!   maps that number to the client's file;
//! - after `fork` the child opens its own connections and reopens the
//!   parent's files on first use (at the position they had at the fork).

// The exported functions are libc's; their contract is libc's.
#![allow(clippy::missing_safety_doc)]

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("chfs-preload supports 64-bit Linux (glibc) only");

mod paths;
mod real;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_long, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock, RwLock};

use chfs_client::cabi::{self, id, in_buf, out_buf};
use chfs_client::{Client, ClientConfig, Error, Stat, Whence};
use libc::{mode_t, off_t, size_t, ssize_t, AT_FDCWD, DIR, FILE};
use real::Fail;

type R<T> = Result<T, Error>;

fn err<T>(errno: c_int, what: &str) -> R<T> {
    Err(Error::new(errno, what.to_string()))
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    // SAFETY: as in set_errno.
    unsafe { *libc::__errno_location() }
}

fn last_os_error(what: &str) -> Error {
    Error::new(errno(), what.to_string())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ----- re-entrancy guard and the boundary -----------------------------

thread_local! {
    /// Set while this thread is inside the client.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Is this thread inside the client (or exiting)? Then libc it is.
fn inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true)
}

struct Inside(bool);

impl Inside {
    fn enter() -> Inside {
        Inside(INSIDE.try_with(|c| c.replace(true)).unwrap_or(true))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let prev = self.0;
        let _ = INSIDE.try_with(|c| c.set(prev));
    }
}

/// Runs the chfs-rs side of a call: errors set `errno`, a panic is `EIO`;
/// on success `errno` is left as it was.
fn run<T: Fail>(f: impl FnOnce() -> R<T>) -> T {
    let saved = errno();
    let _in = Inside::enter();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            set_errno(saved);
            v
        }
        Ok(Err(e)) => {
            set_errno(e.errno());
            T::fail()
        }
        Err(_) => {
            set_errno(libc::EIO);
            T::fail()
        }
    }
}

// ----- the mount prefix and the current directory ----------------------

static MOUNT: OnceLock<Option<String>> = OnceLock::new();

/// `CHFS_MOUNTPOINT`, normalised (unset, empty or `/`: nothing is ours).
fn mount() -> Option<&'static str> {
    MOUNT
        .get_or_init(|| {
            let v = std::env::var("CHFS_MOUNTPOINT").ok()?;
            if !v.starts_with('/') {
                return None;
            }
            let n = paths::normalize_abs(&v);
            (n != "/").then_some(n)
        })
        .as_deref()
}

/// Set after a `chdir` into the prefix; `CWD` is then the chfs-rs path.
static CWD_IN: AtomicBool = AtomicBool::new(false);
static CWD: Mutex<String> = Mutex::new(String::new());

/// Where a path argument goes.
enum Route {
    /// To libc with the caller's arguments.
    Pass,
    /// To libc, as this absolute path (a relative path from a chfs-rs
    /// directory that leads out of the prefix).
    Local(CString),
    /// To the pool, as this chfs-rs path.
    Chfs(String),
}

fn classify(m: &str, full: &str) -> Route {
    // Most paths need no normalising: one allocation instead of three.
    if paths::is_normal(full) {
        if let Some(p) = paths::strip(m, full) {
            return Route::Chfs(p);
        }
    }
    let n = paths::normalize_abs(full);
    match paths::strip(m, &n) {
        Some(p) => Route::Chfs(p),
        None => CString::new(n).map_or(Route::Pass, Route::Local),
    }
}

/// Routes `path` relative to `dirfd` (`AT_FDCWD` or a descriptor).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn route_at(dirfd: c_int, path: *const c_char) -> Route {
    let Some(m) = mount() else {
        return Route::Pass;
    };
    if path.is_null() || inside() {
        return Route::Pass;
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let first = unsafe { *path } as u8;
    if first == b'/' {
        // SAFETY: as above.
        if !unsafe { paths::has_prefix(path, m.as_bytes()) } {
            return Route::Pass;
        }
        // SAFETY: as above.
        let Ok(s) = unsafe { CStr::from_ptr(path) }.to_str() else {
            return Route::Pass;
        };
        return classify(m, s);
    }
    let base = if dirfd == AT_FDCWD {
        if !CWD_IN.load(Ordering::Acquire) {
            return Route::Pass;
        }
        lock(&CWD).clone()
    } else if let Some(f) = fds::get(dirfd) {
        f.path.clone()
    } else {
        return Route::Pass;
    };
    // SAFETY: as above.
    let Ok(rel) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return Route::Pass;
    };
    classify(m, &format!("{m}{base}/{rel}"))
}

/// # Safety
/// As [`route_at`].
unsafe fn route(path: *const c_char) -> Route {
    // SAFETY: the caller's contract.
    unsafe { route_at(AT_FDCWD, path) }
}

// ----- the client ------------------------------------------------------

struct Live {
    client: Client,
    /// [`FORKS`] when it was made: a forked child makes its own.
    forks: u64,
    /// Bumped for every client made.
    gen: u64,
}

static LIVE: RwLock<Option<Live>> = RwLock::new(None);
static GEN: AtomicU64 = AtomicU64::new(0);
/// Forks this process descends from (bumped in the child by a
/// `pthread_atfork` handler, registered before the first client is
/// made): one atomic load per call where `getpid` was a system call.
static FORKS: AtomicU64 = AtomicU64::new(0);
/// This process's id, from the first client on (and in a forked child,
/// its own): see [`foreign_child`].
static PID: AtomicU32 = AtomicU32::new(0);

/// Is this a child that shares the parent's memory (`vfork`, which
/// Python's subprocess uses, or `clone`/`_Fork` without the atfork
/// handlers)? Its changes to the descriptor table, the current directory
/// or the client would be the parent's: such a child closes, duplicates
/// and changes directory in the kernel only. A `getpid` system call, made
/// only in a program that has called `vfork` (shim.c notes it) and only
/// on those paths (closing or duplicating a chfs-rs descriptor,
/// `close_range`, leaving a chfs-rs current directory, exec, `_exit`).
/// A raw `clone` or glibc's `_Fork` without a `vfork` before is not seen.
pub(crate) fn foreign_child() -> bool {
    extern "C" {
        /// In shim.c: has the program called vfork (always 1 where the
        /// shim cannot tell)?
        fn chfs_preload_vfork_seen() -> c_int;
    }
    // SAFETY: reads a flag; no arguments.
    if unsafe { chfs_preload_vfork_seen() } == 0 {
        return false;
    }
    let p = PID.load(Ordering::Acquire);
    // SAFETY: getpid has no preconditions.
    p != 0 && p != unsafe { libc::getpid() } as u32
}
static UMASK: AtomicU32 = AtomicU32::new(0o022);
static SETUP: Once = Once::new();

fn process_umask() -> u32 {
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        for l in s.lines() {
            if let Some(v) = l.strip_prefix("Umask:") {
                if let Ok(m) = u32::from_str_radix(v.trim(), 8) {
                    return m;
                }
            }
        }
    }
    0o022
}

/// The client of this process, connected on first use.
fn client() -> R<(Client, u64)> {
    let forks = FORKS.load(Ordering::Acquire);
    if let Some(l) = &*LIVE.read().unwrap_or_else(|e| e.into_inner()) {
        if l.forks == forks {
            return Ok((l.client.clone(), l.gen));
        }
    }
    let mut g = LIVE.write().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = &*g {
        if l.forks == forks {
            return Ok((l.client.clone(), l.gen));
        }
    }
    SETUP.call_once(|| {
        // Panics are caught at the boundary; this library's copy of std
        // must not print them into the host program's stderr.
        std::panic::set_hook(Box::new(|_| {}));
        // SAFETY: registers plain extern "C" functions without arguments.
        unsafe { libc::pthread_atfork(Some(before_fork), None, Some(in_child)) };
        // SAFETY: as above; `at_exit` runs once, at exit(3).
        unsafe { libc::atexit(at_exit) };
        // SAFETY: getpid has no preconditions.
        PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    });
    UMASK.store(process_umask(), Ordering::Relaxed);
    let client = Client::connect(ClientConfig::from_env()?)?;
    if let Some(old) = g.take() {
        // A forked child: the parent's connections are shared sockets;
        // closing them here would cut the parent off. Leak them.
        std::mem::forget(old.client);
    }
    let gen = GEN.fetch_add(1, Ordering::Relaxed) + 1;
    *g = Some(Live {
        client: client.clone(),
        forks,
        gen,
    });
    Ok((client, gen))
}

/// The client if this process has one already (no connection made).
fn live() -> Option<(Client, u64)> {
    let g = LIVE.read().unwrap_or_else(|e| e.into_inner());
    g.as_ref()
        .filter(|l| l.forks == FORKS.load(Ordering::Acquire))
        .map(|l| (l.client.clone(), l.gen))
}

/// `pthread_atfork` child handler: this process needs a client of its
/// own; the parent's sockets, inherited, are no longer the client's
/// (the program may close them).
extern "C" fn in_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    owned::forget_all();
}

/// `pthread_atfork` prepare handler: buffered writes reach the servers and
/// every file's position is noted, so that the child reopens it there.
extern "C" fn before_fork() {
    if inside() {
        return;
    }
    run(|| {
        let Some((c, gen)) = live() else {
            return Ok(());
        };
        for f in fds::all() {
            let mut h = lock(&f.h);
            if h.gen == gen {
                let _ = c.flush(h.cfd);
                if let Ok(p) = c.seek(h.cfd, 0, Whence::Cur) {
                    h.pos = p;
                }
            }
        }
        Ok(())
    })
}

/// Every open chfs-rs file's buffered writes and size reach the servers
/// (a process that ends or execs without closing its files loses nothing).
/// Not in a vfork child: the files are its parent's, which goes on with
/// them (and the child's descriptor table, where the client's sockets may
/// already be closed, is not the parent's); the program it execs sees
/// what the parent has published, as a process on another node would.
pub(crate) fn publish_open_files() {
    if !foreign_child() {
        before_fork();
    }
}

/// `atexit` handler: stdio streams first (exit(3) flushes them only after
/// the atexit handlers, and a stream on a chfs-rs file writes through this
/// library), then every open file, as close would.
extern "C" fn at_exit() {
    if inside() {
        return;
    }
    // SAFETY: fflush(NULL) flushes every output stream; exit(3) would do
    // the same a moment later.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    publish_open_files();
}

// ----- descriptors -----------------------------------------------------

/// An open chfs-rs file, shared by the descriptors `dup` made of it.
struct OpenFile {
    /// chfs-rs path (for `*at` calls relative to it and for `fchdir`).
    path: String,
    /// open(2) flags the caller gave.
    flags: c_int,
    dir: bool,
    h: Mutex<Handle>,
    /// A directory's listing for `getdents64` and the next entry's index
    /// (taken at the first call, dropped by `lseek` to 0).
    list: Mutex<Option<(Vec<Entry>, usize)>>,
}

/// A directory entry as the C views report it: name, `d_type`, `d_ino`.
type Entry = (CString, u8, u64);

struct Handle {
    /// Client generation `cfd` belongs to.
    gen: u64,
    cfd: c_int,
    /// Position at the last fork.
    pos: u64,
}

impl OpenFile {
    /// The client descriptor, reopened in a forked child.
    fn cfd(&self, c: &Client, gen: u64) -> R<c_int> {
        let mut h = lock(&self.h);
        if h.gen != gen {
            let flags = self.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            let cfd = c.open(&self.path, client_flags(flags), 0)?;
            if h.pos > 0 {
                c.seek(cfd, h.pos as i64, Whence::Set)?;
            }
            h.gen = gen;
            h.cfd = cfd;
        }
        Ok(h.cfd)
    }
}

mod fds {
    use super::*;

    pub(super) const MAX: usize = 1 << 16;
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicU64 = AtomicU64::new(0);
    /// Bit per descriptor number: is it ours?
    static BITS: [AtomicU64; MAX / 64] = [ZERO; MAX / 64];
    static TABLE: RwLock<BTreeMap<c_int, Arc<OpenFile>>> = RwLock::new(BTreeMap::new());

    fn bit(fd: c_int) -> Option<(usize, u64)> {
        let i = usize::try_from(fd).ok().filter(|&i| i < MAX)?;
        Some((i / 64, 1u64 << (i % 64)))
    }

    /// The chfs-rs file of descriptor `fd`, if it is one.
    #[inline]
    pub(super) fn get(fd: c_int) -> Option<Arc<OpenFile>> {
        let (w, b) = bit(fd)?;
        if BITS[w].load(Ordering::Acquire) & b == 0 {
            return None;
        }
        TABLE
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fd)
            .cloned()
    }

    pub(super) fn set(fd: c_int, f: Arc<OpenFile>) {
        let Some((w, b)) = bit(fd) else { return };
        TABLE
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fd, f);
        BITS[w].fetch_or(b, Ordering::Release);
    }

    pub(super) fn take(fd: c_int) -> Option<Arc<OpenFile>> {
        let (w, b) = bit(fd)?;
        if BITS[w].load(Ordering::Acquire) & b == 0 {
            return None;
        }
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        BITS[w].fetch_and(!b, Ordering::Release);
        t.remove(&fd)
    }

    /// The descriptor numbers of chfs-rs files.
    pub(super) fn numbers() -> Vec<c_int> {
        TABLE
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    pub(super) fn all() -> Vec<Arc<OpenFile>> {
        TABLE
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Descriptors the library holds itself: the client's sockets and the
/// kept `/dev/null` descriptor. A program closing every descriptor (a
/// daemon, a shell, an MPI launcher: a `close` loop, `close_range`,
/// `closefrom`) would otherwise cut the client off, or worse, the number
/// would be handed to one of the program's files and the client would
/// send its requests there. A `close` of one by the program succeeds and
/// does nothing; `close_range`/`closefrom` leave them out; `dup2`/`dup3`
/// onto one fails with `EBUSY`. Sockets are moved to high numbers when
/// made ([`hold`]), out of the way of programs that choose
/// numbers.
mod owned {
    use super::*;

    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicU64 = AtomicU64::new(0);
    static BITS: [AtomicU64; fds::MAX / 64] = [ZERO; fds::MAX / 64];
    static ANY: AtomicBool = AtomicBool::new(false);

    fn bit(fd: c_int) -> Option<(usize, u64)> {
        let i = usize::try_from(fd).ok().filter(|&i| i < fds::MAX)?;
        Some((i / 64, 1u64 << (i % 64)))
    }

    pub(super) fn add(fd: c_int) {
        if let Some((w, b)) = bit(fd) {
            BITS[w].fetch_or(b, Ordering::Release);
            ANY.store(true, Ordering::Release);
        }
    }

    pub(super) fn remove(fd: c_int) {
        if let Some((w, b)) = bit(fd) {
            BITS[w].fetch_and(!b, Ordering::Release);
        }
    }

    #[inline]
    pub(super) fn has(fd: c_int) -> bool {
        ANY.load(Ordering::Acquire)
            && bit(fd).is_some_and(|(w, b)| BITS[w].load(Ordering::Acquire) & b != 0)
    }

    /// Ours among `first..=last`, in order.
    pub(super) fn within(first: c_uint, last: c_uint) -> Vec<c_int> {
        if !ANY.load(Ordering::Acquire) {
            return Vec::new();
        }
        let hi = (last as usize).min(fds::MAX - 1);
        (first as usize..=hi)
            .filter(|&i| BITS[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0)
            .map(|i| i as c_int)
            .collect()
    }

    /// In a forked child: the sockets inherited from the parent are not
    /// this process's client's (the kept `/dev/null` descriptor still is).
    pub(super) fn forget_all() {
        for w in &BITS {
            w.store(0, Ordering::Release);
        }
        let t = TEMPLATE.load(Ordering::Acquire);
        if t >= 0 {
            add(t);
        }
    }
}

/// Is this thread inside the client (for descriptors it makes)? Unlike
/// [`inside`], false while the thread's locals are being destroyed.
fn client_thread() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(false)
}

/// Where the client's sockets are moved: below 1024 (`select` limits),
/// near the top of what the descriptor limit allows, where programs that
/// pick numbers (`dup2` onto 3, 4, ...; shells use 10 and up and 255)
/// do not look.
fn high_base() -> c_int {
    static BASE: AtomicU32 = AtomicU32::new(0);
    let b = BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b as c_int;
    }
    // SAFETY: getrlimit writes the struct it is given.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur.min(1024) as u32
    } else {
        1024
    };
    let b = if soft >= 512 { soft - 128 } else { soft / 2 }.max(3);
    BASE.store(b, Ordering::Relaxed);
    b as c_int
}

/// A descriptor the library keeps (a client socket, the kept
/// `/dev/null`): moved to a high number and marked as the library's.
fn hold(fd: c_int) -> c_int {
    // SAFETY: libc's fcntl(F_DUPFD_CLOEXEC) on the new socket.
    let hi = unsafe {
        real::fcntl(
            fd,
            libc::F_DUPFD_CLOEXEC,
            high_base() as usize as *mut c_void,
        )
    };
    let fd = if hi >= 0 {
        // SAFETY: the original number, now duplicated.
        unsafe { real::close(fd) };
        hi
    } else {
        fd
    };
    owned::add(fd);
    fd
}

/// The chfs-rs file of `fd` when the call is to be ours.
#[inline]
fn ours(fd: c_int) -> Option<Arc<OpenFile>> {
    let f = fds::get(fd)?;
    (!inside()).then_some(f)
}

/// Drops one descriptor's share of a file: the last closes it in the client
/// (and reports what that flush says).
fn release(f: Arc<OpenFile>) -> R<()> {
    let Some(f) = Arc::into_inner(f) else {
        return Ok(());
    };
    let h = f.h.into_inner().unwrap_or_else(|e| e.into_inner());
    match live() {
        Some((c, gen)) if gen == h.gen => c.close(h.cfd),
        _ => Ok(()),
    }
}

/// Open flags the client understands.
fn client_flags(flags: c_int) -> c_int {
    let mut f = flags
        & (libc::O_ACCMODE
            | libc::O_CREAT
            | libc::O_EXCL
            | libc::O_TRUNC
            | libc::O_APPEND
            | libc::O_DIRECTORY
            | libc::O_NOFOLLOW);
    if flags & libc::O_PATH != 0 {
        f &= !(libc::O_ACCMODE | libc::O_TRUNC);
    }
    f
}

/// A descriptor of `/dev/null` kept (close-on-exec, one of [`owned`]) to
/// be duplicated for each chfs-rs file: `fcntl(F_DUPFD)` costs ~0.3 us
/// where opening `/dev/null` costs ~2.5 us, a fifth of a create.
static TEMPLATE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

fn open_null(flags: c_int) -> R<c_int> {
    // SAFETY: a NUL-terminated literal path.
    let fd = unsafe { real::open(c"/dev/null".as_ptr(), flags, 0) };
    if fd < 0 {
        return Err(last_os_error("cannot reserve a descriptor (/dev/null)"));
    }
    Ok(fd)
}

/// A duplicate of `TEMPLATE`. The program cannot close it or put
/// another file on its number ([`owned`]: close, close_range, closefrom,
/// dup2 and dup3 leave it alone), so it is not checked with `fstat` each
/// time (a third system call per open): only a raw system call could
/// replace it, and one that closes it is seen here (EBADF).
fn dup_template(cloexec: bool) -> Option<c_int> {
    let t = TEMPLATE.load(Ordering::Acquire);
    if t < 0 {
        return None;
    }
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: libc's fcntl(F_DUPFD[_CLOEXEC], 0) on a descriptor number.
    let fd = unsafe { real::fcntl(t, cmd, std::ptr::null_mut()) };
    if fd >= 0 {
        return Some(fd);
    }
    // Closed behind our back (a raw system call): forget the number.
    if TEMPLATE
        .compare_exchange(t, -1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        owned::remove(t);
    }
    None
}

/// A kernel descriptor to stand for a chfs-rs file.
fn reserve(cloexec: bool) -> R<c_int> {
    let fd = match dup_template(cloexec) {
        Some(fd) => fd,
        None => {
            let fd = open_null(libc::O_RDWR | if cloexec { libc::O_CLOEXEC } else { 0 })?;
            if let Ok(t) = open_null(libc::O_RDWR | libc::O_CLOEXEC) {
                let t = hold(t);
                if TEMPLATE
                    .compare_exchange(-1, t, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    owned::remove(t);
                    // SAFETY: the descriptor just opened.
                    unsafe { real::close(t) };
                }
            }
            fd
        }
    };
    if fd as usize >= fds::MAX {
        // SAFETY: the descriptor just made.
        unsafe { real::close(fd) };
        return err(libc::EMFILE, "descriptor number above the preload table");
    }
    Ok(fd)
}

fn chfs_open(path: &str, flags: c_int, mode: u32) -> R<c_int> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return err(libc::EOPNOTSUPP, "O_TMPFILE");
    }
    let (c, gen) = client()?;
    let cfd = c.open(
        path,
        client_flags(flags),
        mode & 0o7777 & !UMASK.load(Ordering::Relaxed),
    )?;
    let dir = c.fstat_cached(cfd).map(|s| s.is_dir()).unwrap_or(false);
    let kfd = match reserve(flags & libc::O_CLOEXEC != 0) {
        Ok(k) => k,
        Err(e) => {
            let _ = c.close(cfd);
            return Err(e);
        }
    };
    let path = c.fd_path(cfd).unwrap_or_else(|_| path.to_string());
    fds::set(
        kfd,
        Arc::new(OpenFile {
            path,
            flags,
            dir,
            h: Mutex::new(Handle { gen, cfd, pos: 0 }),
            list: Mutex::new(None),
        }),
    );
    Ok(kfd)
}

/// Runs `op` on the client descriptor of `f`.
fn with<T>(f: &OpenFile, op: impl FnOnce(&Client, c_int) -> R<T>) -> R<T> {
    let (c, gen) = client()?;
    let cfd = f.cfd(&c, gen)?;
    op(&c, cfd)
}

// ----- conversions -----------------------------------------------------

/// `st_dev` of every chfs-rs file (major 0xcf5, minor 1).
const DEV_MAJOR: u32 = 0xcf5;
const DEV_MINOR: u32 = 1;

fn makedev(major: u32, minor: u32) -> u64 {
    let (ma, mi) = (u64::from(major), u64::from(minor));
    ((ma & 0xffff_f000) << 32) | ((ma & 0xfff) << 8) | ((mi & 0xffff_ff00) << 12) | (mi & 0xff)
}

fn ns_split(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

fn to_c_stat(s: &Stat) -> libc::stat {
    let mut st = s.to_libc();
    st.st_dev = makedev(DEV_MAJOR, DEV_MINOR);
    st
}

fn to_statx(s: &Stat) -> libc::statx {
    // SAFETY: `struct statx` is plain old data; all-zero is a valid value.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    let ts = |ns: i64| {
        let (sec, nsec) = ns_split(ns);
        // SAFETY: plain old data; all-zero is a valid value.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = sec;
        t.tv_nsec = nsec as u32;
        t
    };
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = s.blksize;
    x.stx_nlink = s.nlink;
    x.stx_uid = s.uid;
    x.stx_gid = s.gid;
    x.stx_mode = s.mode as u16;
    x.stx_ino = s.ino;
    x.stx_size = s.size;
    x.stx_blocks = s.blocks;
    x.stx_atime = ts(s.atime);
    x.stx_mtime = ts(s.mtime);
    x.stx_ctime = ts(s.ctime);
    x.stx_rdev_major = (((s.rdev >> 8) & 0xfff) | ((s.rdev >> 32) & !0xfff)) as u32;
    x.stx_rdev_minor = ((s.rdev & 0xff) | ((s.rdev >> 12) & !0xff)) as u32;
    x.stx_dev_major = DEV_MAJOR;
    x.stx_dev_minor = DEV_MINOR;
    x
}

fn offset(off: off_t) -> R<u64> {
    u64::try_from(off).map_err(|_| Error::new(libc::EINVAL, format!("negative offset {off}")))
}

/// # Safety
/// `iov` points to `cnt` iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> R<&'a [libc::iovec]> {
    let n = usize::try_from(cnt).map_err(|_| Error::new(libc::EINVAL, "iovcnt".to_string()))?;
    if n == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return err(libc::EFAULT, "NULL iovec");
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, n) })
}

fn gather(v: &[libc::iovec]) -> R<Vec<u8>> {
    let mut out = Vec::new();
    for e in v {
        // SAFETY: each iovec describes the caller's readable buffer.
        out.extend_from_slice(unsafe { in_buf(e.iov_base, e.iov_len) }?);
    }
    Ok(out)
}

fn scatter(v: &[libc::iovec], data: &[u8]) -> R<()> {
    let mut rest = data;
    for e in v {
        if rest.is_empty() {
            break;
        }
        let n = e.iov_len.min(rest.len());
        // SAFETY: each iovec describes the caller's writable buffer.
        unsafe { out_buf(e.iov_base, n) }?.copy_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
    Ok(())
}

fn whence(w: c_int) -> R<Whence> {
    match w {
        libc::SEEK_SET => Ok(Whence::Set),
        libc::SEEK_CUR => Ok(Whence::Cur),
        libc::SEEK_END => Ok(Whence::End),
        _ => err(libc::EINVAL, "whence"),
    }
}

// ----- helpers for the entry points -------------------------------------

/// A call with a path: libc's `pass(dirfd, path)` or the pool's
/// `chfs(path)`.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
unsafe fn by_path<T: Fail>(
    dirfd: c_int,
    path: *const c_char,
    pass: impl FnOnce(c_int, *const c_char) -> T,
    chfs: impl FnOnce(&str) -> R<T>,
) -> T {
    // SAFETY: the caller's contract.
    match unsafe { route_at(dirfd, path) } {
        Route::Pass => pass(dirfd, path),
        Route::Local(p) => pass(AT_FDCWD, p.as_ptr()),
        Route::Chfs(p) => run(|| chfs(&p)),
    }
}

/// A call with a descriptor: libc's `pass()` or the pool's `chfs`.
fn by_fd<T: Fail>(
    fd: c_int,
    pass: impl FnOnce() -> T,
    chfs: impl FnOnce(&Client, c_int, &OpenFile) -> R<T>,
) -> T {
    match ours(fd) {
        None => pass(),
        Some(f) => run(|| {
            let (c, gen) = client()?;
            let cfd = f.cfd(&c, gen)?;
            chfs(&c, cfd, &f)
        }),
    }
}

/// Entry points that are another's under a second name, with the same
/// arguments (`stat64` is `stat` on 64-bit Linux, ...).
macro_rules! twins {
    ($($name:ident = $target:ident($($a:ident: $t:ty),* $(,)?) -> $r:ty;)*) => { $(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            // SAFETY: the twin's contract, which is this function's.
            unsafe { $target($($a),*) }
        }
    )* };
}

/// Entry points whose first argument is a path (from the current
/// directory): libc's function of the same name, or under the prefix
/// `$chfs` with the chfs-rs path as `$p`.
macro_rules! path_fns {
    ($($name:ident($($a:ident: $t:ty),* $(,)?) -> $r:ty = |$p:ident| $chfs:expr;)*) => { $(
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, $($a: $t),*) -> $r {
            // SAFETY: the caller's C string and arguments, passed on.
            unsafe { by_path(AT_FDCWD, path, |_, q| real::$name(q, $($a),*), |$p| $chfs) }
        }
    )* };
}

/// Entry points that start another program image (exec, spawn): every
/// open chfs-rs file's buffered writes and size are published first
/// (the new image has its own client), then libc's function runs.
macro_rules! publish_first {
    ($($name:ident($($a:ident: $t:ty),* $(,)?) -> $r:ty;)*) => { $(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            publish_open_files();
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real::$name($($a),*) }
        }
    )* };
}

mod entry;
mod more;
mod stdio;
