//! The crate's one module with unsafe code: the C shim's declarations
//! (src/shim.c) and safe owners of what libfabric hands out.
//!
//! Soundness rests on two rules kept here, so the rest of the crate cannot
//! break them:
//! - memory given to the provider stays alive and unaliased until the
//!   operation ends: every post takes an owner of its buffer (a [`Buffer`]
//!   by value, an `Arc` of a [`Window`] or [`Pinned`]) and keeps it in the
//!   endpoint's table of operations in flight, released only when the
//!   operation's completion is read or the endpoint is closed (closing
//!   ends every outstanding operation);
//! - objects are closed children first: an endpoint and every registration
//!   hold an `Arc` of their domain, which closes last.
//!
//! Without libfabric (`cfg(chfs_libfabric)` unset by build.rs) the same
//! types exist but cannot be made: [`Domain::open`] says why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// `FI_ADDR_STR`: names are NUL-terminated strings.
pub(crate) const FMT_ADDR_STR: u32 = 9;
/// `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, not offsets.
const MR_VIRT_ADDR: u64 = 1 << 4;
/// `FI_MR_LOCAL`: memory an operation reads or writes here must be
/// registered too (verbs), not only memory peers reach.
const MR_LOCAL: u64 = 1 << 2;
/// `FI_ADDR_NOTAVAIL`.
pub(crate) const ADDR_NOTAVAIL: u64 = u64::MAX;

const FI_READ: u64 = 1 << 8;
const FI_WRITE: u64 = 1 << 9;
const FI_RECV: u64 = 1 << 10;
const FI_SEND: u64 = 1 << 11;
const FI_REMOTE_READ: u64 = 1 << 12;
const FI_REMOTE_WRITE: u64 = 1 << 13;

/// What the endpoint's completion queue is waited on with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// A file descriptor, polled after `fi_trywait` (FI_WAIT_FD).
    Fd,
    /// None: the waiter sleeps between reads.
    Sleep,
}

/// Facts of an open domain.
#[derive(Debug, Clone)]
pub struct DomainAttr {
    /// The provider as libfabric names it (`tcp;ofi_rxm`).
    pub provider: String,
    /// The fabric's name (for tcp, the network: `127.0.0.1/32`).
    pub fabric: String,
    /// The domain's name (for tcp, the interface: `lo`).
    pub domain: String,
    /// `FI_MR_*` bits the provider requires.
    pub mr_mode: u64,
    /// Largest send copied out at once (`fi_inject`).
    pub inject_size: usize,
    /// Largest message.
    pub max_msg_size: u64,
    /// Most local pieces of one operation (`tx_attr.iov_limit`).
    pub iov_limit: usize,
    /// Most places of the peer's memory one RMA names
    /// (`tx_attr.rma_iov_limit`).
    pub rma_iov_limit: usize,
    /// The address format (`FI_SOCKADDR_IN`, ...).
    pub addr_format: u32,
}

/// Where a peer may read or write a [`Window`]: what a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteKey {
    /// The address to name in `fi_read`/`fi_write` (a virtual address or
    /// an offset, as the provider wants).
    pub addr: u64,
    /// The window's length in bytes.
    pub len: u64,
    /// The registration's key.
    pub key: u64,
}

impl RemoteKey {
    /// Encoded length.
    pub const LEN: usize = 24;

    /// Little-endian encoding (addr, len, key).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Decodes [`RemoteKey::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Result<RemoteKey> {
        if b.len() != Self::LEN {
            return Err(Error::InvalidInput(format!(
                "a remote key is {} bytes, not {}",
                Self::LEN,
                b.len()
            )));
        }
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(RemoteKey {
            addr: word(0),
            len: word(8),
            key: word(16),
        })
    }
}

/// A completion read from an endpoint's queue.
#[derive(Debug)]
pub struct Completion {
    /// The id [`Ep`]'s post gave the operation.
    pub id: u64,
    /// Bytes received (receives).
    pub len: usize,
    /// Ok, or the error (`FI_E*`, provider's code).
    pub status: std::result::Result<(), (i32, i32)>,
    /// The buffer the operation was posted with, given back.
    pub buffer: Option<Buffer>,
}

/// Memory that can be registered while something else owns it: its bytes
/// lie at one address for as long as the value lives, even when the value
/// is moved, and never change while it is shared.
///
/// # Safety
/// `as_ref()` must return the same slice (address and length) every time
/// and after moves of the value, and the memory must stay allocated and
/// unmodified until the value is dropped.
pub unsafe trait StableBuf: AsRef<[u8]> + Send + Sync + 'static {}

// SAFETY: a Vec's elements are on the heap; moving the Vec moves only its
// pointer, and a Vec owned here is never changed (no &mut is handed out).
unsafe impl StableBuf for Vec<u8> {}
// SAFETY: as for Vec: heap memory, never changed while owned here.
unsafe impl StableBuf for Box<[u8]> {}
// SAFETY: shared slices are immutable and live as long as any Arc.
unsafe impl StableBuf for Arc<[u8]> {}
// SAFETY: Bytes are immutable views of memory kept alive by their owner
// (shared, static or unique heap storage); moving a Bytes keeps its view.
unsafe impl StableBuf for bytes::Bytes {}

#[cfg(chfs_libfabric)]
mod sys {
    use std::ffi::{c_char, c_int, c_void};

    /// Opaque `struct chfs_fi_domain`.
    #[repr(C)]
    pub struct Domain {
        _p: [u8; 0],
    }
    /// Opaque `struct chfs_fi_ep`.
    #[repr(C)]
    pub struct Ep {
        _p: [u8; 0],
    }
    /// Opaque `struct fid_mr`.
    #[repr(C)]
    pub struct FidMr {
        _p: [u8; 0],
    }

    #[repr(C)]
    pub struct DomainAttr {
        pub mr_mode: u64,
        pub inject_size: u64,
        pub max_msg_size: u64,
        pub iov_limit: u64,
        pub rma_iov_limit: u64,
        pub addr_format: u32,
        pub prov_name: [c_char; 64],
        pub fabric_name: [c_char; 128],
        pub domain_name: [c_char; 64],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Comp {
        pub ctx: u64,
        pub flags: u64,
        pub len: u64,
        pub src: u64,
        pub err: i32,
        pub prov_errno: i32,
    }

    #[repr(C)]
    pub struct Mr {
        pub mr: *mut FidMr,
        pub desc: *mut c_void,
        pub key: u64,
    }

    unsafe extern "C" {
        pub fn chfs_fi_strerror(err: c_int) -> *const c_char;
        pub fn chfs_fi_version() -> u32;
        pub fn chfs_fi_domain_open(
            prov: *const c_char,
            node: *const c_char,
            service: *const c_char,
            out: *mut *mut Domain,
            attr: *mut DomainAttr,
        ) -> c_int;
        pub fn chfs_fi_domain_close(d: *mut Domain);
        pub fn chfs_fi_ep_open(
            d: *mut Domain,
            cq_size: usize,
            out: *mut *mut Ep,
            wait_kind: *mut c_int,
        ) -> c_int;
        pub fn chfs_fi_ep_close(e: *mut Ep);
        pub fn chfs_fi_getname(e: *mut Ep, buf: *mut c_void, len: *mut usize) -> c_int;
        pub fn chfs_fi_av_insert(e: *mut Ep, addr: *const c_void, fi_addr: *mut u64) -> c_int;
        pub fn chfs_fi_av_remove(e: *mut Ep, fi_addr: u64) -> c_int;
        pub fn chfs_fi_send(
            e: *mut Ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            ctx: u64,
        ) -> isize;
        pub fn chfs_fi_inject(e: *mut Ep, buf: *const c_void, len: usize, dest: u64) -> isize;
        pub fn chfs_fi_recv(
            e: *mut Ep,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            ctx: u64,
        ) -> isize;
        pub fn chfs_fi_read(
            e: *mut Ep,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            src: u64,
            raddr: u64,
            key: u64,
            ctx: u64,
        ) -> isize;
        pub fn chfs_fi_write(
            e: *mut Ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            raddr: u64,
            key: u64,
            ctx: u64,
        ) -> isize;
        pub fn chfs_fi_writev(
            e: *mut Ep,
            iov: *const libc::iovec,
            desc: *mut *mut c_void,
            count: usize,
            dest: u64,
            raddr: *const u64,
            rlen: *const u64,
            rma_count: usize,
            key: u64,
            ctx: u64,
        ) -> isize;
        pub fn chfs_fi_mr_reg(
            d: *mut Domain,
            buf: *const c_void,
            len: usize,
            access: u64,
            requested_key: u64,
            out: *mut Mr,
        ) -> c_int;
        pub fn chfs_fi_mr_close(mr: *mut FidMr);
        pub fn chfs_fi_poll(e: *mut Ep, out: *mut Comp, max: usize, timeout_ms: c_int) -> isize;
    }
}

/// `fi_strerror` of a libfabric error code (either sign).
#[cfg(chfs_libfabric)]
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated
    // string for any code.
    let s = unsafe { std::ffi::CStr::from_ptr(sys::chfs_fi_strerror(code)) };
    s.to_string_lossy().into_owned()
}

/// `fi_strerror` of a libfabric error code (either sign).
#[cfg(not(chfs_libfabric))]
pub(crate) fn strerror(code: i32) -> String {
    std::io::Error::from_raw_os_error(code.abs()).to_string()
}

/// The libfabric version the process runs with, as "major.minor", or None
/// in a build without libfabric.
pub fn libfabric_version() -> Option<String> {
    #[cfg(chfs_libfabric)]
    {
        // SAFETY: fi_version takes no arguments and returns a number.
        let v = unsafe { sys::chfs_fi_version() };
        Some(format!("{}.{}", v >> 16, v & 0xffff))
    }
    #[cfg(not(chfs_libfabric))]
    None
}

/// 64 random bits from the kernel (`getrandom(2)`).
pub(crate) fn random_u64() -> Result<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the remaining bytes of `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Call {
                call: "getrandom",
                code: e.raw_os_error().unwrap_or(libc::EIO),
                message: e.to_string(),
            });
        }
        got += n as usize;
    }
    Ok(u64::from_le_bytes(b))
}

fn call_err(call: &'static str, ret: i64) -> Error {
    let code = i32::try_from(-ret).unwrap_or(i32::MAX);
    Error::Call {
        call,
        code,
        message: strerror(code),
    }
}

/// An open fabric and domain of one provider.
pub struct Domain {
    #[cfg(chfs_libfabric)]
    ptr: *mut sys::Domain,
    #[cfg(not(chfs_libfabric))]
    never: std::convert::Infallible,
    attr: DomainAttr,
    /// Next key to ask for where the provider does not choose keys.
    next_key: AtomicU64,
}

// SAFETY: the domain is opened FI_THREAD_SAFE: libfabric serialises its own
// state, so the handle may be used and dropped from any thread.
unsafe impl Send for Domain {}
// SAFETY: as above, concurrent calls on the domain are allowed.
unsafe impl Sync for Domain {}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain").field("attr", &self.attr).finish()
    }
}

impl Domain {
    /// Opens the first domain of `provider` (libfabric's name, e.g.
    /// `tcp;ofi_rxm`) for reliable datagram endpoints with messages and
    /// RMA, bound to `node`/`service` when given.
    #[cfg(chfs_libfabric)]
    pub fn open(provider: &str, node: Option<&str>, service: Option<&str>) -> Result<Arc<Domain>> {
        use std::ffi::CString;
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| Error::InvalidInput(format!("NUL byte in {s:?}")))
        };
        let prov = cstr(provider)?;
        let node = node.map(cstr).transpose()?;
        let service = service.map(cstr).transpose()?;
        let mut ptr = std::ptr::null_mut();
        let mut a = sys::DomainAttr {
            mr_mode: 0,
            inject_size: 0,
            max_msg_size: 0,
            iov_limit: 0,
            rma_iov_limit: 0,
            addr_format: 0,
            prov_name: [0; 64],
            fabric_name: [0; 128],
            domain_name: [0; 64],
        };
        // SAFETY: the strings are NUL-terminated and outlive the call (NULL
        // for absent node/service, as fi_getinfo allows); `ptr` and `a` are
        // live places the shim writes.
        let ret = unsafe {
            sys::chfs_fi_domain_open(
                prov.as_ptr(),
                node.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                service.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                &mut ptr,
                &mut a,
            )
        };
        if ret != 0 {
            // -FI_ENODATA: no provider of that name (or no matching domain).
            if ret == -61 {
                return Err(Error::Unavailable(format!(
                    "no libfabric provider {provider:?} for reliable datagram endpoints with messages and RMA{} (fi_info -l lists the providers here)",
                    node.as_ref().map(|n| format!(" at {}", n.to_string_lossy())).unwrap_or_default()
                )));
            }
            // -FI_ENOSYS from the shim: libfabric.so.1 could not be loaded.
            if ret == -38 {
                return Err(Error::Unavailable(format!(
                    "libfabric (libfabric.so.1) could not be loaded, so provider {provider:?} cannot be used"
                )));
            }
            return Err(call_err("fi_getinfo/fi_fabric/fi_domain", ret.into()));
        }
        let name = |b: &[std::ffi::c_char]| {
            let bytes: Vec<u8> = b
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(Arc::new(Domain {
            ptr,
            attr: DomainAttr {
                provider: name(&a.prov_name),
                fabric: name(&a.fabric_name),
                domain: name(&a.domain_name),
                mr_mode: a.mr_mode,
                inject_size: usize::try_from(a.inject_size).unwrap_or(0),
                max_msg_size: a.max_msg_size,
                iov_limit: usize::try_from(a.iov_limit).unwrap_or(1),
                rma_iov_limit: usize::try_from(a.rma_iov_limit).unwrap_or(1),
                addr_format: a.addr_format,
            },
            next_key: AtomicU64::new(1),
        }))
    }

    /// Opens the first domain of `provider`: in this build, never.
    #[cfg(not(chfs_libfabric))]
    pub fn open(
        provider: &str,
        _node: Option<&str>,
        _service: Option<&str>,
    ) -> Result<Arc<Domain>> {
        Err(Error::Unavailable(format!(
            "chfs-fabric was built without libfabric (no libfabric.pc found by pkg-config: install libfabric-dev and rebuild), so provider {provider:?} cannot be used"
        )))
    }

    /// Facts of the domain.
    pub fn attr(&self) -> &DomainAttr {
        &self.attr
    }

    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// Private: the callers below own the memory and close the
    /// registration before letting it go.
    #[cfg(chfs_libfabric)]
    fn register(&self, ptr: *const u8, len: usize, access: u64) -> Result<RawMr> {
        let mut mr = sys::Mr {
            mr: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            key: 0,
        };
        let requested = self.next_key.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the domain is open; ptr..ptr+len is memory the caller owns
        // and keeps until the registration is closed; `mr` is a live place.
        let ret =
            unsafe { sys::chfs_fi_mr_reg(self.ptr, ptr.cast(), len, access, requested, &mut mr) };
        if ret != 0 {
            return Err(call_err("fi_mr_reg", ret.into()));
        }
        Ok(RawMr {
            mr: mr.mr,
            desc: mr.desc,
            key: mr.key,
        })
    }

    #[cfg(not(chfs_libfabric))]
    fn register(&self, _ptr: *const u8, _len: usize, _access: u64) -> Result<RawMr> {
        match self.never {}
    }

    /// The address a peer names for byte `off` of a registration at `base`.
    fn remote_addr(&self, base: *const u8, off: usize) -> u64 {
        if self.attr.mr_mode & MR_VIRT_ADDR != 0 {
            base as u64 + off as u64
        } else {
            off as u64
        }
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        #[cfg(chfs_libfabric)]
        // SAFETY: every endpoint and registration holds an Arc of the
        // domain, so none is left when it drops; closed once here.
        unsafe {
            sys::chfs_fi_domain_close(self.ptr)
        };
    }
}

/// A registration handle; closed by its owner's Drop.
struct RawMr {
    #[cfg(chfs_libfabric)]
    mr: *mut sys::FidMr,
    #[cfg(chfs_libfabric)]
    desc: *mut std::ffi::c_void,
    key: u64,
}

impl RawMr {
    /// No registration (closing it does nothing).
    fn none() -> RawMr {
        RawMr {
            #[cfg(chfs_libfabric)]
            mr: std::ptr::null_mut(),
            #[cfg(chfs_libfabric)]
            desc: std::ptr::null_mut(),
            key: 0,
        }
    }

    #[cfg(chfs_libfabric)]
    fn close(&mut self) {
        // SAFETY: the registration is open and closed only here, once
        // (the pointer is cleared).
        unsafe { sys::chfs_fi_mr_close(self.mr) };
        self.mr = std::ptr::null_mut();
    }
    #[cfg(not(chfs_libfabric))]
    fn close(&mut self) {}
}

/// Page-aligned zeroed memory: from the allocator when small, else a
/// mapping of its own ([`RawBuf::MAPPED`] bytes and more), so that freeing
/// it gives the pages back to the system at once. (Registered buffers are
/// long-lived or pooled, and a large one may become a chunk's memory that
/// the store frees when the file goes: from the allocator's heap the
/// pages stayed resident after free, hundreds of MiB of them in chfsd —
/// the heap is not trimmed below its top.)
struct RawBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl RawBuf {
    /// Sizes from which a buffer is a mapping of its own.
    const MAPPED: usize = 64 * 1024;

    fn layout(len: usize) -> Result<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::InvalidInput(format!("buffer of {len} bytes: {e}")))
    }

    fn new(len: usize) -> Result<RawBuf> {
        if len >= Self::MAPPED {
            // SAFETY: a new private anonymous mapping (no address given,
            // no file); the result is checked before use.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                return Err(Error::InvalidInput(format!("cannot map {len} bytes: {e}")));
            }
            let ptr = std::ptr::NonNull::new(p.cast::<u8>())
                .ok_or_else(|| Error::InvalidInput(format!("cannot map {len} bytes")))?;
            // (Anonymous mappings are zeroed.)
            return Ok(RawBuf { ptr, len });
        }
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr)
            .ok_or_else(|| Error::InvalidInput(format!("cannot allocate {len} bytes")))?;
        Ok(RawBuf { ptr, len })
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        if self.len >= Self::MAPPED {
            // SAFETY: mapped in `new` with this length, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            return;
        }
        let layout = Self::layout(self.len).expect("checked at allocation");
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Registered memory owned by one holder at a time, for local use: sent
/// from, received into, the source of an RMA write or the target of an
/// RMA read. Posting it moves it into the endpoint; its completion gives
/// it back, so nothing else touches it meanwhile.
pub struct Buffer {
    mr: RawMr,
    mem: RawBuf,
    domain: Arc<Domain>,
}

// SAFETY: the memory is owned and reached only through &/&mut self; the
// registration handle may be closed from any thread (FI_THREAD_SAFE).
unsafe impl Send for Buffer {}
// SAFETY: &Buffer only reads the memory.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.mem.len)
            .finish()
    }
}

impl Buffer {
    /// Allocates and registers `len` zeroed bytes.
    pub fn new(domain: &Arc<Domain>, len: usize) -> Result<Buffer> {
        if len == 0 {
            return Err(Error::InvalidInput("an empty buffer".into()));
        }
        let mem = RawBuf::new(len)?;
        let mr = domain.register(
            mem.ptr.as_ptr(),
            len,
            FI_SEND | FI_RECV | FI_READ | FI_WRITE,
        )?;
        Ok(Buffer {
            mr,
            mem,
            domain: domain.clone(),
        })
    }

    /// The domain it is registered with.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the memory is allocated, initialised (zeroed) and owned
        // by self; the provider writes it only while the Buffer is posted,
        // when nobody holds it.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.mem.len) }
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), self.mem.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Closed before `mem` is freed (fields drop after this).
        self.mr.close();
    }
}

/// Registered memory that peers may read and write with RMA (its
/// [`RemoteKey`] told to them): shared like a mapping shared with another
/// process, so its bytes are reached by copying in and out only.
pub struct Window {
    mr: RawMr,
    mem: RawBuf,
    domain: Arc<Domain>,
}

// SAFETY: the memory is only copied in and out with raw copies; the
// registration may be closed from any thread.
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

impl Window {
    /// Allocates and registers `len` zeroed bytes for remote reads and
    /// writes.
    pub fn new(domain: &Arc<Domain>, len: usize) -> Result<Arc<Window>> {
        if len == 0 {
            return Err(Error::InvalidInput("an empty window".into()));
        }
        let mem = RawBuf::new(len)?;
        let mr = domain.register(
            mem.ptr.as_ptr(),
            len,
            FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV | FI_READ | FI_WRITE,
        )?;
        Ok(Arc::new(Window {
            mr,
            mem,
            domain: domain.clone(),
        }))
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always false: windows have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// What a peer needs to read or write it.
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey {
            addr: self.domain.remote_addr(self.mem.ptr.as_ptr(), 0),
            len: self.mem.len as u64,
            key: self.mr.key,
        }
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.mem.len) {
            return Err(Error::InvalidInput(format!(
                "range {off}+{len} outside a window of {} bytes",
                self.mem.len
            )));
        }
        Ok(())
    }

    /// Copies `src` into the window at `off`.
    pub fn copy_in(&self, off: usize, src: &[u8]) -> Result<()> {
        self.check(off, src.len())?;
        // SAFETY: the range is inside the allocation (checked); the window
        // is shared memory, written by peers only through operations its
        // user lets them make, as with a mapping shared between processes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.mem.ptr.as_ptr().add(off), src.len())
        };
        Ok(())
    }

    /// Copies the window's bytes at `off` into `dst`.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        self.check(off, dst.len())?;
        // SAFETY: as for copy_in.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.ptr.as_ptr().add(off),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Revokes remote access before `mem` is freed.
        self.mr.close();
    }
}

/// Registered memory someone else owns ([`StableBuf`]: a chunk's shared
/// buffer, a Vec), kept alive by the registration: sent from, the source
/// of RMA writes, read by peers. What the registration cache holds.
pub struct Pinned {
    mr: RawMr,
    ptr: *const u8,
    len: usize,
    domain: Arc<Domain>,
    /// Peers may reach it ([`Pinned::new_local`]: not).
    remote: bool,
    _owner: Box<dyn StableBuf>,
}

// SAFETY: the owner is Send + Sync (StableBuf) and never changed; the
// registration may be closed from any thread.
unsafe impl Send for Pinned {}
// SAFETY: as above; the memory is only read.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Registers `owner`'s bytes (kept alive by the registration); on
    /// failure gives `owner` back.
    pub fn new<B: StableBuf>(
        domain: &Arc<Domain>,
        owner: B,
    ) -> std::result::Result<Arc<Pinned>, (Error, B)> {
        // The bytes stay where they are when `owner` moves (StableBuf).
        let (ptr, len) = {
            let bytes = owner.as_ref();
            (bytes.as_ptr(), bytes.len())
        };
        if len == 0 {
            return Err((
                Error::InvalidInput("registering an empty buffer".into()),
                owner,
            ));
        }
        let mr = match domain.register(ptr, len, FI_SEND | FI_WRITE | FI_REMOTE_READ) {
            Ok(mr) => mr,
            Err(e) => return Err((e, owner)),
        };
        let owner: Box<dyn StableBuf> = Box::new(owner);
        Ok(Arc::new(Pinned {
            mr,
            ptr,
            len,
            domain: domain.clone(),
            remote: true,
            _owner: owner,
        }))
    }

    /// `owner`'s bytes for this process's operations only (the source of
    /// a send or an RMA write), kept alive as by [`Pinned::new`]:
    /// registered only where the provider wants local memory registered
    /// (`FI_MR_LOCAL`: verbs); elsewhere (tcp, shm) a registration per
    /// piece is work for nothing. Peers cannot reach it
    /// ([`Pinned::remote_key`] refuses).
    pub fn new_local<B: StableBuf>(
        domain: &Arc<Domain>,
        owner: B,
    ) -> std::result::Result<Arc<Pinned>, (Error, B)> {
        if domain.attr.mr_mode & MR_LOCAL != 0 {
            return Self::new(domain, owner).map(|p| {
                // (Registered, but handed out for local use only.)
                let mut p = Arc::into_inner(p).expect("just made");
                p.remote = false;
                Arc::new(p)
            });
        }
        let (ptr, len) = {
            let bytes = owner.as_ref();
            (bytes.as_ptr(), bytes.len())
        };
        if len == 0 {
            return Err((Error::InvalidInput("holding an empty buffer".into()), owner));
        }
        Ok(Arc::new(Pinned {
            mr: RawMr::none(),
            ptr,
            len,
            domain: domain.clone(),
            remote: false,
            _owner: Box::new(owner),
        }))
    }

    /// The address range it covers (start, length).
    pub fn range(&self) -> (usize, usize) {
        (self.ptr as usize, self.len)
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the owner keeps ptr..ptr+len allocated and unchanged
        // (StableBuf) for as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// What a peer needs to read bytes `off..off+len` of it.
    pub fn remote_key(&self, off: usize, len: usize) -> Result<RemoteKey> {
        if !self.remote {
            return Err(Error::InvalidInput(
                "memory held for local operations only".into(),
            ));
        }
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidInput(format!(
                "range {off}+{len} outside {} registered bytes",
                self.len
            )));
        }
        Ok(RemoteKey {
            addr: self.domain.remote_addr(self.ptr, off),
            len: len as u64,
            key: self.mr.key,
        })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Closed before the owner is dropped (fields drop after this).
        self.mr.close();
    }
}

/// A registration closed when dropped (also when the closure that holds
/// it panics).
struct Exposure(RawMr);

impl Drop for Exposure {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A caller's memory lent to peers for as long as the borrow `'a` it
/// took: registered when made (for remote reads, or with
/// [`Lent::new_mut`] remote writes too), closed when dropped, so no peer
/// reaches the memory after the borrow ends (over providers that revoke a
/// closed registration: tcp does, libfabric 1.17's shm does not, see
/// [`expose`]). Unlike [`expose`], the lending can outlive a call that
/// made it: a request in flight holds it, and the memory's owner cannot
/// touch (or free) it meanwhile. No copy, no cache: a fresh registration
/// per lending, under a key never used before (the domain's keys count
/// up), so a key of memory lent earlier never names memory lent later at
/// the same address.
pub struct Lent<'a> {
    mr: Exposure,
    key: RemoteKey,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: a Lent is only a registration handle (libfabric's MR objects may
// be closed from any thread) and a borrow's lifetime; the memory it names
// is reached by the provider, not through the Lent.
unsafe impl Send for Lent<'_> {}

impl<'a> Lent<'a> {
    /// Lends `buf` for remote reads.
    pub(crate) fn new(domain: &Arc<Domain>, buf: &'a [u8]) -> Result<Lent<'a>> {
        Self::lend(domain, buf.as_ptr(), buf.len(), FI_REMOTE_READ)
    }

    /// Lends `buf` for remote writes (and reads): the borrow is taken
    /// whole, so nothing here reads or writes `buf` while peers may. On
    /// failure the borrow is given back.
    pub(crate) fn new_mut(
        domain: &Arc<Domain>,
        buf: &'a mut [u8],
    ) -> std::result::Result<Lent<'a>, (Error, &'a mut [u8])> {
        let ptr = buf.as_mut_ptr();
        match Self::lend(domain, ptr, buf.len(), FI_REMOTE_READ | FI_REMOTE_WRITE) {
            Ok(l) => Ok(l),
            Err(e) => Err((e, buf)),
        }
    }

    fn lend(domain: &Arc<Domain>, ptr: *const u8, len: usize, access: u64) -> Result<Lent<'a>> {
        if len == 0 {
            return Err(Error::InvalidInput("lending an empty buffer".into()));
        }
        let mr = Exposure(domain.register(ptr, len, access)?);
        let key = RemoteKey {
            addr: domain.remote_addr(ptr, 0),
            len: len as u64,
            key: mr.0.key,
        };
        Ok(Lent {
            mr,
            key,
            _borrow: std::marker::PhantomData,
        })
    }

    /// The key a peer names the memory by.
    pub fn remote_key(&self) -> RemoteKey {
        self.key
    }

    /// Ends the lending now (as dropping it does).
    pub fn end(self) {
        drop(self.mr);
    }
}

/// Lets peers read `buf` with RMA while `f` runs: registers it for remote
/// reads, hands `f` the key, and closes the registration before
/// returning, so no peer reaches the memory after the borrow ends.
pub fn expose<R>(domain: &Arc<Domain>, buf: &[u8], f: impl FnOnce(RemoteKey) -> R) -> Result<R> {
    if buf.is_empty() {
        return Err(Error::InvalidInput("exposing an empty buffer".into()));
    }
    let mr = Exposure(domain.register(buf.as_ptr(), buf.len(), FI_REMOTE_READ)?);
    let key = RemoteKey {
        addr: domain.remote_addr(buf.as_ptr(), 0),
        len: buf.len() as u64,
        key: mr.0.key,
    };
    let r = f(key);
    drop(mr);
    Ok(r)
}

/// Lets peers write (and read) `buf` with RMA while `f` runs; as
/// [`expose`]. `f` cannot reach `buf` (it is borrowed here), so the
/// peer's writes race with nothing.
pub fn expose_mut<R>(
    domain: &Arc<Domain>,
    buf: &mut [u8],
    f: impl FnOnce(RemoteKey) -> R,
) -> Result<R> {
    if buf.is_empty() {
        return Err(Error::InvalidInput("exposing an empty buffer".into()));
    }
    let ptr = buf.as_mut_ptr();
    let mr = Exposure(domain.register(ptr, buf.len(), FI_REMOTE_READ | FI_REMOTE_WRITE)?);
    let key = RemoteKey {
        addr: domain.remote_addr(ptr, 0),
        len: buf.len() as u64,
        key: mr.0.key,
    };
    let r = f(key);
    drop(mr);
    Ok(r)
}

/// Local memory for an operation: a buffer moved in, or a shared
/// registration.
pub enum Local {
    /// An owned buffer (given back in the completion).
    Buffer(Buffer),
    /// A window.
    Window(Arc<Window>),
    /// Someone else's memory, registered.
    Pinned(Arc<Pinned>),
}

impl Local {
    fn domain(&self) -> &Arc<Domain> {
        match self {
            Local::Buffer(b) => &b.domain,
            Local::Window(w) => &w.domain,
            Local::Pinned(p) => &p.domain,
        }
    }

    fn span(&self) -> (*const u8, usize) {
        match self {
            Local::Buffer(b) => (b.mem.ptr.as_ptr(), b.mem.len),
            Local::Window(w) => (w.mem.ptr.as_ptr(), w.mem.len),
            Local::Pinned(p) => (p.ptr, p.len),
        }
    }

    fn mr(&self) -> &RawMr {
        match self {
            Local::Buffer(b) => &b.mr,
            Local::Window(w) => &w.mr,
            Local::Pinned(p) => &p.mr,
        }
    }

    fn writable(&self) -> bool {
        !matches!(self, Local::Pinned(_))
    }
}

/// A post that was refused: the error and the memory back.
pub struct PostError<L = Local> {
    /// Why (`Error::Call` with code `FI_EAGAIN` = 11 when the queue is full).
    pub error: Error,
    /// The memory given to the post.
    pub local: L,
}

impl<L> PostError<L> {
    /// The queue was full: progress, then try again.
    pub fn is_again(&self) -> bool {
        matches!(self.error, Error::Call { code: 11, .. })
    }
}

/// What an operation in flight holds until its completion.
enum Held {
    One(Local),
    /// The pieces of a gathered write ([`Ep::post_writev`]).
    Pieces(Vec<Piece>),
}

/// One local piece of a gathered RMA write ([`Ep::post_writev`]): `len`
/// bytes at `off` of registered memory.
pub struct Piece {
    pub mem: Arc<Pinned>,
    pub off: usize,
    pub len: usize,
}

/// Most local pieces, and most places of the peer's memory, of one
/// gathered write (the shim's arrays; a provider may allow fewer).
pub const WRITEV_MAX: usize = 16;

/// The kind of operation to post.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Send `len` bytes at `off` to the peer.
    Send,
    /// Receive into the buffer.
    Recv,
    /// RMA read of the peer's memory into the buffer.
    Read(RemoteKey, u64),
    /// RMA write of the buffer into the peer's memory.
    Write(RemoteKey, u64),
}

/// An enabled endpoint with its address vector and completion queue.
pub struct Ep {
    #[cfg(chfs_libfabric)]
    ptr: *mut sys::Ep,
    #[cfg(not(chfs_libfabric))]
    never: std::convert::Infallible,
    wait: WaitKind,
    domain: Arc<Domain>,
    /// Its provider shares memory with the peers' processes (`shm`): its
    /// calls go through [`ShmCall`].
    shm: bool,
    next_id: AtomicU64,
    /// Operations in flight: their memory, released at completion.
    inflight: Mutex<HashMap<u64, Held>>,
    /// The addresses inserted and not removed: only these are given to
    /// libfabric (a number from another endpoint's vector could name
    /// nothing).
    peers: Mutex<std::collections::HashSet<u64>>,
}

// SAFETY: the endpoint is opened on an FI_THREAD_SAFE domain; the table of
// operations is behind a mutex.
unsafe impl Send for Ep {}
// SAFETY: as above.
unsafe impl Sync for Ep {}

impl Ep {
    /// Opens an endpoint on `domain` with a completion queue of
    /// `cq_size` entries (0: the provider's default).
    #[cfg(chfs_libfabric)]
    pub fn open(domain: &Arc<Domain>, cq_size: usize) -> Result<Ep> {
        let mut ptr = std::ptr::null_mut();
        let mut kind = 0;
        // SAFETY: the domain is open and outlives the endpoint (the Arc
        // kept below); out-parameters are live places.
        let ret = unsafe { sys::chfs_fi_ep_open(domain.ptr, cq_size, &mut ptr, &mut kind) };
        if ret != 0 {
            return Err(call_err("fi_endpoint", ret.into()));
        }
        Ok(Ep {
            ptr,
            wait: match kind {
                1 => WaitKind::Fd,
                _ => WaitKind::Sleep,
            },
            shm: domain.attr.provider.split(';').any(|p| p == "shm"),
            domain: domain.clone(),
            next_id: AtomicU64::new(1),
            inflight: Mutex::new(HashMap::new()),
            peers: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// Opens an endpoint: in this build, never (no domain can be made).
    #[cfg(not(chfs_libfabric))]
    pub fn open(domain: &Arc<Domain>, _cq_size: usize) -> Result<Ep> {
        match domain.never {}
    }

    /// How its completion queue is waited on.
    pub fn wait_kind(&self) -> WaitKind {
        self.wait
    }

    /// Its domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Its address (`fi_getname`).
    #[cfg(chfs_libfabric)]
    pub fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 512];
        let mut len = buf.len();
        // SAFETY: buf has `len` writable bytes; the shim writes at most
        // that and stores the name's length.
        let ret = unsafe { sys::chfs_fi_getname(self.ptr, buf.as_mut_ptr().cast(), &mut len) };
        if ret != 0 {
            return Err(call_err("fi_getname", ret.into()));
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Adds a peer's address (as its [`Ep::name`] gave it) to the address
    /// vector. `name` must be of this provider's format; its length is
    /// checked against `own_len` (this endpoint's name), or for string
    /// formats its terminating NUL, so libfabric never reads past it.
    #[cfg(chfs_libfabric)]
    pub fn insert(&self, name: &[u8], own_len: usize) -> Result<u64> {
        let ok = if self.domain.attr.addr_format == FMT_ADDR_STR {
            name.last() == Some(&0)
        } else {
            name.len() == own_len
        };
        if !ok {
            return Err(Error::InvalidInput(format!(
                "a {}-byte address for provider {} (its addresses are {})",
                name.len(),
                self.domain.attr.provider,
                if self.domain.attr.addr_format == FMT_ADDR_STR {
                    "NUL-terminated strings".to_string()
                } else {
                    format!("{own_len} bytes")
                }
            )));
        }
        let mut fi_addr = ADDR_NOTAVAIL;
        let _call = ShmCall::enter(self.shm);
        // SAFETY: `name` holds a whole address of the provider's format
        // (checked above); fi_addr is a live place.
        let ret = unsafe { sys::chfs_fi_av_insert(self.ptr, name.as_ptr().cast(), &mut fi_addr) };
        if ret != 0 {
            return Err(call_err("fi_av_insert", ret.into()));
        }
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fi_addr);
        Ok(fi_addr)
    }

    /// Refuses an address this endpoint did not insert.
    fn check_peer(&self, fi_addr: u64) -> Result<()> {
        if self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&fi_addr)
        {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "peer {fi_addr} is not in this endpoint's address vector"
            )))
        }
    }

    /// Removes a peer from the address vector.
    #[cfg(chfs_libfabric)]
    pub fn remove(&self, fi_addr: u64) -> Result<()> {
        self.check_peer(fi_addr)?;
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fi_addr);
        let _call = ShmCall::enter(self.shm);
        // SAFETY: the endpoint is open and the address was inserted.
        let ret = unsafe { sys::chfs_fi_av_remove(self.ptr, fi_addr) };
        if ret != 0 {
            return Err(call_err("fi_av_remove", ret.into()));
        }
        Ok(())
    }

    /// Sends `data` copied out at once (`fi_inject`, at most the domain's
    /// inject size): no completion, the slice is free on return.
    #[cfg(chfs_libfabric)]
    pub fn inject(&self, data: &[u8], dest: u64) -> Result<()> {
        if data.len() > self.domain.attr.inject_size {
            return Err(Error::InvalidInput(format!(
                "{} bytes to inject, at most {}",
                data.len(),
                self.domain.attr.inject_size
            )));
        }
        self.check_peer(dest)?;
        let _call = ShmCall::enter(self.shm);
        // SAFETY: fi_inject copies the bytes before it returns; `dest` was
        // inserted.
        let ret = unsafe { sys::chfs_fi_inject(self.ptr, data.as_ptr().cast(), data.len(), dest) };
        if ret != 0 {
            return Err(call_err("fi_inject", ret as i64));
        }
        Ok(())
    }

    /// Posts `op` on `len` bytes of `local` at `off`, with `peer` (ignored
    /// for receives). Returns the operation's id, which its completion
    /// carries; `local` is kept until then.
    #[cfg(chfs_libfabric)]
    pub fn post(
        &self,
        op: Op,
        local: Local,
        off: usize,
        len: usize,
        peer: u64,
    ) -> std::result::Result<u64, PostError> {
        let refuse = |local: Local, error: Error| PostError { error, local };
        if !Arc::ptr_eq(local.domain(), &self.domain) {
            return Err(refuse(
                local,
                Error::InvalidInput("memory registered with another domain".into()),
            ));
        }
        let (base, cap) = local.span();
        if off.checked_add(len).is_none_or(|end| end > cap) {
            return Err(refuse(
                local,
                Error::InvalidInput(format!("range {off}+{len} outside {cap} bytes")),
            ));
        }
        let writes_local = matches!(op, Op::Recv | Op::Read(..));
        if writes_local && !local.writable() {
            return Err(refuse(
                local,
                Error::InvalidInput("receiving into memory registered read-only".into()),
            ));
        }
        if !matches!(op, Op::Recv) {
            if let Err(e) = self.check_peer(peer) {
                return Err(refuse(local, e));
            }
        }
        if let Op::Read(rk, roff) | Op::Write(rk, roff) = op {
            if roff.checked_add(len as u64).is_none_or(|end| end > rk.len) {
                return Err(refuse(
                    local,
                    Error::InvalidInput(format!(
                        "remote range {roff}+{len} outside a {}-byte window",
                        rk.len
                    )),
                ));
            }
        }
        // SAFETY: base..base+cap is registered memory owned by `local`.
        let ptr = unsafe { base.add(off) };
        let desc = local.mr().desc;
        let name = match op {
            Op::Send => "fi_send",
            Op::Recv => "fi_recv",
            Op::Read(..) => "fi_read",
            Op::Write(..) => "fi_write",
        };
        let post = |id: u64| {
            // SAFETY: ptr..ptr+len lies in registered memory (checked
            // above) that the table keeps alive and, for writes into it,
            // unshared (a Buffer moved in, or a Window whose bytes are
            // only copied) until the completion is read or the endpoint
            // closes; `peer` was inserted (checked above).
            unsafe {
                match op {
                    Op::Send => sys::chfs_fi_send(self.ptr, ptr.cast(), len, desc, peer, id),
                    Op::Recv => sys::chfs_fi_recv(self.ptr, ptr.cast_mut().cast(), len, desc, id),
                    Op::Read(rk, roff) => sys::chfs_fi_read(
                        self.ptr,
                        ptr.cast_mut().cast(),
                        len,
                        desc,
                        peer,
                        rk.addr + roff,
                        rk.key,
                        id,
                    ),
                    Op::Write(rk, roff) => sys::chfs_fi_write(
                        self.ptr,
                        ptr.cast(),
                        len,
                        desc,
                        peer,
                        rk.addr + roff,
                        rk.key,
                        id,
                    ),
                }
            }
        };
        match self.track(Held::One(local), name, post) {
            Ok(id) => Ok(id),
            Err((error, Held::One(local))) => Err(PostError { error, local }),
            Err((_, Held::Pieces(_))) => unreachable!("kept as given"),
        }
    }

    /// Keeps `held` in the table of operations in flight under a new id
    /// (before the post: a completion may be read by another thread before
    /// the post returns), posts with `post(id)`, and takes `held` back if
    /// the post is refused (`name` for the error).
    #[cfg(chfs_libfabric)]
    fn track(
        &self,
        held: Held,
        name: &'static str,
        post: impl FnOnce(u64) -> isize,
    ) -> std::result::Result<u64, (Error, Held)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, held);
        let ret = {
            let _call = ShmCall::enter(self.shm);
            post(id)
        };
        if ret != 0 {
            let held = self
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
                .expect("kept above; only a completion removes it, and none came");
            return Err((call_err(name, ret as i64), held));
        }
        Ok(id)
    }

    /// Posts one RMA write gathered from `pieces` (at most the domain's
    /// `iov_limit` and [`WRITEV_MAX`]) into `places` of the peer's memory
    /// under `remote` (offsets and lengths in it; at most its
    /// `rma_iov_limit` and [`WRITEV_MAX`]): the pieces' bytes, one after
    /// the other, fill the places one after the other, so both add up to
    /// the same length. The pieces are kept until the completion.
    #[cfg(chfs_libfabric)]
    pub fn post_writev(
        &self,
        pieces: Vec<Piece>,
        places: &[(u64, u64)],
        remote: RemoteKey,
        peer: u64,
    ) -> std::result::Result<u64, PostError<Vec<Piece>>> {
        if let Err(error) = self.check_writev(&pieces, places, remote, peer) {
            return Err(PostError {
                error,
                local: pieces,
            });
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; WRITEV_MAX];
        let mut desc = [std::ptr::null_mut(); WRITEV_MAX];
        for (i, p) in pieces.iter().enumerate() {
            // SAFETY: off+len lies within the registration (checked).
            iov[i].iov_base = unsafe { p.mem.ptr.add(p.off) }.cast_mut().cast();
            iov[i].iov_len = p.len;
            desc[i] = p.mem.mr.desc;
        }
        let mut raddr = [0u64; WRITEV_MAX];
        let mut rlen = [0u64; WRITEV_MAX];
        for (i, &(roff, len)) in places.iter().enumerate() {
            raddr[i] = remote.addr + roff;
            rlen[i] = len;
        }
        let count = pieces.len();
        let post = |id: u64| {
            // SAFETY: every iovec lies in registered memory (checked
            // above) that the table keeps alive until the completion is
            // read or the endpoint closes; the provider only reads it; the
            // arrays outlive the call, which copies what it keeps; `peer`
            // was inserted (checked above).
            unsafe {
                sys::chfs_fi_writev(
                    self.ptr,
                    iov.as_ptr(),
                    desc.as_mut_ptr(),
                    count,
                    peer,
                    raddr.as_ptr(),
                    rlen.as_ptr(),
                    places.len(),
                    remote.key,
                    id,
                )
            }
        };
        match self.track(Held::Pieces(pieces), "fi_writemsg", post) {
            Ok(id) => Ok(id),
            Err((error, Held::Pieces(local))) => Err(PostError { error, local }),
            Err((_, Held::One(_))) => unreachable!("kept as given"),
        }
    }

    /// What [`Ep::post_writev`] checks before it posts.
    fn check_writev(
        &self,
        pieces: &[Piece],
        places: &[(u64, u64)],
        remote: RemoteKey,
        peer: u64,
    ) -> Result<()> {
        let attr = &self.domain.attr;
        let most = attr.iov_limit.clamp(1, WRITEV_MAX);
        let most_places = attr.rma_iov_limit.clamp(1, WRITEV_MAX);
        if pieces.is_empty() || pieces.len() > most || places.len() > most_places {
            return Err(Error::InvalidInput(format!(
                "a gathered write of {} pieces into {} places (1-{most} and at most {most_places})",
                pieces.len(),
                places.len()
            )));
        }
        let mut total = 0u64;
        for p in pieces {
            if !Arc::ptr_eq(&p.mem.domain, &self.domain) {
                return Err(Error::InvalidInput(
                    "memory registered with another domain".into(),
                ));
            }
            if p.off.checked_add(p.len).is_none_or(|end| end > p.mem.len) || p.len == 0 {
                return Err(Error::InvalidInput(format!(
                    "piece {}+{} outside {} bytes (or empty)",
                    p.off, p.len, p.mem.len
                )));
            }
            total += p.len as u64;
        }
        let mut placed = 0u64;
        for &(roff, len) in places {
            if roff.checked_add(len).is_none_or(|end| end > remote.len) {
                return Err(Error::InvalidInput(format!(
                    "remote range {roff}+{len} outside a {}-byte window",
                    remote.len
                )));
            }
            placed += len;
        }
        if placed != total {
            return Err(Error::InvalidInput(format!(
                "{total} bytes of pieces into {placed} bytes of places"
            )));
        }
        self.check_peer(peer)
    }

    /// Reads up to `max` completions, waiting up to `timeout_ms` without
    /// spinning when none is ready (0: do not wait; a queue without a wait
    /// object never waits). Drives the provider's progress.
    #[cfg(chfs_libfabric)]
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize, timeout_ms: i32) -> Result<usize> {
        let mut raw = [sys::Comp {
            ctx: 0,
            flags: 0,
            len: 0,
            src: 0,
            err: 0,
            prov_errno: 0,
        }; 64];
        let max = max.min(raw.len());
        let call = ShmCall::enter(self.shm);
        // SAFETY: raw has room for `max` entries; the shim fills at most
        // that many.
        let n = unsafe { sys::chfs_fi_poll(self.ptr, raw.as_mut_ptr(), max, timeout_ms) };
        drop(call);
        if n < 0 {
            return Err(call_err("fi_cq_read", n as i64));
        }
        let n = n as usize;
        let mut table = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        for c in &raw[..n] {
            let buffer = match table.remove(&c.ctx) {
                Some(Held::One(Local::Buffer(b))) => Some(b),
                _ => None,
            };
            out.push(Completion {
                id: c.ctx,
                len: usize::try_from(c.len).unwrap_or(usize::MAX),
                status: if c.err == 0 {
                    Ok(())
                } else {
                    Err((c.err, c.prov_errno))
                },
                buffer,
            });
        }
        Ok(n)
    }

    #[cfg(not(chfs_libfabric))]
    pub fn name(&self) -> Result<Vec<u8>> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn insert(&self, _name: &[u8], _own_len: usize) -> Result<u64> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn remove(&self, _fi_addr: u64) -> Result<()> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn inject(&self, _data: &[u8], _dest: u64) -> Result<()> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn post(
        &self,
        _op: Op,
        _local: Local,
        _off: usize,
        _len: usize,
        _peer: u64,
    ) -> std::result::Result<u64, PostError> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn post_writev(
        &self,
        _pieces: Vec<Piece>,
        _places: &[(u64, u64)],
        _remote: RemoteKey,
        _peer: u64,
    ) -> std::result::Result<u64, PostError<Vec<Piece>>> {
        match self.never {}
    }
    #[cfg(not(chfs_libfabric))]
    pub fn poll(&self, _out: &mut Vec<Completion>, _max: usize, _timeout_ms: i32) -> Result<usize> {
        match self.never {}
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        #[cfg(chfs_libfabric)]
        {
            let _call = ShmCall::enter(self.shm);
            // SAFETY: closed once; closing the endpoint ends its
            // outstanding operations, and only then does the table
            // (dropped after this body) free their memory.
            unsafe { sys::chfs_fi_ep_close(self.ptr) };
        }
    }
}

/// Calls of this process into a provider whose endpoints share memory
/// with their peers' processes (`shm`) now under way.
static SHM_CALLS: AtomicUsize = AtomicUsize::new(0);

/// The thread (`pthread_self`) that runs the exit hook, once it runs; 0
/// before.
static EXITING: AtomicU64 = AtomicU64::new(0);

/// Most the exit hook waits for the calls under way to end.
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// One call into a shared-memory provider, counted while it lasts. The
/// shm provider of libfabric 1.17 takes spin locks that live in the
/// peers' shared queues; a process that ended while one of its threads
/// held one (`exit(3)`, or a return from `main`, with another thread
/// inside the provider) left it held for good, and the peer, a server,
/// then spun inside the provider forever, as did every process that
/// reached it after. So the exit hook closes the gate to every thread but
/// its own and waits (at most [`EXIT_DRAIN`]) for the calls under way to
/// end; a thread that comes to the gate later stops there until the
/// process is gone (its exit, now under way, ends it), and the exiting
/// thread itself goes on (a flush at exit). A process killed outright
/// (SIGKILL, a crash) can still leave a lock held: ofi+shm has no cure
/// for that (doc/fabric.md).
struct ShmCall(bool);

impl ShmCall {
    fn enter(shm: bool) -> ShmCall {
        if shm {
            SHM_CALLS.fetch_add(1, Ordering::SeqCst);
            let exiting = EXITING.load(Ordering::SeqCst);
            if exiting != 0 && exiting != this_thread() {
                SHM_CALLS.fetch_sub(1, Ordering::SeqCst);
                loop {
                    std::thread::park();
                }
            }
        }
        ShmCall(shm)
    }

    /// Closes the gate to every thread but this one and waits for the
    /// calls of the others to end (the exit hook).
    fn close_and_drain() {
        EXITING.store(this_thread(), Ordering::SeqCst);
        let until = std::time::Instant::now() + EXIT_DRAIN;
        while SHM_CALLS.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Drop for ShmCall {
    fn drop(&mut self) {
        if self.0 {
            SHM_CALLS.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// This thread, as a number that is never 0.
fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    (unsafe { libc::pthread_self() } as u64).max(1)
}

/// Names of the shared-memory queue files (`shm_open` names) of this
/// process's open shm endpoints, with the PID that created them (a forked
/// child inherits the list, not the files). See [`ShmFile`].
static SHM_FILES: std::sync::Mutex<Vec<(u32, std::ffi::CString)>> =
    std::sync::Mutex::new(Vec::new());

/// A queue file that libfabric's shm provider made for an endpoint of this
/// process (`/dev/shm/NAME`, 16 MiB in 1.17): recorded while the endpoint
/// is open, and unlinked when the process exits normally (`exit(3)`, a
/// return from `main`) with the endpoint still open, as the client's
/// shared endpoint always is. The provider unlinks it when the endpoint
/// closes; it did not when the process ended first, and every process that
/// used `ofi+shm` left its file behind.
///
/// Only unlinked, never closed at exit: `exit` runs its handlers while the
/// process's other threads still run, and one of them may be inside the
/// provider with the endpoint (closing it under them would be a use after
/// free). Unlinking takes nothing from anyone: the memory stays mapped by
/// this process until it is gone and by peers that mapped it until they
/// drop this peer; no new peer can map it, which an exiting process does
/// not need. Dropped after the endpoint closed, it forgets the name.
pub(crate) struct ShmFile {
    name: std::ffi::CString,
}

impl ShmFile {
    /// Records `name` (the provider's `shm_open` name, no slash) for the
    /// exit hook, which is registered with the first record in this
    /// process image.
    pub(crate) fn record(name: &str) -> Option<ShmFile> {
        let name = std::ffi::CString::new(name).ok()?;
        static HOOKED: std::sync::Once = std::sync::Once::new();
        HOOKED.call_once(|| {
            // SAFETY: registers a function of this crate that takes no
            // arguments, catches any unwind and only reads the list and
            // unlinks files. `atexit` from a shared object registers it
            // for that object (`__cxa_atexit` with its `__dso_handle`), so
            // a library unloaded before the exit runs it at its unload
            // rather than leaving a dangling handler. Failure (no memory)
            // only loses the clean-up.
            unsafe { libc::atexit(unlink_shm_files_at_exit) };
        });
        SHM_FILES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((std::process::id(), name.clone()));
        Some(ShmFile { name })
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let pid = std::process::id();
        SHM_FILES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(p, n)| !(*p == pid && *n == self.name));
    }
}

/// The exit hook: closes the gate of shared-memory provider calls to the
/// process's other threads and waits for theirs to end ([`ShmCall`]),
/// then unlinks the queue files this process (this PID) made for
/// endpoints still open. It never waits long for the list: a forked
/// child may hold it locked by a thread that no longer exists, and an
/// exiting process must not hang (it then leaves its files, as before).
extern "C" fn unlink_shm_files_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        ShmCall::close_and_drain();
        let pid = std::process::id();
        let give_up = std::time::Instant::now() + std::time::Duration::from_millis(50);
        let files = loop {
            match SHM_FILES.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= give_up {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        };
        for (p, name) in files.iter() {
            if *p == pid {
                // SAFETY: `name` is a NUL-terminated string owned by the
                // list, which the guard keeps alive for the call.
                unsafe { libc::shm_unlink(name.as_ptr()) };
            }
        }
    });
}

/// What [`remove_if_unused`] did with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileUse {
    /// Nobody had it open for writing or mapped: removed.
    Removed,
    /// A process (of any PID namespace) has it open for writing or mapped
    /// shared: left alone.
    InUse,
    /// Not told (not a regular file of this user, leases unavailable, a
    /// file that changed meanwhile...): left alone.
    Unknown,
}

/// `F_SETSIG` (Linux's `fcntl.h`; not in the libc crate for glibc).
const F_SETSIG: libc::c_int = 10;

/// Removes the file `path` if it is a regular file of this user that no
/// process has open for writing or mapped shared-writable, and
/// `accept(first 8 bytes)` holds for its start (`None`: the file is
/// shorter, as one just created is until it is sized). The kernel tells: a write
/// lease (`F_SETLEASE`, `F_WRLCK`) is granted only on a file that no one
/// else has open, and a mapping keeps its file open (a shm queue's
/// creator maps it for as long as its endpoint lives, and so does every
/// peer that reached it), whatever PID namespace the process is in; a
/// dead process holds nothing. The lease is held only while the name is
/// unlinked.
///
/// A process that opens the file while the lease is held (it would be
/// mapping a dead process's queue) makes the kernel signal the lease's
/// holder: SIGIO by default, which ends a process that does not handle
/// it. So the lease's signal is set to SIGWINCH (ignored by default)
/// before it is taken, and its owner cleared right after (then no signal
/// at all); the opener waits until the lease is let go, microseconds.
pub(crate) fn remove_if_unused(
    path: &std::path::Path,
    accept: impl FnOnce(Option<&[u8; 8]>) -> bool,
) -> FileUse {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    // (nothing but a regular file is opened: opening a device may act)
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        return FileUse::Unknown;
    }
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    else {
        return FileUse::Unknown;
    };
    let Ok(meta) = f.metadata() else {
        return FileUse::Unknown;
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() || meta.uid() != me {
        return FileUse::Unknown;
    }
    let mut head = [0u8; 8];
    let head = f.read_exact_at(&mut head, 0).is_ok().then_some(&head);
    if !accept(head) {
        return FileUse::Unknown;
    }
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on a descriptor `f` owns, with integer arguments.
    if unsafe { libc::fcntl(fd, F_SETSIG, libc::SIGWINCH) } != 0 {
        return FileUse::Unknown;
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } != 0 {
        let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
        return if busy {
            FileUse::InUse
        } else {
            FileUse::Unknown
        };
    }
    // SAFETY: as above; owner 0: no signal when the lease is broken.
    unsafe { libc::fcntl(fd, libc::F_SETOWN, 0) };
    // The name still names the file that was leased (not replaced by
    // another since it was opened).
    let same = std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.ino() == meta.ino() && m.dev() == meta.dev());
    let removed = same && std::fs::remove_file(path).is_ok();
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
    drop(f);
    if removed {
        FileUse::Removed
    } else {
        FileUse::Unknown
    }
}
