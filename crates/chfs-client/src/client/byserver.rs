//! Reads of several chunks by server: one `ReadSpans` per server,
//! carrying that server's parts of the read, instead of one `Read` per
//! chunk. Each request's data arrives in one piece: by a single RMA write
//! into a buffer here (over a fabric, `ofi+*`) or by the server's copy
//! into a slot of the landing area (a server on this host), and is then
//! copied to its places in the caller's buffer; or as one reply over a
//! socket (TCP, or a Unix socket without the landing area), received
//! straight into those places (a recvmsg(2) with an iovec per span, at
//! most [`crate::conn::MAX_PARTS`] spans per request).
//!
//! Every chunk request costs each side an operation and a message each
//! way. With 64 KiB chunks (the default) a 1 MiB read is 16 of them.
//! Over `ofi+tcp` the provider's per-operation CPU halved what such reads
//! moved, compared with 1 MiB chunks. Over TCP (loopback, 2 ranks and 2
//! servers on 2 CPUs) one process's 1 MiB reads went from 1,741-2,041
//! to 1,965-2,451 MiB/s with a copy out of a buffer, and further without
//! it (crates/chfs-bench/README.md).
//!
//! Only for chunks of up to 256 KiB ([`CHUNK_MAX`]): larger ones move
//! straight into the caller's memory, a chunk per request, without the
//! copy.
//!
//! Writes over a fabric go the same way ([`Client::write_groups`]): each
//! fabric server's pieces of a write of several chunks of up to 256 KiB
//! in one `WriteSpans`, gathered into one buffer the server pulls.
//!
//! `ReadSpans` pads each span with zeros, as a plain read's short reply
//! is padded here, and the read is already cut at the file size this
//! client knows; so the bytes are those of plain reads. A server that does
//! not know `ReadSpans`, or refuses one (`ESTALE`: the client's list is
//! out of date), makes the call a plain read; so does a request that
//! cannot lend its buffer (`ENOBUFS`: over `ofi+shm` once the quarantine
//! of windows never answered is full, where a chunk that fits a message
//! still goes in it).

use chfs_proto::msg::{op, MAX_SPANS};

use super::io::LAND_SLOTS_PER_READ;
use super::{fill_parts, fill_read, Client, OpenFile};
use crate::error::Result;
use crate::pool::{Dst, Op, PoolState};
use crate::shm::{Buf, SLOT};

/// How a request's data comes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// By RMA into a buffer here.
    Fabric,
    /// Into a slot of the landing area.
    Land,
    /// As the reply's data, received into a buffer here.
    Socket,
}

impl Via {
    /// Most bytes of one request: a slot; a buffer kept small.
    fn req_max(self) -> usize {
        match self {
            Via::Land => SLOT,
            Via::Fabric => REQ_MAX,
            Via::Socket => SOCKET_REQ_MAX,
        }
    }

    /// Most spans of one request: a socket's are received in place, an
    /// iovec each.
    fn spans_max(self) -> usize {
        match self {
            Via::Socket => crate::conn::MAX_PARTS,
            _ => MAX_SPANS,
        }
    }
}

/// One request: its server, its spans (chunk, offset, length), and where
/// each span's bytes go in the caller's buffer.
struct Req {
    server: usize,
    spans: Vec<(u64, u32, u32)>,
    places: Vec<usize>,
    len: usize,
    via: Via,
}

thread_local! {
    /// Buffers the requests' data landed in, kept for this thread's next
    /// read (fresh memory would cost a page fault per 4 KiB).
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Largest chunk size for which reads go by server: with larger chunks
/// the per-chunk operations weigh less than the copy out of the buffer
/// (a chunk's data moves straight into the caller's memory otherwise).
pub(super) const CHUNK_MAX: u64 = 256 << 10;

/// Most buffers kept per thread.
const SPARE_KEPT: usize = 4;

/// Most bytes of one request over a fabric (a server's parts of a larger
/// read go in several): the buffers here stay this small.
const REQ_MAX: usize = 4 << 20;

/// Most bytes of one request over a socket: 16 chunks of 64 KiB (the
/// servers' requests of a large read are many, in flight at once).
const SOCKET_REQ_MAX: usize = 1 << 20;

impl Client {
    /// `pread` of `buf.len()` bytes at `off` (below the file size this
    /// client knows) with one `ReadSpans` per server; None when not for
    /// this read (no more than one chunk per server, a server that does
    /// not know `ReadSpans` or refused it, no landing slot free): then
    /// read plainly.
    pub(super) fn read_by_server(
        &self,
        st: &PoolState,
        f: &OpenFile,
        mut buf: &mut [u8],
        off: u64,
        flags: u16,
    ) -> Result<Option<usize>> {
        if st.is_node_local(&f.path) {
            return Ok(None);
        }
        let cs = f.meta.chunk_size as u64;
        let list = st.ring.list();
        let pool = &self.inner.pool;
        // Over the fabric, into the landing area, or through the socket?
        let how = |server: usize| {
            let addr = list.servers.get(server)?;
            Some(if crate::fabric_link::is_fabric(addr) {
                Via::Fabric
            } else if pool.landing(st, server).is_some() {
                Via::Land
            } else {
                Via::Socket
            })
        };
        // Each server's open request (a pool may have thousands).
        let mut open: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let mut reqs: Vec<Req> = Vec::new();
        // Each piece's request, in the order of the caller's buffer.
        let mut seq: Vec<(usize, usize)> = Vec::new();
        let mut pieces = 0;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / cs;
            let in_chunk = (pos % cs) as u32;
            let n = ((cs - in_chunk as u64) as usize).min(buf.len() - done);
            let server = st.owner_of_hash(&f.path, f.hash, idx);
            // (Asked once per server of the read, not per chunk.)
            let via = match open.get(&server) {
                Some(&r) => reqs[r].via,
                None => match (list.servers.get(server), how(server)) {
                    (Some(addr), Some(via)) if !self.inner.older.refused(addr, op::READ_SPANS) => {
                        via
                    }
                    _ => return Ok(None),
                },
            };
            let r = match open.get(&server).copied() {
                Some(r)
                    if reqs[r].spans.len() < via.spans_max()
                        && reqs[r].len + n <= via.req_max() =>
                {
                    r
                }
                _ => {
                    reqs.push(Req {
                        server,
                        spans: Vec::new(),
                        places: Vec::new(),
                        len: 0,
                        via,
                    });
                    open.insert(server, reqs.len() - 1);
                    reqs.len() - 1
                }
            };
            reqs[r].spans.push((idx, in_chunk, n as u32));
            reqs[r].places.push(done);
            reqs[r].len += n;
            seq.push((r, n));
            pieces += 1;
            done += n;
        }
        if reqs.len() == pieces
            || reqs.iter().filter(|r| r.via == Via::Land).count() > LAND_SLOTS_PER_READ
        {
            // A chunk per request either way; or more slots than a read
            // takes (the plain read lands what it can).
            return Ok(None);
        }
        // Over a fabric whose provider revokes closed registrations, the
        // caller's buffer is lent once and each server writes its parts
        // at their places in it: no copy on either side.
        if let Some(ep) = self.placed_endpoint(st, &reqs) {
            match self.read_placed(st, f, flags, buf, &reqs, &ep) {
                Placed::Done(r) => return r,
                Placed::Packed(b) => buf = b,
            }
        }
        // Slots first: a read that cannot have them all is a plain one.
        let mut slots = Vec::new();
        for r in reqs.iter().filter(|r| r.via == Via::Land) {
            match pool.landing(st, r.server).and_then(|a| a.take(r.len)) {
                Some(s) => slots.push(s),
                None => return Ok(None),
            }
        }
        let mut slots = slots.into_iter();
        let ops: Vec<Op<'_>> = reqs
            .iter()
            .map(|r| {
                Op::req(
                    r.server,
                    &super::ahead::read_spans(f, flags, r.spans.clone()),
                )
            })
            .collect();
        // A slot or a buffer for each request whose data comes in one
        // piece elsewhere; none for those received in place.
        let mut bufs: Vec<Option<Buf>> = reqs
            .iter()
            .map(|r| {
                if r.via == Via::Socket {
                    return None;
                }
                // (Each landing request has its slot: taken above.)
                let slot = if r.via == Via::Land {
                    slots.next()
                } else {
                    None
                };
                Some(match slot {
                    Some(s) => Buf::Slot(s),
                    None => {
                        // (Every byte is written below: by the reply,
                        // or by zeros where it is short.)
                        let mut b = spare();
                        b.resize(r.len, 0);
                        Buf::Heap(b)
                    }
                })
            })
            .collect();
        let mut outcome = Ok(Some(buf.len()));
        let mut failed = vec![false; ops.len()];
        {
            // The places in the caller's buffer of the requests received
            // in place, each request's in order.
            let mut parts: Vec<Vec<&mut [u8]>> = reqs
                .iter()
                .map(|r| match r.via {
                    Via::Socket => Vec::with_capacity(r.spans.len()),
                    _ => Vec::new(),
                })
                .collect();
            let mut rest = &mut buf[..];
            for &(r, n) in &seq {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
                rest = tail;
                if reqs[r].via == Via::Socket {
                    parts[r].push(piece);
                }
            }
            let mut dsts: Vec<Dst> = bufs
                .iter_mut()
                .zip(parts)
                .map(|(b, p)| match b {
                    Some(b) => Dst::One(b.bytes_mut()),
                    None => Dst::Parts(p),
                })
                .collect();
            self.count(ops.len());
            let results = self.inner.pool.read_into(st, &ops, &mut dsts);
            for (i, (((r, d), o), q)) in results
                .into_iter()
                .zip(dsts.iter_mut())
                .zip(&ops)
                .zip(&reqs)
                .enumerate()
            {
                failed[i] = r.is_err();
                match r {
                    Ok(l) => {
                        let put = match d {
                            Dst::One(d) => fill_read(d, l, None),
                            Dst::Parts(p) => fill_parts(p, l),
                            Dst::Placed(..) => unreachable!("placed reads are read_placed's"),
                        };
                        if let Err(e) = put {
                            if outcome.as_ref().is_ok_and(Option::is_some) {
                                outcome = Err(e);
                            }
                        }
                    }
                    // (Into the landing area, the pool did not send it
                    // again on a new connection: the plain read does.)
                    Err(e) if q.via == Via::Land && crate::pool::retry_safe(&e, o.op) => {
                        if outcome.is_ok() {
                            outcome = Ok(None);
                        }
                    }
                    Err(e)
                        if o.op == op::READ_SPANS
                            && matches!(e.errno(), libc::EPROTO | libc::ESTALE | libc::ENOBUFS) =>
                    {
                        if e.errno() == libc::EPROTO {
                            self.inner
                                .older
                                .add(&list.servers[o.server], op::READ_SPANS);
                        }
                        if outcome.is_ok() {
                            outcome = Ok(None);
                        }
                    }
                    Err(e) => {
                        if outcome.is_ok() {
                            outcome = Err(e);
                        }
                    }
                }
            }
        }
        if matches!(outcome, Ok(Some(_))) {
            for (r, b) in reqs.iter().zip(&bufs) {
                let Some(b) = b else { continue };
                let mut at = 0;
                let b = b.bytes();
                for (&(_, _, n), &place) in r.spans.iter().zip(&r.places) {
                    let n = n as usize;
                    buf[place..place + n].copy_from_slice(&b[at..at + n]);
                    at += n;
                }
            }
        }
        give_back(
            bufs.into_iter()
                .zip(failed)
                .filter_map(|(b, failed)| b.and_then(|b| b.retire(failed)))
                .collect(),
        );
        outcome
    }
}

/// What [`Client::read_placed`] did: the read (done, or to be read
/// plainly: `Ok(None)`), or nothing, the buffer given back for a
/// `ReadSpans` per server.
enum Placed<'a> {
    Done(Result<Option<usize>>),
    Packed(&'a mut [u8]),
}

impl Client {
    /// The endpoint every request of a read by server lends the caller's
    /// memory on, when they all go over a fabric (one endpoint: a key names
    /// memory of one) whose servers know `ReadSpansPlaced`.
    fn placed_endpoint(
        &self,
        st: &PoolState,
        reqs: &[Req],
    ) -> Option<std::sync::Arc<chfs_fabric::Endpoint>> {
        let list = st.ring.list();
        let mut on: Option<std::sync::Arc<chfs_fabric::Endpoint>> = None;
        for r in reqs {
            if r.via != Via::Fabric
                || self
                    .inner
                    .older
                    .refused(list.servers.get(r.server)?, op::READ_SPANS_PLACED)
            {
                return None;
            }
            let link = self.inner.pool.conn(st, r.server).ok()?;
            let ep = link.lender()?;
            match &on {
                Some(o) if !std::sync::Arc::ptr_eq(o, ep) => return None,
                Some(_) => {}
                None => on = Some(ep.clone()),
            }
        }
        on
    }

    /// The read of `reqs` (each a server's spans and their places in
    /// `buf`) with `buf` lent once on `ep` and each server's spans written
    /// at their places in it by the server (`ReadSpansPlaced`). A server
    /// that does not know the request (EPROTO, remembered), or refuses it
    /// (ESTALE, ENOBUFS), makes the read a plain one; memory that cannot
    /// be lent, a read by `ReadSpans` per server.
    fn read_placed<'a>(
        &self,
        st: &PoolState,
        f: &OpenFile,
        flags: u16,
        buf: &'a mut [u8],
        reqs: &[Req],
        ep: &chfs_fabric::Endpoint,
    ) -> Placed<'a> {
        let total = buf.len();
        // SAFETY: the lending ends below (`lent.end()`), after every
        // request naming the memory was answered or failed (`read_into`
        // returns only then) and before `buf` is used again; it is held
        // in this frame only, never leaked.
        let lent = match unsafe { ep.lend_mut(buf) } {
            Ok(l) => l,
            Err((_, buf)) => return Placed::Packed(buf),
        };
        let key = lent.remote_key();
        let ops: Vec<Op<'_>> = reqs
            .iter()
            .map(|r| {
                let req = super::ahead::read_spans(f, flags, r.spans.clone()).into_placed();
                Op::req(r.server, &req)
            })
            .collect();
        let mut dsts: Vec<Dst> = reqs
            .iter()
            .map(|r| {
                let from = r.places[0];
                let end = r.places.last().copied().unwrap_or(from)
                    + r.spans.last().map_or(0, |s| s.2 as usize);
                Dst::Placed(
                    chfs_fabric::RemoteKey {
                        addr: key.addr + from as u64,
                        len: (end - from) as u64,
                        key: key.key,
                    },
                    ep,
                )
            })
            .collect();
        self.count(ops.len());
        let results = self.inner.pool.read_into(st, &ops, &mut dsts);
        drop(dsts);
        lent.end();
        let list = st.ring.list();
        let mut outcome = Ok(Some(total));
        for ((r, o), q) in results.into_iter().zip(&ops).zip(reqs) {
            let e = match r {
                Ok(crate::conn::Landing::Landed(n)) if n == q.len => continue,
                Ok(other) => crate::error::Error::new(
                    libc::EIO,
                    format!(
                        "{}: server {} placed {} of {} bytes",
                        f.path,
                        list.servers.get(q.server).map_or("?", |s| s.as_str()),
                        match other {
                            crate::conn::Landing::Landed(n) => n.to_string(),
                            crate::conn::Landing::Reply(_) => "none".into(),
                        },
                        q.len
                    ),
                ),
                Err(e) => e,
            };
            match e.errno() {
                libc::EPROTO | libc::ESTALE | libc::ENOBUFS => {
                    if e.errno() == libc::EPROTO {
                        self.inner
                            .older
                            .add(&list.servers[o.server], op::READ_SPANS_PLACED);
                    }
                    if outcome.is_ok() {
                        outcome = Ok(None);
                    }
                }
                _ => {
                    if outcome.as_ref().is_ok() {
                        outcome = Err(e);
                    }
                }
            }
        }
        Placed::Done(outcome)
    }
}

/// One chunk's part of a write: the chunk, the offset in it, its bytes,
/// where they are in the caller's buffer, and the chunk's server.
pub(super) struct Piece {
    pub idx: u64,
    pub off: u32,
    pub n: usize,
    pub at: usize,
    pub server: usize,
}

impl Client {
    /// The pieces of a write that go to their server together, in one
    /// `WriteSpans` per group (each group's pieces in order; the others
    /// go a `Write` each): a server over a fabric with two or more of
    /// the write's pieces, chunks of up to [`CHUNK_MAX`], a server not
    /// known to refuse it. Over a fabric each chunk request is a message
    /// each way and an RMA pull of its own (a 1 MiB write of 64 KiB chunks:
    /// 16 of each), where a group is one; its bytes are gathered into one
    /// buffer first ([`gather`]). Over sockets the chunk requests are
    /// streamed and their data goes straight from the caller's buffer, so
    /// they stay as they are.
    pub(super) fn write_groups(
        &self,
        st: &PoolState,
        path: &str,
        chunk_size: u32,
        pieces: &[Piece],
    ) -> Vec<Vec<usize>> {
        if pieces.len() < 2 || chunk_size as u64 > CHUNK_MAX || st.is_node_local(path) {
            return Vec::new();
        }
        let list = st.ring.list();
        let fabric = |server: usize| {
            list.servers
                .get(server)
                .is_some_and(|a| crate::fabric_link::is_fabric(a))
        };
        // (Writes to servers over sockets, the usual case, stop here.)
        if !pieces.iter().any(|p| fabric(p.server)) {
            return Vec::new();
        }
        let mut by: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, p) in pieces.iter().enumerate() {
            if fabric(p.server) {
                by.entry(p.server).or_default().push(i);
            }
        }
        let mut groups = Vec::new();
        for (server, mine) in by {
            if mine.len() < 2
                || self
                    .inner
                    .older
                    .refused(&list.servers[server], op::WRITE_SPANS)
            {
                continue;
            }
            let mut cur: Vec<usize> = Vec::new();
            let mut len = 0;
            for i in mine {
                if !cur.is_empty() && (len + pieces[i].n > REQ_MAX || cur.len() >= MAX_SPANS) {
                    groups.push(std::mem::take(&mut cur));
                    len = 0;
                }
                len += pieces[i].n;
                cur.push(i);
            }
            // (A piece left alone goes as a plain write.)
            if cur.len() >= 2 {
                groups.push(cur);
            }
        }
        groups
    }
}

/// The bytes of a group's pieces one after the other, in a buffer of
/// this thread's spares ([`give_back`] it after the request).
pub(super) fn gather(buf: &[u8], pieces: &[Piece], group: &[usize]) -> Vec<u8> {
    let total = group.iter().map(|&i| pieces[i].n).sum();
    let mut b = spare();
    b.clear();
    b.reserve(total);
    for &i in group {
        let p = &pieces[i];
        b.extend_from_slice(&buf[p.at..p.at + p.n]);
    }
    b
}

/// A buffer of this thread's spares, or a new one. (`try_with`: a read or
/// write may come from a thread's or the process's exit handlers, such as
/// the preload's flush of open files, after this thread's storage is
/// gone: `with` would panic there.)
fn spare() -> Vec<u8> {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Buffers back to this thread's spares: those of [`gather`] (a request
/// that failed cannot have its buffer written: the server only reads
/// it), and those of reads that are safe to use again (`Buf::retire`).
pub(super) fn give_back(bufs: Vec<Vec<u8>>) {
    if bufs.is_empty() {
        return;
    }
    // (After this thread's storage is gone: dropped, see `gather`.)
    let _ = SPARE.try_with(|s| {
        let mut spare = s.borrow_mut();
        for b in bufs {
            if spare.len() < SPARE_KEPT {
                spare.push(b);
            }
        }
    });
}
