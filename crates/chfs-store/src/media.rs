//! The byte-addressable medium under the persistent-memory engine: a
//! memory-mapped file or device, or (in tests) a fault-injecting model.
//!
//! Persistence points: [`Media::persist`] makes a range durable and orders
//! it before later stores. On a DAX mapping (`MAP_SYNC` accepted) that is a
//! cache-line flush of every line plus a store fence; on a file of a block
//! file system it is `msync(MS_SYNC)` of the range; on tmpfs/ramfs (which do
//! not outlive the machine anyway) it is nothing, and only the program order
//! of stores matters (a killed process loses no completed store).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::crc::crc32c_append;

/// How a mapping reaches persistence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMode {
    /// Persistent memory mapped with `MAP_SYNC`: cache-line flush + fence.
    Dax,
    /// A file on a block file system: `msync` of the range.
    Msync,
    /// Volatile memory (tmpfs, ramfs): stores are all there is.
    Volatile,
}

impl PersistMode {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            PersistMode::Dax => "dax (clflush+sfence)",
            PersistMode::Msync => "msync",
            PersistMode::Volatile => "volatile (tmpfs)",
        }
    }
}

/// A byte-addressable medium. Offsets are absolute. Callers guarantee that
/// no two threads access overlapping ranges at the same time where one of
/// them writes (the engine's locks and allocator ensure it).
pub(crate) trait Media: Send + Sync + 'static {
    /// Length in bytes.
    fn len(&self) -> u64;
    /// Copies bytes out.
    fn read(&self, off: u64, buf: &mut [u8]);
    /// Copies bytes in.
    fn write(&self, off: u64, data: &[u8]);
    /// Zero-fills a range.
    fn zero(&self, off: u64, len: u64);
    /// Copies `len` bytes from `src` to a disjoint `dst`.
    fn copy(&self, src: u64, dst: u64, len: u64);
    /// Continues a CRC-32C over a range.
    fn crc(&self, off: u64, len: u64, init: u32) -> u32;
    /// Loads an aligned 8-byte word atomically.
    fn load_word(&self, off: u64) -> u64;
    /// Stores an aligned 8-byte word atomically (failure-atomic on PMEM).
    fn store_word(&self, off: u64, v: u64);
    /// Makes a range durable before anything stored later.
    fn persist(&self, off: u64, len: u64) -> io::Result<()>;
    /// Makes everything stored so far durable.
    fn sync(&self) -> io::Result<()>;
    /// How this medium persists.
    fn mode(&self) -> PersistMode;
    /// Hints that `[off, off+len)` is about to be written (no effect on
    /// contents; ranges beyond the medium are ignored).
    fn prefetch(&self, _off: u64, _len: u64) {}
}

/// `MAP_SYNC` (linux/mman.h); not exported by every libc version.
const MAP_SYNC: libc::c_int = 0x80000;
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// A shared memory mapping of a file or DAX device.
pub(crate) struct MmapMedia {
    ptr: *mut u8,
    len: u64,
    mode: PersistMode,
    _file: File,
}

// SAFETY: the mapping is plain memory shared by all threads; concurrent
// access discipline is the caller's contract documented on `Media`.
unsafe impl Send for MmapMedia {}
// SAFETY: as above.
unsafe impl Sync for MmapMedia {}

impl MmapMedia {
    /// Maps `len` bytes of `file` (writable unless `readonly`).
    pub fn map(file: File, path: &Path, len: u64, readonly: bool) -> io::Result<Self> {
        if len == 0 || len > isize::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mapping length out of range",
            ));
        }
        let prot = if readonly {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        let fd = file.as_raw_fd();
        let mut mode = PersistMode::Dax;
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a file
        // we hold open; the result is checked against MAP_FAILED.
        let mut p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot,
                libc::MAP_SHARED_VALIDATE | MAP_SYNC,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            use std::os::unix::fs::FileTypeExt;
            let devdax = file.metadata()?.file_type().is_char_device();
            // A devdax character device is persistent memory even without
            // MAP_SYNC (its mappings are always synchronous); its statfs
            // reports devtmpfs, which must not be taken for tmpfs.
            mode = if devdax {
                PersistMode::Dax
            } else if on_volatile_fs(path) {
                PersistMode::Volatile
            } else {
                PersistMode::Msync
            };
            // SAFETY: as above, without MAP_SYNC.
            p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    prot,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self {
            ptr: p.cast(),
            len,
            mode,
            _file: file,
        })
    }

    fn at(&self, off: u64, len: u64) -> *mut u8 {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "media access {off}+{len} beyond {}",
            self.len
        );
        // SAFETY: off + len <= self.len (asserted), so the pointer stays
        // within the mapping.
        unsafe { self.ptr.add(off as usize) }
    }

    /// The bytes of a range (for read-only inspection).
    fn slice(&self, off: u64, len: u64) -> &[u8] {
        let p = self.at(off, len);
        // SAFETY: the range lies within the live mapping (checked by `at`);
        // callers do not write it concurrently (Media contract).
        unsafe { std::slice::from_raw_parts(p, len as usize) }
    }
}

fn on_volatile_fs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs only writes into `st`, a zeroed plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is valid for writes.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

impl Drop for MmapMedia {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe the mapping created in `map`, unmapped
        // exactly once here; no references into it outlive `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len as usize);
        }
    }
}

impl Media for MmapMedia {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        let p = self.at(off, buf.len() as u64);
        // SAFETY: source range within the mapping (checked by `at`),
        // destination is a distinct Rust buffer of the same length.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) }
    }

    fn write(&self, off: u64, data: &[u8]) {
        let p = self.at(off, data.len() as u64);
        // SAFETY: destination range within the mapping (checked by `at`);
        // the caller holds the only access to it (Media contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
    }

    fn zero(&self, off: u64, len: u64) {
        let p = self.at(off, len);
        // SAFETY: range within the mapping, exclusively ours (as in write).
        unsafe { std::ptr::write_bytes(p, 0, len as usize) }
    }

    fn copy(&self, src: u64, dst: u64, len: u64) {
        let s = self.at(src, len);
        let d = self.at(dst, len);
        assert!(src + len <= dst || dst + len <= src, "overlapping copy");
        // SAFETY: both ranges lie within the mapping and do not overlap
        // (asserted); dst is exclusively ours (Media contract).
        unsafe { std::ptr::copy_nonoverlapping(s, d, len as usize) }
    }

    fn crc(&self, off: u64, len: u64, init: u32) -> u32 {
        crc32c_append(init, self.slice(off, len))
    }

    fn load_word(&self, off: u64) -> u64 {
        assert_eq!(off % 8, 0, "unaligned word");
        let p = self.at(off, 8);
        // SAFETY: p is 8-byte aligned (mapping is page aligned, off % 8 == 0)
        // and within the mapping; AtomicU64 has the layout of u64.
        unsafe { (*(p as *const AtomicU64)).load(Ordering::Acquire) }
    }

    fn prefetch(&self, off: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let end = off.saturating_add(len).min(self.len);
            let mut o = off;
            while o < end {
                // SAFETY: o < self.len, so the address lies within the
                // mapping; a prefetch never faults and changes no memory.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
                    _mm_prefetch::<_MM_HINT_ET0>(self.ptr.add(o as usize) as *const i8);
                }
                o += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, len);
    }

    fn store_word(&self, off: u64, v: u64) {
        assert_eq!(off % 8, 0, "unaligned word");
        let p = self.at(off, 8);
        // SAFETY: as in load_word.
        unsafe { (*(p as *const AtomicU64)).store(v, Ordering::Release) }
    }

    fn persist(&self, off: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match self.mode {
            PersistMode::Volatile => Ok(()),
            PersistMode::Dax => {
                flush_lines(self.at(off, len), len);
                Ok(())
            }
            PersistMode::Msync => {
                let page = 4096u64;
                let start = off / page * page;
                let end = (off + len).min(self.len);
                let p = self.at(start, end - start);
                // SAFETY: page-aligned range inside our mapping.
                let rc = unsafe { libc::msync(p.cast(), (end - start) as usize, libc::MS_SYNC) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    fn sync(&self) -> io::Result<()> {
        match self.mode {
            PersistMode::Dax => {
                fence();
                Ok(())
            }
            PersistMode::Volatile | PersistMode::Msync => {
                // SAFETY: the whole mapping created in `map`.
                let rc = unsafe { libc::msync(self.ptr.cast(), self.len as usize, libc::MS_SYNC) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    fn mode(&self) -> PersistMode {
        self.mode
    }
}

#[cfg(target_arch = "x86_64")]
fn flush_lines(p: *mut u8, len: u64) {
    use std::arch::x86_64::_mm_clflush;
    let start = p as usize & !63;
    let end = p as usize + len as usize;
    let mut a = start;
    while a < end {
        // SAFETY: every line flushed overlaps the mapped range [p, p+len).
        unsafe { _mm_clflush(a as *const u8) };
        a += 64;
    }
    fence();
}

#[cfg(not(target_arch = "x86_64"))]
fn flush_lines(_p: *mut u8, _len: u64) {
    fence();
}

fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no memory operands; SSE is baseline on x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}
