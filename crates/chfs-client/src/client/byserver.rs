//! Reads of several chunks from servers over a fabric (`ofi+*`): one
//! `ReadSpans` per server, carrying that server's parts of the read,
//! instead of one `Read` per chunk. Each request's data arrives by a
//! single RMA write into a buffer here, and is then copied to its places
//! in the caller's buffer.
//!
//! Over the fabric every chunk request costs the provider an operation
//! and a message each way. With 64 KiB chunks (the default) a 1 MiB read
//! is 16 of them, and over `ofi+tcp` the provider's per-operation CPU
//! halved what such reads moved, compared with 1 MiB chunks.
//!
//! Only for chunks of up to 256 KiB ([`CHUNK_MAX`]): larger ones move
//! straight into the caller's memory, a chunk per RMA, without the copy.
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
use chfs_proto::Response;

use super::{unexpected, Client, OpenFile};
use crate::conn::Landing;
use crate::error::Result;
use crate::pool::{Op, PoolState};

/// One request: its server, its spans (chunk, offset, length), and where
/// each span's bytes go in the caller's buffer.
struct Req {
    server: usize,
    spans: Vec<(u64, u32, u32)>,
    places: Vec<usize>,
    len: usize,
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

/// Most bytes of one request (a server's parts of a larger read go in
/// several): the buffers here stay this small.
const REQ_MAX: usize = 4 << 20;

impl Client {
    /// `pread` of `buf.len()` bytes at `off` (below the file size this
    /// client knows) with one `ReadSpans` per fabric server; None when
    /// not for this read (a server not over a fabric, no more than one
    /// chunk per server, a server that does not know `ReadSpans` or
    /// refused it): then read plainly.
    pub(super) fn read_by_server(
        &self,
        st: &PoolState,
        f: &OpenFile,
        buf: &mut [u8],
        off: u64,
        flags: u16,
    ) -> Result<Option<usize>> {
        if st.is_node_local(&f.path) {
            return Ok(None);
        }
        let cs = f.meta.chunk_size as u64;
        let list = st.ring.list();
        // Over TCP (most pools) this is all it costs a read.
        let first = st.owner_of_hash(&f.path, f.hash, off / cs);
        if !list
            .servers
            .get(first)
            .is_some_and(|a| crate::fabric_link::is_fabric(a))
        {
            return Ok(None);
        }
        // Each server's open request (a pool may have thousands).
        let mut open: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let mut reqs: Vec<Req> = Vec::new();
        let mut pieces = 0;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / cs;
            let in_chunk = (pos % cs) as u32;
            let n = ((cs - in_chunk as u64) as usize).min(buf.len() - done);
            let server = st.owner_of_hash(&f.path, f.hash, idx);
            let Some(addr) = list.servers.get(server) else {
                return Ok(None);
            };
            if !crate::fabric_link::is_fabric(addr) || self.inner.no_spans.has(addr) {
                return Ok(None);
            }
            let r = match open.get(&server).copied() {
                Some(r) if reqs[r].spans.len() < MAX_SPANS && reqs[r].len + n <= REQ_MAX => r,
                _ => {
                    reqs.push(Req {
                        server,
                        spans: Vec::new(),
                        places: Vec::new(),
                        len: 0,
                    });
                    open.insert(server, reqs.len() - 1);
                    reqs.len() - 1
                }
            };
            reqs[r].spans.push((idx, in_chunk, n as u32));
            reqs[r].places.push(done);
            reqs[r].len += n;
            pieces += 1;
            done += n;
        }
        if reqs.len() == pieces {
            // A chunk per request either way.
            return Ok(None);
        }
        let ops: Vec<Op<'_>> = reqs
            .iter()
            .map(|r| {
                Op::req(
                    r.server,
                    &super::ahead::read_spans(f, flags, r.spans.clone()),
                )
            })
            .collect();
        let mut bufs: Vec<Vec<u8>> = SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            reqs.iter()
                .map(|r| {
                    // (Every byte is written below: by the reply, or by
                    // zeros where it is short.)
                    let mut b = spare.pop().unwrap_or_default();
                    b.resize(r.len, 0);
                    b
                })
                .collect()
        });
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        self.count(ops.len());
        let results = self.inner.pool.read_into(st, &ops, &mut dsts);
        let mut outcome = Ok(Some(buf.len()));
        for ((r, d), o) in results.into_iter().zip(dsts).zip(&ops) {
            match r {
                Ok(Landing::Landed(k)) => {
                    let k = k.min(d.len());
                    d[k..].fill(0);
                }
                Ok(Landing::Reply(Response::Data(x))) => {
                    let k = x.len().min(d.len());
                    d[..k].copy_from_slice(&x[..k]);
                    d[k..].fill(0);
                }
                Ok(Landing::Reply(other)) => {
                    if outcome.as_ref().is_ok_and(Option::is_some) {
                        outcome = Err(unexpected(other));
                    }
                }
                Err(e)
                    if o.op == op::READ_SPANS
                        && matches!(e.errno(), libc::EPROTO | libc::ESTALE | libc::ENOBUFS) =>
                {
                    if e.errno() == libc::EPROTO {
                        self.inner.no_spans.add(&list.servers[o.server]);
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
        if matches!(outcome, Ok(Some(_))) {
            for (r, b) in reqs.iter().zip(&bufs) {
                let mut at = 0;
                for (&(_, _, n), &place) in r.spans.iter().zip(&r.places) {
                    let n = n as usize;
                    buf[place..place + n].copy_from_slice(&b[at..at + n]);
                    at += n;
                }
            }
        }
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            for b in bufs {
                if spare.len() < SPARE_KEPT {
                    spare.push(b);
                }
            }
        });
        outcome
    }
}
