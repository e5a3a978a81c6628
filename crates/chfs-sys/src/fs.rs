//! File-system calls std has no safe form of: the type of the file system
//! holding a path (`statfs(2)`), and reserving a file's blocks
//! (`posix_fallocate(3)`).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn tempfile_in_tmp() -> File {
        let p = std::env::temp_dir().join(format!("chfs-sys-fs-{}", std::process::id()));
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
