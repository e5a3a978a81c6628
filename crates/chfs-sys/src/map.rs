//! Memory mappings, unmapped on drop.
//!
//! Made with `memmap2` where its options suffice (shared read-only or
//! read-write file mappings, `MAP_POPULATE`, private anonymous memory);
//! raw `mmap(2)` only for what it lacks (`MAP_SYNC`,
//! [`Mapping::shared_sync`], and `msync(2)` of such a mapping).
//!
//! A [`Mapping`] hands out a raw pointer, never a Rust reference to the
//! bytes: the memory is shared with other processes or the kernel, which
//! may write it at any moment, so reading or writing it is the caller's
//! (unsafe) business. The exception is [`Mapping::atomic_u32`], a word the
//! other side also accesses atomically (io_uring's ring heads and tails).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::AtomicU32;

use memmap2::{MmapOptions, MmapRaw};

/// `MAP_SYNC` (linux/mman.h); not exported by every libc version.
const MAP_SYNC: libc::c_int = 0x80000;

/// A memory mapping: `len` bytes at `ptr`.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    owner: Owner,
}

/// Who unmaps the mapping.
enum Owner {
    /// memmap2, when `map` drops.
    Memmap { map: MmapRaw },
    /// [`Mapping`]'s Drop (made here with flags memmap2 lacks).
    Raw,
}

// SAFETY: the mapping is plain memory owned by this value, unmapped once
// in Drop; it hands out raw pointers only (whose users coordinate their
// own accesses) and atomics, so any thread may own or share it.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` gives nothing but the address, the length
// and atomic words.
unsafe impl Sync for Mapping {}

fn einval_if_empty(len: usize) -> io::Result<()> {
    // mmap(2) refuses an empty mapping; memmap2 would map a byte instead.
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(())
}

impl Mapping {
    fn memmap(map: MmapRaw, writable: bool) -> Mapping {
        Mapping {
            ptr: map.as_mut_ptr(),
            len: map.len(),
            writable,
            owner: Owner::Memmap { map },
        }
    }

    /// The first `len` bytes of file `fd`, shared (`MAP_SHARED`) and
    /// read-only. Reading past the file's end faults (SIGBUS): callers map
    /// files that cannot shrink (a memory file sealed with
    /// `F_SEAL_SHRINK`).
    pub fn shared_read_only(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        einval_if_empty(len)?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw_read_only(fd.as_fd().as_raw_fd())?;
        Ok(Mapping::memmap(map, false))
    }

    /// The first `len` bytes of file `fd`, shared (`MAP_SHARED`) and
    /// read-write; the same caveat about the file's end.
    pub fn shared_read_write(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        einval_if_empty(len)?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(fd.as_fd().as_raw_fd())?;
        Ok(Mapping::memmap(map, true))
    }

    /// `len` bytes of `fd` from `offset` (a multiple of the page size),
    /// shared, read-write and populated up front (`MAP_POPULATE`): the
    /// rings of an io_uring, say.
    pub fn shared_populated(fd: impl AsFd, len: usize, offset: u64) -> io::Result<Mapping> {
        einval_if_empty(len)?;
        let map = MmapOptions::new()
            .len(len)
            .offset(offset)
            .populate()
            .map_raw(fd.as_fd().as_raw_fd())?;
        Ok(Mapping::memmap(map, true))
    }

    /// `len` bytes of private zeroed memory (`MAP_PRIVATE |
    /// MAP_ANONYMOUS`), read-write; pages are allocated as first written.
    pub fn private_anonymous(len: usize) -> io::Result<Mapping> {
        einval_if_empty(len)?;
        let map = MmapOptions::new().len(len).map_anon()?;
        Ok(Mapping::memmap(MmapRaw::from(map), true))
    }

    /// The first `len` bytes of file `fd`, shared and synchronous
    /// (`MAP_SHARED_VALIDATE | MAP_SYNC`: stores reach persistent memory
    /// without msync, on a DAX file system), writable when `writable`.
    /// EOPNOTSUPP where the file system cannot (anything but DAX).
    pub fn shared_sync(fd: impl AsFd, len: usize, writable: bool) -> io::Result<Mapping> {
        einval_if_empty(len)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: memmap2 has no MAP_SYNC, hence the raw call: a fresh
        // mapping at an address the kernel picks (NULL hint), of a file the
        // caller holds open, so no existing memory is touched; the result
        // is checked against MAP_FAILED and unmapped once, in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED_VALIDATE | MAP_SYNC,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: p.cast(),
            len,
            writable,
            owner: Owner::Raw,
        })
    }

    /// Writes the pages of a shared file mapping holding bytes
    /// `[off, off+len)` back to the file and waits for them
    /// (`msync(MS_SYNC)`: durable once it returns). InvalidInput when the
    /// range is not within the mapping.
    pub fn flush(&self, off: usize, len: usize) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        match &self.owner {
            Owner::Memmap { map } => map.flush_range(off, len),
            Owner::Raw => {
                if len == 0 {
                    return Ok(());
                }
                // Mappings start on a page boundary: round the start down.
                let start = off / page_size() * page_size();
                // SAFETY: [start, off+len) lies within the mapping made in
                // `shared_sync` (checked above; start only moves down to
                // the page boundary, at or after the mapping's start);
                // msync reads no Rust memory.
                let rc = unsafe {
                    libc::msync(self.ptr.add(start).cast(), off + len - start, libc::MS_SYNC)
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    /// Start of the mapping: valid for [`Mapping::len`] bytes while this
    /// value lives (writable only if mapped so).
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: empty mappings are refused.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 4-byte-aligned word at byte `off` of a writable mapping, as an
    /// atomic: for words another party (the kernel, another process)
    /// accesses atomically too. Panics when out of bounds, misaligned or
    /// read-only.
    #[inline]
    pub fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(
            self.writable
                && off.checked_add(4).is_some_and(|e| e <= self.len)
                && off.is_multiple_of(4),
            "atomic word {off} of a {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds and 4-aligned (checked; mappings are page
        // aligned), writable, and live as long as the borrow of self; the
        // memory is only ever accessed atomically through this type.
        unsafe { &*self.ptr.add(off).cast::<AtomicU32>() }
    }
}

/// The page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a system constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Owner::Raw = self.owner {
            // SAFETY: unmaps exactly the mapping made in `shared_sync`,
            // once; nothing borrowed from it outlives `self`.
            unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            }
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::memfd;

    fn page() -> usize {
        page_size()
    }

    fn memory_file(len: usize) -> std::fs::File {
        let f = memfd::create(c"map-test", memfd::MFD_CLOEXEC).unwrap();
        f.set_len(len as u64).unwrap();
        f
    }

    #[test]
    fn a_populated_mapping_at_an_offset_sees_that_part_of_the_file() {
        let pg = page();
        let f = memory_file(3 * pg);
        let whole = Mapping::shared_read_write(&f, 3 * pg).unwrap();
        for i in 0..3 * pg {
            // SAFETY: in bounds of the live mapping; no other user.
            unsafe { whole.as_ptr().add(i).write((i / pg) as u8 + 1) };
        }
        let second = Mapping::shared_populated(&f, pg, pg as u64).unwrap();
        assert_eq!(second.len(), pg);
        // SAFETY: in bounds of the live mappings.
        unsafe {
            assert_eq!(second.as_ptr().read(), 2);
            assert_eq!(second.as_ptr().add(pg - 1).read(), 2);
            second.as_ptr().write(9);
            assert_eq!(whole.as_ptr().add(pg).read(), 9);
        }
        // Shared: atomics stored through one are seen through the other.
        second.atomic_u32(8).store(0xdead_beef, Ordering::Release);
        assert_eq!(
            whole.atomic_u32(pg + 8).load(Ordering::Acquire),
            0xdead_beef
        );
    }

    #[test]
    fn anonymous_memory_is_private_and_zeroed() {
        let a = Mapping::private_anonymous(1 << 20).unwrap();
        let b = Mapping::private_anonymous(1 << 20).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert!(!a.is_empty());
        // SAFETY: in bounds of the live mappings.
        unsafe {
            assert_eq!(a.as_ptr().add(12345).read(), 0);
            a.as_ptr().add(12345).write(7);
            assert_eq!(a.as_ptr().add(12345).read(), 7);
            assert_eq!(b.as_ptr().add(12345).read(), 0);
        }
        assert_eq!(a.atomic_u32(4).fetch_add(1, Ordering::Relaxed), 0);
        assert_eq!(a.atomic_u32(4).load(Ordering::Relaxed), 1);
    }

    #[test]
    fn errors_are_the_kernels() {
        let f = memory_file(4096);
        for r in [
            Mapping::shared_read_only(&f, 0),
            Mapping::shared_read_write(&f, 0),
            Mapping::shared_populated(&f, 0, 0),
            Mapping::private_anonymous(0),
            Mapping::shared_sync(&f, 0, true),
        ] {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EINVAL));
        }
        // A read-write mapping of a file opened read-only.
        let ro = std::fs::File::open("/proc/self/exe").unwrap();
        let e = Mapping::shared_read_write(&ro, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert!(Mapping::shared_read_only(&ro, 4096).is_ok());
        // MAP_SYNC needs DAX: not a memory file.
        let e = Mapping::shared_sync(&f, 4096, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
    }

    #[test]
    fn flush_writes_a_range_back_and_checks_bounds() {
        let dir = std::env::temp_dir().join(format!("chfs-sys-flush-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dir)
            .unwrap();
        std::fs::remove_file(&dir).unwrap();
        f.set_len(3 * 4096).unwrap();
        let m = Mapping::shared_read_write(&f, 3 * 4096).unwrap();
        // SAFETY: in bounds of the live mapping; no other user.
        unsafe { m.as_ptr().add(5000).write(42) };
        m.flush(5000, 1).unwrap();
        m.flush(0, 3 * 4096).unwrap();
        m.flush(3 * 4096, 0).unwrap();
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 5000).unwrap();
        assert_eq!(b[0], 42);
        for (off, len) in [(0, 3 * 4096 + 1), (3 * 4096, 1), (usize::MAX, 2)] {
            let e = m.flush(off, len).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    #[should_panic(expected = "atomic word")]
    fn atomics_of_a_read_only_mapping_are_refused() {
        let f = memory_file(4096);
        let m = Mapping::shared_read_only(&f, 4096).unwrap();
        m.atomic_u32(0);
    }

    #[test]
    #[should_panic(expected = "atomic word")]
    fn atomics_beyond_the_end_are_refused() {
        let m = Mapping::private_anonymous(4096).unwrap();
        m.atomic_u32(4096);
    }
}
