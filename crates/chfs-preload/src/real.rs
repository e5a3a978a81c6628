//! libc's definitions of the interposed functions: `dlsym(RTLD_NEXT, name)`,
//! looked up on first use and kept in an atomic (no lock, no allocation).

use std::ffi::{c_char, c_int, c_long, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{mode_t, off_t, size_t, ssize_t, DIR, FILE};

/// The value a function returns on failure (with `errno` set).
pub(crate) trait Fail {
    fn fail() -> Self;
}

impl Fail for c_int {
    fn fail() -> Self {
        -1
    }
}
impl Fail for c_long {
    fn fail() -> Self {
        -1
    }
}
impl Fail for isize {
    fn fail() -> Self {
        -1
    }
}
impl Fail for () {
    fn fail() -> Self {}
}
impl<T> Fail for *mut T {
    fn fail() -> Self {
        std::ptr::null_mut()
    }
}

/// The next definition of `name` (NUL-terminated), 0 if there is none.
fn lookup(slot: &AtomicUsize, name: &'static [u8]) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // SAFETY: `name` is a NUL-terminated literal; dlsym has no other
    // precondition.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    slot.store(p, Ordering::Release);
    p
}

macro_rules! real {
    ($( fn $name:ident($($a:ident: $t:ty),* $(,)?) -> $r:ty; )*) => { $(
        #[allow(non_snake_case, clippy::too_many_arguments, dead_code)]
        pub(crate) unsafe fn $name($($a: $t),*) -> $r {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let p = lookup(&SLOT, concat!(stringify!($name), "\0").as_bytes());
            if p == 0 {
                crate::set_errno(libc::ENOSYS);
                return <$r as Fail>::fail();
            }
            // SAFETY: `p` is libc's definition of this very function, whose
            // C prototype is the one written here.
            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { f($($a),*) }
        }
    )* };
}

/// `open`/`openat`/`fcntl` are variadic: called as such.
macro_rules! real_variadic {
    ($( fn $name:ident($($a:ident: $t:ty),*; $v:ident: $vt:ty) -> $r:ty; )*) => { $(
        pub(crate) unsafe fn $name($($a: $t),*, $v: $vt) -> $r {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let p = lookup(&SLOT, concat!(stringify!($name), "\0").as_bytes());
            if p == 0 {
                crate::set_errno(libc::ENOSYS);
                return -1;
            }
            // SAFETY: libc's definition of this variadic function.
            let f: unsafe extern "C" fn($($t),*, ...) -> $r = unsafe { std::mem::transmute(p) };
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { f($($a),*, $v) }
        }
    )* };
}

real_variadic! {
    fn open(path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int; arg: *mut c_void) -> c_int;
}

real! {
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_uint) -> c_int;
    fn closefrom(low: c_int) -> ();
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int) -> c_int;
    fn pipe(fds: *mut c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn epoll_create(size: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn eventfd(initval: c_uint, flags: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t;
    fn stat(path: *const c_char, st: *mut libc::stat) -> c_int;
    fn lstat(path: *const c_char, st: *mut libc::stat) -> c_int;
    fn fstat(fd: c_int, st: *mut libc::stat) -> c_int;
    fn fstatat(dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, st: *mut libc::statx) -> c_int;
    fn __xstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int;
    fn __lxstat(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int;
    fn __fxstat(ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int;
    fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int;
    fn access(path: *const c_char, mode: c_int) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    fn unlink(path: *const c_char) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn rmdir(path: *const c_char) -> c_int;
    fn rename(from: *const c_char, to: *const c_char) -> c_int;
    fn renameat(fd1: c_int, from: *const c_char, fd2: c_int, to: *const c_char) -> c_int;
    fn renameat2(fd1: c_int, from: *const c_char, fd2: c_int, to: *const c_char, flags: c_uint) -> c_int;
    fn truncate(path: *const c_char, len: off_t) -> c_int;
    fn ftruncate(fd: c_int, len: off_t) -> c_int;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn opendir(path: *const c_char) -> *mut DIR;
    fn fdopendir(fd: c_int) -> *mut DIR;
    fn readdir(d: *mut DIR) -> *mut libc::dirent64;
    fn readdir64(d: *mut DIR) -> *mut libc::dirent64;
    fn closedir(d: *mut DIR) -> c_int;
    fn dirfd(d: *mut DIR) -> c_int;
    fn rewinddir(d: *mut DIR) -> ();
    fn telldir(d: *mut DIR) -> c_long;
    fn seekdir(d: *mut DIR, loc: c_long) -> ();
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char;
    fn __getcwd_chk(buf: *mut c_char, size: size_t, buflen: size_t) -> *mut c_char;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, new: c_int) -> c_int;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int;
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
    fn freopen(path: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE;
    fn fileno(f: *mut FILE) -> c_int;
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void;
    fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int;
    fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int;
    fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int;
    fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn copy_file_range(inp: c_int, oi: *mut off_t, out: c_int, oo: *mut off_t, n: size_t, flags: c_uint) -> ssize_t;
    fn symlink(target: *const c_char, path: *const c_char) -> c_int;
    fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int;
    fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t;
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t;
    fn chmod(path: *const c_char, mode: mode_t) -> c_int;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
    fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int;
    fn utimensat(dirfd: c_int, path: *const c_char, t: *const libc::timespec, flags: c_int) -> c_int;
    fn futimens(fd: c_int, t: *const libc::timespec) -> c_int;
    fn getxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn lgetxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn listxattr(path: *const c_char, list: *mut c_char, n: size_t) -> ssize_t;
    fn llistxattr(path: *const c_char, list: *mut c_char, n: size_t) -> ssize_t;
    fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int;
    fn lsetxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int;
    fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int;
    fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int;
    fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int;
    fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int;
    fn link(from: *const c_char, to: *const c_char) -> c_int;
    fn linkat(d1: c_int, from: *const c_char, d2: c_int, to: *const c_char, flags: c_int) -> c_int;
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int;
    fn __xmknodat(ver: c_int, dirfd: c_int, path: *const c_char, mode: mode_t, dev: *mut libc::dev_t) -> c_int;
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int;
    fn utimes(path: *const c_char, t: *const libc::timeval) -> c_int;
    fn lutimes(path: *const c_char, t: *const libc::timeval) -> c_int;
    fn futimes(fd: c_int, t: *const libc::timeval) -> c_int;
    fn futimesat(dirfd: c_int, path: *const c_char, t: *const libc::timeval) -> c_int;
    fn readdir64_r(d: *mut DIR, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int;
    fn scandir(path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: crate::more::Filter, compar: crate::more::Compar) -> c_int;
    fn scandirat(dirfd: c_int, path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: crate::more::Filter, compar: crate::more::Compar) -> c_int;
    fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn splice(inp: c_int, oi: *mut off_t, out: c_int, oo: *mut off_t, n: size_t, flags: c_uint) -> ssize_t;
    fn system(cmd: *const c_char) -> c_int;
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int;
}
