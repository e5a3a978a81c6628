//! Memory files (`memfd_create(2)`) and their seals (`fcntl(2)`
//! `F_ADD_SEALS`/`F_GET_SEALS`).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};

pub use libc::{
    F_SEAL_FUTURE_WRITE, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE, MFD_ALLOW_SEALING,
    MFD_CLOEXEC, MFD_HUGETLB,
};

/// A new memory file named `name` (shown in /proc/PID/fd), empty, with
/// `flags` (`MFD_*`); size it with [`File::set_len`].
pub fn create(name: &CStr, flags: libc::c_uint) -> io::Result<File> {
    // SAFETY: a NUL-terminated name; the call creates a descriptor.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(raw) })
}

/// Adds `seals` (`F_SEAL_*`) to memory file `fd`.
pub fn add_seals(fd: impl AsFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: a descriptor call on a descriptor the caller holds; no memory.
    if unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The seals of `fd` (`F_SEAL_*`); EINVAL when it is not a file that
/// takes seals (a memory file, say).
pub fn seals(fd: impl AsFd) -> io::Result<libc::c_int> {
    // SAFETY: a descriptor call on a descriptor the caller holds; no memory.
    let s = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_GET_SEALS) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// Is `fd` a file of a tmpfs (plain shared memory, a memfd among them, and
/// not hugetlbfs, whose holes may have no page to give)? False also when
/// `fstatfs(2)` fails.
pub fn on_tmpfs(fd: impl AsFd) -> bool {
    // SAFETY: fstatfs fills the zeroed plain C struct it is given.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::fstatfs(fd.as_fd().as_raw_fd(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mapping;

    #[test]
    fn a_sealed_memory_file_keeps_its_size_and_maps() {
        let f = create(c"chfs-sys-test", MFD_CLOEXEC | MFD_ALLOW_SEALING).unwrap();
        assert!(on_tmpfs(&f));
        assert_eq!(seals(&f).unwrap(), 0);
        f.set_len(1 << 16).unwrap();
        add_seals(&f, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL).unwrap();
        assert_eq!(
            seals(&f).unwrap(),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL
        );
        // Neither shrinks nor grows, nor takes more seals.
        assert_eq!(
            f.set_len(4096).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert_eq!(
            f.set_len(1 << 20).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        let e = add_seals(&f, F_SEAL_WRITE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));

        // What one mapping writes, another reads (both shared).
        let rw = Mapping::shared_read_write(&f, 1 << 16).unwrap();
        let ro = Mapping::shared_read_only(&f, 1 << 16).unwrap();
        assert_eq!(rw.len(), 1 << 16);
        assert_ne!(rw.as_ptr(), ro.as_ptr());
        // SAFETY: both in bounds of their live mappings, nobody else
        // touches them.
        unsafe {
            rw.as_ptr().add(5000).write(0xa5);
            assert_eq!(ro.as_ptr().add(5000).read(), 0xa5);
            assert_eq!(ro.as_ptr().add(5001).read(), 0);
        }
    }

    #[test]
    fn seals_of_a_file_that_takes_none_are_einval() {
        let dir = std::env::temp_dir();
        let f = File::open(dir).unwrap();
        assert_eq!(seals(&f).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        let unsealable = create(c"plain", MFD_CLOEXEC).unwrap();
        // Without MFD_ALLOW_SEALING a memory file is born sealed.
        assert_eq!(seals(&unsealable).unwrap(), F_SEAL_SEAL);
        let e = add_seals(&unsealable, F_SEAL_SHRINK).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn an_unknown_flag_is_einval() {
        let e = create(c"x", 0x8000_0000).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
