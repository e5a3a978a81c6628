//! Shared-memory windows: memory of this process that local servers map
//! too: one they copy writes' data from (see
//! [`crate::Client::shared_buffer`]), and the landing area they place
//! reads' data in ([`Landing`]).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use chfs_proto::Request;
use chfs_sys::{memfd, Mapping};

use crate::error::{Error, Result};

/// A sealed memory file mapped read-write here; unmapped when the last
/// owner (the client's pool and every [`SharedBuffer`]) goes. The client
/// only hands out its address; writers coordinate through their own
/// protocol (chfuse: one ring entry per slice).
pub(crate) struct Window {
    map: Mapping,
    fd: File,
}

fn os_err(what: &str, e: std::io::Error) -> Error {
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
        let flags = memfd::MFD_CLOEXEC | memfd::MFD_ALLOW_SEALING;
        let fd = memfd::create(c"chfs-shared", flags).map_err(|e| os_err("memfd_create", e))?;
        fd.set_len(len as u64)
            .map_err(|e| os_err("ftruncate of the shared buffer", e))?;
        let seals = memfd::F_SEAL_SHRINK | memfd::F_SEAL_GROW | memfd::F_SEAL_SEAL;
        memfd::add_seals(&fd, seals).map_err(|e| os_err("sealing the shared buffer", e))?;
        let map = Mapping::shared_read_write(&fd, len)
            .map_err(|e| os_err("mapping the shared buffer", e))?;
        Ok(Window { map, fd })
    }

    /// Does `[p, p + len)` lie in this window?
    pub(crate) fn holds(&self, p: *const u8, len: usize) -> bool {
        let base = self.map.as_ptr() as usize;
        let a = p as usize;
        a >= base
            && a.checked_add(len)
                .is_some_and(|e| e <= base + self.map.len())
    }

    /// The request that tells a local server about this window.
    pub(crate) fn attach_request(&self) -> Request {
        Request::ShmAttach {
            fd: self.fd.as_raw_fd(),
            base: self.map.as_ptr() as u64,
            len: self.map.len() as u64,
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
        self.window.map.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.window.map.len()
    }

    /// Never: buffers are not empty.
    pub fn is_empty(&self) -> bool {
        self.window.map.is_empty()
    }
}

impl std::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("ptr", &self.window.map.as_ptr())
            .field("len", &self.window.map.len())
            .finish()
    }
}

/// Bytes of one landing slot: a read-ahead request's reply at the default
/// `CHFS_READ_AHEAD`, or a `pread`'s chunks placed one after the other
/// (larger requests come through the socket).
pub(crate) const SLOT: usize = 1 << 20;

/// Slots of the landing area (its pages are only allocated as they are
/// first written, and the slot freed last is taken first: a process uses
/// as many as it has reads in flight at once).
const SLOTS: usize = 32;

/// Smallest read that goes through the landing area.
pub(crate) const LAND_MIN: usize = 16 * 1024;

/// Where local servers place the data of this client's reads instead of
/// sending it through the socket ([`chfs_proto::frame::FLAG_LAND`]): a
/// memory file mapped here and, read-write, by each local server that
/// agrees (per connection), cut into [`SLOT`]-byte slots. A slot is the
/// room of one request at a time. One whose request failed is never used
/// again (quarantined): the server may still be about to write it (a
/// request that timed out, a connection that broke).
pub(crate) struct Landing {
    window: Window,
    /// Free slots, the most recently freed last (its pages are warm).
    free: std::sync::Mutex<Vec<u32>>,
    quarantined: std::sync::atomic::AtomicUsize,
}

impl Landing {
    /// A landing area of [`SLOTS`] slots.
    pub(crate) fn new() -> Result<Landing> {
        Ok(Landing {
            window: Window::new(SLOT * SLOTS)?,
            free: std::sync::Mutex::new((0..SLOTS as u32).rev().collect()),
            quarantined: Default::default(),
        })
    }

    /// The request that tells a local server about this area (sent with
    /// `FLAG_LAND`).
    pub(crate) fn attach_request(&self) -> Request {
        self.window.attach_request()
    }

    /// Does `[p, p + len)` lie in this area?
    pub(crate) fn holds(&self, p: *const u8, len: usize) -> bool {
        self.window.holds(p, len)
    }

    /// A free slot with room for `len` bytes, if any.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> Option<Slot> {
        if len > SLOT {
            return None;
        }
        let i = chfs_sys::lock(&self.free).pop()?;
        Some(Slot {
            area: self.clone(),
            i,
            len,
            lost: false,
        })
    }

    /// Slots given up for good.
    pub(crate) fn quarantined(&self) -> usize {
        self.quarantined.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One slot of a [`Landing`] area, `len` bytes of it in use; back to the
/// area when dropped, unless quarantined.
pub(crate) struct Slot {
    area: Arc<Landing>,
    i: u32,
    len: usize,
    /// Quarantined: never back to the area.
    lost: bool,
}

impl Slot {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: slot `i` < SLOTS lies in the mapping of SLOT * SLOTS bytes.
        unsafe { self.area.window.map.as_ptr().add(self.i as usize * SLOT) }
    }

    /// The bytes in use.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len <= SLOT` bytes of this slot, which nobody else in
        // this process uses while it is held; a server writes it only
        // while a request of ours names it, and a slot whose request did
        // not end cleanly is never used again (`quarantine`).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes in use, to be written (by this process or, through a
    /// request naming them, a server).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, held exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// Gives the slot up for good: a server may still write it.
    pub(crate) fn quarantine(mut self) {
        self.area
            .quarantined
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lost = true;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.lost {
            chfs_sys::lock(&self.area.free).push(self.i);
        }
    }
}

/// Where a request's reply lands: memory of this process, or a slot of
/// the landing area that a local server writes itself (no copy through
/// the socket).
pub(crate) enum Buf {
    Heap(Vec<u8>),
    Slot(Slot),
}

impl Buf {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Buf::Heap(v) => v,
            Buf::Slot(s) => s.bytes(),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Heap(v) => v,
            Buf::Slot(s) => s.bytes_mut(),
        }
    }

    /// Done with: a slot whose request failed is given up for good (a
    /// server may still write it); heap memory is handed back.
    pub(crate) fn retire(self, failed: bool) -> Option<Vec<u8>> {
        match self {
            Buf::Heap(v) => Some(v),
            Buf::Slot(s) if failed => {
                s.quarantine();
                None
            }
            Buf::Slot(_) => None,
        }
    }
}
