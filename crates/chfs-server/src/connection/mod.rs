//! Serving one connection after its handshake: the reader loop that
//! decodes frames and spawns a task per request ([`serve_conn`]), the
//! replies it writes itself ([`reply_now`]) and the writer task that
//! batches the others, what the connection may ask
//! ([`Access`]), and requests whose data lies in a local client's memory
//! ([`cma`], shared-memory windows of [`crate::shm`]).

pub(crate) mod cma;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use chfs_proto::frame::{CmaRef, Header, FLAG_CMA, FLAG_ERROR, FLAG_FORWARDED, FLAG_LAND};
use chfs_proto::handshake::Role;
use chfs_proto::msg::{encode_error, op};
use chfs_proto::{ErrorReply, Request, Response};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::handler::Served;
use crate::metrics::Counters;
use crate::net;
use crate::state::Shared;

/// One outgoing response: header, head bytes, a data tail, and the
/// request's share of the connection's budget (given back once sent).
pub(crate) type Out = (Header, Head, Tail, Option<crate::limits::Permits>);

/// A reply's data tail: one buffer (a read's chunk slice), or the pieces
/// of a `ReadSpans`' records (store slices and zero padding) written with
/// vectored writes instead of being gathered into one buffer first.
#[derive(Default)]
pub(crate) struct Tail {
    /// What is left of the first piece not yet written.
    first: Bytes,
    /// The pieces after it (none, and no allocation, for one buffer; a
    /// box: a reply is moved through a channel, and is kept small).
    more: Option<Box<More>>,
}

/// The pieces of a [`Tail`] after its first.
#[derive(Clone)]
struct More(std::collections::VecDeque<Bytes>);

/// Most pieces given to one vectored write (the kernel takes at most
/// `IOV_MAX`, 1024; the rest goes in the next).
const TAIL_IOVECS: usize = 64;

impl Tail {
    /// A tail of one buffer.
    pub(crate) fn one(b: Bytes) -> Tail {
        Tail {
            first: b,
            more: None,
        }
    }

    /// A tail of these pieces, in order.
    pub(crate) fn pieces(pieces: Vec<Bytes>) -> Tail {
        let mut more: std::collections::VecDeque<Bytes> =
            pieces.into_iter().filter(|p| !p.is_empty()).collect();
        let first = more.pop_front().unwrap_or_default();
        Tail {
            first,
            more: (!more.is_empty()).then(|| Box::new(More(more))),
        }
    }

    /// The pieces after the first.
    fn rest(&self) -> impl Iterator<Item = &Bytes> {
        self.more.iter().flat_map(|m| m.0.iter())
    }

    /// Bytes not yet written.
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.rest().map(Bytes::len).sum::<usize>()
    }

    /// (The first piece is empty only when all are.)
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// Appends what is left to `buf`, and empties the tail.
    fn copy_into(&mut self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.first);
        for p in self.rest() {
            buf.extend_from_slice(p);
        }
        *self = Tail::default();
    }

    /// What is left as one buffer (a copy unless it is one piece).
    pub(crate) fn into_bytes(mut self) -> Bytes {
        if self.more.is_none() {
            return self.first;
        }
        let mut v = Vec::with_capacity(self.len());
        self.copy_into(&mut v);
        Bytes::from(v)
    }

    /// `head` (unwritten, may be empty) then the tail's pieces (the
    /// first [`TAIL_IOVECS`]), as slices for one vectored write, in
    /// `out`; returns how many.
    fn slices<'a>(
        &'a self,
        head: &'a [u8],
        out: &mut [std::io::IoSlice<'a>; TAIL_IOVECS + 1],
    ) -> usize {
        let mut k = 0;
        let pieces = std::iter::once(head)
            .chain(std::iter::once(&self.first[..]))
            .chain(self.rest().map(|p| &p[..]))
            .filter(|p| !p.is_empty());
        for p in pieces.take(TAIL_IOVECS + 1) {
            out[k] = std::io::IoSlice::new(p);
            k += 1;
        }
        k
    }

    /// Drops the first `n` bytes left.
    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            if n < self.first.len() {
                self.first = self.first.slice(n..);
                return;
            }
            n -= self.first.len();
            self.first = match self.more.as_mut().and_then(|m| m.0.pop_front()) {
                Some(p) => p,
                None => {
                    assert_eq!(n, 0, "advanced past the tail");
                    Bytes::new()
                }
            };
            if self.more.as_ref().is_some_and(|m| m.0.is_empty()) {
                self.more = None;
            }
        }
    }
}

/// Writes `head` then `tail` with vectored writes until both are sent.
async fn write_all_tail(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    head: &[u8],
    tail: &mut Tail,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut head = head;
    while !head.is_empty() || !tail.is_empty() {
        let mut slices = [std::io::IoSlice::new(&[]); TAIL_IOVECS + 1];
        let k = tail.slices(head, &mut slices);
        let n = w.write_vectored(&slices[..k]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        tail.advance(n - from_head);
    }
    Ok(())
}

/// Heads at most this long are kept inline in their [`Head`].
const HEAD_INLINE: usize = 96;

/// A reply's encoded head (all of it but a data tail): inline when short,
/// as most are (a stat's, a read's tag, an error), so that it costs no
/// allocation; else the buffer it was encoded in.
pub(crate) struct Head {
    len: usize,
    inline: [u8; HEAD_INLINE],
    heap: Vec<u8>,
}

impl Head {
    /// What `f` encodes, through a thread's buffer used again.
    fn encode(f: impl FnOnce(&mut Vec<u8>)) -> Head {
        thread_local! {
            static ENC: std::cell::RefCell<Vec<u8>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut f = Some(f);
        let mut head = Head {
            len: 0,
            inline: [0; HEAD_INLINE],
            heap: Vec::new(),
        };
        let mut keep = |v: &mut Vec<u8>| {
            if v.len() <= HEAD_INLINE {
                head.inline[..v.len()].copy_from_slice(v);
                head.len = v.len();
            } else {
                // A long head (a listing) keeps the buffer.
                head.len = v.len();
                head.heap = std::mem::take(v);
            }
        };
        let used = ENC.try_with(|b| {
            let Ok(mut b) = b.try_borrow_mut() else {
                return false;
            };
            b.clear();
            b.reserve(HEAD_INLINE);
            (f.take().expect("once"))(&mut b);
            keep(&mut b);
            true
        });
        if !matches!(used, Ok(true)) {
            let mut v = Vec::new();
            (f.take().expect("once"))(&mut v);
            keep(&mut v);
        }
        head
    }
}

impl std::ops::Deref for Head {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len <= HEAD_INLINE {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

pub(crate) fn response_frame(id: u64, op: u16, r: Result<Response, ErrorReply>) -> Out {
    served_frame(id, op, r.map(Served::Reply))
}

/// [`response_frame`] of what [`crate::handler::handle_pieces`] answers:
/// the pieces of a `ReadSpans` become the reply's data tail as they are.
pub(crate) fn served_frame(id: u64, op: u16, r: Result<Served, ErrorReply>) -> Out {
    let mut tail = Tail::default();
    let mut flags = 0;
    let head = Head::encode(|head| match r {
        Ok(Served::Reply(Response::Data(d))) => {
            Response::Data(Bytes::new()).encode(head);
            tail = Tail::one(d);
        }
        Ok(Served::Pieces(p)) => {
            Response::Data(Bytes::new()).encode(head);
            tail = Tail::pieces(p);
        }
        Ok(Served::Reply(resp)) => resp.encode(head),
        Err(e) => {
            encode_error(head, &e);
            flags = FLAG_ERROR;
        }
    });
    (
        Header {
            len: (head.len() + tail.len()) as u32,
            id,
            op,
            flags,
        },
        head,
        tail,
        None,
    )
}

/// [`response_frame`] holding `permits` until it is sent.
fn response_with(
    id: u64,
    op: u16,
    r: Result<Response, ErrorReply>,
    permits: crate::limits::Permits,
) -> Out {
    served_with(id, op, r.map(Served::Reply), permits)
}

/// [`served_frame`] holding `permits` until it is sent.
fn served_with(
    id: u64,
    op: u16,
    r: Result<Served, ErrorReply>,
    permits: crate::limits::Permits,
) -> Out {
    let mut out = served_frame(id, op, r);
    out.3 = Some(permits);
    out
}

/// What the reader hands the writer task: a reply, or word that the
/// reader left part of one unwritten ([`reply_now`]).
pub(crate) enum Msg {
    Reply(Out),
    Flush,
}

/// A connection's reply side, shared by its writer task and its reader:
/// the socket's write half, replies gathered but not yet written, and
/// their budget shares.
struct Replies<W> {
    wr: W,
    buf: Vec<u8>,
    held: Vec<crate::limits::Permits>,
    /// The unwritten rest of a large data tail, to be written after
    /// `buf` and before anything else.
    rest: Tail,
}

/// Writes a reply from the reader, without handing it to the writer
/// task, when that task is idle and nothing of an earlier reply waits in
/// the buffer: the reply of a request served inline then costs no
/// channel message, no wake-up of the writer task and no poll of it.
/// A large data tail (a read's) is written from where it lies, after
/// the header in one vectored write. Whatever the socket does not take at
/// once (or everything, with a busy writer) goes to the writer task.
fn reply_now<W>(replies: &tokio::sync::Mutex<Replies<W>>, tx: &mpsc::UnboundedSender<Msg>, out: Out)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut g = match replies.try_lock() {
        Ok(g) if g.buf.is_empty() && g.rest.is_empty() => g,
        _ => {
            let _ = tx.send(Msg::Reply(out));
            return;
        }
    };
    let (h, head, mut tail, permits) = out;
    let r = &mut *g;
    r.buf.extend_from_slice(&h.encode());
    r.buf.extend_from_slice(&head);
    if tail.len() < BIG_TAIL {
        tail.copy_into(&mut r.buf);
    }
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // Written of the buffer; the tail is advanced as it goes.
    let mut sent = 0;
    while sent < r.buf.len() || !tail.is_empty() {
        let w = std::pin::Pin::new(&mut r.wr);
        let res = if tail.is_empty() {
            // (Most replies: a stat's, an error, a small read's.)
            w.poll_write(&mut cx, &r.buf[sent..])
        } else {
            let mut slices = [std::io::IoSlice::new(&[]); TAIL_IOVECS + 1];
            let k = tail.slices(&r.buf[sent..], &mut slices);
            w.poll_write_vectored(&mut cx, &slices[..k])
        };
        match res {
            std::task::Poll::Ready(Ok(n)) if n > 0 => {
                let from_buf = n.min(r.buf.len() - sent);
                sent += from_buf;
                tail.advance(n - from_buf);
            }
            // Full, or an error the writer task will meet again and end on.
            _ => break,
        }
    }
    if sent == r.buf.len() && tail.is_empty() {
        r.buf.clear();
        return;
    }
    // The rest: what is left of the buffer, then of the tail.
    r.buf.drain(..sent);
    r.rest = tail;
    r.held.extend(permits);
    drop(g);
    let _ = tx.send(Msg::Flush);
}

/// A connection's read buffer: small requests that arrive together are
/// read with one system call (a few dozen metadata requests fit), and a
/// frame's data past what the buffer took is read straight into its own
/// memory; what the buffer took is copied (32 KiB here copied half of
/// each 64 KiB chunk written over TCP a second time).
const READ_BUFFER: usize = 8 << 10;

/// Requests at most this large (all but writes of much data) are first
/// served in the connection's reader ([`serve_conn`]).
const INLINE_MAX: usize = 16 << 10;

/// Data tails at least this large are not copied into the reply buffer.
const BIG_TAIL: usize = 16 << 10;

/// Writes `a` then `b` with vectored writes until both are sent.
pub(crate) async fn write_all_vectored(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    a: &[u8],
    b: &[u8],
) -> std::io::Result<()> {
    let mut bufs = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
    let mut slices: &mut [std::io::IoSlice<'_>] = &mut bufs;
    while !slices.is_empty() {
        let n = w.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// What a connection may do: the role it proved (None: the pool has no
/// secret, everything). See [`Access::refusal`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access(pub Option<Role>);

impl Access {
    /// Why a request with opcode `op` (forwarded or not) is not for this
    /// connection; None when it may go ahead. Membership and chunk moves
    /// between servers, and forwarded requests, are for servers; stopping
    /// and rebalancing the pool for servers and the administrator;
    /// everything else for every role.
    pub fn refusal(self, op: u16, forwarded: bool) -> Option<ErrorReply> {
        let role = match self.0 {
            None | Some(Role::Server) => return None,
            Some(r) => r,
        };
        let only = match op {
            _ if forwarded => "servers of the pool (forwarded requests)",
            op::JOIN
            | op::UPDATE_SERVERS
            | op::ADOPT_CHUNK
            | op::PUT_CHUNK
            | op::WATCH_STAT
            | op::INVALIDATE => "servers of the pool",
            op::SHUTDOWN | op::REBALANCE if role == Role::Client => {
                "the pool's administrator (chfsctl, with the pool secret)"
            }
            _ => return None,
        };
        Some(ErrorReply::new(
            libc::EPERM,
            format!("request {op} refused: a connection authenticated as {role} may not make it; it is for {only}"),
        ))
    }
}

/// Takes one from `n` if it is not 0.
fn take_one(n: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    n.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1))
        .is_ok()
}

/// A duplicate of a socket's descriptor (None if the process is out of
/// them: the connection then has no idle watchdog).
pub(crate) fn dup_fd(s: &impl std::os::fd::AsFd) -> Option<std::os::fd::OwnedFd> {
    s.as_fd().try_clone_to_owned().ok()
}

/// Serves the requests of one connection; `cma`: the pid whose memory
/// `FLAG_CMA` requests may name (local peers of the server's user);
/// `access`: what the connection authenticated as; `fd`: a duplicate of
/// its socket, for the idle watchdog ([`crate::limits::Watchdogs`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_conn<R, W>(
    shared: Arc<Shared>,
    rd: R,
    wr: W,
    peer: String,
    cma: Option<libc::pid_t>,
    first: Option<(Header, Bytes)>,
    access: Access,
    fd: Option<std::os::fd::OwnedFd>,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Small frames that arrive together are read with one system call; a
    // frame's data past the buffer is read straight into its own memory.
    // (256 KiB here was most of a connection's memory, ~0.2 MiB each: the
    // buffer is zeroed when allocated.)
    let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, rd);
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    // `buf`: small replies gathered while more are queued (and what the
    // reader could not write at once); `held`: their budget shares,
    // given back once written.
    let replies = Arc::new(tokio::sync::Mutex::new(Replies {
        wr,
        buf: Vec::with_capacity(64 << 10),
        held: Vec::new(),
        rest: Tail::default(),
    }));
    let writer = {
        let replies = replies.clone();
        tokio::spawn(async move {
            // A large data tail is written from where it lies, with what
            // is gathered, in one vectored write (no copy into the buffer).
            while let Some(msg) = rx.recv().await {
                let mut g = replies.lock().await;
                let Replies {
                    wr,
                    buf,
                    held,
                    rest,
                } = &mut *g;
                // What the reader could not write goes first.
                if !rest.is_empty() {
                    let mut t = std::mem::take(rest);
                    if write_all_tail(wr, buf, &mut t).await.is_err() {
                        break;
                    }
                    buf.clear();
                    held.clear();
                }
                let tail = match msg {
                    Msg::Reply((h, head, tail, permits)) => {
                        held.extend(permits);
                        buf.extend_from_slice(&h.encode());
                        buf.extend_from_slice(&head);
                        tail
                    }
                    Msg::Flush => Tail::default(),
                };
                let mut tail = tail;
                let r = if tail.len() >= BIG_TAIL {
                    let r = write_all_tail(wr, buf, &mut tail).await;
                    buf.clear();
                    held.clear();
                    r
                } else {
                    tail.copy_into(buf);
                    if rx.is_empty() || buf.len() >= 256 << 10 {
                        let r = wr.write_all(buf).await;
                        buf.clear();
                        held.clear();
                        r
                    } else {
                        Ok(())
                    }
                };
                if r.is_err() {
                    break;
                }
            }
        })
    };
    let mut first = first;
    // Small frames' payloads, used again (net::read_frame_reusing).
    let mut frames = bytes::BytesMut::new();
    let mut window: Option<Arc<crate::shm::Window>> = None;
    // Where `FLAG_LAND` replies' data goes.
    let mut landing: Option<Arc<crate::shm::Window>> = None;
    let budget = crate::limits::Budget::new(&shared.limits);
    let watchdog = fd.and_then(|fd| {
        let (sh, p) = (shared.clone(), peer.clone());
        shared.watchdogs.watch(fd, &budget, move || {
            Counters::inc(&sh.counters.idle_closed);
            debug!(peer = %p, "closing an idle or stalled connection");
        })
    });
    loop {
        let frame = match first.take() {
            Some(f) => Ok(Some(f)),
            None => net::read_frame_reusing(&mut rd, Some(&mut frames)).await,
        };
        if let Some(w) = &watchdog {
            w.touch();
        }
        if let Ok(Some((h, _))) = &frame {
            if let Some(e) = access.refusal(h.op, h.flags & FLAG_FORWARDED != 0) {
                Counters::inc(&shared.counters.denied);
                warn!(%peer, op = h.op, "{}", e.message);
                let _ = tx.send(Msg::Reply(response_frame(h.id, h.op, Err(e))));
                continue;
            }
        }
        match frame {
            Ok(Some((h, payload))) if h.flags & FLAG_CMA != 0 && h.flags & FLAG_LAND == 0 => {
                let permits = budget
                    .admit(crate::limits::cost(&h, &payload), &shared.counters)
                    .await;
                let (sh, tx, w) = (shared.clone(), tx.clone(), window.clone());
                tokio::spawn(async move {
                    let r = cma::serve(&sh, cma, w.as_deref(), h, payload).await;
                    let _ = tx.send(Msg::Reply(response_with(h.id, h.op, r, permits)));
                });
            }
            // Answered here, in order: the connection's later writes see
            // the window.
            Ok(Some((h, payload)))
                if h.op == op::SHM_ATTACH && (h.flags == 0 || h.flags == FLAG_LAND) =>
            {
                let writable = h.flags == FLAG_LAND;
                let slot = if writable { &mut landing } else { &mut window };
                let r = attach_window(cma, slot.is_some(), payload, writable).map(|w| {
                    *slot = Some(Arc::new(w));
                    Response::Ok
                });
                if let Err(e) = &r {
                    debug!(%peer, "shared memory refused: {}", e.message);
                }
                let _ = tx.send(Msg::Reply(response_frame(h.id, h.op, r)));
            }
            Ok(Some((h, payload))) => match if shared.unknown_ops.contains(&h.op) {
                Err(chfs_proto::ProtoError::UnknownOp(h.op))
            } else {
                match landing_of(h, payload, landing.as_ref()) {
                    Ok((_, Some(_))) if take_one(&shared.drop_landings) => {
                        debug!(%peer, "closing the connection instead of a landing read (--test-drop-landings)");
                        break;
                    }
                    Ok((payload, land)) => Request::decode(h.op, payload).map(|r| (r, land)),
                    Err(e) => {
                        debug!(%peer, op = h.op, "landing refused: {}", e.message);
                        let _ = tx.send(Msg::Reply(response_frame(h.id, h.op, Err(e))));
                        continue;
                    }
                }
            } {
                Ok((req, land)) => {
                    // (Not a clone of the payload kept for this: its first
                    // clone allocates a shared count.)
                    let permits = budget
                        .admit(
                            crate::limits::cost_of(h.len as usize, &req),
                            &shared.counters,
                        )
                        .await;
                    let forwarded = h.flags & FLAG_FORWARDED != 0;
                    let sh = shared.clone();
                    // (A `ReadSpans`' records are written as the pieces
                    // they are in the store: no gather into one buffer.)
                    let mut served = Box::pin(async move {
                        let Some((w, r)) = land else {
                            return crate::handler::handle_pieces(&sh, req, forwarded).await;
                        };
                        let room = w.room(&r)?;
                        let n = crate::handler::handle_landing(&sh, req, forwarded, room).await?;
                        Counters::inc(&sh.counters.shm_reads);
                        Ok(Served::Reply(n))
                    });
                    // A small request is first served here, in the reader:
                    // most complete at once (a store lookup), and then cost
                    // no task of their own and no hand-off to it. One that
                    // waits (forwarding, the store's locks), a large write,
                    // and everything in cache mode (backend I/O) get a task,
                    // so that the connection's next requests go on meanwhile.
                    if h.len as usize <= INLINE_MAX && shared.cache.is_none() {
                        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                        if let std::task::Poll::Ready(r) = served.as_mut().poll(&mut cx) {
                            reply_now(&replies, &tx, served_with(h.id, h.op, r, permits));
                            continue;
                        }
                    }
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let r = served.await;
                        let _ = tx.send(Msg::Reply(served_with(h.id, h.op, r, permits)));
                    });
                }
                Err(e @ chfs_proto::ProtoError::UnknownOp(_)) => {
                    // A newer client's request: refused, and the
                    // connection goes on (the frame was read whole; the
                    // client's other requests on it are not lost).
                    debug!(%peer, op = h.op, "{e}");
                    let _ = tx.send(Msg::Reply(response_frame(
                        h.id,
                        h.op,
                        Err(ErrorReply::new(e.errno(), format!("{e}"))),
                    )));
                }
                Err(e) => {
                    warn!(%peer, op = h.op, "malformed request, closing connection: {e}");
                    let _ = tx.send(Msg::Reply(response_frame(
                        h.id,
                        h.op,
                        Err(ErrorReply::new(
                            e.errno(),
                            format!("malformed request: {e}"),
                        )),
                    )));
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                warn!(%peer, "closing connection: {e}");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer.await;
    drop(replies);
    debug!(%peer, "connection closed");
}

/// A `FLAG_LAND` request's payload without its [`CmaRef`], the landing
/// window and that reference; any other request's payload as it is.
#[allow(clippy::type_complexity)]
fn landing_of(
    h: Header,
    payload: Bytes,
    landing: Option<&Arc<crate::shm::Window>>,
) -> Result<(Bytes, Option<(Arc<crate::shm::Window>, CmaRef)>), ErrorReply> {
    if h.flags & FLAG_LAND == 0 {
        return Ok((payload, None));
    }
    if !matches!(h.op, op::READ | op::READ_SPANS) || h.flags & FLAG_CMA != 0 {
        return Err(ErrorReply::new(
            libc::EINVAL,
            format!("a landing window is not for request {}", h.op),
        ));
    }
    let Some(w) = landing else {
        return Err(ErrorReply::new(
            libc::EINVAL,
            "this connection has no landing window",
        ));
    };
    let (rest, r) = CmaRef::split_off(&payload)
        .map_err(|e| ErrorReply::new(e.errno(), format!("malformed request: {e}")))?;
    Ok((payload.slice(..rest.len()), Some((w.clone(), r))))
}

/// Maps the window a [`Request::ShmAttach`] names, for a peer allowed
/// cross-memory attach (`pid`), once per connection (`writable`: a
/// landing window, `FLAG_LAND`).
fn attach_window(
    pid: Option<libc::pid_t>,
    attached: bool,
    payload: Bytes,
    writable: bool,
) -> Result<crate::shm::Window, ErrorReply> {
    let Some(pid) = pid else {
        return Err(ErrorReply::new(
            libc::EPERM,
            "shared memory is only for local clients of the server's user",
        ));
    };
    if attached {
        return Err(ErrorReply::new(
            libc::EBUSY,
            "this connection already has a shared-memory window",
        ));
    }
    match Request::decode(op::SHM_ATTACH, payload) {
        Ok(Request::ShmAttach { fd, base, len }) => {
            crate::shm::Window::attach(pid, fd, base, len, writable)
        }
        Ok(other) => Err(ErrorReply::new(
            libc::EPROTO,
            format!("expected a shared-memory request, decoded {:?}", other.op()),
        )),
        Err(e) => Err(ErrorReply::new(
            e.errno(),
            format!("malformed request: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chfs_proto::Meta;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting each thread's allocations (this
    /// test binary only).
    struct Counting;

    thread_local! {
        static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }

    // SAFETY: forwards every call unchanged to the system allocator.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.realloc(p, l, n) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    fn decoded(out: &Out) -> Result<Response, ErrorReply> {
        let (h, head, tail, _) = out;
        let mut p = head.to_vec();
        let mut t = Vec::new();
        Tail {
            first: tail.first.clone(),
            more: tail.more.clone(),
        }
        .copy_into(&mut t);
        p.extend_from_slice(&t);
        assert_eq!(h.len as usize, p.len());
        if h.flags & FLAG_ERROR != 0 {
            Err(chfs_proto::msg::decode_error(Bytes::from(p)).unwrap())
        } else {
            Ok(Response::decode(Bytes::from(p)).unwrap())
        }
    }

    /// Replies are framed as they were (each decodes back to itself), and
    /// a short head (a stat's, a read's tag, an error) allocates nothing.
    #[test]
    fn reply_heads_are_inline_when_short() {
        let meta = Meta {
            mode: 0o100644,
            size: 47_008,
            chunk_size: 65_536,
            fileid: 3,
            ..Default::default()
        };
        let data = Bytes::from(vec![5u8; 47_008]);
        let err = ErrorReply::new(libc::ENOENT, "no such file");
        let listing = Response::Entries {
            entries: (0..100)
                .map(|i| chfs_proto::msg::DirEntry {
                    name: format!("name{i}"),
                    meta,
                })
                .collect(),
            done: true,
        };
        for r in [
            Ok(Response::Meta(meta)),
            Ok(Response::Data(data.clone())),
            Ok(Response::Ok),
            Err(err.clone()),
            Ok(listing.clone()),
        ] {
            let out = response_frame(7, op::STAT, r.clone());
            assert_eq!(out.0.id, 7);
            assert_eq!(decoded(&out), r);
        }
        // Short heads: nothing allocated (once the thread has an encode
        // buffer again: the listing took the last one).
        drop(response_frame(1, op::STAT, Ok(Response::Meta(meta))));
        let a0 = ALLOCS.with(Cell::get);
        for _ in 0..100 {
            drop(response_frame(1, op::STAT, Ok(Response::Meta(meta))));
            drop(response_frame(
                2,
                op::READ,
                Ok(Response::Data(data.clone())),
            ));
        }
        assert_eq!(ALLOCS.with(Cell::get) - a0, 0);
        // A long head keeps its buffer; the next one is encoded as well.
        let long = response_frame(3, op::READDIR, Ok(listing.clone()));
        let short = response_frame(4, op::STAT, Ok(Response::Meta(meta)));
        assert_eq!(decoded(&long), Ok(listing));
        assert_eq!(decoded(&short), Ok(Response::Meta(meta)));
    }

    /// A writer that takes at most `most` bytes per call, across slices.
    struct Trickle {
        got: Vec<u8>,
        most: usize,
        calls: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            b: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = b.len().min(self.most);
            self.got.extend_from_slice(&b[..n]);
            self.calls += 1;
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut left = self.most;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(left);
                self.got.extend_from_slice(&b[..k]);
                left -= k;
                n += k;
            }
            self.calls += 1;
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A reply's tail in pieces (empty ones among them, more than one
    /// vectored write takes) is written whole and in order after its
    /// head, whatever each write takes; `copy_into` and `into_bytes` give
    /// the same bytes.
    #[test]
    fn a_tail_of_pieces_is_written_in_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for round in 0..200 {
            let n = next(3 * TAIL_IOVECS as u64) as usize;
            let pieces: Vec<Bytes> = (0..n)
                .map(|i| {
                    let len = next(if i % 5 == 0 { 1 } else { 300 }) as usize;
                    Bytes::from(
                        (0..len)
                            .map(|k| (k * 7 + i + round) as u8)
                            .collect::<Vec<u8>>(),
                    )
                })
                .collect();
            let want_tail: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            let head: Vec<u8> = (0..next(40)).map(|k| k as u8 ^ 0x55).collect();
            let mut want = head.clone();
            want.extend_from_slice(&want_tail);
            let tail = Tail::pieces(pieces.clone());
            assert_eq!(tail.len(), want_tail.len());
            assert_eq!(tail.is_empty(), want_tail.is_empty());
            assert_eq!(Tail::pieces(pieces.clone()).into_bytes(), want_tail);
            let mut copied = Vec::new();
            Tail::pieces(pieces.clone()).copy_into(&mut copied);
            assert_eq!(copied, want_tail);
            let mut w = Trickle {
                got: Vec::new(),
                most: 1 + next(700) as usize,
                calls: 0,
            };
            let mut tail = tail;
            rt.block_on(write_all_tail(&mut w, &head, &mut tail))
                .unwrap();
            assert!(
                w.got == want,
                "round {round}: {} of {} bytes",
                w.got.len(),
                want.len()
            );
            assert!(tail.is_empty());
            assert_eq!(tail.len(), 0);
        }
    }
}
