//! File-system calls std has no safe form of: the type of the file system
//! holding a path (`statfs(2)`), reserving a file's blocks
//! (`posix_fallocate(3)`), and reading into memory that is not a slice
//! (`pread(2)`).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `f_type` of tmpfs (linux/magic.h).
pub const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `f_type` of ramfs (linux/magic.h).
pub const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// The magic number of the file system holding `path` (`statfs(2)`
/// `f_type`: [`TMPFS_MAGIC`], ...).
pub fn fs_type(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statfs is a plain C struct for which all zeros is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is valid for writes.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Is `path` on a file system in memory only (tmpfs, ramfs)? False when
/// it cannot be told.
pub fn in_memory(path: &Path) -> bool {
    matches!(fs_type(path), Ok(TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Reserves the blocks of bytes `[0, len)` of `f`, growing it to `len`
/// if shorter (`posix_fallocate(3)`): later writes into the range cannot
/// fail for lack of space. Errors are the call's (EOPNOTSUPP where the file
/// system cannot).
pub fn allocate(f: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: a descriptor call on a file the caller holds open; no memory.
    match unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Reads `len` bytes at `off` of `fd` to `buf` with `pread(2)`, going on
/// after short reads and EINTR; `UnexpectedEof` when the file ends first
/// (some bytes may have been written then).
///
/// # Safety
/// `buf` is valid for writes of `len` bytes, and nothing in this process
/// reads or writes them during the call.
pub unsafe fn pread_exact(
    fd: BorrowedFd<'_>,
    buf: *mut u8,
    len: usize,
    off: u64,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let at = off
            .checked_add(done as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `buf + done .. buf + len` is valid for writes and ours
        // (the caller's contract); `fd` is open for the call (borrowed).
        let n = unsafe { libc::pread(fd.as_raw_fd(), buf.add(done).cast(), len - done, at) };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pread_exact_reads_all_or_says_eof() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let mut f = tempfile_in_tmp();
        f.write_all(b"0123456789").unwrap();
        let mut b = [0u8; 4];
        // SAFETY: `b` is ours, 4 bytes.
        unsafe { pread_exact(f.as_fd(), b.as_mut_ptr(), 4, 3) }.unwrap();
        assert_eq!(&b, b"3456");
        // SAFETY: as above.
        let e = unsafe { pread_exact(f.as_fd(), b.as_mut_ptr(), 4, 8) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(&b[..2], b"89");
    }

    #[test]
    fn types_and_allocation() {
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(fs_type(Path::new("/dev/shm")).unwrap(), TMPFS_MAGIC);
            assert!(in_memory(Path::new("/dev/shm")));
        }
        assert!(!in_memory(Path::new("/proc")));
        assert!(!in_memory(Path::new("/no/such/path")));
        assert_eq!(
            fs_type(Path::new("/no/such/path")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let f = tempfile_in_tmp();
        allocate(&f, 10_000).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 10_000);
    }

    /// An unlinked file of its own (each call: tests run at once).
    fn tempfile_in_tmp() -> File {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("chfs-sys-fs-{}-{n}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }
}
