//! A shared-memory window: memory of this process that local servers map
//! too (see [`crate::Client::shared_buffer`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use chfs_proto::Request;

use crate::error::{Error, Result};

/// A sealed memory file mapped read-write here; unmapped when the last
/// owner (the client's pool and every [`SharedBuffer`]) goes.
pub(crate) struct Window {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the client only
// hands out its address, and writers coordinate through their own
// protocol (chfuse: one ring entry per slice).
unsafe impl Send for Window {}
// SAFETY: as above; nothing here reads or writes through `ptr`.
unsafe impl Sync for Window {}

fn last_os(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    Error::new(chfs_proto::error::io_errno(&e), format!("{what}: {e}"))
}

impl Window {
    /// A memory file of `len` bytes, sealed so that it can neither shrink
    /// (servers map it) nor grow, mapped (pages are allocated as they are
    /// first written).
    pub(crate) fn new(len: usize) -> Result<Window> {
        if len == 0 {
            return Err(Error::new(libc::EINVAL, "an empty shared buffer"));
        }
        let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        // SAFETY: a NUL-terminated name; the call creates a descriptor.
        let raw = unsafe { libc::memfd_create(c"chfs-shared".as_ptr(), flags) };
        if raw < 0 {
            return Err(last_os("memfd_create"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: descriptor calls on our own descriptor; no memory.
        if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
            return Err(last_os("ftruncate of the shared buffer"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(last_os("sealing the shared buffer"));
        }
        // SAFETY: a fresh shared mapping of the whole file at an address
        // the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os("mapping the shared buffer"));
        }
        Ok(Window {
            fd,
            ptr: p.cast(),
            len,
        })
    }

    /// The request that tells a local server about this window.
    pub(crate) fn attach_request(&self) -> Request {
        Request::ShmAttach {
            fd: self.fd.as_raw_fd(),
            base: self.ptr as u64,
            len: self.len as u64,
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Memory the client's local servers read writes from without
/// `process_vm_readv` ([`crate::Client::shared_buffer`]). Writes whose
/// data lies here go the usual way; only the server's copy is cheaper.
#[derive(Clone)]
pub struct SharedBuffer {
    pub(crate) window: Arc<Window>,
}

impl SharedBuffer {
    /// Start of the buffer: valid for [`SharedBuffer::len`] bytes while
    /// this value or the client lives. What it holds is the caller's to
    /// coordinate.
    pub fn as_ptr(&self) -> *mut u8 {
        self.window.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.window.len
    }

    /// Never: buffers are not empty.
    pub fn is_empty(&self) -> bool {
        self.window.len == 0
    }
}

impl std::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("ptr", &self.window.ptr)
            .field("len", &self.window.len)
            .finish()
    }
}
