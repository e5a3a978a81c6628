//! Shared-memory windows: a local client's memory that is a shared mapping
//! of a memory file (memfd) the server maps too ([`Request::ShmAttach`]).
//!
//! A write whose data lies in the window ([`chfs_proto::frame::FLAG_CMA`],
//! as any cross-memory write) is copied from the server's own mapping with
//! non-temporal stores, which write a chunk's fresh memory without first
//! reading it into the cache: on the test VM 18 GB/s into memory not in
//! the cache against 5-6 GB/s for `process_vm_readv` (whose kernel copy
//! does read it first), and no page pinning. chfuse places its FUSE ring
//! buffers in such a window, so the data the kernel copied there reaches a
//! chunk in a fraction of the time.
//!
//! Only for the same peers as cross-memory attach (local, the server's own
//! user). The file must be plain shared memory sealed against shrinking:
//! a client could otherwise truncate it under the mapping, or give a
//! hugetlb file with no page for a hole, and the server's reads would
//! fault (SIGBUS). The server never forms a Rust reference to the window:
//! the client may write it at any moment, so it is read through raw pointers
//! only, and a client that changes its data during a write gets a chunk
//! of old and new bytes, as with `process_vm_readv`.
//!
//! A *landing* window (attached with [`chfs_proto::frame::FLAG_LAND`]) is
//! mapped read-write: reads flagged `FLAG_LAND` have their data copied
//! into it at the room their [`chfs_proto::frame::CmaRef`] names
//! ([`Window::room`]: by the store itself, from where the bytes lie)
//! instead of sent through the socket. The client never
//! uses a room again whose read did not end cleanly, and the server does
//! not write one past the request's deadline.
//!
//! [`Request::ShmAttach`]: chfs_proto::Request::ShmAttach

use std::mem::MaybeUninit;

use bytes::Bytes;
use chfs_proto::frame::CmaRef;
use chfs_proto::ErrorReply;
use chfs_store::Dst;
use chfs_sys::{memfd, Mapping};

/// Largest window a client may attach (the mapping costs address space
/// only, but a bound keeps a bad request from asking for the impossible).
const MAX_WINDOW: u64 = 1 << 36;

/// The server's mapping of a client's window (read-only, or read-write
/// for a landing window), reached through raw pointers only (the client
/// touches it concurrently in any case), unmapped when the last owner
/// goes.
pub(crate) struct Window {
    /// Where the client maps the file.
    base: u64,
    /// Where the server maps it.
    map: Mapping,
    /// Mapped read-write: a landing window.
    writable: bool,
}

/// A read's room in a client's landing window ([`Window::room`]).
pub(crate) struct Room<'a> {
    /// The room's memory.
    pub(crate) dst: Dst<'a>,
    /// When the client stops waiting for the read.
    deadline_ns: u64,
}

impl Room<'_> {
    /// Fails once the client stopped waiting: it never uses the room
    /// again, and would not read what came after.
    pub(crate) fn waited_for(&self) -> Result<(), ErrorReply> {
        still_waiting(self.deadline_ns)
    }

    /// Fails (EOVERFLOW) unless the room holds `total` bytes.
    pub(crate) fn holds(&self, total: u64) -> Result<(), ErrorReply> {
        if total > self.dst.len() as u64 {
            return Err(ErrorReply::new(
                libc::EOVERFLOW,
                format!(
                    "a reply of {total} bytes does not fit the {} bytes of room given",
                    self.dst.len()
                ),
            ));
        }
        Ok(())
    }

    /// Places `pieces` one after the other when the room holds them; the
    /// bytes placed.
    pub(crate) fn place(&mut self, pieces: &[Bytes]) -> Result<usize, ErrorReply> {
        self.waited_for()?;
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        self.holds(total as u64)?;
        let mut at = 0;
        for p in pieces {
            self.dst.put(at, p);
            at += p.len();
        }
        Ok(total)
    }
}

/// Fails once `deadline_ns` passed.
fn still_waiting(deadline_ns: u64) -> Result<(), ErrorReply> {
    if CmaRef::clock_ns() > deadline_ns {
        return Err(ErrorReply::new(
            libc::ETIMEDOUT,
            "the client stopped waiting for this read",
        ));
    }
    Ok(())
}

fn io_err(what: &str, e: std::io::Error) -> ErrorReply {
    ErrorReply::io(what, &e)
}

impl Window {
    /// Maps descriptor `fd` of process `pid` (opened through `/proc`, which
    /// the kernel allows only to a process that may trace `pid`, as for
    /// cross-memory attach).
    /// `writable`: a landing window ([`chfs_proto::frame::FLAG_LAND`]),
    /// which the server writes replies' data into.
    pub(crate) fn attach(
        pid: libc::pid_t,
        fd: i32,
        base: u64,
        len: u64,
        writable: bool,
    ) -> Result<Window, ErrorReply> {
        if len == 0 || len > MAX_WINDOW || base.checked_add(len).is_none() {
            return Err(ErrorReply::new(
                libc::EINVAL,
                format!("shared-memory window of {len} bytes at {base:#x}"),
            ));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        // Only plain shared memory: a hugetlb file, say, may have no page
        // to give when the server reads a hole, and that is a SIGBUS.
        if !memfd::on_tmpfs(&file) {
            return Err(ErrorReply::new(
                libc::EINVAL,
                format!("{path} is not a memory file (memfd)"),
            ));
        }
        let seals =
            memfd::seals(&file).map_err(|e| io_err(&format!("{path} is not a memory file"), e))?;
        if seals & memfd::F_SEAL_SHRINK == 0 {
            return Err(ErrorReply::new(
                libc::EPERM,
                format!("{path} is not sealed against shrinking"),
            ));
        }
        let size = file.metadata().map_err(|e| io_err(&path, e))?.len();
        if size < len {
            return Err(ErrorReply::new(
                libc::EINVAL,
                format!("{path} holds {size} bytes, not the {len} of the window"),
            ));
        }
        // The file cannot shrink (sealed), so every mapped page stays
        // backed.
        let map = if writable {
            Mapping::shared_read_write(&file, len as usize)
        } else {
            Mapping::shared_read_only(&file, len as usize)
        }
        .map_err(|e| io_err("cannot map the shared-memory window", e))?;
        Ok(Window {
            base,
            map,
            writable,
        })
    }

    /// The room `r` names in a landing window, when it lies in it and the
    /// client still waits (`r.deadline_ns`). Its bytes are written with
    /// plain stores: the client reads them next, so they are best left in
    /// the cache.
    pub(crate) fn room(&self, r: &CmaRef) -> Result<Room<'_>, ErrorReply> {
        still_waiting(r.deadline_ns)?;
        let len = usize::try_from(r.len).unwrap_or(usize::MAX);
        let off = r
            .addr
            .checked_sub(self.base)
            .map(|o| o as usize)
            .filter(|o| self.writable && o.checked_add(len).is_some_and(|e| e <= self.map.len()))
            .ok_or_else(|| {
                ErrorReply::new(
                    libc::EFAULT,
                    format!(
                        "{len} bytes at {:#x} are not in this connection's landing window",
                        r.addr
                    ),
                )
            })?;
        Ok(Room {
            // SAFETY: `[off, off + len)` lies in the mapping (checked
            // above), which is writable and stays mapped while `self`
            // lives (the file cannot shrink: sealed). This process only
            // writes it (never reads it; the client may write it too, its
            // own doing).
            dst: unsafe { Dst::from_raw(self.map.as_ptr().add(off), len) },
            deadline_ns: r.deadline_ns,
        })
    }

    /// Copies the client's `[addr, addr + dst.len())` into `dst` when it
    /// lies in the window (`false`: it does not; `dst` untouched).
    pub(crate) fn copy_into(&self, addr: u64, dst: &mut [MaybeUninit<u8>]) -> bool {
        let len = dst.len();
        let Some(off) = addr.checked_sub(self.base) else {
            return false;
        };
        if (off as usize)
            .checked_add(len)
            .is_none_or(|end| end > self.map.len())
        {
            return false;
        }
        // SAFETY: `off + len` lies in the mapping (checked) and `dst` is
        // `len` writable bytes of our own; the two do not overlap.
        unsafe {
            stream_copy(
                dst.as_mut_ptr().cast(),
                self.map.as_ptr().add(off as usize),
                len,
            )
        };
        true
    }
}

/// Copies `len` bytes from `src` to `dst` with non-temporal stores where
/// the CPU has them (x86-64: SSE2, always there).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Bytes up to the first 16-byte boundary of `dst`, copied plainly.
        let head = (dst.align_offset(16)).min(len);
        // SAFETY: within both ranges (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut i = head;
        while i + 64 <= len {
            // SAFETY: i + 64 <= len keeps the loads and stores in range;
            // dst + i is 16-byte aligned (head above), as the stores need;
            // the loads take any alignment.
            unsafe {
                let s = src.add(i).cast::<__m128i>();
                let d = dst.add(i).cast::<__m128i>();
                let (a, b, c, e) = (
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                );
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            i += 64;
        }
        // SAFETY: the rest of both ranges; the fence orders the streamed
        // stores before anything that later publishes the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_copies_equal_plain_ones_at_every_alignment() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![0u8; 70_100];
        for (doff, soff, len) in [
            (0, 0, 65_536),
            (3, 0, 1000),
            (0, 5, 4097),
            (13, 9, 63),
            (1, 1, 0),
        ] {
            dst.fill(0xee);
            // SAFETY: both ranges are in bounds of their vectors.
            unsafe { stream_copy(dst.as_mut_ptr().add(doff), src.as_ptr().add(soff), len) };
            assert_eq!(
                &dst[doff..doff + len],
                &src[soff..soff + len],
                "{doff} {soff} {len}"
            );
            assert!(dst[..doff].iter().all(|&b| b == 0xee));
            assert!(dst[doff + len..].iter().all(|&b| b == 0xee));
        }
    }
}
