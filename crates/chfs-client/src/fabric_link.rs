//! A link to a server over a libfabric endpoint (a server address
//! `ofi+tcp://IP:PORT`, ...): the fabric side of [`crate::link::Link`].
//!
//! One endpoint per process and protocol is shared by the links to every
//! server ([`endpoint_for`]); a link is a peer and the session token its
//! server gave in the handshake (`chfs_fabric::rpc`). Replies of every
//! server arrive on the one completion queue, and the thread reading it
//! files them by frame id for their waiters (ids are unique per process),
//! as [`crate::conn::Conn`]'s reader does for one socket. A send that
//! fails, or a wait that sees the transport fail (a dead server: ENOTCONN,
//! ECONNRESET), marks the link broken and removes the peer from the
//! address vector, so that the next link to that server (the pool opens one
//! on the next request) starts a new rxm connection and a new session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_fabric::rpc::{RpcClient, RpcError, Session};
use chfs_fabric::rpc::{FLAG_RMA, OP_BYE, OP_NO_SESSION};
use chfs_fabric::{Address, Endpoint, Lent, Protocol, RemoteKey, Window};
use chfs_proto::frame::{Header, FLAG_ERROR};
use chfs_proto::handshake::Credential;
use chfs_proto::msg::decode_error;
use chfs_proto::{Request, Response};
use chfs_sys::lock;

use crate::config::ClientConfig;
use crate::conn::Landing;
use crate::error::{ConnFault, Error, Result};
use crate::poll::Counts;

/// Largest message: must be the server's (chfsd's `fabric::MAX_MESSAGE`),
/// checked by the handshake.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024 + 4096;

/// Room a message needs besides a request's head and data (the sender's
/// address, the frame header, the tag of a data reply), and some.
const INLINE_MARGIN: usize = 64;

/// Is `addr` a fabric address (`ofi+...://`)?
pub(crate) fn is_fabric(addr: &str) -> bool {
    addr.starts_with("ofi+")
}

/// The process's RPC client of `protocol`, its endpoint opened on the
/// first use (bound to the local address that routes to `server`).
///
/// A forked child gets its own: the parent's endpoint (its provider's
/// sockets and queues) is the parent's; the child leaves it alone.
fn endpoint_for(protocol: Protocol, server: &Address, poll: Duration) -> Result<Arc<RpcClient>> {
    type Clients = HashMap<(Protocol, u32), Arc<RpcClient>>;
    static CLIENTS: OnceLock<Mutex<Clients>> = OnceLock::new();
    let mut g = lock(CLIENTS.get_or_init(Default::default));
    let key = (protocol, crate::process_id());
    if let Some(c) = g.get(&key) {
        return Ok(c.clone());
    }
    let mut cfg = chfs_fabric::Config::new(protocol);
    cfg.max_message = MAX_MESSAGE;
    cfg.recv_buffers = 64;
    // A caller waiting for a reply reads the queue without sleeping for
    // this long after the last completion, as over sockets
    // (`CHFS_POLL_USEC`; the first client of the process sets it).
    cfg.poll_usec = poll.as_micros().min(u64::MAX as u128) as u64;
    if let Some(ip) = server.socket_addr().and_then(|sa| route_to(&sa)) {
        cfg = cfg.bind(&ip, None);
    }
    let ep = crate::cloexec::new_fds_cloexec(|| Endpoint::open(&cfg)).map_err(|e| {
        Error::new(
            e.errno(),
            format!("cannot open a {protocol} endpoint for server {server}: {e}"),
        )
    })?;
    let c = Arc::new(RpcClient::new(Arc::new(ep)));
    g.insert(key, c.clone());
    Ok(c)
}

/// The local IP address the kernel would use to reach `to` (a UDP socket
/// connected there sends nothing).
fn route_to(to: &std::net::SocketAddr) -> Option<String> {
    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

/// A session with one server over the fabric.
pub(crate) struct FabricLink {
    addr: String,
    rpc: Arc<RpcClient>,
    session: Session,
    alive: AtomicBool,
    timeout: Duration,
    opened: Instant,
    /// When it last sent or received, and whether it has been answered
    /// since an idle spell.
    watch: IdleWatch,
    /// The process that opened it (a forked child opens its own).
    pid: u32,
    /// Chunk data of at least this many bytes moves by RMA.
    rdma_thresh: usize,
    /// Registered windows for RMA, kept for reuse, where the caller's
    /// memory is not lent ([`FabricLink::lends`]).
    windows: Mutex<Vec<Arc<Window>>>,
    /// The provider revokes a closed registration (not shm): bulk data
    /// moves straight from or into the caller's memory, lent for the
    /// request, instead of through a window with a copy.
    lends: bool,
    /// The client's counters (lent and copied transfers).
    counts: Arc<Counts>,
}

/// A link unused for this long reads the endpoint before it sends
/// ([`RpcClient::progress`]).
const IDLE_PROGRESS: Duration = Duration::from_millis(200);

/// A link's idle spells, and which requests are waited for with probes
/// ([`RpcClient::wait_probing`]): every one that leaves before the link
/// was answered again after an idle spell of [`IDLE_PROGRESS`], not only
/// the first. rxm may take a message into a connection that ended while
/// nobody read (a restarted server) and lose it; requests that other
/// threads, or the rest of a pipeline, send right after the first one
/// may go the same way, and unprobed each would wait out the RPC
/// timeout. An answer proves the connection carries messages again.
/// Times are nanoseconds since the link opened.
#[derive(Debug, Default)]
struct IdleWatch {
    last_io: AtomicU64,
    /// Requests have left since an idle spell and none was answered yet.
    unconfirmed: AtomicBool,
}

impl IdleWatch {
    /// How long since the link last sent or received, at `now`.
    fn idle_for(&self, now: u64) -> Duration {
        Duration::from_nanos(now.saturating_sub(self.last_io.load(Ordering::Relaxed)))
    }

    /// A request leaves at `now`: (the link was idle, so the endpoint is
    /// to be read first; the request is to be waited for with probes).
    fn sending(&self, now: u64) -> (bool, bool) {
        let idle = self.idle_for(now) >= IDLE_PROGRESS;
        if idle {
            self.unconfirmed.store(true, Ordering::Release);
        }
        (idle, idle || self.unconfirmed.load(Ordering::Acquire))
    }

    /// A request left at `now`.
    fn sent(&self, now: u64) {
        self.last_io.store(now, Ordering::Relaxed);
    }

    /// An answer came at `now` (not OP_NO_SESSION): the connection works.
    fn answered(&self, now: u64) {
        self.last_io.store(now, Ordering::Relaxed);
        self.unconfirmed.store(false, Ordering::Release);
    }
}

/// Windows a link keeps for reuse, and the smallest allocated.
const WINDOWS_KEPT: usize = 16;
const WINDOW_MIN: usize = 64 << 10;

/// A request in flight on a fabric link: its frame id, when it left, and
/// the memory its bulk data moves from or into by the server's RMA, if
/// any: a window of the link's, or the caller's own memory lent for the
/// flight (the borrow `'a`); and a read's destination, if its data is
/// not lent.
pub(crate) struct FabricTicket<'a> {
    id: u64,
    sent: Instant,
    bulk: Option<Bulk>,
    /// The caller's memory the server reads (a write's data) or writes (a
    /// read's destination, then `true`), lent until the answer came; the
    /// lending ends (the registration is closed, revoking the key) when
    /// the ticket is done with, whatever the outcome.
    lent: Option<(Lent<'a>, bool)>,
    dst: Option<&'a mut [u8]>,
    /// Sent after an idle spell, before the link was answered again
    /// ([`IdleWatch`]): it may have gone into a connection that ended
    /// meanwhile ([`RpcClient::wait_probing`]).
    after_idle: bool,
    /// A read whose data the server writes into memory the caller lent
    /// for several requests at once ([`FabricLink::send_placed`]).
    placed: bool,
}

/// How a request's bulk data moves.
struct Moves<'a> {
    bulk: Option<Bulk>,
    lent: Option<(Lent<'a>, bool)>,
    dst: Option<&'a mut [u8]>,
    key: Option<RemoteKey>,
    placed: bool,
}

impl<'a> Moves<'a> {
    /// The data goes in the message (a read's into `dst`, if given, when
    /// the answer comes).
    fn none(dst: Option<&'a mut [u8]>) -> Self {
        Moves {
            bulk: None,
            lent: None,
            dst,
            key: None,
            placed: false,
        }
    }
}

/// A window lent to the server for one request.
struct Bulk {
    window: Option<Arc<Window>>,
    /// A read's: the server writes up to this many bytes there and
    /// answers `Written(n)`.
    read: bool,
    /// The provider does not revoke a closed registration (shm): a
    /// window whose request was not answered is never freed.
    keep_unanswered: bool,
}

impl Bulk {
    fn window(&self) -> &Arc<Window> {
        self.window.as_ref().expect("held until settled")
    }
}

/// Windows of requests never answered over a provider that does not
/// revoke registrations (shm): the server may still write into them (a
/// read it serves late) or read them, so their memory is never given back
/// to the allocator. Each is at most a chunk; one per request that timed
/// out or failed after it was sent.
static QUARANTINE: Mutex<Vec<Arc<Window>>> = Mutex::new(Vec::new());

/// Bytes the quarantine holds.
static QUARANTINED: AtomicUsize = AtomicUsize::new(0);

/// Bytes the quarantine may hold: once it does, a request over such a
/// provider lends no new window: its data goes in the message if it fits
/// one, else it fails with ENOBUFS (a process whose server keeps not
/// answering would otherwise give up a chunk of memory per request).
pub(crate) const QUARANTINE_MAX: usize = 64 << 20;

impl Drop for Bulk {
    /// A window still here was lent for a request that got no answer:
    /// dropped (tcp revokes the key on close), or over shm kept forever.
    fn drop(&mut self) {
        if let Some(w) = self.window.take() {
            if self.keep_unanswered {
                QUARANTINED.fetch_add(w.len(), Ordering::Relaxed);
                lock(&QUARANTINE).push(w);
            }
        }
    }
}

fn rpc_err(addr: &str, what: &str, e: RpcError) -> Error {
    match e {
        RpcError::Remote(r) => Error::new(r.errno, format!("server {addr}: {}", r.message)),
        e => Error::new(e.errno(), format!("server {addr}: {what}: {e}")),
    }
}

impl FabricLink {
    /// Opens a session with the server at `addr` (the handshake with the
    /// pool's secret as `cfg.role`).
    pub fn connect(addr: &str, cfg: &ClientConfig, counts: Arc<Counts>) -> Result<FabricLink> {
        let a: Address = addr
            .parse()
            .map_err(|e| Error::new(libc::EINVAL, format!("server {addr}: {e}")))?;
        let cred = Credential::parse(&cfg.secret)
            .map_err(|e| Error::new(libc::EINVAL, format!("CHFS_SECRET(_FILE): {e}")))?;
        let rpc = endpoint_for(a.protocol, &a, cfg.poll.max())?;
        let timeout = cfg.rpc_timeout;
        // The handshake opens the connection (descriptors not inherited).
        let handshake = || rpc.handshake(&a, cfg.role, &cred, timeout);
        let session = match crate::cloexec::new_fds_cloexec(handshake) {
            Ok(s) => s,
            Err(e) => {
                // A broken rxm connection to that server is not reused.
                if let Ok(p) = rpc.endpoint().connect(&a) {
                    let _ = rpc.endpoint().disconnect(p);
                }
                return Err(rpc_err(addr, "handshake", e));
            }
        };
        Ok(FabricLink {
            addr: addr.to_string(),
            rpc,
            session,
            alive: AtomicBool::new(true),
            timeout,
            opened: Instant::now(),
            watch: IdleWatch::default(),
            pid: crate::process_id(),
            rdma_thresh: cfg.rdma_thresh.max(1),
            windows: Mutex::new(Vec::new()),
            lends: a.protocol != Protocol::Shm,
            counts,
        })
    }

    /// Is the link still usable?
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && self.pid == crate::process_id()
    }

    /// How long since the link last sent or received.
    pub fn idle_for(&self) -> Duration {
        self.watch.idle_for(self.now())
    }

    /// Nanoseconds since the link opened.
    fn now(&self) -> u64 {
        self.opened.elapsed().as_nanos() as u64
    }

    /// Marks the link broken and forgets the peer (its rxm connection may
    /// be broken for good: a new link inserts it again).
    fn fail(&self) {
        if self.alive.swap(false, Ordering::AcqRel) && self.pid == crate::process_id() {
            let _ = self.rpc.endpoint().disconnect(self.session.peer);
        }
    }

    /// A registered window of at least `len` bytes: a kept one, else a
    /// new one.
    fn window(&self, len: usize) -> Result<Arc<Window>> {
        let kept = {
            let mut w = lock(&self.windows);
            w.iter()
                .enumerate()
                .filter(|(_, x)| x.len() >= len)
                .min_by_key(|(_, x)| x.len())
                .map(|(i, _)| i)
                .map(|i| w.swap_remove(i))
        };
        if let Some(w) = kept {
            return Ok(w);
        }
        self.rpc
            .endpoint()
            .window(len.next_power_of_two().max(WINDOW_MIN))
            .map_err(|e| {
                Error::new(
                    e.errno(),
                    format!("server {}: no window for RMA: {e}", self.addr),
                )
            })
    }

    /// Keeps a window whose request was answered (one whose request failed
    /// or timed out is dropped: the server may still reach it).
    fn keep(&self, w: Arc<Window>) {
        let mut ws = lock(&self.windows);
        if ws.len() < WINDOWS_KEPT {
            ws.push(w);
        }
    }

    /// How the bulk part of a request moves, if by RMA: a write's data of
    /// at least the threshold, read by the server; a read of at least the
    /// threshold, written by the server. Where the provider revokes a
    /// closed registration, straight from the caller's `tail` or into its
    /// `dst` (lent for the flight); else (shm, or where the memory cannot
    /// be registered) through a window of the link's, with a copy.
    fn bulk<'a>(
        &self,
        op: u16,
        head: &[u8],
        tail: &'a [u8],
        mut dst: Option<&'a mut [u8]>,
    ) -> Result<Moves<'a>> {
        use chfs_proto::msg::op;
        // Data that would not fit a message with its request or reply
        // moves by RMA whatever the threshold (CHFS_RDMA_THRESH may be set
        // above a message's size).
        let fits = |n: usize| head.len() + n + INLINE_MARGIN <= MAX_MESSAGE;
        let (len, read) = match op {
            op::WRITE | op::WRITE_SPANS if tail.len() >= self.rdma_thresh || !fits(tail.len()) => {
                (tail.len(), false)
            }
            op::READ | op::READ_SPANS => {
                let len = match Request::decode(op, Bytes::copy_from_slice(head)) {
                    Ok(Request::Read { len, .. }) => len as usize,
                    // Records read ahead: their pieces, one after the other.
                    Ok(Request::ReadSpans { spans, .. }) => {
                        spans.iter().map(|s| s.2 as usize).sum()
                    }
                    _ => return Ok(Moves::none(dst)),
                };
                if len < self.rdma_thresh && fits(len) {
                    return Ok(Moves::none(dst));
                }
                (len, true)
            }
            _ => return Ok(Moves::none(dst)),
        };
        if self.lends && len > 0 {
            let ep = self.rpc.endpoint();
            // Both lendings below: the `Lent` goes into the request's
            // `FabricTicket` (through `Moves`), a crate-private type that
            // this crate never leaks: every ticket is consumed by a wait
            // or dropped (pipelines drop theirs on error), and either ends
            // the lending before the caller's borrow ends.
            let lent = if !read {
                // SAFETY: see above; the ticket ends the lending.
                unsafe { ep.lend(tail) }.ok()
            } else {
                match dst.take() {
                    // SAFETY: see above; the ticket ends the lending.
                    Some(d) if d.len() >= len => match unsafe { ep.lend_mut(&mut d[..len]) } {
                        Ok(l) => Some(l),
                        Err((_, d)) => {
                            dst = Some(d);
                            None
                        }
                    },
                    d => {
                        dst = d;
                        None
                    }
                }
            };
            if let Some(l) = lent {
                Counts::bump(&self.counts.rma_lent);
                let key = l.remote_key();
                return Ok(Moves {
                    bulk: None,
                    lent: Some((l, read)),
                    dst,
                    key: Some(key),
                    placed: false,
                });
            }
        }
        let keep_unanswered = self.rpc.endpoint().address().protocol == Protocol::Shm;
        let held = QUARANTINED.load(Ordering::Relaxed);
        if keep_unanswered && held >= QUARANTINE_MAX {
            if fits(len) {
                // In the message: nothing lent.
                return Ok(Moves::none(dst));
            }
            return Err(Error::new(
                libc::ENOBUFS,
                format!(
                    "server {}: {held} bytes of RMA windows of requests never answered are held \
                     (ofi+shm does not revoke them; at most {QUARANTINE_MAX}): no more transfers \
                     of {len} bytes over it in this process",
                    self.addr
                ),
            ));
        }
        let window = self.window(len)?;
        if !read {
            window
                .copy_in(0, tail)
                .map_err(|e| Error::new(e.errno(), format!("server {}: {e}", self.addr)))?;
        }
        Counts::bump(&self.counts.rma_copied);
        let key = RemoteKey {
            len: len as u64,
            ..window.remote_key()
        };
        Ok(Moves {
            bulk: Some(Bulk {
                window: Some(window),
                read,
                keep_unanswered,
            }),
            lent: None,
            dst,
            key: Some(key),
            placed: false,
        })
    }

    /// Sends a request whose payload is `head` followed by `tail` (the
    /// data of a write, which moves by RMA from the threshold on: the
    /// server may read `tail` until the answer is waited for).
    pub fn send_raw<'a>(&self, op: u16, head: &[u8], tail: &'a [u8]) -> Result<FabricTicket<'a>> {
        self.send_with(op, head, tail, None)
    }

    /// Sends a read (`head`) whose data is to land in `dst`: written
    /// there by the server's RMA where the caller's memory can be lent
    /// (from the threshold on), else copied there when the answer comes.
    pub fn send_read<'a>(
        &self,
        op: u16,
        head: &[u8],
        dst: &'a mut [u8],
    ) -> Result<FabricTicket<'a>> {
        self.send_with(op, head, &[], Some(dst))
    }

    /// The endpoint this link lends the caller's memory on, where the
    /// provider revokes a closed registration ([`FabricLink::lends`]):
    /// memory lent there once may be named by several requests
    /// ([`FabricLink::send_placed`]).
    pub fn lender(&self) -> Option<&Arc<Endpoint>> {
        self.lends.then(|| self.rpc.endpoint())
    }

    /// Sends a read (`head`, a `ReadSpansPlaced`) whose data the server
    /// writes into `key`, memory the caller lent on `on` (this link's
    /// [`FabricLink::lender`]) and keeps lent until the answer came; it
    /// answers `Written(n)`. ESTALE when `on` is not this link's endpoint
    /// (the key would name nothing here).
    pub fn send_placed(
        &self,
        op: u16,
        head: &[u8],
        key: RemoteKey,
        on: &Endpoint,
    ) -> Result<FabricTicket<'static>> {
        if !self.lender().is_some_and(|e| std::ptr::eq(&**e, on)) {
            return Err(Error::new(
                libc::ESTALE,
                format!("server {}: memory lent on another endpoint", self.addr),
            ));
        }
        Counts::bump(&self.counts.rma_lent);
        let moves = Moves {
            bulk: None,
            lent: None,
            dst: None,
            key: Some(key),
            placed: true,
        };
        self.send_moves(op, head, &[], moves)
    }

    fn send_with<'a>(
        &self,
        op: u16,
        head: &[u8],
        tail: &'a [u8],
        dst: Option<&'a mut [u8]>,
    ) -> Result<FabricTicket<'a>> {
        let moves = self.bulk(op, head, tail, dst)?;
        self.send_moves(op, head, tail, moves)
    }

    fn send_moves<'a>(
        &self,
        op: u16,
        head: &[u8],
        tail: &'a [u8],
        moves: Moves<'a>,
    ) -> Result<FabricTicket<'a>> {
        let addr = &self.addr;
        if !self.alive() {
            return Err(
                Error::new(libc::EIO, format!("link to server {addr} is broken"))
                    .with_conn_fault(ConnFault::NotSent),
            );
        }
        let (idle, after_idle) = self.watch.sending(self.now());
        if idle {
            // Lets the provider notice a connection that ended meanwhile
            // (a restarted server), so that this request is not lost on it
            // (mostly: see RpcClient::wait_probing).
            self.rpc.progress();
        }
        let mut payload = Vec::with_capacity(head.len() + tail.len().min(MAX_MESSAGE));
        payload.extend_from_slice(head);
        let flags = match &moves.key {
            Some(key) => {
                payload.extend_from_slice(&key.encode());
                FLAG_RMA
            }
            None => {
                payload.extend_from_slice(tail);
                0
            }
        };
        // A request larger than a message (a server list of thousands)
        // is lent by the RPC client for the server to pull (`FLAG_LENT`).
        // The request's timeout counts from here: a send that waits (to a
        // host that is gone) takes from it, not adds to it.
        let sent = Instant::now();
        match self
            .rpc
            .post(&self.session, op, flags, &payload, self.timeout)
        {
            Ok(id) => {
                self.watch.sent(self.now());
                Ok(FabricTicket {
                    id,
                    sent,
                    bulk: moves.bulk,
                    lent: moves.lent,
                    dst: moves.dst,
                    after_idle,
                    placed: moves.placed,
                })
            }
            Err(e) => {
                self.fail();
                // A send the provider took but did not finish in time may
                // still leave (the server was stopped and goes on), and
                // the server still knows this session: the request may
                // yet be carried out, so it is lost, not unsent (sent
                // again only where doing it twice is harmless). Any other
                // error: the message never left whole.
                let fault = match &e {
                    RpcError::Fabric(f) if f.may_have_left() => ConnFault::Lost,
                    _ => ConnFault::NotSent,
                };
                Err(rpc_err(addr, "send failed", e).with_conn_fault(fault))
            }
        }
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<FabricTicket<'static>> {
        let mut head = Vec::with_capacity(64);
        req.encode(&mut head);
        self.send_raw(req.op(), &head, &[])
    }

    /// Waits for the answer to a request, at most the request timeout
    /// after it was sent (the requests of a pipeline to a server that died
    /// all fail about one timeout after they left, not one timeout after
    /// another). A timeout also marks the link broken: rxm may accept a
    /// small message for a peer that is gone and lose it, so the next
    /// request opens a new session, which finds out.
    pub fn wait(&self, t: FabricTicket<'_>) -> Result<Response> {
        match self.wait_into(t, None)? {
            Landing::Reply(r) => Ok(r),
            Landing::Landed(_) => unreachable!("no destination given"),
        }
    }

    /// Waits for the answer; a read's data that came by RMA is in the
    /// destination lent for it, or goes from the window into `dst` (or
    /// the destination the ticket holds) when it fits
    /// ([`Landing::Landed`]).
    pub fn wait_into(&self, mut t: FabricTicket<'_>, dst: Option<&mut [u8]>) -> Result<Landing> {
        let left = self
            .timeout
            .saturating_sub(t.sent.elapsed())
            .max(Duration::from_millis(1));
        let r = match self.answer(&t, left) {
            Ok((h, _)) if h.op == OP_NO_SESSION => {
                // The server restarted, or ended the session for idleness:
                // it did not serve the request. The pool sends it again on
                // a new link (a new session).
                self.fail();
                return Err(Error::new(
                    libc::ENOTCONN,
                    format!(
                        "server {} no longer knows this session (restarted, or idle too long)",
                        self.addr
                    ),
                )
                .with_conn_fault(ConnFault::NotSent));
            }
            Ok((h, payload)) => {
                self.watch.answered(self.now());
                self.decode(h, payload)
            }
            Err(RpcError::Fabric(chfs_fabric::Error::Timeout { .. })) => {
                self.fail();
                return Err(Error::new(
                    libc::ETIMEDOUT,
                    format!(
                        "server {} did not answer within {} ms",
                        self.addr,
                        self.timeout.as_millis()
                    ),
                ));
            }
            Err(e) => {
                self.fail();
                return Err(rpc_err(&self.addr, "lost", e).with_conn_fault(ConnFault::Lost));
            }
        };
        if t.placed {
            // The caller ends the lending once every request naming the
            // memory is done with; an error answer may come after the
            // server gave up on an RMA still queued: as below.
            if r.is_err() {
                self.fail();
            }
            return match r {
                Ok(Response::Written(n)) => Ok(Landing::Landed(n as usize)),
                Ok(other) => Err(Error::new(
                    libc::EPROTO,
                    format!(
                        "server {}: unexpected answer to a read by RMA: {other:?}",
                        self.addr
                    ),
                )),
                Err(e) => Err(e),
            };
        }
        if let Some((lent, read)) = t.lent.take() {
            let lent_len = lent.remote_key().len;
            // Answered: the server is done with the memory (its RMA
            // completed before it answered, or it gave up on it, and then
            // the lending ends here: the key is revoked).
            lent.end();
            if r.is_err() {
                // An error answer may come after the server gave up on an
                // RMA still queued (its timeout): the connection is
                // dropped, so nothing more of it reaches the memory.
                self.fail();
            }
            return match r {
                Ok(Response::Written(n)) if read && u64::from(n) <= lent_len => {
                    Ok(Landing::Landed(n as usize))
                }
                Ok(other) if read => Err(Error::new(
                    libc::EPROTO,
                    format!(
                        "server {}: unexpected answer to a read by RMA: {other:?}",
                        self.addr
                    ),
                )),
                r => r.map(Landing::Reply),
            };
        }
        let dst = dst.or(t.dst.take());
        let Some(mut bulk) = t.bulk.take() else {
            return r.map(Landing::Reply);
        };
        // Answered: the server is done with the window (after an error it
        // may have given up on an RMA still in flight: not reused).
        let ok = r.is_ok();
        let out = match r {
            Ok(Response::Written(n)) if bulk.read && n as usize <= bulk.window().len() => {
                let n = n as usize;
                let copied = match dst {
                    Some(d) if n <= d.len() => bulk
                        .window()
                        .copy_out(0, &mut d[..n])
                        .map(|_| Landing::Landed(n)),
                    _ => {
                        let mut v = vec![0u8; n];
                        bulk.window()
                            .copy_out(0, &mut v)
                            .map(|_| Landing::Reply(Response::Data(Bytes::from(v))))
                    }
                };
                copied.map_err(|e| Error::new(e.errno(), format!("server {}: {e}", self.addr)))
            }
            Ok(other) if bulk.read => Err(Error::new(
                libc::EPROTO,
                format!(
                    "server {}: unexpected answer to a read by RMA: {other:?}",
                    self.addr
                ),
            )),
            r => r.map(Landing::Reply),
        };
        if ok {
            if let Some(w) = bulk.window.take() {
                self.keep(w);
            }
        }
        out
    }

    /// The answer to the ticket's request, waited for at most `left`;
    /// for a request sent after the link was idle, probed with pings
    /// ([`RpcClient::wait_probing`]).
    fn answer(
        &self,
        t: &FabricTicket<'_>,
        left: Duration,
    ) -> std::result::Result<(Header, Bytes), RpcError> {
        match t.after_idle {
            true => self.rpc.wait_probing(&self.session, t.id, left),
            false => self.rpc.wait(&self.session, t.id, left),
        }
    }

    fn decode(&self, h: Header, payload: Bytes) -> Result<Response> {
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
}

impl Drop for FabricLink {
    /// Tells the server the session is over (a message small enough to be
    /// injected: no wait), so that it forgets it.
    fn drop(&mut self) {
        if self.alive() {
            let _ = self
                .rpc
                .post(&self.session, OP_BYE, 0, &[], Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's endpoint of a protocol polls for the window the
    /// client asks (`CHFS_POLL_USEC`), as its socket connections do.
    /// (The only test here that opens a fabric endpoint: the first asks.)
    #[test]
    fn the_endpoint_polls_for_the_clients_window() {
        let test = "the_endpoint_polls_for_the_clients_window";
        if !chfs_fabric::BUILT_WITH_LIBFABRIC {
            chfs_localpool::skip("fabric", test, "built without libfabric");
            return;
        }
        let a: Address = "ofi+tcp://127.0.0.1:9".parse().unwrap();
        let rpc = endpoint_for(Protocol::Tcp, &a, Duration::from_micros(123)).unwrap();
        assert_eq!(rpc.endpoint().poll_window(), Duration::from_micros(123));
    }

    const MS: u64 = 1_000_000;

    /// After an idle spell every request is probed until one is answered,
    /// not only the first (the others of a pipeline, other threads'); a
    /// busy link probes none.
    #[test]
    fn requests_leaving_before_the_first_answer_after_idle_are_probed() {
        let idle = IDLE_PROGRESS.as_nanos() as u64;
        let w = IdleWatch::default();
        // Just opened, never used: idle since its start.
        w.sent(0);
        assert_eq!(w.sending(MS), (false, false));
        // Busy: answered, sent again soon.
        w.sent(MS);
        w.answered(2 * MS);
        assert_eq!(w.sending(3 * MS), (false, false));
        w.sent(3 * MS);
        w.answered(4 * MS);
        // An idle spell: the first request reads the endpoint and is
        // probed; so are those that leave before any answer came.
        let t = 4 * MS + idle;
        assert_eq!(w.sending(t), (true, true));
        w.sent(t);
        assert_eq!(w.sending(t + MS), (false, true));
        w.sent(t + MS);
        assert_eq!(w.sending(t + 100 * MS), (false, true));
        w.sent(t + 100 * MS);
        // Answered: the connection carries messages; no more probes.
        w.answered(t + 101 * MS);
        assert_eq!(w.sending(t + 102 * MS), (false, false));
        assert_eq!(w.idle_for(t + 102 * MS), Duration::from_millis(1));
        // Unanswered for a whole idle spell: the next one reads first.
        w.sent(t + 102 * MS);
        assert_eq!(w.sending(t + 102 * MS + idle), (true, true));
    }
}
