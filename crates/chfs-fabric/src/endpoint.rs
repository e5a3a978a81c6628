//! A reliable datagram endpoint: messages into pre-posted receive
//! buffers, RMA reads and writes, completions waited for without spinning.
//!
//! Any thread may post and wait. Completions come from one queue; the
//! first thread that needs one reads the queue (blocking on its wait
//! object, so an idle endpoint costs no CPU) and files what it finds for
//! the others, who wait on a condition variable: a lone caller pays no
//! thread hop (the client's leader/follower pattern, `chfs-client`'s
//! `conn.rs`). Every wait has a deadline: a peer that died or never
//! answers gives an error, never a hang.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::addr::{Address, Protocol};
use crate::cache::{CacheStats, RegCache, Registered};
use crate::error::{Error, Result};
use crate::ffi::{
    self, Buffer, Completion, Domain, DomainAttr, Ep, Lent, Local, Op, Pinned, PostError,
    RemoteKey, StableBuf, WaitKind, Window,
};

/// How to open an endpoint.
#[derive(Debug, Clone)]
pub struct Config {
    /// The transport.
    pub protocol: Protocol,
    /// Local address to bind (an IP address for tcp; None: the provider's
    /// choice).
    pub node: Option<String>,
    /// Local port or service (None or "0": any free one).
    pub service: Option<String>,
    /// Receive buffers posted at all times (default 16).
    pub recv_buffers: usize,
    /// Largest message, the size of each receive buffer (default
    /// 64 KiB + 4 KiB: a chunk of the default size with its request).
    /// Peers must agree on it.
    pub max_message: usize,
    /// Completion queue entries (0: the provider's default).
    pub cq_size: usize,
    /// Bytes the registration cache may hold registered (default 256 MiB).
    pub cache_limit: usize,
    /// For how long after a completion a waiter reads the queue without
    /// sleeping, in microseconds (default 0: it blocks at once; a
    /// provider without a wait object spins at least 200 us). Like
    /// `CHFS_POLL_USEC`, this trades CPU for latency.
    pub poll_usec: u64,
}

impl Config {
    /// Defaults for `protocol`, bound where the provider chooses.
    pub fn new(protocol: Protocol) -> Config {
        Config {
            protocol,
            node: None,
            service: None,
            recv_buffers: 16,
            max_message: 64 * 1024 + 4096,
            cq_size: 0,
            cache_limit: 256 << 20,
            poll_usec: 0,
        }
    }

    /// Binds to `node` (and `service`, a port for tcp).
    pub fn bind(mut self, node: &str, service: Option<&str>) -> Config {
        self.node = Some(node.to_string());
        self.service = service.map(str::to_string);
        self
    }
}

/// A peer in the endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer(u64);

/// Counters of an endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Messages sent.
    pub sends: u64,
    /// Messages received.
    pub recvs: u64,
    /// RMA reads completed.
    pub reads: u64,
    /// RMA writes completed.
    pub writes: u64,
    /// Operations whose completion was not read in time.
    pub timeouts: u64,
    /// Transfers that went through a copy because the memory could not be
    /// registered.
    pub reg_fallbacks: u64,
    /// The registration cache's counters.
    pub cache: CacheStats,
    /// Completions read while reading the queue without sleeping, soon
    /// after the one before (`Config::poll_usec`): waits that cost no
    /// wake-up.
    pub spun: u64,
    /// Waits that slept in the kernel (`poll(2)` on the queue's
    /// descriptor) or napped.
    pub slept: u64,
    /// Times the thread reading the queue woke threads waiting for its
    /// news (none for a lone caller).
    pub notified: u64,
}

/// A received message: its bytes lie in a receive buffer, which goes back
/// to the provider when this is dropped.
pub struct Message<'a> {
    ep: &'a Endpoint,
    buffer: Option<Buffer>,
    len: usize,
}

impl Message<'_> {
    /// The message's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buffer.as_ref().expect("held until drop")[..self.len]
    }
}

impl Drop for Message<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            let mut st = self.ep.lock();
            self.ep.post_recv(&mut st, b);
        }
    }
}

/// A completion filed for its waiter.
struct Done {
    status: std::result::Result<(), (i32, i32)>,
    buffer: Option<Buffer>,
}

struct Incoming {
    buffer: Buffer,
    len: usize,
    status: std::result::Result<(), (i32, i32)>,
}

#[derive(Default)]
struct State {
    /// A thread is reading the completion queue.
    polling: bool,
    /// Threads asleep on the condition variable, waiting for the reader's
    /// news: it is signalled only when there are some (a notification is
    /// a futex system call even with nobody to wake, one per wait of a
    /// lone caller).
    sleepers: usize,
    done: HashMap<u64, Done>,
    /// Operations whose waiter gave up: their completions are dropped.
    abandoned: HashSet<u64>,
    /// Ids of posted receives.
    recv_ids: HashSet<u64>,
    received: VecDeque<Incoming>,
    /// Receive buffers not posted (the queue was full): posted again after
    /// the next read of completions.
    repost: Vec<Buffer>,
    /// Send buffers free for reuse.
    send_pool: Vec<Buffer>,
    /// Tasks awaiting an [`InFlight`] operation, woken when its
    /// completion is filed.
    wakers: HashMap<u64, Waker>,
}

/// An open endpoint.
pub struct Endpoint {
    // Field order is drop order: the endpoint closes before the cache's
    // registrations and the buffers go.
    ep: Ep,
    /// Over shm, the provider's queue file of this endpoint, unlinked at
    /// the process's exit if the endpoint is still open then (dropped
    /// after `ep`: the provider unlinks it at the close).
    _shm_file: Option<ffi::ShmFile>,
    state: Mutex<State>,
    cv: Condvar,
    cache: RegCache,
    address: Address,
    max_message: usize,
    sends: AtomicU64,
    recvs: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    timeouts: AtomicU64,
    reg_fallbacks: AtomicU64,
    spun: AtomicU64,
    slept: AtomicU64,
    notified: AtomicU64,
    /// Reads of the completion queue still to fail
    /// ([`Endpoint::fail_completion_reads`]: a test's fault).
    failing_reads: AtomicU64,
    /// When the endpoint was opened, and the last completion since (ns).
    born: Instant,
    last_event: AtomicU64,
    /// How long after a completion waiters read without sleeping.
    spin: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("address", &self.address.to_string())
            .field("attr", self.ep.domain().attr())
            .finish()
    }
}

/// When to give up, and the time allowed (for the error).
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    allowed: Duration,
}

impl Deadline {
    fn after(allowed: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + allowed,
            allowed,
        }
    }
}

/// Longest single wait on the queue: a follower whose deadline passes
/// while another thread waits is woken by the condition variable, the
/// reader itself by this.
const MAX_POLL_MS: u64 = 1000;

impl Endpoint {
    /// Opens an endpoint and posts its receive buffers.
    pub fn open(cfg: &Config) -> Result<Endpoint> {
        if cfg.recv_buffers == 0 || cfg.max_message == 0 {
            return Err(Error::InvalidInput(
                "an endpoint needs receive buffers of at least one byte".into(),
            ));
        }
        if cfg.protocol == Protocol::Shm {
            clear_stale_shm_regions();
        }
        let domain = Domain::open(
            cfg.protocol.provider(),
            cfg.node.as_deref(),
            cfg.service.as_deref(),
        )?;
        let ep = Ep::open(&domain, cfg.cq_size)?;
        let ep_wait = ep.wait_kind();
        let raw = ep.name()?;
        let shm_file = match cfg.protocol {
            Protocol::Shm => shm_file_name(&raw).and_then(|n| ffi::ShmFile::record(&n)),
            _ => None,
        };
        let endpoint = Endpoint {
            cache: RegCache::new(&domain, cfg.cache_limit),
            ep,
            _shm_file: shm_file,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            address: Address {
                protocol: cfg.protocol,
                raw,
            },
            max_message: cfg.max_message,
            sends: AtomicU64::new(0),
            recvs: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            spun: AtomicU64::new(0),
            slept: AtomicU64::new(0),
            notified: AtomicU64::new(0),
            failing_reads: AtomicU64::new(0),
            reg_fallbacks: AtomicU64::new(0),
            born: Instant::now(),
            last_event: AtomicU64::new(0),
            spin: Duration::from_micros(match ep_wait {
                // Without a wait object, at least 200 us: a sleep costs
                // 60 us or more.
                WaitKind::Sleep => cfg.poll_usec.max(200),
                WaitKind::Fd => cfg.poll_usec,
            }),
        };
        {
            let mut st = endpoint.lock();
            for _ in 0..cfg.recv_buffers {
                let b = Buffer::new(&domain, cfg.max_message)?;
                match endpoint
                    .ep
                    .post(Op::Recv, Local::Buffer(b), 0, cfg.max_message, 0)
                {
                    Ok(id) => {
                        st.recv_ids.insert(id);
                    }
                    Err(e) => return Err(e.error),
                }
            }
        }
        Ok(endpoint)
    }

    /// Its address, for peers (`ofi+tcp://127.0.0.1:PORT`).
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The provider's facts (name, domain, inject size, MR mode).
    pub fn attr(&self) -> &DomainAttr {
        self.ep.domain().attr()
    }

    /// How the completion queue is waited on.
    pub fn wait_kind(&self) -> WaitKind {
        self.ep.wait_kind()
    }

    /// The largest message.
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// Adds a peer.
    pub fn connect(&self, addr: &Address) -> Result<Peer> {
        if addr.protocol != self.address.protocol {
            return Err(Error::BadAddress {
                input: addr.to_string(),
                why: format!("this endpoint speaks {}", self.address.protocol),
            });
        }
        self.ep
            .insert(&addr.raw, self.address.raw.len())
            .map(Peer)
            .map_err(|e| match e {
                Error::InvalidInput(why) => Error::BadAddress {
                    input: addr.to_string(),
                    why,
                },
                other => other,
            })
    }

    /// Removes a peer (a new `connect` may add it again).
    pub fn disconnect(&self, peer: Peer) -> Result<()> {
        self.ep.remove(peer.0)
    }

    /// A registered buffer of `len` bytes (for receiving RMA reads and
    /// sending without a copy).
    pub fn buffer(&self, len: usize) -> Result<Buffer> {
        Buffer::new(self.ep.domain(), len)
    }

    /// A window of `len` bytes peers may read and write.
    pub fn window(&self, len: usize) -> Result<Arc<Window>> {
        Window::new(self.ep.domain(), len)
    }

    /// Lets peers read `buf` with RMA while `f` runs (registered for the
    /// call, closed before it returns).
    pub fn expose<R>(&self, buf: &[u8], f: impl FnOnce(RemoteKey) -> R) -> Result<R> {
        ffi::expose(self.ep.domain(), buf, f)
    }

    /// Lets peers write `buf` with RMA while `f` runs.
    pub fn expose_mut<R>(&self, buf: &mut [u8], f: impl FnOnce(RemoteKey) -> R) -> Result<R> {
        ffi::expose_mut(self.ep.domain(), buf, f)
    }

    /// Lends `buf` to peers for remote reads until the [`Lent`] drops
    /// (see there: revoked on drop where the provider revokes).
    ///
    /// # Safety
    /// The [`Lent`] must be dropped, never leaked (`mem::forget`, a cycle
    /// of `Arc`s), before the borrow ends: only its drop closes the
    /// registration, so a leaked one would let peers reach the memory
    /// after its owner got it back (or freed it). The borrow alone cannot
    /// promise that, which is why [`Endpoint::expose`] takes a closure.
    pub unsafe fn lend<'a>(&self, buf: &'a [u8]) -> Result<Lent<'a>> {
        Lent::new(self.ep.domain(), buf)
    }

    /// Lends `buf` to peers for remote writes (and reads) until the
    /// [`Lent`] drops; gives the borrow back with the error if the memory
    /// cannot be registered.
    ///
    /// # Safety
    /// As for [`Endpoint::lend`]: the [`Lent`] must be dropped, never
    /// leaked, before the borrow ends (peers may write the memory until
    /// then).
    pub unsafe fn lend_mut<'a>(
        &self,
        buf: &'a mut [u8],
    ) -> std::result::Result<Lent<'a>, (Error, &'a mut [u8])> {
        Lent::new_mut(self.ep.domain(), buf)
    }

    /// The registration of `buf` through the cache.
    pub fn register<B: StableBuf>(&self, buf: B) -> Result<Registered> {
        self.cache.get(buf).map_err(|(e, _)| e)
    }

    /// A registration of `buf` of its own, outside the cache: closed when
    /// the last holder of the returned [`Pinned`] (an operation in flight
    /// holds it) drops it, and `buf` with it. For memory whose owner may
    /// let go of it at any time (a store's chunk): a cache entry would
    /// keep it allocated until evicted. Gives `buf` back with the error
    /// where the provider refuses to register it.
    pub fn pin<B: StableBuf>(&self, buf: B) -> std::result::Result<Arc<Pinned>, (Error, B)> {
        Pinned::new(self.ep.domain(), buf)
    }

    /// `buf` kept for this endpoint's own operations (the source of sends
    /// and RMA writes), registered only where the provider needs that
    /// ([`Pinned::new_local`]).
    pub fn hold<B: StableBuf>(&self, buf: B) -> std::result::Result<Arc<Pinned>, (Error, B)> {
        Pinned::new_local(self.ep.domain(), buf)
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            sends: self.sends.load(Ordering::Relaxed),
            recvs: self.recvs.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            reg_fallbacks: self.reg_fallbacks.load(Ordering::Relaxed),
            cache: self.cache.stats(),
            spun: self.spun.load(Ordering::Relaxed),
            slept: self.slept.load(Ordering::Relaxed),
            notified: self.notified.load(Ordering::Relaxed),
        }
    }

    /// For how long after a completion a waiter reads the queue without
    /// sleeping (`Config::poll_usec`, at least 200 us without a wait
    /// object).
    pub fn poll_window(&self) -> Duration {
        self.spin
    }

    /// Sends `data` (at most [`Endpoint::max_message`] bytes) and waits
    /// until the provider is done with it.
    pub fn send(&self, peer: Peer, data: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout);
        self.check_message(data.len())?;
        if data.len() <= self.attr().inject_size {
            loop {
                match self.ep.inject(data, peer.0) {
                    Ok(()) => {
                        self.sends.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(Error::Call { code: 11, .. }) => self.progress_until(deadline, "send")?,
                    Err(e) => return Err(e),
                }
            }
        }
        let pooled = self.lock().send_pool.pop();
        let mut b = match pooled {
            Some(b) => b,
            None => self.buffer(self.max_message)?,
        };
        b[..data.len()].copy_from_slice(data);
        let done = self.run(
            Op::Send,
            Local::Buffer(b),
            0,
            data.len(),
            peer,
            deadline,
            "send",
        )?;
        self.sends.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = done {
            self.lock().send_pool.push(b);
        }
        Ok(())
    }

    /// Sends `data` (at most [`Endpoint::max_message`] bytes) without
    /// waiting for anything: injected ([`Sent::Done`]), posted (its
    /// completion is the returned future's; dropping it leaves the copy
    /// with the endpoint until the provider is done), or not sent at all
    /// because the provider's queue is full ([`Sent::Again`]: try again
    /// after progress). A peer that does not take its messages never holds
    /// the caller, as [`Endpoint::send`] does until its timeout.
    pub fn try_send(self: &Arc<Self>, peer: Peer, data: &[u8]) -> Result<Sent> {
        self.check_message(data.len())?;
        if data.len() <= self.attr().inject_size {
            return match self.ep.inject(data, peer.0) {
                Ok(()) => {
                    self.sends.fetch_add(1, Ordering::Relaxed);
                    Ok(Sent::Done)
                }
                Err(Error::Call { code: 11, .. }) => Ok(Sent::Again),
                Err(e) => Err(e),
            };
        }
        let pooled = self.lock().send_pool.pop();
        let mut b = match pooled {
            Some(b) => b,
            None => self.buffer(self.max_message)?,
        };
        b[..data.len()].copy_from_slice(data);
        match self
            .ep
            .post(Op::Send, Local::Buffer(b), 0, data.len(), peer.0)
        {
            Ok(id) => {
                self.sends.fetch_add(1, Ordering::Relaxed);
                Ok(Sent::Posted(InFlight {
                    ep: self.clone(),
                    id,
                    name: "send",
                    finished: false,
                }))
            }
            Err(e) if e.is_again() => {
                if let Local::Buffer(b) = e.local {
                    self.lock().send_pool.push(b);
                }
                Ok(Sent::Again)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Sends `len` bytes of `buf` at `off` without copying; gives the
    /// buffer back.
    pub fn send_buffer(
        &self,
        peer: Peer,
        buf: Buffer,
        off: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<Buffer> {
        self.check_message(len)?;
        let deadline = Deadline::after(timeout);
        let b = self.run(
            Op::Send,
            Local::Buffer(buf),
            off,
            len,
            peer,
            deadline,
            "send",
        )?;
        self.sends.fetch_add(1, Ordering::Relaxed);
        Ok(b.expect("a buffer posted comes back"))
    }

    /// Waits for the next message.
    pub fn recv(&self, timeout: Duration) -> Result<Message<'_>> {
        let deadline = Deadline::after(timeout);
        let mut st = self.lock();
        loop {
            if let Some(inc) = st.received.pop_front() {
                if let Err((code, prov)) = inc.status {
                    self.post_recv(&mut st, inc.buffer);
                    return Err(failed("recv", code, prov));
                }
                self.recvs.fetch_add(1, Ordering::Relaxed);
                return Ok(Message {
                    ep: self,
                    buffer: Some(inc.buffer),
                    len: inc.len,
                });
            }
            st = self.wait_turn(st, deadline, "recv", None)?;
        }
    }

    /// RMA write of `len` bytes of `local` at `off` into the peer's memory
    /// `remote` at `roff`; waits for its completion (the data is then in
    /// the peer's memory). Gives a buffer back.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        peer: Peer,
        local: Local,
        off: usize,
        len: usize,
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<Option<Buffer>> {
        let deadline = Deadline::after(timeout);
        let b = self.run(
            Op::Write(remote, roff),
            local,
            off,
            len,
            peer,
            deadline,
            "write",
        )?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(b)
    }

    /// RMA write of `data` (registered through the cache; where it cannot
    /// be registered, copied into a registered buffer, counted as
    /// `reg_fallbacks`).
    pub fn write_from<B: StableBuf>(
        &self,
        peer: Peer,
        data: B,
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<()> {
        match self.cache.get(data) {
            Ok(r) => {
                let local = Local::Pinned(r.pinned.clone());
                self.write(peer, local, r.off, r.len, remote, roff, timeout)?;
                Ok(())
            }
            Err((_, data)) => self.write_copy(peer, data.as_ref(), remote, roff, timeout),
        }
    }

    /// RMA write of `data` through a registered copy: for memory that
    /// cannot be registered (or is not owned).
    pub fn write_copy(
        &self,
        peer: Peer,
        data: &[u8],
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<()> {
        self.reg_fallbacks.fetch_add(1, Ordering::Relaxed);
        let mut b = self.buffer(data.len())?;
        b.copy_from_slice(data);
        self.write(peer, Local::Buffer(b), 0, data.len(), remote, roff, timeout)?;
        Ok(())
    }

    /// RMA read of `len` bytes of the peer's memory `remote` at `roff`
    /// into `local` at `off`; waits for its completion. Gives a buffer
    /// back.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        peer: Peer,
        local: Local,
        off: usize,
        len: usize,
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<Option<Buffer>> {
        let deadline = Deadline::after(timeout);
        let b = self.run(
            Op::Read(remote, roff),
            local,
            off,
            len,
            peer,
            deadline,
            "read",
        )?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(b)
    }

    /// Starts an RMA read like [`Endpoint::read`] and returns at once: the
    /// returned future completes when a thread reading this endpoint's
    /// queue (a progress thread looping on [`Endpoint::progress`] or
    /// [`Endpoint::recv`]) files its completion, so async tasks never
    /// block on the fabric. `timeout` bounds only the post (a full
    /// queue); bound the wait with the runtime's timer. Dropping the
    /// future abandons the operation (its memory stays with the endpoint
    /// until the provider is done).
    #[allow(clippy::too_many_arguments)]
    pub fn start_read(
        self: &Arc<Self>,
        peer: Peer,
        local: Local,
        off: usize,
        len: usize,
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<InFlight> {
        self.start(
            Op::Read(remote, roff),
            local,
            off,
            len,
            peer,
            timeout,
            "read",
        )
    }

    /// Starts an RMA write; as [`Endpoint::start_read`].
    #[allow(clippy::too_many_arguments)]
    pub fn start_write(
        self: &Arc<Self>,
        peer: Peer,
        local: Local,
        off: usize,
        len: usize,
        remote: RemoteKey,
        roff: u64,
        timeout: Duration,
    ) -> Result<InFlight> {
        self.start(
            Op::Write(remote, roff),
            local,
            off,
            len,
            peer,
            timeout,
            "write",
        )
    }

    /// Starts an RMA write gathered from `pieces` into `places` (offset,
    /// length) of the peer's memory under `remote`, as
    /// [`Endpoint::start_write`]: the pieces' bytes, in order, fill the
    /// places in order. At most [`Endpoint::writev_limits`] of each.
    pub fn start_writev(
        self: &Arc<Self>,
        peer: Peer,
        mut pieces: Vec<crate::ffi::Piece>,
        places: &[(u64, u64)],
        remote: RemoteKey,
        timeout: Duration,
    ) -> Result<InFlight> {
        let deadline = Deadline::after(timeout);
        let id = loop {
            match self.ep.post_writev(pieces, places, remote, peer.0) {
                Ok(id) => break id,
                Err(e) if e.is_again() => {
                    pieces = e.local;
                    self.progress_until(deadline, "write")?;
                }
                Err(PostError { error, .. }) => return Err(error),
            }
        };
        Ok(InFlight {
            ep: self.clone(),
            id,
            name: "write",
            finished: false,
        })
    }

    /// Most local pieces and most places of the peer's memory of one
    /// [`Endpoint::start_writev`].
    pub fn writev_limits(&self) -> (usize, usize) {
        let a = self.attr();
        (
            a.iov_limit.clamp(1, crate::ffi::WRITEV_MAX),
            a.rma_iov_limit.clamp(1, crate::ffi::WRITEV_MAX),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        self: &Arc<Self>,
        op: Op,
        mut local: Local,
        off: usize,
        len: usize,
        peer: Peer,
        timeout: Duration,
        name: &'static str,
    ) -> Result<InFlight> {
        let deadline = Deadline::after(timeout);
        let id = loop {
            match self.ep.post(op, local, off, len, peer.0) {
                Ok(id) => break id,
                Err(e) if e.is_again() => {
                    local = e.local;
                    self.progress_until(deadline, name)?;
                }
                Err(PostError { error, .. }) => return Err(error),
            }
        };
        Ok(InFlight {
            ep: self.clone(),
            id,
            name,
            finished: false,
        })
    }

    /// Drives progress (RMA aimed at this endpoint needs it on providers
    /// with manual progress, such as tcp under rxm) for up to `timeout`,
    /// returning early when a message arrives. A server's progress thread
    /// is a loop of [`Endpoint::recv`], which does this.
    pub fn progress(&self, timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let st = self.lock();
        if !st.received.is_empty() {
            return Ok(());
        }
        match self.wait_turn(st, deadline, "progress", None) {
            Ok(_) | Err(Error::Timeout { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn check_message(&self, len: usize) -> Result<()> {
        if len > self.max_message {
            return Err(Error::InvalidInput(format!(
                "a message of {len} bytes; at most {} (the receive buffers' size)",
                self.max_message
            )));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts `op` and waits for its completion by `deadline`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        op: Op,
        mut local: Local,
        off: usize,
        len: usize,
        peer: Peer,
        deadline: Deadline,
        name: &'static str,
    ) -> Result<Option<Buffer>> {
        let id = loop {
            match self.ep.post(op, local, off, len, peer.0) {
                Ok(id) => break id,
                Err(e) if e.is_again() => {
                    local = e.local;
                    self.progress_until(deadline, name)?;
                }
                Err(PostError { error, .. }) => return Err(error),
            }
        };
        let mut st = self.lock();
        loop {
            if let Some(done) = st.done.remove(&id) {
                return match done.status {
                    Ok(()) => Ok(done.buffer),
                    Err((code, prov)) => Err(failed(name, code, prov)),
                };
            }
            st = match self.wait_turn(st, deadline, name, Some(id)) {
                Ok(st) => st,
                Err(e @ Error::Timeout { .. }) => return Err(e),
                Err(e) => {
                    // Reading the completion queue failed after the
                    // provider took the operation: whether it was carried
                    // out is not known (a send may have reached the peer).
                    let mut st = self.lock();
                    if let Some(done) = st.done.remove(&id) {
                        return match done.status {
                            Ok(()) => Ok(done.buffer),
                            Err((code, prov)) => Err(failed(name, code, prov)),
                        };
                    }
                    st.abandoned.insert(id);
                    return Err(Error::Unsettled {
                        op: name,
                        cause: Box::new(e),
                    });
                }
            };
        }
    }

    /// Makes the next `n` reads of the completion queue fail (with EIO) as
    /// if the provider had failed them: a fault for tests of what callers
    /// do when an operation's outcome cannot be learnt.
    #[doc(hidden)]
    pub fn fail_completion_reads(&self, n: u64) {
        self.failing_reads.store(n, Ordering::SeqCst);
    }

    /// Reads up to `max` completions (waiting at most `ms`), unless a
    /// fault says this read fails ([`Endpoint::fail_completion_reads`]).
    fn read_completions(&self, out: &mut Vec<Completion>, max: usize, ms: i32) -> Result<usize> {
        if self.failing_reads.load(Ordering::Relaxed) > 0
            && self
                .failing_reads
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(Error::Call {
                call: "fi_cq_read",
                code: libc::EIO,
                message: "completion queue read failed (injected fault)".into(),
            });
        }
        self.ep.poll(out, max, ms)
    }

    /// One read of completions (or, with another thread reading, one wait
    /// for it), then back: on a full queue.
    fn progress_until(&self, deadline: Deadline, name: &'static str) -> Result<()> {
        if Instant::now() >= deadline.at {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Timeout {
                op: name,
                after: deadline.allowed,
                posted: false,
            });
        }
        let st = self.lock();
        let soon = Deadline {
            at: deadline.at.min(Instant::now() + Duration::from_millis(1)),
            allowed: deadline.allowed,
        };
        match self.wait_turn(st, soon, name, None) {
            Ok(_) | Err(Error::Timeout { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits for something to happen: reads the queue itself if no other
    /// thread does, else waits for that thread's news. Past `deadline`,
    /// gives up on operation `id` (its completion will be dropped) and
    /// says so.
    fn wait_turn<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Deadline,
        name: &'static str,
        id: Option<u64>,
    ) -> Result<MutexGuard<'a, State>> {
        let now = Instant::now();
        if now >= deadline.at {
            if let Some(id) = id {
                st.abandoned.insert(id);
                self.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            return Err(Error::Timeout {
                op: name,
                after: deadline.allowed,
                posted: id.is_some(),
            });
        }
        let left = deadline.at - now;
        if st.polling {
            st.sleepers += 1;
            let mut st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.sleepers -= 1;
            return Ok(st);
        }
        st.polling = true;
        drop(st);
        let mut comps: Vec<Completion> = Vec::new();
        let since = self.since_event();
        let r = if since < self.spin {
            // Soon after the last completion: read again without sleeping,
            // yielding the CPU to anything else that wants it.
            let r = self.read_completions(&mut comps, 64, 0);
            match r {
                Ok(0) => std::thread::yield_now(),
                Ok(n) => {
                    self.spun.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(_) => {}
            }
            r
        } else if self.ep.wait_kind() == WaitKind::Fd {
            let ms = left.as_millis().clamp(1, MAX_POLL_MS as u128) as i32;
            self.slept.fetch_add(1, Ordering::Relaxed);
            self.read_completions(&mut comps, 64, ms)
        } else {
            // No wait object: read, then sleep an eighth of the quiet time
            // so far (at most 5 ms: an idle endpoint reads its queue 200
            // times a second; a message after a long quiet waits up to that).
            let r = self.read_completions(&mut comps, 64, 0);
            if r.as_ref().is_ok_and(|&n| n == 0) {
                self.slept.fetch_add(1, Ordering::Relaxed);
                let nap = (since / 8).clamp(Duration::from_micros(20), Duration::from_millis(5));
                std::thread::sleep(left.min(nap));
            }
            r
        };
        if !comps.is_empty() {
            self.mark_event();
        }
        let mut st = self.lock();
        st.polling = false;
        let mut wake = Vec::new();
        for c in comps {
            if let Some(w) = self.file(&mut st, c) {
                wake.push(w);
            }
        }
        let repost = std::mem::take(&mut st.repost);
        for b in repost {
            self.post_recv(&mut st, b);
        }
        if st.sleepers > 0 {
            self.notified.fetch_add(1, Ordering::Relaxed);
            self.cv.notify_all();
        }
        if !wake.is_empty() {
            // Woken outside the lock: a waker may poll its future at once.
            drop(st);
            wake.into_iter().for_each(Waker::wake);
            st = self.lock();
        }
        r?;
        Ok(st)
    }

    fn since_event(&self) -> Duration {
        let last = Duration::from_nanos(self.last_event.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    fn mark_event(&self) {
        let now = self.born.elapsed().as_nanos() as u64;
        self.last_event.store(now, Ordering::Relaxed);
    }

    /// Files a completion; gives back the waker of a task awaiting it.
    fn file(&self, st: &mut State, c: Completion) -> Option<Waker> {
        if st.recv_ids.remove(&c.id) {
            let buffer = c.buffer?;
            st.received.push_back(Incoming {
                buffer,
                len: c.len,
                status: c.status,
            });
        } else if !st.abandoned.remove(&c.id) {
            st.done.insert(
                c.id,
                Done {
                    status: c.status,
                    buffer: c.buffer,
                },
            );
            return st.wakers.remove(&c.id);
        }
        None
    }

    fn post_recv(&self, st: &mut State, b: Buffer) {
        let len = b.len();
        match self.ep.post(Op::Recv, Local::Buffer(b), 0, len, 0) {
            Ok(id) => {
                st.recv_ids.insert(id);
            }
            Err(e) => {
                if let Local::Buffer(b) = e.local {
                    st.repost.push(b);
                }
            }
        }
    }
}

fn failed(op: &'static str, code: i32, prov_errno: i32) -> Error {
    Error::Failed {
        op,
        code,
        prov_errno,
        message: ffi::strerror(code),
    }
}

/// What [`Endpoint::try_send`] did with a message.
pub enum Sent {
    /// Injected: the provider has it, nothing to wait for.
    Done,
    /// Posted: done when the future completes.
    Posted(InFlight),
    /// Not sent: the provider's queue was full.
    Again,
}

/// An operation started with [`Endpoint::start_read`] or
/// [`Endpoint::start_write`]: a future of its completion (the buffer
/// posted comes back).
pub struct InFlight {
    ep: Arc<Endpoint>,
    id: u64,
    name: &'static str,
    finished: bool,
}

impl Future for InFlight {
    type Output = Result<Option<Buffer>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.ep.lock();
        let Some(done) = st.done.remove(&self.id) else {
            st.wakers.insert(self.id, cx.waker().clone());
            return Poll::Pending;
        };
        st.wakers.remove(&self.id);
        drop(st);
        self.finished = true;
        Poll::Ready(match done.status {
            Ok(()) => {
                match self.name {
                    "read" => self.ep.reads.fetch_add(1, Ordering::Relaxed),
                    "write" => self.ep.writes.fetch_add(1, Ordering::Relaxed),
                    // A send (counted when posted): its buffer is reused.
                    _ => {
                        if let Some(b) = done.buffer {
                            self.ep.lock().send_pool.push(b);
                        }
                        return Poll::Ready(Ok(None));
                    }
                };
                Ok(done.buffer)
            }
            Err((code, prov)) => Err(failed(self.name, code, prov)),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut st = self.ep.lock();
        st.wakers.remove(&self.id);
        if st.done.remove(&self.id).is_none() {
            st.abandoned.insert(self.id);
        }
    }
}

/// The name of the file in /dev/shm that holds the queue of the shm
/// endpoint whose address is `raw`: libfabric 1.17 names an endpoint
/// `fi_shm://NAME` and `shm_open`s NAME (`PID:N:M`). None if the
/// address is not of that form or no such file exists (another version
/// naming its files otherwise: nothing is unlinked at exit).
fn shm_file_name(raw: &[u8]) -> Option<String> {
    shm_queue_name(raw).filter(|name| std::path::Path::new("/dev/shm").join(name).exists())
}

/// The `shm_open` name of the queue of the shm endpoint whose address is
/// `raw` (`fi_shm://NAME`, NAME a plain file name), whether or not the
/// file exists; None if the address is not of that form.
pub(crate) fn shm_queue_name(raw: &[u8]) -> Option<String> {
    let raw = raw.split(|&b| b == 0).next()?;
    let name = std::str::from_utf8(raw).ok()?.strip_prefix("fi_shm://")?;
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    plain.then(|| name.to_string())
}

/// libfabric's shm provider keeps each endpoint's queue in a file of
/// /dev/shm named `PID:N:M`, created exclusively, and unlinks it when the
/// endpoint closes. A process that ends with its endpoint open unlinks it
/// at exit ([`ffi::ShmFile`]), but one killed by a signal (or ending by
/// `_exit`) leaves its file (16 MiB of tmpfs) behind, and a later process
/// given the same PID got EBUSY ("fi_endpoint: Device or resource busy")
/// opening its own: seen in CI once stale files had accumulated.
///
/// So before this process (this PID: a forked child is another) opens its
/// first shm endpoint, the queue files that no process uses are removed:
/// files of this user named `PID:N:M` whose header (version, flags, then
/// the creator's PID) names the same PID, which no process has open or
/// mapped ([`ffi::remove_if_unused`]: the kernel's answer, true of
/// processes of every PID namespace sharing /dev/shm; the PID in a name
/// is only the creator's namespace's, so whether a process with that PID
/// lives here says nothing). A file named with this process's PID is
/// removed, whatever its start, unless it is seen in use (no other
/// process of this namespace has this PID, and this one has opened none
/// yet).
fn clear_stale_shm_regions() {
    static DONE_FOR: Mutex<u32> = Mutex::new(0);
    let pid = std::process::id();
    let mut done = DONE_FOR.lock().unwrap_or_else(|e| e.into_inner());
    if *done == pid {
        return;
    }
    *done = pid;
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(owner) = name.to_str().and_then(queue_file_pid) else {
            continue;
        };
        let path = e.path();
        // A file named with this PID is stale whatever its start says
        // (none of this process's endpoints exists yet), unless someone
        // uses it: a process of another PID namespace sharing /dev/shm
        // with this PID, creating its queue right now (empty, or its
        // header not written yet), has it open and is left alone.
        let by_owner = |head: Option<&[u8; 8]>| {
            owner == pid
                || head.is_some_and(|head| {
                    let created_by = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
                    i64::from(created_by) == i64::from(owner)
                })
        };
        let found = ffi::remove_if_unused(&path, by_owner);
        if owner == pid && found == ffi::FileUse::Unknown {
            // Best effort: another user's file stays (sticky /dev/shm).
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The PID in the name of a shm queue file (`PID:N:M`, all decimal).
fn queue_file_pid(name: &str) -> Option<u32> {
    let parts: Vec<&str> = name.split(':').collect();
    let numeric = |p: &str| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit());
    match parts[..] {
        [pid, n, m] if numeric(pid) && numeric(n) && numeric(m) => pid.parse().ok(),
        _ => None,
    }
}
