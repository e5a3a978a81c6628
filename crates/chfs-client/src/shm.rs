//! A shared-memory window: memory of this process that local servers map
//! too (see [`crate::Client::shared_buffer`]).

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
