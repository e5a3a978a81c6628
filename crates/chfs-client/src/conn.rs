//! One blocking connection to a server, shared by many threads.
//!
//! Callers write their request frame under a short lock and get a
//! [`Ticket`], so many requests are in flight at once and complete in any
//! order. Sending k requests and then waiting for k tickets is how one call
//! reaches k servers concurrently.
//!
//! There is no reader thread: a waiting caller reads the socket itself
//! (leader/follower). The first waiter becomes the reader and reads frames
//! until its own reply arrives, filing the replies of other waiters and
//! waking them; then it hands the role on. A lone caller thus gets its reply
//! straight from the socket, without a thread hop (a hop costs a cross-CPU
//! wake-up, as much as the round trip itself on some machines).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use chfs_proto::frame::{CmaRef, Header, FLAG_CMA, FLAG_ERROR, FLAG_LAND, HEADER_LEN};
use chfs_proto::handshake::{Auth, Connector, Credential, HelloReply, Verdict};
use chfs_proto::msg::{decode_error, op, DATA_TAG};
use chfs_proto::{Request, Response};
use chfs_sys::lock;

use crate::config::ClientConfig;
use crate::error::{fail, ConnFault, Error, Result};
use crate::poll::{Counts, Poller};
use crate::stream::Stream;

/// Smallest write whose data a local server copies from this process's
/// memory rather than receiving it through the socket (below it, the
/// socket's two copies cost less than pinning the pages).
const CMA_MIN: usize = 16 * 1024;

type Reply = Result<Response>;

/// Replies in flight, shared by the waiters of a connection.
#[derive(Default)]
struct State {
    /// Request id -> its reply once read (None: not yet).
    pending: HashMap<u64, Option<Reply>, IdHash>,
    /// A waiter is reading the socket.
    reading: bool,
    /// Threads asleep on [`Conn::filed`]: it is signalled only when there
    /// are some (a notification is a futex system call even with nobody
    /// to wake, one per operation of a lone caller).
    sleepers: usize,
    /// Why the connection broke.
    dead: Option<String>,
}

/// Hashes request ids for [`State::pending`]: ids are a counter, unique
/// on their connection, so a multiplicative hash spreads them as well as
/// SipHash does at a fraction of its cost (~770 instructions per
/// 47,008-byte read, ~430 per stat went to SipHash).
#[derive(Default, Clone, Copy)]
struct IdHash;

impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

/// The hasher of [`IdHash`] (u64 keys only).
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Fibonacci hashing: the high bits, which hashbrown uses for its
        // tags, depend on every bit of the id.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A connection.
pub(crate) struct Conn {
    addr: String,
    state: Mutex<State>,
    /// Signalled when a reply is filed, the reader role is free, or the
    /// connection broke.
    filed: Condvar,
    /// Only used by the waiter holding the reader role.
    reader: Mutex<FrameReader>,
    writer: Mutex<Stream>,
    alive: AtomicBool,
    next_id: AtomicU64,
    timeout: Duration,
    /// The server copies large write data from our memory (probed at
    /// connect; see [`chfs_proto::frame::FLAG_CMA`]).
    cma: AtomicBool,
    /// The client's shared-memory window was offered (see
    /// [`Conn::offer_window`]).
    window_offered: AtomicBool,
    /// The client's landing area: 0 not offered yet, 1 being offered, 2
    /// the server agreed, 3 it refused ([`Conn::lands_in`]).
    landing: AtomicU8,
    /// Our pid at connect (a forked child has another address space: it
    /// sends its data through the socket).
    pid: u32,
    /// A Unix socket to a server on this host.
    local: bool,
    /// The socket (for [`Conn::closed_by_server`]; owned by `writer`).
    fd: std::os::fd::RawFd,
    /// When the connection was opened, and ns after that of the last reply
    /// read from it.
    opened: Instant,
    last_io: AtomicU64,
    /// How long a waiter polls for a reply before it sleeps.
    poll: Poller,
}

/// A connection idle for this long is checked for a server that closed it
/// (a server restarted meanwhile) before it is used again.
const IDLE_CHECK: Duration = Duration::from_millis(5);

/// Most requests in flight on a connection among which a waiter looks
/// for an older one than its own (see [`Conn::wait_into`]).
const NEXT_SCAN: usize = 16;

/// A request in flight.
pub(crate) struct Ticket {
    id: u64,
}

/// A frame read.
enum Frame {
    /// Header and payload.
    Whole(Header, Bytes),
    /// A data reply whose data (this many bytes) went to the destination
    /// given.
    Landed(usize),
}

/// What [`Conn::wait_into`] got.
pub(crate) enum Landing {
    /// The reply's data, this many bytes, is in the caller's buffer.
    Landed(usize),
    /// A reply (of another kind, or whose data did not go there).
    Reply(Response),
}

/// How reading a frame failed.
enum ReadError {
    /// Nothing arrived within the socket's read timeout (between frames:
    /// the connection is still usable).
    Idle,
    /// The connection is unusable.
    Broken(std::io::Error),
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Read timeouts tolerated inside one frame before the connection is
/// declared broken (a server that stops mid-frame).
const MID_FRAME_STALLS: u32 = 3;

/// Reads frames off a connection into one buffer, as much as has arrived
/// (up to [`READ_AHEAD`] past the frame in hand): a reply's payload is a
/// slice of it, not a copy, and the buffer's memory is used again once
/// the slices handed out are gone.
///
/// While replies are held (a read of 1 MiB keeps its 16 chunk replies
/// until all have come), the buffer cannot be refilled and another one is
/// needed. Those are kept ([`SPARES`]) and taken again once their replies
/// are gone, instead of being freed and allocated afresh for every call:
/// malloc hands blocks of this size back to the kernel (mmap threshold,
/// heap trimming), and the new ones' pages were faulted in again on every
/// read (20,000-40,000 page faults per 512 MiB read, up to half the time
/// of a 1 MiB read, varying from process to process with malloc's
/// adaptive thresholds).
struct FrameReader {
    s: Stream,
    buf: BytesMut,
    /// Bytes allocated for `buf` (its capacity shrinks as frames are cut).
    alloc: usize,
    /// Buffers whose replies may still be held, each with its size.
    spares: Vec<(BytesMut, usize)>,
    /// Buffers allocated so far.
    allocated: u64,
    /// recvmsg(2) calls so far.
    recvs: u64,
}

/// Buffers a connection keeps for use again, and the largest kept.
const SPARES: usize = 8;
const SPARE_MAX: usize = 2 << 20;

/// How far a read may run past the frame it needs (small replies that
/// arrive together are read with one system call).
const READ_AHEAD: usize = 256 << 10;

/// How much of what follows a reply's data one read into a caller's
/// buffer also takes (small replies that arrived with it; more would be
/// copied when it is the next reply's data).
const SPLIT_AHEAD: usize = 4 << 10;

/// Largest read buffer kept once empty (a 64 MiB chunk's reply grows it
/// past this).
const KEEP_MAX: usize = 8 << 20;

impl FrameReader {
    fn new(s: Stream) -> FrameReader {
        FrameReader {
            s,
            buf: BytesMut::new(),
            alloc: 0,
            spares: Vec::new(),
            allocated: 0,
            recvs: 0,
        }
    }

    /// Room for the `more` bytes still missing of the frame in hand and
    /// [`READ_AHEAD`] past it (at least a quarter of that): in `buf`
    /// itself, else in a spare buffer whose replies are all gone, else in
    /// a new one; the bytes in hand move along.
    fn room(&mut self, more: usize) {
        let want = more + READ_AHEAD;
        // A buffer grown for one large reply is not kept for small ones.
        if self.buf.is_empty() && self.alloc > KEEP_MAX && want <= KEEP_MAX {
            self.buf = BytesMut::with_capacity(want);
            self.alloc = want;
            self.allocated += 1;
            return;
        }
        let enough = more + READ_AHEAD / 4;
        if self.buf.try_reclaim(want) || self.buf.capacity() - self.buf.len() >= enough {
            return;
        }
        let have = self.buf.len();
        let (mut next, alloc) = match self
            .spares
            .iter_mut()
            .position(|(b, _)| b.try_reclaim(have + enough))
        {
            Some(i) => self.spares.swap_remove(i),
            None => {
                let n = (have + want).max(self.alloc.min(SPARE_MAX));
                self.allocated += 1;
                (BytesMut::with_capacity(n), n)
            }
        };
        next.extend_from_slice(&self.buf);
        let mut old = std::mem::replace(&mut self.buf, next);
        let old_alloc = std::mem::replace(&mut self.alloc, alloc);
        if self.spares.len() < SPARES && (1..=SPARE_MAX).contains(&old_alloc) {
            old.clear();
            self.spares.push((old, old_alloc));
        }
    }

    #[cfg(test)]
    fn read_frame(
        &mut self,
        poll: Option<&Poller>,
    ) -> std::result::Result<(Header, Bytes), ReadError> {
        match self.read_frame_into(poll, None, false)? {
            Frame::Whole(h, p) => Ok((h, p)),
            Frame::Landed(..) => unreachable!("no destination given"),
        }
    }

    /// Reads a frame; with `dst` = (id, buffer), the data of a
    /// [`Response::Data`] reply to `id` that fits the buffer is read
    /// straight into it ([`Frame::Landed`]); see
    /// [`FrameReader::read_frame_parts`].
    #[cfg(test)]
    fn read_frame_into(
        &mut self,
        poll: Option<&Poller>,
        dst: Option<(u64, &mut [u8])>,
        next: bool,
    ) -> std::result::Result<Frame, ReadError> {
        match dst {
            Some((id, d)) => self.read_frame_parts(poll, Some((id, &mut [d])), next),
            None => self.read_frame_parts(poll, None, next),
        }
    }

    /// Reads a frame; with `dst` = (id, parts), the data of a
    /// [`Response::Data`] reply to `id` that fits the parts (one after the
    /// other: a buffer, or the places of a `ReadSpans`' spans in a
    /// caller's buffer) is read straight into them ([`Frame::Landed`])
    /// rather than into our buffer and copied out by the caller. With
    /// `next` (the reply is likely the next frame: its request is alone in
    /// flight on the connection), while the next frame's head and tag are
    /// not in hand, one recvmsg(2) asks for them into our buffer, for the
    /// data into the destination and for a little of what follows into our
    /// buffer again ([`FrameReader::fill_split`]): a reply that has arrived
    /// whole costs one system call. What went to the destination but is
    /// not this reply's data (another frame, an error, what follows a short
    /// reply) is moved back into our buffer, in order. Without `next`
    /// (other threads' replies may come first, and would each be copied
    /// once more that way), the head and tag are asked for alone first,
    /// then the data, which then lands exactly.
    fn read_frame_parts(
        &mut self,
        poll: Option<&Poller>,
        mut dst: Option<(u64, &mut [&mut [u8]])>,
        next: bool,
    ) -> std::result::Result<Frame, ReadError> {
        let mut stalls = 0;
        loop {
            let have = self.buf.len();
            let head = if have >= HEADER_LEN {
                let mut hb = [0u8; HEADER_LEN];
                hb.copy_from_slice(&self.buf[..HEADER_LEN]);
                Some(Header::decode(&hb).map_err(|e| ReadError::Broken(std::io::Error::other(e)))?)
            } else {
                None
            };
            if let Some((id, d)) = dst.as_mut() {
                // Where this frame's data may go: all of the destination
                // while the head is unknown, else exactly the data of a
                // reply to `id` that fits.
                let total = parts_len(d);
                let room = match head {
                    None if next => Some(total),
                    Some(h) if awaited(&h, *id, total) => Some(h.len as usize - 1),
                    _ => None,
                };
                if let Some(room) = room {
                    if have <= HEADER_LEN {
                        if let Some(n) = self.fill_split(*id, d, room, &mut stalls, poll)? {
                            return Ok(Frame::Landed(n));
                        }
                        continue;
                    }
                    if self.buf[HEADER_LEN] == DATA_TAG {
                        let n = self.land(room, d, &mut stalls)?;
                        return Ok(Frame::Landed(n));
                    }
                }
            }
            let need = head.map_or(HEADER_LEN, |h| HEADER_LEN + h.len as usize);
            if let (Some(h), true) = (head, have >= need) {
                self.buf.advance(HEADER_LEN);
                return Ok(Frame::Whole(h, self.buf.split_to(h.len as usize).freeze()));
            }
            // A destination waits but the head is unknown: the head and
            // tag alone (the data may be the destination's).
            let cap = match (&dst, head) {
                (Some(_), None) => HEADER_LEN + 1 - have,
                _ => usize::MAX,
            };
            self.fill(need, &mut stalls, poll, cap)?;
        }
    }

    /// With at most a head in hand and no tag: one recvmsg(2) for the rest
    /// of the head and the tag (into our buffer), for the data (into the
    /// first `room` bytes of `d`, as many as the data may be) and for at
    /// most [`SPLIT_AHEAD`] bytes after it (into our buffer). If the frame
    /// is the data reply to `id` and its data fits `room`, the rest of the
    /// data is received into `d` too and its length returned. Else (or
    /// while the head is incomplete) whatever went to `d` is moved back
    /// into our buffer where it belongs, and None returned.
    fn fill_split(
        &mut self,
        id: u64,
        d: &mut [&mut [u8]],
        room: usize,
        stalls: &mut u32,
        poll: Option<&Poller>,
    ) -> std::result::Result<Option<usize>, ReadError> {
        let have = self.buf.len();
        let head = HEADER_LEN + 1 - have;
        self.room(head);
        let spare = self.buf.spare_capacity_mut();
        let ahead = (spare.len() - head).min(SPLIT_AHEAD);
        let (h_part, rest) = spare.split_at_mut(head);
        let mut iov = Iovecs::new();
        iov.push(h_part.as_mut_ptr().cast(), head);
        iov.parts(d, 0, room);
        iov.push(rest.as_mut_ptr().cast(), ahead);
        let n = self.recv(iov.as_mut(), have == 0, stalls, poll)?;
        let a = n.min(head);
        let b = (n - a).min(room);
        let c = n - a - b;
        // SAFETY: the kernel initialised the `a` bytes after the `have` in
        // hand and, when it got to the third part (`c` > 0, so `a` is
        // `head`), the `c` bytes right after those.
        unsafe { self.buf.set_len(have + a + c) };
        if a < head {
            return Ok(None);
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&self.buf[..HEADER_LEN]);
        let h = Header::decode(&hb).map_err(|e| ReadError::Broken(std::io::Error::other(e)))?;
        if !(awaited(&h, id, room) && self.buf[HEADER_LEN] == DATA_TAG) {
            // Not this reply's data: what went to `d` follows the tag.
            insert(&mut self.buf, HEADER_LEN + 1, &gather(d, 0, b));
            return Ok(None);
        }
        let len = h.len as usize - 1;
        self.buf.advance(HEADER_LEN + 1);
        if b > len {
            // A short reply: the next frames' first bytes went to `d`.
            insert(&mut self.buf, 0, &gather(d, len, b));
        }
        self.recv_exact(d, b.min(len), len, stalls)?;
        Ok(Some(len))
    }

    /// With a data reply's header and tag byte first in our buffer: moves
    /// its `n` data bytes to `d`, those already read with a copy, the rest
    /// straight from the socket.
    fn land(
        &mut self,
        n: usize,
        d: &mut [&mut [u8]],
        stalls: &mut u32,
    ) -> std::result::Result<usize, ReadError> {
        self.buf.advance(HEADER_LEN + 1);
        let k = self.buf.len().min(n);
        put(d, 0, &self.buf[..k]);
        self.buf.advance(k);
        self.recv_exact(d, k, n, stalls)?;
        Ok(n)
    }

    /// Receives exactly bytes `from..to` of `d` (of a frame under way).
    fn recv_exact(
        &mut self,
        d: &mut [&mut [u8]],
        from: usize,
        to: usize,
        stalls: &mut u32,
    ) -> std::result::Result<(), ReadError> {
        let mut got = from;
        while got < to {
            let mut iov = Iovecs::new();
            iov.parts(d, got, to);
            got += self.recv(iov.as_mut(), false, stalls, None)?;
        }
        Ok(())
    }

    /// Reads what has arrived, at least one byte, with room for `need`
    /// bytes in the buffer and [`READ_AHEAD`] more (but at most `cap`
    /// bytes).
    fn fill(
        &mut self,
        need: usize,
        stalls: &mut u32,
        poll: Option<&Poller>,
        cap: usize,
    ) -> std::result::Result<(), ReadError> {
        self.room(need.saturating_sub(self.buf.len()));
        let had = self.buf.len();
        let spare = self.buf.spare_capacity_mut();
        let k = cap.min(spare.len());
        let mut iov = [libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: k,
        }];
        let n = self.recv(&mut iov, had == 0, stalls, poll)?;
        // SAFETY: the kernel initialised the next `n` bytes.
        unsafe { self.buf.set_len(had + n) };
        Ok(())
    }

    /// One recvmsg(2) into `iov` that gets at least one byte. Asks
    /// without blocking for the window of `poll` first (if any), then
    /// sleeps. A read timeout is [`ReadError::Idle`] when `between`
    /// frames, else a stall (a few are tolerated).
    fn recv(
        &mut self,
        iov: &mut [libc::iovec],
        between: bool,
        stalls: &mut u32,
        poll: Option<&Poller>,
    ) -> std::result::Result<usize, ReadError> {
        use ReadError::*;
        let window = poll.map_or(Duration::ZERO, Poller::window);
        let mut polling = !window.is_zero();
        let start = Instant::now();
        // How long it polled before sleeping.
        let mut polled = Duration::ZERO;
        loop {
            // SAFETY: a zeroed msghdr is valid (no name, no control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            self.recvs += 1;
            // SAFETY: each iovec names memory the caller lets the kernel
            // write (live and not otherwise referenced meanwhile), at most
            // its length.
            let n = unsafe {
                libc::recvmsg(
                    self.s.as_raw_fd(),
                    &mut msg,
                    if polling { libc::MSG_DONTWAIT } else { 0 },
                )
            };
            if n > 0 {
                match poll {
                    Some(p) if polling => p.hit(),
                    Some(p) => p.slept(polled, start.elapsed() - polled),
                    None => {}
                }
                return Ok(n as usize);
            }
            if n == 0 {
                return Err(Broken(std::io::ErrorKind::UnexpectedEof.into()));
            }
            let e = std::io::Error::last_os_error();
            if polling && e.kind() == std::io::ErrorKind::WouldBlock {
                let t = start.elapsed();
                if t >= window {
                    polling = false;
                    polled = t;
                }
                // Whatever else wants this CPU (a server, another rank)
                // runs first: polling only uses time nobody else wants.
                std::thread::yield_now();
                continue;
            }
            match e {
                e if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Nothing of a frame yet: the connection is just idle.
                e if is_timeout(&e) && between => return Err(Idle),
                e if is_timeout(&e) && *stalls < MID_FRAME_STALLS => *stalls += 1,
                e => return Err(Broken(e)),
            }
        }
    }
}

/// Is a frame with head `h` possibly the data reply to `id` whose data
/// fits `room` bytes (no error, a tag, not too long)?
fn awaited(h: &Header, id: u64, room: usize) -> bool {
    h.id == id && h.flags & FLAG_ERROR == 0 && h.len >= 1 && h.len as usize - 1 <= room
}

/// Inserts `bytes` into `buf` at `at` (rare: bytes that a read into a
/// caller's buffer took from other frames).
fn insert(buf: &mut BytesMut, at: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let after = buf[at..].to_vec();
    buf.truncate(at);
    buf.extend_from_slice(bytes);
    buf.extend_from_slice(&after);
}

/// Bytes of a destination in parts.
fn parts_len(d: &[&mut [u8]]) -> usize {
    d.iter().map(|p| p.len()).sum()
}

/// Copies `src` into the parts `d`, starting at byte `at` of them.
fn put(d: &mut [&mut [u8]], mut at: usize, mut src: &[u8]) {
    for p in d.iter_mut() {
        if src.is_empty() {
            return;
        }
        if at >= p.len() {
            at -= p.len();
            continue;
        }
        let k = (p.len() - at).min(src.len());
        p[at..at + k].copy_from_slice(&src[..k]);
        src = &src[k..];
        at = 0;
    }
}

/// Bytes `from..to` of the parts `d`, gathered.
fn gather(d: &[&mut [u8]], from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(to.saturating_sub(from));
    let mut pos = 0;
    for p in d {
        let (a, b) = (from.max(pos), to.min(pos + p.len()));
        if a < b {
            out.extend_from_slice(&p[a - pos..b - pos]);
        }
        pos += p.len();
    }
    out
}

/// Most pieces one recvmsg(2) of a reply asks for: a head, the
/// destination's parts, what follows ([`MAX_PARTS`] parts and two).
const IOVECS: usize = MAX_PARTS + 2;

/// Most parts a destination may have (a `ReadSpans`' spans received in
/// place; more would need more than one system call per reply anyway).
pub(crate) const MAX_PARTS: usize = 64;

/// The iovecs of one recvmsg(2), on the stack.
struct Iovecs {
    v: [libc::iovec; IOVECS],
    n: usize,
}

impl Iovecs {
    fn new() -> Iovecs {
        Iovecs {
            v: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; IOVECS],
            n: 0,
        }
    }

    /// Adds `len` bytes at `base` (nothing for none, or when full).
    fn push(&mut self, base: *mut libc::c_void, len: usize) {
        if len > 0 && self.n < IOVECS {
            self.v[self.n] = libc::iovec {
                iov_base: base,
                iov_len: len,
            };
            self.n += 1;
        }
    }

    /// Adds bytes `from..to` of the parts `d`.
    fn parts(&mut self, d: &mut [&mut [u8]], from: usize, to: usize) {
        let mut pos = 0;
        for p in d.iter_mut() {
            let (a, b) = (from.max(pos), to.min(pos + p.len()));
            if a < b {
                self.push(p[a - pos..].as_mut_ptr().cast(), b - a);
            }
            pos += p.len();
        }
    }

    fn as_mut(&mut self) -> &mut [libc::iovec] {
        &mut self.v[..self.n]
    }
}

thread_local! {
    /// A thread's buffers for encoding a request and for the frame that
    /// carries it (kept, so that a request allocates nothing here).
    static HEAD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static FRAME: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Largest encode buffer a thread keeps.
const KEEP_ENCODE: usize = 64 << 10;

/// Runs `f` with `key`'s buffer, empty; with a new one if that is in use
/// or gone (a call from a thread-local destructor).
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u8>>>,
    f: impl FnOnce(&mut Vec<u8>) -> R,
) -> R {
    let mut f = Some(f);
    let r = key.try_with(|b| {
        let mut b = b.try_borrow_mut().ok()?;
        b.clear();
        let r = (f.take().expect("called once"))(&mut b);
        if b.capacity() > KEEP_ENCODE {
            *b = Vec::new();
        }
        Some(r)
    });
    match r {
        Ok(Some(r)) => r,
        _ => (f.take().expect("not called"))(&mut Vec::new()),
    }
}

fn io_err(addr: &str, what: &str, e: std::io::Error) -> Error {
    let errno = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => libc::ETIMEDOUT,
        // A Unix socket whose server died gives EPIPE where TCP gives
        // ECONNRESET: one errno for "the server went away" (and none that
        // callers of read(2) or write(2) take for a closed pipe).
        _ if e.raw_os_error() == Some(libc::EPIPE) => libc::ECONNRESET,
        _ => chfs_proto::error::io_errno(&e),
    };
    Error::new(errno, format!("server {addr}: {what}: {e}")).with_source(e)
}

impl Conn {
    /// Connects and performs the handshake. With `cfg.local_socket`, a
    /// server on this host is reached through its Unix socket (see
    /// [`crate::stream`]), and with `cfg.cma` asked whether it can copy
    /// write data from this process's memory.
    pub fn connect(addr: &str, cfg: &ClientConfig, counts: Arc<Counts>) -> Result<Conn> {
        Self::open(addr, cfg, None, counts)
    }

    /// A local connection served on the server's thread for `cpu`
    /// ([`Request::Lane`]); an error when the server is not local or
    /// refuses.
    pub fn connect_lane(
        addr: &str,
        cfg: &ClientConfig,
        cpu: u32,
        counts: Arc<Counts>,
    ) -> Result<Conn> {
        Self::open(addr, cfg, Some(cpu), counts)
    }

    fn open(
        addr: &str,
        cfg: &ClientConfig,
        lane: Option<u32>,
        counts: Arc<Counts>,
    ) -> Result<Conn> {
        let timeout = cfg.rpc_timeout;
        let cred = Credential::parse(&cfg.secret)
            .map_err(|e| Error::new(libc::EINVAL, format!("CHFS_SECRET(_FILE): {e}")))?;
        let mut s = match cfg.local_socket.then(|| Stream::local(addr)).flatten() {
            Some(s) => s,
            None => Stream::Tcp(Self::connect_tcp(addr, timeout)?),
        };
        s.set_read_timeout(Some(timeout))
            .map_err(|e| io_err(addr, "socket", e))?;
        Self::handshake(&mut s, addr, cfg.role, &cred)?;
        // Reads wake up at least every `timeout` so that a waiter can give
        // up on a request the server does not answer.
        s.set_read_timeout(Some(timeout))
            .map_err(|e| io_err(addr, "socket", e))?;
        // A server that stops reading cannot block a sender forever.
        s.set_write_timeout(Some(timeout))
            .map_err(|e| io_err(addr, "socket", e))?;
        let reader = s.try_clone().map_err(|e| io_err(addr, "socket", e))?;
        let local = s.is_local();
        let fd = s.as_raw_fd();
        let c = Conn {
            addr: addr.to_string(),
            state: Mutex::new(State::default()),
            filed: Condvar::new(),
            reader: Mutex::new(FrameReader::new(reader)),
            writer: Mutex::new(s),
            alive: AtomicBool::new(true),
            next_id: AtomicU64::new(1),
            timeout,
            cma: AtomicBool::new(false),
            window_offered: AtomicBool::new(false),
            landing: AtomicU8::new(0),
            pid: crate::process_id(),
            local,
            fd,
            opened: Instant::now(),
            last_io: AtomicU64::new(0),
            // A lane's server runs on this CPU: polling would keep it off.
            poll: Poller::new(
                match lane {
                    Some(_) => Duration::ZERO,
                    None => cfg.poll.max(),
                },
                counts,
            ),
        };
        if let Some(cpu) = lane {
            // The lane is asked for by the connection's first request.
            if !local {
                return fail(libc::EINVAL, format!("server {addr} is not local"));
            }
            match c.call(&Request::Lane { cpu })? {
                Response::Ok => {}
                other => {
                    return fail(
                        libc::EPROTO,
                        format!("server {addr}: unexpected answer {other:?}"),
                    )
                }
            }
        }
        if cfg.cma && local {
            c.probe_cma();
        }
        Ok(c)
    }

    /// The handshake ([`chfs_proto::handshake`]): authenticates as `role`
    /// with `cred` and checks that the server knows the pool's secret.
    fn handshake(
        s: &mut Stream,
        addr: &str,
        role: chfs_proto::handshake::Role,
        cred: &Credential,
    ) -> Result<()> {
        let refused = |e: chfs_proto::ErrorReply| {
            Error::new(e.errno, format!("server {addr}: {}", e.message))
        };
        let proto = |e: chfs_proto::ProtoError| {
            Error::new(libc::EPROTO, format!("server {addr}: handshake: {e}"))
        };
        let (c, hello) = Connector::start(role, cred).map_err(refused)?;
        let read = |s: &mut Stream, n: usize| -> Result<Vec<u8>> {
            let mut b = vec![0u8; n];
            s.read_exact(&mut b)
                .map_err(|e| io_err(addr, "handshake", e))?;
            Ok(b)
        };
        s.write_all(&hello)
            .map_err(|e| io_err(addr, "handshake", e))?;
        let fixed = read(s, HelloReply::FIXED_LEN)?;
        let (version, status, n) =
            HelloReply::decode_fixed(fixed[..].try_into().expect("fixed length")).map_err(proto)?;
        let msg = String::from_utf8_lossy(&read(s, n)?).into_owned();
        let mut auth = Auth::Open;
        if status == 0
            && HelloReply::decode_auth(read(s, HelloReply::AUTH_LEN)?[0]).map_err(proto)?
        {
            let ch = read(s, HelloReply::CHALLENGE_LEN)?;
            auth = HelloReply::decode_challenge(ch[..].try_into().expect("challenge length"));
        }
        let Some(proof) = c.on_reply(version, status, &msg, &auth).map_err(refused)? else {
            return Ok(());
        };
        s.write_all(&proof)
            .map_err(|e| io_err(addr, "handshake", e))?;
        let fixed = read(s, Verdict::FIXED_LEN)?;
        let (status, n) =
            Verdict::decode_fixed(fixed[..].try_into().expect("fixed length")).map_err(proto)?;
        let msg = String::from_utf8_lossy(&read(s, n)?).into_owned();
        Connector::on_verdict(status, &msg).map_err(refused)
    }

    /// Tells a local server that copies from our memory about the shared
    /// window `w`, once per connection (the first caller asks; the others
    /// go on meanwhile). A refusal changes nothing: the server reads the
    /// window with `process_vm_readv` like any other memory.
    pub fn offer_window(&self, w: &crate::shm::Window) {
        if self.local
            && self.cma.load(Ordering::Relaxed)
            && !self.window_offered.load(Ordering::Relaxed)
            && !self.window_offered.swap(true, Ordering::Relaxed)
        {
            let _ = self.call(&w.attach_request());
        }
    }

    /// Asks the server to copy a probe from our memory; on success, large
    /// writes leave their data here for it ([`CMA_MIN`]). A server that
    /// cannot (another user, a kernel without `process_vm_readv`, an old
    /// server) answers with an error and nothing changes.
    fn probe_cma(&self) {
        let probe = (CmaRef::clock_ns() ^ (self as *const Self as u64)).to_le_bytes();
        let r = self
            .send_frame(op::PING, &[], &[], Some(&probe), FLAG_CMA)
            .map(|t| self.wait(t));
        if let Ok(Ok(Response::Data(d))) = r {
            if d[..] == probe[..] {
                self.cma.store(true, Ordering::Relaxed);
            }
        }
    }

    fn connect_tcp(addr: &str, timeout: Duration) -> Result<TcpStream> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| io_err(addr, "cannot resolve address", e))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout.min(Duration::from_secs(10))) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let s = match stream {
            Some(s) => s,
            None => {
                let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
                return Err(io_err(addr, "cannot connect", e));
            }
        };
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    /// Is this a Unix socket to a server on this host?
    pub fn is_local(&self) -> bool {
        self.local
    }

    /// Is the connection still usable?
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// How long since the connection last sent or received.
    pub fn idle_for(&self) -> std::time::Duration {
        let last = self.last_io.load(Ordering::Relaxed);
        std::time::Duration::from_nanos(
            (self.opened.elapsed().as_nanos() as u64).saturating_sub(last),
        )
    }

    fn note_io(&self) {
        self.last_io
            .store(self.opened.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Is the connection usable, as far as can be told without a round
    /// trip? One idle for a while is first checked for an end of stream
    /// from the server (it stopped or restarted since): such a connection
    /// is marked broken, so that the next request opens a new one instead
    /// of failing on this one.
    pub fn usable(&self) -> bool {
        if !self.alive() {
            return false;
        }
        let idle = (self.opened.elapsed().as_nanos() as u64)
            .saturating_sub(self.last_io.load(Ordering::Relaxed));
        if idle < IDLE_CHECK.as_nanos() as u64 || !self.closed_by_server() {
            return true;
        }
        self.fail_all(&format!("server {} closed the connection", self.addr));
        false
    }

    /// Has the server closed (or reset) the connection? A look at the
    /// socket that takes nothing from it.
    fn closed_by_server(&self) -> bool {
        let mut b = 0u8;
        // SAFETY: recv into a one-byte local with MSG_PEEK|MSG_DONTWAIT on
        // the socket `writer` owns, which lives as long as `self`.
        let n = unsafe {
            libc::recv(
                self.fd,
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => !matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN) | Some(libc::EINTR)
            ),
        }
    }

    /// Marks the connection broken: every waiter gets `why`.
    fn fail_all(&self, why: &str) {
        self.alive.store(false, Ordering::Release);
        let mut st = lock(&self.state);
        if st.dead.is_none() {
            st.dead = Some(why.to_string());
        }
        for slot in st.pending.values_mut() {
            if slot.is_none() {
                *slot = Some(Err(
                    Error::new(libc::EIO, why.to_string()).with_conn_fault(ConnFault::Lost)
                ));
            }
        }
        drop(st);
        self.filed.notify_all();
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }

    /// Sends a request whose payload is `head` followed by `tail`. A large
    /// write to a server that copies from our memory sends only where
    /// `tail` lies: the caller keeps it unchanged until the reply (every
    /// caller waits for its tickets before its buffer goes away).
    pub fn send_raw(&self, op: u16, head: &[u8], tail: &[u8]) -> Result<Ticket> {
        if op == op::WRITE
            && tail.len() >= CMA_MIN
            && self.cma.load(Ordering::Relaxed)
            && crate::process_id() == self.pid
        {
            return self.send_frame(op, head, &[], Some(tail), FLAG_CMA);
        }
        self.send_frame(op, head, tail, None, 0)
    }

    /// Will the server place replies' data in `area` (a local server of
    /// our user that mapped it)? Offered once per connection (by the
    /// first caller; the others read through the socket meanwhile).
    pub fn lands_in(&self, area: &crate::shm::Landing) -> bool {
        if !self.local || !self.cma.load(Ordering::Relaxed) || crate::process_id() != self.pid {
            return false;
        }
        match self.landing.load(Ordering::Acquire) {
            2 => return true,
            0 => {}
            _ => return false,
        }
        if self
            .landing
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let r = with_buffer(&HEAD, |head| {
            let req = area.attach_request();
            req.encode(head);
            self.send_frame(req.op(), head, &[], None, FLAG_LAND)
        })
        .and_then(|t| self.wait(t));
        let state = match &r {
            Ok(Response::Ok) => 2,
            // Not answered: offered again by a later read.
            Err(e) if e.errno() == libc::ETIMEDOUT || e.conn_fault() != ConnFault::None => 0,
            Err(e) => {
                tracing::debug!(server = %self.addr, "no landing window: {e}");
                3
            }
            Ok(_) => 3,
        };
        self.landing.store(state, Ordering::Release);
        state == 2
    }

    /// Sends a read whose data the server is to place in `room` of the
    /// landing area ([`Conn::lands_in`]): the caller waits for it with
    /// [`Conn::wait_landing`] and never uses the room again if that fails.
    pub fn send_landing(&self, op: u16, head: &[u8], room: &[u8]) -> Result<Ticket> {
        self.send_frame(op, head, &[], Some(room), FLAG_LAND)
    }

    /// Waits for a read sent with [`Conn::send_landing`]: its data is in
    /// `dst` (the room named) when it succeeds. After a failure the room
    /// is not to be used again (not even for the same read on a new
    /// connection when this one broke: the server might still write it).
    pub fn wait_landing(&self, t: Ticket, dst: &mut [u8]) -> Result<Landing> {
        match self.wait(t) {
            Ok(Response::Written(n)) if n as usize <= dst.len() => Ok(Landing::Landed(n as usize)),
            Ok(Response::Written(n)) => Err(Error::new(
                libc::EPROTO,
                format!(
                    "server {}: placed {n} bytes in a room of {}",
                    self.addr,
                    dst.len()
                ),
            )),
            r => r.map(Landing::Reply),
        }
    }

    /// Sends a frame: `head`, then `tail` in the frame or, with `mem`, a
    /// [`CmaRef`] naming that memory instead (of the data: `FLAG_CMA`; of
    /// the room for the reply's data: `FLAG_LAND`), with `flags`.
    fn send_frame(
        &self,
        op: u16,
        head: &[u8],
        tail: &[u8],
        mem: Option<&[u8]>,
        flags: u16,
    ) -> Result<Ticket> {
        let addr = &self.addr;
        if !self.alive() {
            return Err(
                Error::new(libc::EIO, format!("connection to server {addr} is broken"))
                    .with_conn_fault(ConnFault::NotSent),
            );
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.state).pending.insert(id, None);
        let trailer = mem.map(|m| {
            CmaRef {
                addr: m.as_ptr() as u64,
                len: m.len() as u64,
                // The server must not read it once we stopped waiting.
                deadline_ns: CmaRef::clock_ns() + self.timeout.as_nanos() as u64,
            }
            .encode()
        });
        let trailer = trailer.as_ref().map_or(&[][..], |t| &t[..]);
        let h = Header {
            len: (head.len() + tail.len() + trailer.len()) as u32,
            id,
            op,
            flags,
        };
        let r = with_buffer(&FRAME, |buf| {
            buf.extend_from_slice(&h.encode());
            buf.extend_from_slice(head);
            let mut w = lock(&self.writer);
            if tail.len() < 16 * 1024 {
                buf.extend_from_slice(tail);
                buf.extend_from_slice(trailer);
                w.write_all(buf)
            } else {
                // One sendmsg(2) for the head and the data: MSG_NOSIGNAL,
                // so a dead server gives EPIPE, not a SIGPIPE that would
                // kill a C program using the library.
                use std::io::IoSlice;
                let mut parts = [IoSlice::new(buf), IoSlice::new(tail), IoSlice::new(trailer)];
                crate::stream::write_all_vectored(&mut *w, &mut parts)
            }
        });
        if let Err(e) = r {
            lock(&self.state).pending.remove(&id);
            self.fail_all(&format!("connection to server {addr} lost: {e}"));
            // A frame cut short is never carried out.
            return Err(io_err(addr, "send failed", e).with_conn_fault(ConnFault::NotSent));
        }
        Ok(Ticket { id })
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<Ticket> {
        with_buffer(&HEAD, |head| {
            req.encode(head);
            self.send_raw(req.op(), head, &[])
        })
    }

    fn timed_out(&self) -> Error {
        Error::new(
            libc::ETIMEDOUT,
            format!(
                "server {} did not answer within {} ms",
                self.addr,
                self.timeout.as_millis()
            ),
        )
    }

    /// Waits for the answer to a ticket, at most the request timeout.
    pub fn wait(&self, t: Ticket) -> Reply {
        match self.wait_for(t, None)? {
            Landing::Reply(r) => Ok(r),
            Landing::Landed(_) => unreachable!("no destination given"),
        }
    }

    /// Waits for the answer to a read's ticket: if this thread reads it
    /// off the socket itself and it is data that fits `dst`, the data
    /// goes straight there ([`Landing::Landed`]); else the reply. When its
    /// request is the oldest in flight on the connection, the reply's head
    /// and data are asked for with one system call, and bytes of other
    /// frames may then pass through `dst` on their way (a reply that came
    /// first after all, an error), so that whatever the outcome, `dst`
    /// holds nothing the caller may rely on but the data landed.
    pub fn wait_into(&self, t: Ticket, dst: &mut [u8]) -> Result<Landing> {
        self.wait_for(t, Some(&mut [dst]))
    }

    /// [`Conn::wait_into`] with the data going into `parts`, one after the
    /// other (at most [`MAX_PARTS`]); [`Landing::Landed`] counts the bytes
    /// of all of them.
    pub fn wait_into_parts(&self, t: Ticket, parts: &mut [&mut [u8]]) -> Result<Landing> {
        self.wait_for(t, Some(parts))
    }

    fn wait_for(&self, t: Ticket, mut dst: Option<&mut [&mut [u8]]>) -> Result<Landing> {
        let deadline = Instant::now() + self.timeout;
        let mut st = lock(&self.state);
        loop {
            match st.pending.get(&t.id) {
                Some(Some(_)) => {
                    return st
                        .pending
                        .remove(&t.id)
                        .flatten()
                        .expect("filed")
                        .map(Landing::Reply)
                }
                Some(None) => {}
                None => {
                    return Err(Error::new(
                        libc::EIO,
                        format!("connection to server {}: reply lost", self.addr),
                    )
                    .with_conn_fault(ConnFault::Lost))
                }
            }
            if let Some(why) = &st.dead {
                let why = why.clone();
                st.pending.remove(&t.id);
                return Err(Error::new(libc::EIO, why).with_conn_fault(ConnFault::Lost));
            }
            let now = Instant::now();
            if now >= deadline {
                st.pending.remove(&t.id);
                return Err(self.timed_out());
            }
            if !st.reading {
                st.reading = true;
                // Only a lone request is polled for: a caller with several
                // in flight (a large read or write) waits for their data
                // anyway, and its polling would take CPU from the servers
                // sending it.
                let lone = st.pending.len() == 1;
                // Its reply is likely the next frame when its request is
                // the oldest in flight here (a connection's replies mostly
                // come in order): then a read's head and data are asked
                // for at once (see `FrameReader::read_frame_into`).
                let next = lone
                    || (st.pending.len() <= NEXT_SCAN && st.pending.keys().all(|&k| k >= t.id));
                drop(st);
                let mine = self.read_until(t.id, deadline, lone, next, dst.as_deref_mut());
                st = lock(&self.state);
                st.reading = false;
                // Someone else may be waiting for the reader role.
                if st.sleepers > 0 {
                    self.filed.notify_all();
                }
                if let Some(r) = mine {
                    st.pending.remove(&t.id);
                    return match r {
                        Frame::Whole(h, payload) => self.decode(h, payload).map(Landing::Reply),
                        Frame::Landed(n) => Ok(Landing::Landed(n)),
                    };
                }
                continue;
            }
            st.sleepers += 1;
            st = self
                .filed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            st.sleepers -= 1;
        }
    }

    /// As the reader: reads frames until the reply to `id` arrives (returned)
    /// or `deadline` passes or the connection breaks (None: look at the
    /// state), polling first when the request is `lone` in flight. Replies
    /// to other requests are filed for their waiters.
    /// Its own reply's data goes to `dst` if it fits (see
    /// [`FrameReader::read_frame_parts`]); its own reply is returned
    /// undecoded.
    fn read_until(
        &self,
        id: u64,
        deadline: Instant,
        lone: bool,
        next: bool,
        mut dst: Option<&mut [&mut [u8]]>,
    ) -> Option<Frame> {
        let mut rd = lock(&self.reader);
        loop {
            let into = dst.as_deref_mut().map(|d| (id, d));
            match rd.read_frame_parts(lone.then_some(&self.poll), into, next) {
                Ok(f @ Frame::Landed(..)) => {
                    self.note_io();
                    return Some(f);
                }
                Ok(Frame::Whole(h, payload)) => {
                    self.note_io();
                    if h.id == id {
                        return Some(Frame::Whole(h, payload));
                    }
                    let reply = self.decode(h, payload);
                    let mut st = lock(&self.state);
                    if let Some(slot) = st.pending.get_mut(&h.id) {
                        *slot = Some(reply);
                        let sleepers = st.sleepers;
                        drop(st);
                        if sleepers > 0 {
                            self.filed.notify_all();
                        }
                    }
                }
                Err(ReadError::Idle) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                }
                Err(ReadError::Broken(e)) => {
                    drop(rd);
                    self.fail_all(&format!("connection to server {} lost: {e}", self.addr));
                    return None;
                }
            }
        }
    }

    fn decode(&self, h: Header, payload: Bytes) -> Reply {
        if h.flags & FLAG_ERROR != 0 {
            match decode_error(payload) {
                Ok(e) => Err(Error::from(e)),
                Err(e) => Err(Error::new(
                    libc::EPROTO,
                    format!("server {}: bad error reply: {e}", self.addr),
                )),
            }
        } else {
            Response::decode(payload).map_err(|e| {
                Error::new(
                    libc::EPROTO,
                    format!("server {}: bad reply: {e}", self.addr),
                )
            })
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&self, req: &Request) -> Reply {
        let t = self.send(req)?;
        self.wait(t)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn frame(id: u64, payload: &[u8]) -> Vec<u8> {
        let h = Header {
            len: payload.len() as u32,
            id,
            op: op::READ,
            flags: 0,
        };
        let mut f = h.encode().to_vec();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_are_cut_from_whatever_the_socket_delivers() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        // Nothing yet: idle, not broken.
        assert!(matches!(r.read_frame(None), Err(ReadError::Idle)));
        // Several frames in one write, one larger than the read-ahead, and
        // a frame trickling in byte by byte.
        let big: Vec<u8> = (0..READ_AHEAD as u32 * 3)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut all = frame(1, b"one");
        all.extend(frame(2, &[]));
        all.extend(frame(3, &big));
        let writer = std::thread::spawn(move || {
            b.write_all(&all).unwrap();
            for byte in frame(4, b"slow") {
                b.write_all(&[byte]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            // Half a frame, then the server goes away.
            b.write_all(&frame(5, b"cut short")[..20]).unwrap();
        });
        let mut got = Vec::new();
        for _ in 0..4 {
            let (h, p) = r.read_frame(None).unwrap_or_else(|_| panic!("frame"));
            got.push((h.id, p));
        }
        assert_eq!(got[0], (1, Bytes::from_static(b"one")));
        assert_eq!(got[1], (2, Bytes::new()));
        assert_eq!(got[2], (3, Bytes::from(big)));
        assert_eq!(got[3], (4, Bytes::from_static(b"slow")));
        writer.join().unwrap();
        assert!(matches!(r.read_frame(None), Err(ReadError::Broken(_))));
        // A server that stops in the middle of a frame but keeps the
        // connection: broken after a few read timeouts, not idle forever.
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        b.write_all(&frame(6, b"stalled")[..10]).unwrap();
        assert!(matches!(r.read_frame(None), Err(ReadError::Broken(_))));
        drop(b);
    }

    fn data(d: &[u8]) -> Vec<u8> {
        let mut p = vec![DATA_TAG];
        p.extend_from_slice(d);
        p
    }

    /// The data of a reply to the id given lands in the destination, all of
    /// it and nothing else: whether it arrives with other frames, byte by
    /// byte, short (end of file), too long for the destination, as an error
    /// or as another kind of reply; other ids' frames are read whole.
    /// (With `next`, bytes of other frames may pass through the
    /// destination on their way: the caller owns all of it and fills all
    /// of it on success; without, the destination is not touched but by
    /// the data.)
    #[test]
    fn read_data_lands_in_the_destination() {
        read_data_lands(true);
        read_data_lands(false);
    }

    fn read_data_lands(next: bool) {
        let untouched = |d: &[u8]| {
            if !next {
                assert!(d.iter().all(|&x| x == 0xee), "destination touched");
            }
        };
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        let big: Vec<u8> = (0..47_008u32).map(|i| (i % 253) as u8).collect();
        let mut err = Header {
            len: 8,
            id: 9,
            op: op::READ,
            flags: FLAG_ERROR,
        }
        .encode()
        .to_vec();
        err.extend_from_slice(b"not data");
        let mut all = frame(1, &data(b"other"));
        all.extend(frame(2, &data(&big)));
        all.extend(frame(3, &data(b"next")));
        all.extend(err.clone());
        all.extend(frame(9, &data(&big[..100])));
        all.extend(frame(9, &[0]));
        all.extend(frame(9, &data(&big)));
        let (b2, big2) = (big.clone(), big.clone());
        let writer = std::thread::spawn(move || {
            b.write_all(&all).unwrap();
            // Trickling in: in pieces smaller than the header.
            for piece in frame(7, &data(&big2)).chunks(7000) {
                for p in piece.chunks(if piece.len() > 100 { 5000 } else { 3 }) {
                    b.write_all(p).unwrap();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            b.write_all(&frame(8, &data(b"after"))).unwrap();
            b
        });
        let whole = |f: Frame| match f {
            Frame::Whole(h, p) => (h, p),
            Frame::Landed(_) => panic!("landed"),
        };
        let read = |r: &mut FrameReader, id: u64, d: &mut [u8]| {
            r.read_frame_into(None, Some((id, d)), next)
                .unwrap_or_else(|_| panic!("frame"))
        };
        let mut dst = vec![0xeeu8; 47_008];
        // Another id's frame, while waiting for 2.
        let (h, p) = whole(read(&mut r, 2, &mut dst));
        assert_eq!((h.id, &p[1..]), (1, &b"other"[..]));
        untouched(&dst);
        assert!(matches!(read(&mut r, 2, &mut dst), Frame::Landed(47_008)));
        assert_eq!(dst, big);
        // What followed in the same read is intact.
        let (h, p) = whole(
            r.read_frame_into(None, None, false)
                .unwrap_or_else(|_| panic!()),
        );
        assert_eq!((h.id, &p[1..]), (3, &b"next"[..]));
        // An error reply is not data.
        let mut dst = vec![0xeeu8; 47_008];
        let (h, p) = whole(read(&mut r, 9, &mut dst));
        assert_ne!(h.flags & FLAG_ERROR, 0);
        assert_eq!(&p[..], b"not data");
        untouched(&dst);
        // A short reply fills only its part.
        assert!(matches!(read(&mut r, 9, &mut dst), Frame::Landed(100)));
        assert_eq!(dst[..100], big[..100]);
        untouched(&dst[100..]);
        // Another kind of reply is read whole.
        let (_, p) = whole(read(&mut r, 9, &mut dst));
        assert_eq!(&p[..], &[0]);
        // Data longer than the destination is read whole.
        let mut small = vec![0xeeu8; 1000];
        let (_, p) = whole(read(&mut r, 9, &mut small));
        assert_eq!(&p[1..], &big[..]);
        untouched(&small);
        // Trickling in.
        let mut dst = vec![0u8; 50_000];
        assert!(matches!(read(&mut r, 7, &mut dst), Frame::Landed(47_008)));
        assert_eq!(dst[..47_008], b2[..]);
        let (h, p) = whole(read(&mut r, 7, &mut dst));
        assert_eq!((h.id, &p[1..]), (8, &b"after"[..]));
        let b = writer.join().unwrap();
        // The server goes away in the middle of the data.
        let mut b = b;
        b.write_all(&frame(10, &data(&big))[..30_000]).unwrap();
        drop(b);
        assert!(matches!(
            r.read_frame_into(None, Some((10, &mut dst)), next),
            Err(ReadError::Broken(_))
        ));
    }

    /// Replies in flight are found by id whatever the order they are
    /// filed and taken in (the id hash), among many.
    #[test]
    fn pending_replies_are_found_by_id() {
        let mut st = State::default();
        let ids: Vec<u64> = (1..=5000u64).map(|i| i * 7919 % 5003 + (i << 40)).collect();
        for &id in &ids {
            assert!(st.pending.insert(id, None).is_none());
        }
        for &id in ids.iter().rev().step_by(2) {
            st.pending.insert(id, Some(Ok(Response::Ok)));
        }
        for (k, &id) in ids.iter().enumerate() {
            let filed = st.pending.remove(&id).expect("pending");
            assert_eq!(
                filed.is_some(),
                (ids.len() - 1 - k).is_multiple_of(2),
                "{id}"
            );
        }
        assert!(st.pending.is_empty());
    }

    /// A thread's encode buffer is used again, empty each time; a nested
    /// use gets a buffer of its own; a buffer grown large is not kept.
    #[test]
    fn encode_buffers_are_kept_per_thread() {
        let p1 = with_buffer(&HEAD, |b| {
            b.extend_from_slice(b"first");
            b.as_ptr() as usize
        });
        let p2 = with_buffer(&HEAD, |b| {
            assert!(b.is_empty());
            b.extend_from_slice(b"second");
            let inner = with_buffer(&HEAD, |c| {
                assert!(c.is_empty());
                c.push(1);
                c.as_ptr() as usize
            });
            assert_ne!(inner, b.as_ptr() as usize);
            assert_eq!(&b[..], b"second");
            b.as_ptr() as usize
        });
        assert_eq!(p1, p2);
        with_buffer(&HEAD, |b| b.resize(KEEP_ENCODE + 1, 0));
        assert_eq!(with_buffer(&HEAD, |b| b.capacity()), 0);
    }

    /// A data reply that has arrived whole is read with one recvmsg(2):
    /// head and tag into the connection's buffer, data into the caller's
    /// (a lone reply; then two replies queued together, the second one's
    /// head and first bytes taken by the first call).
    #[test]
    fn a_reply_in_hand_costs_one_system_call() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        let big: Vec<u8> = (0..47_008u32).map(|i| (i % 249) as u8).collect();
        let mut dst = vec![0u8; 47_008];
        b.write_all(&frame(1, &data(&big))).unwrap();
        assert!(matches!(
            r.read_frame_into(None, Some((1, &mut dst)), true),
            Ok(Frame::Landed(47_008))
        ));
        assert_eq!(dst, big);
        assert_eq!(r.recvs, 1);
        let mut two = frame(2, &data(&big[..30_000]));
        two.extend(frame(3, &data(&big[30_000..])));
        b.write_all(&two).unwrap();
        let mut d2 = vec![0u8; 30_000];
        let mut d3 = vec![0u8; 17_008];
        assert!(matches!(
            r.read_frame_into(None, Some((2, &mut d2)), true),
            Ok(Frame::Landed(30_000))
        ));
        assert!(matches!(
            r.read_frame_into(None, Some((3, &mut d3)), true),
            Ok(Frame::Landed(17_008))
        ));
        assert_eq!((&d2[..], &d3[..]), (&big[..30_000], &big[30_000..]));
        assert_eq!(r.recvs, 3);
        // Not likely next (other requests in flight): the head alone
        // first, then the data.
        b.write_all(&frame(4, &data(&big))).unwrap();
        assert!(matches!(
            r.read_frame_into(None, Some((4, &mut dst)), false),
            Ok(Frame::Landed(47_008))
        ));
        assert_eq!(dst, big);
        assert_eq!(r.recvs, 5);
    }

    /// Waits until the peer of `s` has read all that was written to it.
    fn drained(s: &UnixStream) {
        loop {
            let mut q: libc::c_int = 0;
            // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int.
            let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut q) };
            assert_eq!(rc, 0);
            if q == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// What a read with a destination must give, in order.
    enum Expect {
        /// The data landed: these bytes, at the start of a destination
        /// of this size.
        Landed(Vec<u8>, usize),
        /// A frame read whole: its id, flags and payload (asked for with
        /// a destination of this size).
        Whole(u64, u16, Vec<u8>, usize),
    }

    /// Frames cut at every byte boundary (the reader has taken the first
    /// part before the second is sent): the data of the awaited reply
    /// lands whole, and what the one read into the caller's buffer took
    /// from other frames (one before it, the next frames after a short
    /// reply, an error, a non-data reply, data too long) is read back
    /// intact, in order.
    #[test]
    fn frames_cut_anywhere_land_or_are_read_whole() {
        let d: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut err = Header {
            len: 5,
            id: 1,
            op: op::READ,
            flags: FLAG_ERROR,
        }
        .encode()
        .to_vec();
        err.extend_from_slice(b"error");
        let next = |id| frame(id, &data(b"next frame"));
        let whole_next = |id| Expect::Whole(id, 0, data(b"next frame"), 300);
        let cases: Vec<(Vec<u8>, Vec<Expect>)> = vec![
            // The data, then another frame.
            (
                [frame(1, &data(&d)), next(5)].concat(),
                vec![Expect::Landed(d.clone(), 300), whole_next(5)],
            ),
            // A short reply followed by frames that reach into the rest of
            // the destination and past it.
            (
                [frame(1, &data(&d[..40])), frame(6, &data(&d)), next(5)].concat(),
                vec![
                    Expect::Landed(d[..40].to_vec(), 300),
                    Expect::Whole(6, 0, data(&d), 0),
                    whole_next(5),
                ],
            ),
            // Another id's frame first.
            (
                [frame(7, &data(&d[..50])), frame(1, &data(&d)), next(5)].concat(),
                vec![
                    Expect::Whole(7, 0, data(&d[..50]), 300),
                    Expect::Landed(d.clone(), 300),
                    whole_next(5),
                ],
            ),
            // An error reply, a non-data reply, data too long.
            (
                [err, frame(1, &[0]), frame(1, &data(&d)), next(5)].concat(),
                vec![
                    Expect::Whole(1, FLAG_ERROR, b"error".to_vec(), 300),
                    Expect::Whole(1, 0, vec![0], 300),
                    Expect::Whole(1, 0, data(&d), 299),
                    whole_next(5),
                ],
            ),
        ];
        // The destination whole, and in parts (the places of a
        // `ReadSpans`' spans): 7 bytes, 1, 90, the rest.
        fn split(dst: &mut [u8], parts: bool) -> Vec<&mut [u8]> {
            if !parts {
                return vec![dst];
            }
            let mut v = Vec::new();
            let mut rest = dst;
            for n in [7, 1, 90] {
                let (a, b) = std::mem::take(&mut rest).split_at_mut(n.min(rest.len()));
                v.push(a);
                rest = b;
            }
            v.push(rest);
            v
        }
        for (bytes, expect, next, parts) in cases.iter().flat_map(|(b, e)| {
            [(b, e, true), (b, e, false)]
                .into_iter()
                .flat_map(|(b, e, n)| [(b, e, n, false), (b, e, n, true)])
        }) {
            for cut in 1..bytes.len() {
                let (a, mut b) = UnixStream::pair().unwrap();
                a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut r = FrameReader::new(Stream::Unix(a));
                let (first, second) = (bytes[..cut].to_vec(), bytes[cut..].to_vec());
                let writer = std::thread::spawn(move || {
                    b.write_all(&first).unwrap();
                    drained(&b);
                    b.write_all(&second).unwrap();
                    b
                });
                for (i, e) in expect.iter().enumerate() {
                    let at = format!("cut at {cut}, read {i}, next {next}, parts {parts}");
                    match e {
                        Expect::Landed(want, size) => {
                            let mut dst = vec![0xeeu8; *size];
                            let mut d = split(&mut dst, parts);
                            match r.read_frame_parts(None, Some((1, &mut d)), next) {
                                Ok(Frame::Landed(n)) => {
                                    drop(d);
                                    assert_eq!(&dst[..n], &want[..], "{at}")
                                }
                                _ => panic!("{at}: not landed"),
                            }
                        }
                        Expect::Whole(id, flags, want, size) => {
                            let mut dst = vec![0xeeu8; *size];
                            let mut d = split(&mut dst, parts);
                            let into = (*size > 0).then_some((1, &mut d[..]));
                            match r.read_frame_parts(None, into, next) {
                                Ok(Frame::Whole(h, p)) => {
                                    assert_eq!(
                                        (h.id, h.flags, &p[..]),
                                        (*id, *flags, &want[..]),
                                        "{at}"
                                    )
                                }
                                _ => panic!("{at}: not whole"),
                            }
                        }
                    }
                }
                let _b = writer.join().unwrap();
                assert!(r.buf.is_empty(), "cut at {cut}: bytes left over");
            }
        }
    }

    /// Replies held while more are read (a 1 MiB read holds its chunk
    /// replies until all have come) make the reader use other buffers;
    /// once the replies are gone those are used again, not allocated
    /// afresh each time (their pages would be faulted in again).
    #[test]
    fn buffers_of_held_replies_are_used_again() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        // Each round: 16 replies of 32 KiB (twice the read-ahead) held
        // together, then dropped.
        let (rounds, per_round) = (20u64, 16u64);
        let payload = vec![3u8; 32 << 10];
        let p = payload.clone();
        let writer = std::thread::spawn(move || {
            for id in 0..rounds * per_round {
                b.write_all(&frame(id, &p)).unwrap();
            }
            b
        });
        for round in 0..rounds {
            let held: Vec<(Header, Bytes)> = (0..per_round)
                .map(|_| r.read_frame(None).unwrap_or_else(|_| panic!("frame")))
                .collect();
            for (i, (h, p)) in held.iter().enumerate() {
                assert_eq!(h.id, round * per_round + i as u64);
                assert!(p[..] == payload[..]);
            }
        }
        let _b = writer.join().unwrap();
        // Without using them again, every round needs a new buffer at
        // least (its first is still held when the read-ahead runs out).
        assert!(
            r.allocated <= SPARES as u64 + 1,
            "{} buffers allocated in {rounds} rounds",
            r.allocated
        );
    }

    #[test]
    fn a_buffer_grown_for_a_large_reply_is_not_kept() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = FrameReader::new(Stream::Unix(a));
        let big = vec![7u8; KEEP_MAX + (1 << 20)];
        let writer = std::thread::spawn(move || {
            b.write_all(&frame(1, &big)).unwrap();
            b.write_all(&frame(2, b"small")).unwrap();
            b
        });
        let (_, p) = r.read_frame(None).unwrap_or_else(|_| panic!("frame"));
        assert_eq!(p.len(), KEEP_MAX + (1 << 20));
        drop(p);
        let (h, p) = r.read_frame(None).unwrap_or_else(|_| panic!("frame"));
        assert_eq!((h.id, &p[..]), (2, &b"small"[..]));
        drop(p);
        let _b = writer.join().unwrap();
        // The next read starts from a buffer of ordinary size (nothing
        // comes: it times out).
        r.s.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let mut stalls = 0;
        let _ = r.fill(HEADER_LEN, &mut stalls, None, usize::MAX);
        assert!(r.buf.capacity() <= KEEP_MAX, "{}", r.buf.capacity());
    }
}
