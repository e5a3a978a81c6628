//! Strided read-ahead (`CHFS_READ_AHEAD`): a descriptor of a regular
//! file open for reading (the C API opens files read-write) that reads
//! records of one length at a constant stride (the stride at
//! least the length: sequential reads too) gets, from the third such read
//! on, the next records of the pattern (up to `CHFS_READ_AHEAD` bytes of
//! them) in one request per server (`Request::ReadSpans`: the pieces of
//! the records in that server's chunks, not the gaps between them; all
//! servers' requests in flight at once), and the reads that follow are
//! answered from that buffer without a round trip. The replies are kept
//! as they came; a read copies its record out of them. A local server's
//! reply goes to a slot of the landing area when one is free
//! ([`crate::shm::Landing`]: the server copies the records there itself,
//! not through the socket); a slot whose request failed is given up.
//!
//! Consistency (SEMANTICS.md, "data written on node A read on node B"):
//! the buffer belongs to one descriptor and goes with it (close); it is
//! dropped at `fsync`, when it is older than [`MAX_AGE`], and when this
//! client changed the file's data or entry meanwhile through any
//! descriptor or path (a write, truncate, create, unlink, rename: the
//! generations of [`DataGens`], taken before the buffer was asked for and
//! compared at each use, so bytes older than what this process wrote are
//! never returned). Records are only fetched where they lie wholly below
//! the size this client knows; a read the buffer does not hold whole is a
//! plain read, so reads at or past the end, short files and holes give
//! exactly what a plain read gives.
//!
//! A server that does not know `ReadSpans` (an older chfsd: `EPROTO`) is
//! remembered by address and sent one plain `Read` per record piece
//! instead, pipelined in the same batch. Over a fabric (`ofi+*`) the
//! records of a request of `CHFS_RDMA_THRESH` bytes or more land in this
//! buffer by the server's RMA write, as a `Read`'s data does. A server
//! that refuses one (`ESTALE`: a chunk named is not its own, the client's
//! server list is out of date) or any other failure makes that read a
//! plain read.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chfs_proto::msg::{op, MAX_SPANS};
use chfs_proto::Request;
use chfs_sys::lock;

use super::{fill_read, rw_flags, Client, OpenFile};
use crate::error::Result;
use crate::pool::{Op, PoolState};
use crate::shm::Buf;

/// Oldest a read-ahead buffer is used (from when it was asked for).
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);

/// Reads of one pattern seen before records are fetched ahead.
const STREAK: u32 = 2;

/// Most records fetched at once (however small they are).
const MAX_RECORDS: u64 = 4096;

/// Generations of the data of the paths this client changes: a slot per
/// path hash, bumped when a change of a path in it has completed, and one
/// for every path (renames).
pub(crate) struct DataGens {
    slots: [AtomicU64; 64],
    all: AtomicU64,
}

impl Default for DataGens {
    fn default() -> Self {
        DataGens {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            all: AtomicU64::new(0),
        }
    }
}

impl DataGens {
    fn slot(&self, path: &str) -> &AtomicU64 {
        &self.slots[(chfs_proto::ring::path_hash(path) % 64) as usize]
    }

    /// The generation of `path`'s data now.
    pub fn of(&self, path: &str) -> (u64, u64) {
        (
            self.slot(path).load(Ordering::SeqCst),
            self.all.load(Ordering::SeqCst),
        )
    }

    /// A change of `path` completed (or failed: it may have happened).
    pub fn bump(&self, path: &str) {
        self.slot(path).fetch_add(1, Ordering::SeqCst);
    }

    /// A change of any path completed.
    pub fn bump_all(&self) {
        self.all.fetch_add(1, Ordering::SeqCst);
    }
}

/// Bumps a path's generation (or every path's) when dropped: at every
/// way out of a change.
pub(crate) struct Changing<'a> {
    gens: &'a DataGens,
    path: Option<&'a str>,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        match self.path {
            Some(p) => self.gens.bump(p),
            None => self.gens.bump_all(),
        }
    }
}

impl DataGens {
    /// Bumps `path`'s generation when the returned guard is dropped.
    pub fn changing<'a>(&'a self, path: &'a str) -> Changing<'a> {
        Changing {
            gens: self,
            path: Some(path),
        }
    }

    /// Bumps every path's generation when the returned guard is dropped.
    pub fn changing_all(&self) -> Changing<'_> {
        Changing {
            gens: self,
            path: None,
        }
    }
}

/// The `ReadSpans` of `spans` (chunk, offset, length) of `f`'s file.
pub(super) fn read_spans(f: &OpenFile, flags: u16, spans: Vec<(u64, u32, u32)>) -> Request {
    Request::ReadSpans {
        path: f.path.clone(),
        fileid: f.meta.fileid,
        chunk_size: f.meta.chunk_size,
        flags,
        epoch: f.meta.epoch(),
        spans,
    }
}

/// Servers (by address) that answered a request as unknown (older
/// chfsd: `EPROTO`), by opcode: `ReadSpans` (read record by record
/// instead), `StatData` (ask for the entry alone) and `WriteSpans` (write
/// chunk by chunk). Per server, so that
/// one older server in a pool does not cost the others' requests; the
/// usual case, none, is one atomic load.
#[derive(Default)]
pub(crate) struct OlderServers {
    /// Bit `op` set: some server refused opcode `op` (< 64).
    ops: AtomicU64,
    refused: Mutex<HashSet<(String, u16)>>,
}

impl OlderServers {
    /// Did `addr` answer opcode `op` as an unknown request?
    pub(super) fn refused(&self, addr: &str, op: u16) -> bool {
        if self.ops.load(Ordering::Relaxed) & Self::bit(op) == 0 {
            return false;
        }
        lock(&self.refused).contains(&(addr.to_string(), op))
    }

    /// `addr` answered opcode `op` as an unknown request.
    pub(super) fn add(&self, addr: &str, op: u16) {
        tracing::debug!(server = %addr, op, "an older server: not asked for this again");
        lock(&self.refused).insert((addr.to_string(), op));
        self.ops.fetch_or(Self::bit(op), Ordering::Relaxed);
    }

    fn bit(op: u16) -> u64 {
        // (Opcodes past 63 share the last bit: only a cheaper test lost.)
        1 << op.min(63)
    }
}

/// The read-ahead state of one descriptor.
#[derive(Default)]
pub(crate) struct ReadAhead {
    /// The last read (offset, length).
    prev: Option<(u64, usize)>,
    /// The distance between the last two reads, and how many reads in a
    /// row kept it.
    stride: u64,
    streak: u32,
    win: Option<Window>,
    /// The read-ahead is `CHFS_READ_AHEAD >> shrink` bytes: a window
    /// dropped before it was used up (a change of the file by this
    /// client, its age) halves it, one used up doubles it back, so a
    /// descriptor that reads and writes in turn does not fetch a window
    /// per read.
    shrink: u32,
    /// Where the window dropped last would have gone on (its records
    /// were all read when the next fetch starts there).
    next: Option<u64>,
    /// The reply buffers of the window dropped last, for the next fetch:
    /// fresh memory for each would cost a page fault per 4 KiB received
    /// (a quarter of the time of a read-ahead of 47,008-byte records).
    spare: Vec<Vec<u8>>,
}

/// Records fetched ahead: `n` records of `rec` bytes every `stride` bytes
/// from `first`; or (`whole`) a small file's bytes that came with its
/// open (`CHFS_OPEN_DATA`): one record of the file's size at 0.
struct Window {
    first: u64,
    rec: usize,
    stride: u64,
    n: u64,
    data: Records,
    gen: (u64, u64),
    at: Instant,
    /// The record is the whole file as the open found it: any read is
    /// answered from it, ending at its end.
    whole: bool,
}

/// The bytes of records, one after the other (record i at i * length),
/// as they came: in the reply buffers of the requests, a piece (of one
/// chunk) at a time.
struct Records {
    bufs: Vec<Buf>,
    /// In order, covering the records without gaps.
    pieces: Vec<Piece>,
}

/// `len` bytes of the records from `at`, found at `boff` in `bufs[buf]`.
struct Piece {
    at: usize,
    len: usize,
    buf: usize,
    boff: usize,
}

impl Records {
    /// Copies the bytes from `a` on into `out`.
    fn copy_to(&self, a: usize, out: &mut [u8]) {
        let mut k = self.pieces.partition_point(|p| p.at + p.len <= a);
        let mut done = 0;
        while done < out.len() {
            let p = &self.pieces[k];
            let from = a + done - p.at;
            let m = (p.len - from).min(out.len() - done);
            let src = p.boff + from;
            out[done..done + m].copy_from_slice(&self.bufs[p.buf].bytes()[src..src + m]);
            done += m;
            k += 1;
        }
    }
}

impl ReadAhead {
    /// Drops the records fetched ahead.
    pub fn drop_window(&mut self) {
        if let Some(w) = self.win.take() {
            self.next = Some(w.first + w.n * w.stride);
            // (Heap buffers kept for the next fetch; slots go back to
            // the area.)
            self.spare = w
                .data
                .bufs
                .into_iter()
                .filter_map(|b| b.retire(false))
                .collect();
        }
    }

    /// Drops a window that could not be used up.
    fn wasted(&mut self) {
        self.drop_window();
        self.next = None;
        self.shrink = (self.shrink + 1).min(63);
    }

    /// The bytes of a small file that came with its open (of `size`
    /// bytes; `data` shorter where its end is a hole), asked for at `at`
    /// when the file's generation here was `gen`.
    pub(super) fn seed_whole(&mut self, size: u64, data: &[u8], gen: (u64, u64), at: Instant) {
        if data.len() as u64 > size {
            return;
        }
        let mut bytes = data.to_vec();
        bytes.resize(size as usize, 0);
        self.win = Some(Window {
            first: 0,
            rec: size as usize,
            stride: size.max(1),
            n: 1,
            data: Records {
                bufs: vec![Buf::Heap(bytes)],
                pieces: vec![Piece {
                    at: 0,
                    len: size as usize,
                    buf: 0,
                    boff: 0,
                }],
            },
            gen,
            at,
            whole: true,
        });
    }

    /// Copies the read of `buf.len()` bytes at `off` from the window if it
    /// holds it whole (a whole file's window: as much of it as lies below
    /// the file's end) and is still valid (`gen`: the file's generation
    /// now); the bytes copied. Drops a window no longer valid.
    fn serve(&mut self, buf: &mut [u8], off: u64, gen: (u64, u64)) -> Option<usize> {
        let w = self.win.as_ref()?;
        if w.gen != gen || w.at.elapsed() > MAX_AGE {
            match w.whole {
                // (Not a pattern's: no bearing on how far ahead to read.)
                true => self.win = None,
                false => self.wasted(),
            }
            return None;
        }
        if w.whole {
            let n = (w.rec as u64).saturating_sub(off).min(buf.len() as u64) as usize;
            if n > 0 {
                w.data.copy_to(off as usize, &mut buf[..n]);
            }
            return Some(n);
        }
        if off < w.first {
            return None;
        }
        let i = (off - w.first) / w.stride;
        let within = ((off - w.first) % w.stride) as usize;
        if i >= w.n || within + buf.len() > w.rec {
            return None;
        }
        w.data.copy_to(i as usize * w.rec + within, buf);
        Some(buf.len())
    }

    /// Records the read of `len` bytes at `off`; true when it continues a
    /// pattern seen [`STREAK`] times before.
    fn saw(&mut self, off: u64, len: usize) -> bool {
        let mut go = false;
        match self.prev {
            Some((p, l)) if l == len && off > p && off - p >= len as u64 => {
                let d = off - p;
                if d == self.stride {
                    self.streak += 1;
                } else {
                    self.stride = d;
                    self.streak = 1;
                }
                go = self.streak >= STREAK;
            }
            _ => self.streak = 0,
        }
        self.prev = Some((off, len));
        go
    }
}

/// One request of a fetch: its server, its spans (chunk, offset,
/// length) and their total length; a plain `Read` of one span, or a
/// `ReadSpans`.
struct Req {
    server: usize,
    spans: Vec<(u64, u32, u32)>,
    len: usize,
    plain: bool,
}

impl Client {
    /// Answers `pread(buf, off)` of a descriptor from its
    /// read-ahead window, fetching the next records of its pattern first
    /// when the read continues one. None: not answered (read plainly).
    pub(super) fn read_ahead(
        &self,
        st: &PoolState,
        f: &OpenFile,
        buf: &mut [u8],
        off: u64,
    ) -> Result<Option<usize>> {
        let Some(ra) = &f.ahead else {
            return Ok(None);
        };
        // (A request's reply is at most a chunk's size.)
        let limit = self
            .inner
            .read_ahead
            .load(Ordering::Relaxed)
            .min(chfs_proto::MAX_CHUNK_SIZE as u64);
        let len = buf.len();
        if limit == 0 || len as u64 > limit / 2 {
            let mut a = lock(ra);
            // (A whole file's window answers reads of any length.)
            if limit > 0 && a.win.as_ref().is_some_and(|w| w.whole) {
                if let Some(n) = a.serve(buf, off, self.inner.gens.of(&f.path)) {
                    return Ok(Some(n));
                }
            }
            a.drop_window();
            return Ok(None);
        }
        // Taken before the records are asked for: a change this client
        // completes after this drops them.
        let gen = self.inner.gens.of(&f.path);
        let (stride, limit, spare) = {
            let mut a = lock(ra);
            if let Some(n) = a.serve(buf, off, gen) {
                a.saw(off, len);
                return Ok(Some(n));
            }
            if !a.saw(off, len) {
                return Ok(None);
            }
            a.drop_window();
            if a.next.take() == Some(off) {
                // The last window was read to its end.
                a.shrink = a.shrink.saturating_sub(1);
            }
            (a.stride, limit >> a.shrink, std::mem::take(&mut a.spare))
        };
        let size = self.file_size(st, f, false)?;
        let k = (limit / len as u64).min(MAX_RECORDS);
        let n = (0..k)
            .take_while(|i| {
                i.checked_mul(stride)
                    .and_then(|d| d.checked_add(off.saturating_add(len as u64)))
                    .is_some_and(|end| end <= size)
            })
            .count() as u64;
        if n < 2 {
            return Ok(None);
        }
        let at = Instant::now();
        let data = match self.fetch_records(st, f, off, stride, len, n, spare) {
            Ok(d) => d,
            Err(_) => {
                // Read plainly (which reports what is wrong, if anything
                // still is), and look for the pattern again.
                let mut a = lock(ra);
                a.streak = 0;
                return Ok(None);
            }
        };
        data.copy_to(0, buf);
        lock(ra).win = Some(Window {
            first: off,
            rec: len,
            stride,
            n,
            data,
            gen,
            at,
            whole: false,
        });
        Ok(Some(len))
    }

    /// The `n` records of `rec` bytes every `stride` bytes from `first`:
    /// one `ReadSpans` per server for the pieces of its chunks (plain
    /// reads from servers that do not know it), pipelined; into the
    /// buffers of `spare` as far as they go.
    #[allow(clippy::too_many_arguments)]
    fn fetch_records(
        &self,
        st: &PoolState,
        f: &OpenFile,
        first: u64,
        stride: u64,
        rec: usize,
        n: u64,
        mut spare: Vec<Vec<u8>>,
    ) -> Result<Records> {
        let cs = f.meta.chunk_size as u64;
        let list = st.ring.list();
        // Per server: plain reads?, and its open ReadSpans request.
        let mut servers: Vec<Option<(bool, Option<usize>)>> = vec![None; list.servers.len()];
        let mut reqs: Vec<Req> = Vec::new();
        let mut pieces = Vec::new();
        let mut at = 0usize;
        for i in 0..n {
            let mut pos = first + i * stride;
            let mut left = rec;
            while left > 0 {
                let idx = pos / cs;
                let in_chunk = pos % cs;
                let m = ((cs - in_chunk) as usize).min(left);
                let span = (idx, in_chunk as u32, m as u32);
                let server = st.owner_of_hash(&f.path, f.hash, idx);
                let slot = servers[server].get_or_insert_with(|| {
                    let addr = &list.servers[server];
                    let plain = self.inner.older.refused(addr, op::READ_SPANS);
                    (plain, None)
                });
                let r = match slot.1 {
                    Some(r) if !slot.0 && reqs[r].spans.len() < MAX_SPANS => r,
                    _ => {
                        reqs.push(Req {
                            server,
                            spans: Vec::new(),
                            len: 0,
                            plain: slot.0,
                        });
                        slot.1 = Some(reqs.len() - 1);
                        reqs.len() - 1
                    }
                };
                pieces.push(Piece {
                    at,
                    len: m,
                    buf: r,
                    boff: reqs[r].len,
                });
                reqs[r].spans.push(span);
                reqs[r].len += m;
                at += m;
                pos += m as u64;
                left -= m;
            }
        }
        let flags = rw_flags(&f.meta, lock(&f.state).wrote);
        let ops: Vec<Op<'_>> = reqs
            .iter()
            .map(|r| {
                let req = if r.plain {
                    let (idx, off, len) = r.spans[0];
                    Request::Read {
                        path: f.path.clone(),
                        fileid: f.meta.fileid,
                        idx,
                        off,
                        len,
                        chunk_size: f.meta.chunk_size,
                        flags,
                        epoch: f.meta.epoch(),
                    }
                } else {
                    read_spans(f, flags, r.spans.clone())
                };
                Op::req(r.server, &req)
            })
            .collect();
        let pool = &self.inner.pool;
        let mut bufs: Vec<Buf> = reqs
            .iter()
            .map(|r| {
                // A local server's reply lands in a slot when one is free.
                // (Old bytes are all overwritten: by the reply, or by
                // zeros where it is short.)
                if let Some(s) = pool.landing_slot(st, r.server, r.len) {
                    return Buf::Slot(s);
                }
                let mut b = spare.pop().unwrap_or_default();
                b.truncate(r.len);
                b.resize(r.len, 0);
                Buf::Heap(b)
            })
            .collect();
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.bytes_mut()).collect();
        self.count(ops.len());
        let results = self.inner.pool.read_into(st, &ops, &mut dsts);
        let mut first_err = None;
        let mut failed = Vec::new();
        for (i, ((r, d), o)) in results.into_iter().zip(dsts).zip(&ops).enumerate() {
            if r.is_err() {
                failed.push(i);
            }
            match r.and_then(|l| fill_read(d, l, None)) {
                Ok(()) => {}
                Err(e) => {
                    if e.errno() == libc::EPROTO && o.op == op::READ_SPANS {
                        self.inner
                            .older
                            .add(&list.servers[o.server], op::READ_SPANS);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => {
                // A server may still write a slot whose read failed.
                for (i, b) in bufs.into_iter().enumerate() {
                    b.retire(failed.contains(&i));
                }
                Err(e)
            }
            None => Ok(Records { bufs, pieces }),
        }
    }
}
