//! The byte-addressable medium under the persistent-memory engine: a
//! memory-mapped file or device, or (in tests) a fault-injecting model.
//!
//! Persistence points: [`Media::persist`] makes a range durable and orders
//! it before later stores. On a DAX mapping (`MAP_SYNC` accepted) that is a
//! cache-line flush of every line plus a store fence; on a file of a block
//! file system it is `msync(MS_SYNC)` of the range; on tmpfs/ramfs (which do
//! not outlive the machine anyway) it is nothing, and only the program order
//! of stores matters (a killed process loses no completed store).
//!
//! The OS calls (mapping, `msync`, `statfs`) are chfs-sys's
//! ([`chfs_sys::Mapping`], [`chfs_sys::fs`]); what stays unsafe here is
//! access to the mapped bytes and the CPU's flush and fence instructions.

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use chfs_sys::Mapping;

use crate::crc::crc32c_append;
use crate::index::{Dst, Fill};

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
    /// `len` bytes at `off`, in a new buffer.
    fn read_vec(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v);
        v
    }
    /// Copies `n` bytes at `off` to the start of `dst` (by default
    /// through a buffer).
    fn read_into(&self, off: u64, n: usize, dst: &mut Dst<'_>) {
        dst.put(0, &self.read_vec(off, n));
    }
    /// Copies bytes in.
    fn write(&self, off: u64, data: &[u8]);
    /// Writes the bytes `f` fetches at `off` (by default fetched into a
    /// buffer, then written). A fetch that fails may have written some.
    fn fill(&self, off: u64, f: Fill<'_>) -> crate::Result<()> {
        let b = f.fetch()?;
        self.write(off, &b);
        Ok(())
    }
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

/// A shared memory mapping of a file or DAX device
/// ([`chfs_sys::Mapping`]).
pub(crate) struct MmapMedia {
    map: Mapping,
    len: u64,
    mode: PersistMode,
    _file: File,
}

impl MmapMedia {
    /// Maps `len` bytes of `file` (writable unless `readonly`).
    pub fn map(file: File, path: &Path, len: u64, readonly: bool) -> io::Result<Self> {
        if len == 0 || len > isize::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mapping length out of range",
            ));
        }
        let (map, mode) = match Mapping::shared_sync(&file, len as usize, !readonly) {
            Ok(m) => (m, PersistMode::Dax),
            Err(_) => {
                use std::os::unix::fs::FileTypeExt;
                let devdax = file.metadata()?.file_type().is_char_device();
                // A devdax character device is persistent memory even
                // without MAP_SYNC (its mappings are always synchronous);
                // its statfs reports devtmpfs, which must not be taken for
                // tmpfs.
                let mode = if devdax {
                    PersistMode::Dax
                } else if chfs_sys::fs::in_memory(path) {
                    PersistMode::Volatile
                } else {
                    PersistMode::Msync
                };
                let map = if readonly {
                    Mapping::shared_read_only(&file, len as usize)?
                } else {
                    Mapping::shared_read_write(&file, len as usize)?
                };
                (map, mode)
            }
        };
        Ok(Self {
            map,
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
        unsafe { self.map.as_ptr().add(off as usize) }
    }

    /// The bytes of a range (for read-only inspection).
    fn slice(&self, off: u64, len: u64) -> &[u8] {
        let p = self.at(off, len);
        // SAFETY: the range lies within the live mapping (checked by `at`);
        // callers do not write it concurrently (Media contract).
        unsafe { std::slice::from_raw_parts(p, len as usize) }
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

    /// Copied into a buffer not zeroed first.
    fn read_vec(&self, off: u64, len: usize) -> Vec<u8> {
        let p = self.at(off, len as u64);
        let mut v = Vec::with_capacity(len);
        // SAFETY: source range within the mapping (checked by `at`); the
        // destination is the new buffer's `len` bytes of capacity, which
        // the copy initializes before the length covers them.
        unsafe {
            std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), len);
            v.set_len(len);
        }
        v
    }

    /// Copied straight from the mapping.
    fn read_into(&self, off: u64, n: usize, dst: &mut Dst<'_>) {
        dst.put(0, self.slice(off, n as u64));
    }

    fn write(&self, off: u64, data: &[u8]) {
        let p = self.at(off, data.len() as u64);
        // SAFETY: destination range within the mapping (checked by `at`);
        // the caller holds the only access to it (Media contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
    }

    /// Fetches straight into the mapping.
    fn fill(&self, off: u64, f: Fill<'_>) -> crate::Result<()> {
        let len = f.len();
        let p = self.at(off, len as u64);
        // SAFETY: range within the mapping (checked by `at`), exclusively
        // ours (as in write); seen as possibly uninitialized bytes it is
        // only written.
        let dst = unsafe { std::slice::from_raw_parts_mut(p.cast::<MaybeUninit<u8>>(), len) };
        f.fetch_into(dst)
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
                    _mm_prefetch::<_MM_HINT_ET0>(self.map.as_ptr().add(o as usize) as *const i8);
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
                let end = off.saturating_add(len).min(self.len);
                self.map
                    .flush(off as usize, end.saturating_sub(off) as usize)
            }
        }
    }

    fn sync(&self) -> io::Result<()> {
        match self.mode {
            PersistMode::Dax => {
                fence();
                Ok(())
            }
            PersistMode::Volatile | PersistMode::Msync => self.map.flush(0, self.len as usize),
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
