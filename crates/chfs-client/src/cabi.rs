//! The rules every C adapter of the client (the C API `libchfs`, the
//! `LD_PRELOAD` layer) applies to a C caller's arguments and results, in
//! one place so that both answer alike: NULL pointers are `EFAULT`, a
//! string that is not UTF-8 is `EINVAL`, a `timespec`/`timeval` becomes a
//! [`TimeSet`] (`UTIME_NOW`, `UTIME_OMIT`, range checks), an id of -1 is
//! "unchanged", and [`StatFs`] becomes a `struct statvfs` or `statfs`.

use std::ffi::{c_char, c_void, CStr};

use crate::error::{Error, Result};
use crate::types::{StatFs, TimeSet};

/// A C string argument as `&str`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
pub unsafe fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::new(libc::EFAULT, format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|_| Error::new(libc::EINVAL, format!("{what} is not valid UTF-8")))
}

/// A caller's buffer of `n` bytes to read from (NULL only with `n` 0).
///
/// # Safety
/// `buf` is NULL or readable for `n` bytes during `'a`.
pub unsafe fn in_buf<'a>(buf: *const c_void, n: usize) -> Result<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(Error::new(libc::EFAULT, "buffer is NULL"));
    }
    let n = n.min(isize::MAX as usize);
    // SAFETY: non-NULL and readable for `n` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) })
}

/// A caller's buffer of `n` bytes to write into (NULL only with `n` 0).
///
/// # Safety
/// `buf` is NULL or writable for `n` bytes, and not otherwise accessed,
/// during `'a`.
pub unsafe fn out_buf<'a>(buf: *mut c_void, n: usize) -> Result<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(Error::new(libc::EFAULT, "buffer is NULL"));
    }
    let n = n.min(isize::MAX as usize);
    // SAFETY: non-NULL and writable for `n` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) })
}

/// Stores `v` in a caller's result struct (`what` names it).
///
/// # Safety
/// `out` is NULL or writable for one `T`.
pub unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::new(libc::EFAULT, format!("{what} pointer is NULL")));
    }
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

fn at(sec: i64, nsec: i64) -> Result<TimeSet> {
    sec.checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(nsec))
        .map(TimeSet::At)
        .ok_or_else(|| Error::new(libc::EINVAL, "time out of range"))
}

/// One `timespec` of `utimensat(2)`: `UTIME_NOW`, `UTIME_OMIT` or a time.
pub fn time_set(t: &libc::timespec) -> Result<TimeSet> {
    match t.tv_nsec {
        libc::UTIME_NOW => Ok(TimeSet::Now),
        libc::UTIME_OMIT => Ok(TimeSet::Omit),
        n if (0..1_000_000_000).contains(&n) => at(t.tv_sec, n),
        n => Err(Error::new(
            libc::EINVAL,
            format!("tv_nsec {n} out of range"),
        )),
    }
}

/// One `timeval` of `utimes(2)`.
pub fn timeval_set(t: &libc::timeval) -> Result<TimeSet> {
    if !(0..1_000_000).contains(&t.tv_usec) {
        return Err(Error::new(
            libc::EINVAL,
            format!("tv_usec {} out of range", t.tv_usec),
        ));
    }
    at(t.tv_sec, t.tv_usec * 1000)
}

/// `utimensat(2)`'s `times`: NULL sets both to now.
///
/// # Safety
/// `t` is NULL or points to two timespecs.
pub unsafe fn timespecs(t: *const libc::timespec) -> Result<(TimeSet, TimeSet)> {
    if t.is_null() {
        return Ok((TimeSet::Now, TimeSet::Now));
    }
    // SAFETY: two timespecs by the caller's contract.
    let t = unsafe { std::slice::from_raw_parts(t, 2) };
    Ok((time_set(&t[0])?, time_set(&t[1])?))
}

/// `utimes(2)`'s `times`: NULL sets both to now.
///
/// # Safety
/// `t` is NULL or points to two timevals.
pub unsafe fn timevals(t: *const libc::timeval) -> Result<(TimeSet, TimeSet)> {
    if t.is_null() {
        return Ok((TimeSet::Now, TimeSet::Now));
    }
    // SAFETY: two timevals by the caller's contract.
    let t = unsafe { std::slice::from_raw_parts(t, 2) };
    Ok((timeval_set(&t[0])?, timeval_set(&t[1])?))
}

/// A `chown(2)` id: -1 leaves it unchanged.
pub fn id(v: u32) -> Option<u32> {
    (v != u32::MAX).then_some(v)
}

/// `f_type` of `statfs(2)` for chfs-rs (`"chfs"`).
pub const FS_MAGIC: i64 = 0x6368_6673;

/// The fields `struct statvfs` and `struct statfs` share, from
/// [`StatFs::counts`].
macro_rules! fill_counts {
    ($v:ident, $s:expr) => {
        let (blocks, free, files, ffree) = $s.counts();
        $v.f_bsize = Self::BLOCK as _;
        $v.f_frsize = Self::BLOCK as _;
        $v.f_blocks = blocks as _;
        $v.f_bfree = free as _;
        $v.f_bavail = free as _;
        $v.f_files = files as _;
        $v.f_ffree = ffree as _;
    };
}

impl StatFs {
    /// Block size of [`StatFs::to_statvfs`] and [`StatFs::to_statfs`].
    pub const BLOCK: u64 = 4096;

    /// Blocks, free blocks, entries (stored and possible) and free
    /// entries, as every C view reports them (the mount's too): an entry
    /// may be had for every free block, so `df -i` is never full while
    /// space is left.
    pub fn counts(&self) -> (u64, u64, u64, u64) {
        let free = self.free / Self::BLOCK;
        (self.total / Self::BLOCK, free, self.entries + free, free)
    }

    /// As a C `struct statvfs`.
    pub fn to_statvfs(&self) -> libc::statvfs {
        // SAFETY: `struct statvfs` is plain old data; all-zero is valid.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        fill_counts!(v, self);
        v.f_favail = v.f_ffree;
        v.f_namemax = chfs_proto::path::MAX_NAME as _;
        v
    }

    /// As a C `struct statfs` (`f_type` [`FS_MAGIC`]).
    pub fn to_statfs(&self) -> libc::statfs {
        // SAFETY: `struct statfs` is plain old data; all-zero is valid.
        let mut v: libc::statfs = unsafe { std::mem::zeroed() };
        fill_counts!(v, self);
        v.f_type = FS_MAGIC as _;
        v.f_namelen = chfs_proto::path::MAX_NAME as _;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_from_c() {
        let ts = |s, n| libc::timespec {
            tv_sec: s,
            tv_nsec: n,
        };
        assert_eq!(time_set(&ts(-2, 5)).unwrap(), TimeSet::At(-1_999_999_995));
        assert_eq!(time_set(&ts(0, libc::UTIME_NOW)).unwrap(), TimeSet::Now);
        assert_eq!(time_set(&ts(0, libc::UTIME_OMIT)).unwrap(), TimeSet::Omit);
        assert_eq!(
            time_set(&ts(0, 1_000_000_000)).unwrap_err().errno(),
            libc::EINVAL
        );
        assert_eq!(
            time_set(&ts(i64::MAX, 0)).unwrap_err().errno(),
            libc::EINVAL
        );
        let tv = |s, u| libc::timeval {
            tv_sec: s,
            tv_usec: u,
        };
        assert_eq!(timeval_set(&tv(3, 7)).unwrap(), TimeSet::At(3_000_007_000));
        assert_eq!(timeval_set(&tv(3, -1)).unwrap_err().errno(), libc::EINVAL);
        // SAFETY: NULL is allowed.
        let both = unsafe { timevals(std::ptr::null()) }.unwrap();
        assert_eq!(both, (TimeSet::Now, TimeSet::Now));
        assert_eq!(id(u32::MAX), None);
        assert_eq!(id(0), Some(0));
    }

    #[test]
    fn null_arguments_are_efault() {
        // SAFETY: NULL pointers, which the functions check.
        unsafe {
            assert_eq!(
                cstr(std::ptr::null(), "path").unwrap_err().errno(),
                libc::EFAULT
            );
            assert_eq!(
                in_buf(std::ptr::null(), 1).unwrap_err().errno(),
                libc::EFAULT
            );
            assert!(in_buf(std::ptr::null(), 0).unwrap().is_empty());
            assert_eq!(
                out_buf(std::ptr::null_mut(), 1).unwrap_err().errno(),
                libc::EFAULT
            );
            let e = put(std::ptr::null_mut::<u8>(), 1, "x").unwrap_err();
            assert_eq!(e.errno(), libc::EFAULT);
            assert_eq!(
                cstr(c"\xff".as_ptr(), "path").unwrap_err().errno(),
                libc::EINVAL
            );
        }
    }

    #[test]
    fn capacity_in_c_views() {
        let fs = StatFs {
            total: 10 << 20,
            used: 2 << 20,
            free: 8 << 20,
            entries: 100,
            servers: 2,
            ..Default::default()
        };
        let v = fs.to_statvfs();
        assert_eq!(
            (v.f_bsize, v.f_blocks, v.f_bfree, v.f_bavail),
            (4096, 2560, 2048, 2048)
        );
        assert_eq!((v.f_files, v.f_ffree, v.f_namemax), (2148, 2048, 255));
        let s = fs.to_statfs();
        assert_eq!((s.f_type, s.f_blocks, s.f_bavail), (FS_MAGIC, 2560, 2048));
        assert_eq!((s.f_files, s.f_ffree, s.f_namelen), (2148, 2048, 255));
    }
}
