//! chfs-rs OS wrappers: the one place for unsafe calls into the kernel,
//! behind safe functions.
//!
//! - [`hostname`]: this host's name.
//! - [`cpu`]: pinning the calling thread to a CPU, the CPU it runs on.
//! - [`memfd`]: memory files (`memfd_create`) and their seals.
//! - [`Mapping`]: shared (and private anonymous) memory mappings, through
//!   `memmap2` where its options suffice, raw `mmap` only for flags it
//!   lacks (`MAP_SYNC`).
//! - [`poll`]: readiness without blocking, the process's epoll
//!   instances, its CPU time.
//! - [`fs`]: the type of a path's file system, reserving a file's blocks.
//! - [`heap`]: the C heap's free memory, and giving it back.
//! - [`lock`]: poison-tolerant locking of a `Mutex`.
//! - [`coarse_realtime_ns`]: the clock file systems stamp times with.
//!
//! The crate sits below every other one (it depends on libc and memmap2
//! only), so the wire protocol crate stays free of I/O and each layer can
//! use it without breaking the one-way layering. Linux only, as the rest
//! of chfs-rs.

pub mod cpu;
pub mod fs;
pub mod heap;
pub mod map;
pub mod memfd;
pub mod poll;

use std::io;
use std::sync::{Mutex, MutexGuard};

pub use map::Mapping;

/// Locks `m`, taking the data over from a thread that panicked while
/// holding it: chfs-rs never leaves shared state half-changed across a
/// panic point that matters, and one panicking request must not take the
/// process's other users of the lock down with it.
#[inline]
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The wall-clock time in ns since the epoch as the kernel's coarse clock
/// has it (`CLOCK_REALTIME_COARSE`): what local file systems (tmpfs, ext4,
/// ...) stamp modification times with. It lags the precise clock by up to
/// a scheduler tick, so a file modified just after a precise reading can
/// carry an earlier time; compare such times with this clock.
pub fn coarse_realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live timespec above; the coarse
    // realtime clock exists on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// This host's name (`gethostname(2)`), truncated to 255 bytes; bytes
/// that are not UTF-8 are replaced.
pub fn hostname() -> io::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates
    // within that length or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hostname_is_the_kernels() {
        let name = hostname().unwrap();
        assert!(!name.is_empty());
        assert!(!name.contains('\0'));
        let uts = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(name, uts.trim_end_matches('\n'));
    }

    /// What a file system stamps a file made after a coarse reading with
    /// is never earlier than the reading.
    #[test]
    fn files_made_after_a_coarse_reading_are_not_older() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::path::Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let f = dir.join(format!("chfs-sys-clock-{}", std::process::id()));
        for _ in 0..200 {
            let t = coarse_realtime_ns();
            std::fs::write(&f, b"x").unwrap();
            let m = std::fs::metadata(&f).unwrap();
            let mtime = m.mtime() * 1_000_000_000 + m.mtime_nsec();
            assert!(mtime >= t, "mtime {mtime} before the coarse reading {t}");
        }
        std::fs::remove_file(&f).unwrap();
    }

    #[test]
    fn a_poisoned_lock_is_taken_over() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(r.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
        *lock(&m) = 3;
        assert_eq!(*lock(&m), 3);
    }
}
