//! The descriptor table and file I/O: `open` and `close`, reads and writes
//! split into per-chunk requests issued concurrently, the write buffer and
//! publishing the size (`flush`, `fsync`, `flush_all`), and the other
//! calls on a descriptor (`seek`, `fstat`, `ftruncate`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chfs_proto::msg::{encode_write_head, encode_write_spans_head, op, WriteHead, WriteSpansHead};
use chfs_proto::path::normalize;
use chfs_proto::ring::path_hash;
use chfs_proto::{Request, Response};
use chfs_sys::lock;

use super::byserver::{gather, give_back, Piece};
use super::{
    expect_meta, fill_read, link_target, link_text, rw_flags, unexpected, Client, FileState,
    OpenFile, MAX_SYMLINKS,
};
use crate::error::{fail, Error, Result};
use crate::pool::{Op, PoolState};
use crate::types::{Stat, Whence};

/// Most landing-area slots one `pread` takes (its chunks are placed one
/// after the other in them; those that do not fit come through the
/// socket): a large read does not take every slot.
pub(crate) const LAND_SLOTS_PER_READ: usize = 4;

impl Client {
    /// Largest unpublished size of `path` among this client's open files.
    pub(super) fn local_size(&self, path: &str) -> u64 {
        lock(&self.inner.fds)
            .iter()
            .flatten()
            .filter(|f| f.path == path)
            .map(|f| {
                let s = lock(&f.state);
                let buffered = if s.buf.is_empty() {
                    0
                } else {
                    s.buf_off + s.buf.len() as u64
                };
                s.written_end.max(buffered)
            })
            .max()
            .unwrap_or(0)
    }

    pub(super) fn open_files(&self, path: &str) -> Vec<Arc<OpenFile>> {
        lock(&self.inner.fds)
            .iter()
            .flatten()
            .filter(|f| f.path == path)
            .cloned()
            .collect()
    }

    /// `open(2)` / `creat(2)`: returns a descriptor of this client.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<i32> {
        self.open_chunk_size(path, flags, mode, 0)
    }

    /// Like [`Client::open`], creating with a given chunk size (0 = default).
    pub fn open_chunk_size(
        &self,
        path: &str,
        flags: i32,
        mode: u32,
        chunk_size: u32,
    ) -> Result<i32> {
        let st = self.state();
        let mut p = normalize(path)?;
        let cs = if chunk_size == 0 {
            self.inner.chunk_size.load(Ordering::Relaxed)
        } else {
            chunk_size
        };
        if cs > chfs_proto::MAX_CHUNK_SIZE {
            return fail(libc::EINVAL, format!("chunk size {cs} out of range"));
        }
        let acc = flags & libc::O_ACCMODE;
        let wants_write = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let mut hops = 0;
        // A small file's bytes that came with its entry, the generation of
        // its data and when they were asked for (read-ahead's rules).
        let mut seed;
        let open_data = self.open_data_max();
        let meta = loop {
            seed = None;
            let mut link = None;
            let (m, created) = if flags & libc::O_CREAT != 0 {
                let nm = self.new_meta(libc::S_IFREG | (mode & 0o7777), cs);
                self.create_entry(&st, &p, nm, flags & libc::O_EXCL != 0, &[])?
            } else {
                let asked = (open_data > 0 && flags & libc::O_TRUNC == 0)
                    .then(|| (self.inner.gens.of(&p), Instant::now()));
                // A read-only open is a lookup (relayed when configured).
                // (A write-only descriptor reads nothing: no bytes, only a
                // link's target.)
                let max = if acc == libc::O_WRONLY { 0 } else { open_data };
                let with_data = match asked {
                    Some(_) => self.stat_data(&st, &p, max, !wants_write)?,
                    None => None,
                };
                match with_data {
                    Some((m, Some(target))) if m.is_symlink() => {
                        link = Some(target);
                        (m, false)
                    }
                    Some((m, data)) => {
                        seed = data.zip(asked);
                        (m, false)
                    }
                    None if wants_write => (self.stat_meta(&st, &p)?, false),
                    None => (self.lookup_meta(&st, &p)?, false),
                }
            };
            if m.is_symlink() && !created {
                if flags & libc::O_NOFOLLOW != 0 {
                    return fail(libc::ELOOP, format!("{p}: is a symbolic link (O_NOFOLLOW)"));
                }
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return fail(
                        libc::ELOOP,
                        format!("{p}: too many levels of symbolic links"),
                    );
                }
                // (The target came with the entry, or is read now.)
                let target = match link.take() {
                    Some(t) if t.len() as u64 == m.size => link_text(&t)?,
                    _ => self.read_link_meta(&st, &p, &m)?,
                };
                p = link_target(&p, &target)?;
                continue;
            }
            if m.is_dir() && wants_write {
                return fail(libc::EISDIR, format!("{p}: is a directory"));
            }
            if flags & libc::O_DIRECTORY != 0 && !m.is_dir() {
                return fail(libc::ENOTDIR, format!("{p}: not a directory"));
            }
            if flags & libc::O_TRUNC != 0 && wants_write && !created && m.is_reg() && m.size > 0 {
                break self.truncate_resolved(&st, &p, &m, 0)?;
            }
            break m;
        };
        let f = OpenFile {
            hash: path_hash(&p),
            meta,
            flags,
            pos: Mutex::new(0),
            state: Mutex::new(FileState {
                published: meta.size,
                ..Default::default()
            }),
            ahead: (acc != libc::O_WRONLY && meta.is_reg()).then(Default::default),
            path: p,
        };
        // (Not where this process wrote past the size its server knows,
        // through a descriptor that has not published it yet: a plain
        // read sees those bytes.)
        if let (Some(ra), Some((data, (gen, at)))) = (&f.ahead, seed) {
            if self.local_size(&f.path) <= meta.size {
                lock(ra).seed_whole(meta.size, &data, gen, at);
            }
        }
        let mut fds = lock(&self.inner.fds);
        let fd = match fds.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                fds.push(None);
                fds.len() - 1
            }
        };
        fds[fd] = Some(Arc::new(f));
        Ok(fd as i32)
    }

    /// The largest file whose bytes an open asks for with the entry
    /// (`CHFS_OPEN_DATA`; 0 while read-ahead is off, whose rules the bytes
    /// follow).
    fn open_data_max(&self) -> u32 {
        if self.inner.read_ahead.load(Ordering::Relaxed) == 0 {
            0
        } else {
            self.config().open_data
        }
    }

    /// `open(path, O_CREAT|flags, mode)`.
    pub fn create(&self, path: &str, flags: i32, mode: u32) -> Result<i32> {
        self.open(path, flags | libc::O_CREAT, mode)
    }

    fn file(&self, fd: i32) -> Result<Arc<OpenFile>> {
        let fds = lock(&self.inner.fds);
        usize::try_from(fd)
            .ok()
            .and_then(|i| fds.get(i).cloned().flatten())
            .ok_or_else(|| Error::new(libc::EBADF, format!("bad file descriptor {fd}")))
    }

    /// Makes writes through `fd` publish the file size as they grow it
    /// (one more small request per growing write, sent with the data), so
    /// that [`Client::flush`] has nothing left to do unless writes are
    /// buffered (`CHFS_BUF_SIZE`). Used by the FUSE mount, which then asks
    /// the kernel not to send a flush at every close.
    pub fn set_publish_on_write(&self, fd: i32, on: bool) -> Result<()> {
        let f = self.file(fd)?;
        let st = self.state();
        let mut s = lock(&f.state);
        if on && s.need_publish {
            drop(s);
            self.flush_file(&st, &f)?;
            s = lock(&f.state);
        }
        s.eager_publish = on;
        Ok(())
    }

    /// `close(2)`: writes buffered data and publishes the file size.
    pub fn close(&self, fd: i32) -> Result<()> {
        let f = self.file(fd)?;
        let r = self.flush_file(&self.state(), &f);
        let mut fds = lock(&self.inner.fds);
        if let Some(slot) = fds.get_mut(fd as usize) {
            *slot = None;
        }
        while matches!(fds.last(), Some(None)) {
            fds.pop();
        }
        r
    }

    /// What `close` does before releasing the descriptor: writes buffered
    /// data and publishes the size so that other clients see them, without
    /// asking the servers to make their stores durable (that is
    /// [`Client::fsync`]). Used for FUSE `flush` (every `close(2)`).
    pub fn flush(&self, fd: i32) -> Result<()> {
        let f = self.file(fd)?;
        self.flush_file(&self.state(), &f)
    }

    /// `fsync(2)`: writes buffered data, publishes the size, then asks each
    /// server that may hold one of the file's chunks to make its store
    /// durable (`Sync`). With a persistent engine (pmem, posix) the file's
    /// data then survives a server restart; with the DRAM engine it is as
    /// durable as the servers' memory.
    pub fn fsync(&self, fd: i32) -> Result<()> {
        let f = self.file(fd)?;
        if let Some(ra) = &f.ahead {
            lock(ra).drop_window();
        }
        let st = self.state();
        self.flush_file(&st, &f)?;
        let size = {
            let s = lock(&f.state);
            s.published.max(s.written_end)
        };
        self.sync_owners(&st, &f.path, f.meta.chunk_size, size)
    }

    /// Sends `Sync` to every server owning one of the chunks of a file of
    /// `size` bytes.
    fn sync_owners(&self, st: &PoolState, path: &str, chunk_size: u32, size: u64) -> Result<()> {
        let n = st.ring.len();
        let mut owners = Vec::new();
        for idx in 0..=size / chunk_size.max(1) as u64 {
            let o = st.owner(path, idx);
            if !owners.contains(&o) {
                owners.push(o);
                if owners.len() >= n {
                    break;
                }
            }
        }
        for o in owners {
            self.count(1);
            match self.inner.pool.call(st, o, &Request::Sync)? {
                Response::Ok => {}
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    pub(super) fn flush_file(&self, st: &PoolState, f: &OpenFile) -> Result<()> {
        let mut s = lock(&f.state);
        if !s.buf.is_empty() {
            let buf = std::mem::take(&mut s.buf);
            let off = s.buf_off;
            self.write_all_chunks(st, f, &mut s, &buf, off)?;
        }
        if s.need_publish {
            let req = Request::SetSize {
                path: f.path.clone(),
                size: s.written_end,
                grow_only: true,
                if_size: None,
                stray: false,
            };
            let r = self.call_owner(st, &f.path, 0, &req);
            self.inner.names.touched(&f.path);
            let m = expect_meta(r)?;
            s.published = m.size;
            s.need_publish = false;
        }
        Ok(())
    }

    /// Writes all of `buf` at `off` (buffered data the caller was already
    /// told is written): a short write is an error.
    fn write_all_chunks(
        &self,
        st: &PoolState,
        f: &OpenFile,
        s: &mut FileState,
        buf: &[u8],
        off: u64,
    ) -> Result<()> {
        match self.write_chunks(st, f, s, buf, off) {
            (_, Some(e)) => Err(e),
            (_, None) => Ok(()),
        }
    }

    /// Sends the chunk writes of `buf` at `off`, concurrently. Returns the
    /// bytes stored from the start of `buf` (all of them, or those of the
    /// chunks before the first that failed: a short write) and the first
    /// error. The size this client publishes never covers bytes that were
    /// not stored (chunks after a failed one may be stored, but lie beyond
    /// the size).
    fn write_chunks(
        &self,
        st: &PoolState,
        f: &OpenFile,
        s: &mut FileState,
        buf: &[u8],
        off: u64,
    ) -> (usize, Option<Error>) {
        let cs = f.meta.chunk_size as u64;
        let mut pieces = Vec::new();
        let mut done = 0usize;
        let mut data_chunks = false;
        s.wrote = true;
        self.inner.own.changed(&f.path);
        // Read-ahead buffers of this file are dropped once this is done.
        let _changing = self.inner.gens.changing(&f.path);
        let flags = rw_flags(&f.meta, true);
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / cs;
            let in_chunk = (pos % cs) as u32;
            let n = ((cs - in_chunk as u64) as usize).min(buf.len() - done);
            pieces.push(Piece {
                idx,
                off: in_chunk,
                n,
                at: done,
                server: st.owner_of_hash(&f.path, f.hash, idx),
            });
            data_chunks |= idx > 0;
            done += n;
        }
        // Several pieces of a fabric server in one request each.
        let groups = self.write_groups(st, &f.path, f.meta.chunk_size, &pieces);
        let gathered: Vec<Vec<u8>> = groups.iter().map(|g| gather(buf, &pieces, g)).collect();
        // The requests: one per group, then a `Write` per other piece.
        let mut grouped = vec![false; if groups.is_empty() { 0 } else { pieces.len() }];
        let mut plain: Vec<usize> = Vec::with_capacity(pieces.len());
        let mut ops = Vec::with_capacity(pieces.len() + 1);
        for (g, data) in groups.iter().zip(&gathered) {
            let spans: Vec<(u64, u32, u32)> = g
                .iter()
                .map(|&i| (pieces[i].idx, pieces[i].off, pieces[i].n as u32))
                .collect();
            let mut head = Vec::with_capacity(48 + f.path.len() + 16 * spans.len());
            encode_write_spans_head(
                &mut head,
                &WriteSpansHead {
                    path: &f.path,
                    fileid: f.meta.fileid,
                    chunk_size: f.meta.chunk_size,
                    mode: f.meta.mode,
                    flags,
                    epoch: f.meta.epoch(),
                    spans: &spans,
                },
            );
            ops.push(Op {
                server: pieces[g[0]].server,
                op: op::WRITE_SPANS,
                head,
                tail: data,
            });
            for &i in g {
                grouped[i] = true;
            }
        }
        for (i, p) in pieces.iter().enumerate() {
            if !grouped.get(i).copied().unwrap_or(false) {
                ops.push(self.write_op(f, flags, p, buf));
                plain.push(i);
            }
        }
        // Each request's pieces.
        let of_op = |k: usize| -> &[usize] {
            match groups.get(k) {
                Some(g) => g,
                None => std::slice::from_ref(&plain[k - groups.len()]),
            }
        };
        let full_end = off + buf.len() as u64;
        // The size is published with the data (no round trip of its own);
        // should a chunk then fail, it is taken back below.
        let publish = s.eager_publish && data_chunks && full_end > s.published;
        if publish {
            ops.push(Op::req(
                st.owner_of_hash(&f.path, f.hash, 0),
                &Request::SetSize {
                    path: f.path.clone(),
                    size: full_end,
                    grow_only: true,
                    if_size: None,
                    stray: false,
                },
            ));
        }
        let mut results = self.pipeline(st, ops);
        let published = if publish { results.pop() } else { None };
        // Each piece's request that failed, if one did, and their errors.
        let mut failed: Vec<Option<usize>> = vec![None; pieces.len()];
        let mut errors: Vec<Option<Error>> = Vec::new();
        // Chunks stored after one that failed: past the size published
        // (perhaps some of a group that failed part of the way).
        let mut stray = false;
        // Pieces of groups the server would not take: each written plainly.
        let mut again = Vec::new();
        for (k, r) in results.into_iter().enumerate() {
            let ps = of_op(k);
            let e = match r {
                Ok(Response::Written(_)) => continue,
                Ok(other) => unexpected(other),
                Err(e)
                    if ps.len() > 1
                        && matches!(e.errno(), libc::EPROTO | libc::ESTALE | libc::ENOBUFS) =>
                {
                    if e.errno() == libc::EPROTO {
                        if let Some(addr) = st.ring.list().servers.get(pieces[ps[0]].server) {
                            self.inner.older.add(addr, op::WRITE_SPANS);
                        }
                    }
                    again.extend_from_slice(ps);
                    continue;
                }
                Err(e) => e,
            };
            stray |= ps.len() > 1;
            for &i in ps {
                failed[i] = Some(errors.len());
            }
            errors.push(Some(e));
        }
        give_back(gathered);
        if !again.is_empty() {
            let ops = again
                .iter()
                .map(|&i| self.write_op(f, flags, &pieces[i], buf))
                .collect();
            for (r, &i) in self.pipeline(st, ops).into_iter().zip(&again) {
                let e = match r {
                    Ok(Response::Written(_)) => continue,
                    Ok(other) => unexpected(other),
                    Err(e) => e,
                };
                failed[i] = Some(errors.len());
                errors.push(Some(e));
            }
        }
        let mut stored = 0usize;
        let mut first_err = None;
        for (p, fail) in pieces.iter().zip(&failed) {
            match fail {
                None if first_err.is_none() => stored += p.n,
                None => stray = true,
                Some(e) => {
                    if first_err.is_none() {
                        first_err = errors[*e].take();
                    }
                }
            }
        }
        let end = off + stored as u64;
        match published {
            Some(Ok(Response::Sized { meta, before })) => {
                if stored < buf.len() && meta.size == full_end && before < full_end {
                    // Our publish grew the size over bytes that were not
                    // stored: back to what it was, or to the stored
                    // prefix's end, unless it changed since (then the
                    // change stands).
                    let req = Request::SetSize {
                        path: f.path.clone(),
                        size: before.max(end),
                        grow_only: false,
                        if_size: Some(full_end),
                        stray: false,
                    };
                    match expect_meta(self.call_owner(st, &f.path, 0, &req)) {
                        Ok(m) => s.published = m.size,
                        Err(e) => return (stored, Some(first_err.unwrap_or(e))),
                    }
                } else if stored == buf.len() {
                    s.published = s.published.max(meta.size);
                }
            }
            Some(Ok(other)) => {
                first_err.get_or_insert(unexpected(other));
            }
            Some(Err(e)) => {
                first_err.get_or_insert(e);
            }
            None => {}
        }
        if stray {
            // So that removing the file frees them (best effort: if this
            // fails too, their space stays used until the pool ends).
            let req = Request::SetSize {
                path: f.path.clone(),
                size: 0,
                grow_only: true,
                if_size: None,
                stray: true,
            };
            let _ = self.call_owner(st, &f.path, 0, &req);
        }
        if stored == 0 {
            return (0, first_err);
        }
        self.inner.names.touched(&f.path);
        s.written_end = s.written_end.max(end);
        if publish && stored == buf.len() && first_err.is_none() {
            // Published above.
        } else if data_chunks {
            s.need_publish = true;
        } else {
            // Chunk 0 grew the size on its server as part of the write.
            s.published = s.published.max(end);
        }
        (stored, first_err)
    }

    /// The `Write` of one piece of a write.
    fn write_op<'a>(&self, f: &OpenFile, flags: u16, p: &Piece, buf: &'a [u8]) -> Op<'a> {
        let mut head = Vec::with_capacity(48 + f.path.len());
        encode_write_head(
            &mut head,
            &WriteHead {
                path: &f.path,
                fileid: f.meta.fileid,
                chunk_size: f.meta.chunk_size,
                mode: f.meta.mode,
                idx: p.idx,
                off: p.off,
                flags,
                epoch: f.meta.epoch(),
            },
        );
        Op {
            server: p.server,
            op: op::WRITE,
            head,
            tail: &buf[p.at..p.at + p.n],
        }
    }

    /// `pwrite(2)`.
    pub fn pwrite(&self, fd: i32, buf: &[u8], off: u64) -> Result<usize> {
        let f = self.file(fd)?;
        if !f.writable() {
            return fail(
                libc::EBADF,
                format!("descriptor {fd} is not open for writing"),
            );
        }
        if buf.is_empty() {
            return Ok(0);
        }
        off.checked_add(buf.len() as u64)
            .filter(|e| *e <= chfs_proto::meta::MAX_FILE_SIZE)
            .ok_or_else(|| Error::new(libc::EFBIG, "file too large"))?;
        let st = self.state();
        let mut s = lock(&f.state);
        let bsize = self.inner.buf_size.load(Ordering::Relaxed) as usize;
        if bsize > 0 && buf.len() < bsize {
            let contiguous = s.buf.is_empty() || s.buf_off + s.buf.len() as u64 == off;
            if !contiguous || s.buf.len() + buf.len() > bsize {
                let old = std::mem::take(&mut s.buf);
                let o = s.buf_off;
                self.write_all_chunks(&st, &f, &mut s, &old, o)?;
            }
            if s.buf.is_empty() {
                s.buf_off = off;
            }
            s.buf.extend_from_slice(buf);
            return Ok(buf.len());
        }
        if !s.buf.is_empty() {
            let old = std::mem::take(&mut s.buf);
            let o = s.buf_off;
            self.write_all_chunks(&st, &f, &mut s, &old, o)?;
        }
        match self.write_chunks(&st, &f, &mut s, buf, off) {
            (0, Some(e)) => Err(e),
            (n, _) => Ok(n),
        }
    }

    /// `write(2)` at the descriptor's position (`O_APPEND`: at the end,
    /// atomically with respect to other appenders).
    pub fn write(&self, fd: i32, buf: &[u8]) -> Result<usize> {
        let f = self.file(fd)?;
        if f.flags & libc::O_APPEND != 0 {
            if !f.writable() {
                return fail(
                    libc::EBADF,
                    format!("descriptor {fd} is not open for writing"),
                );
            }
            let st = self.state();
            self.flush_file(&st, &f)?;
            let req = Request::AppendReserve {
                path: f.path.clone(),
                len: buf.len() as u64,
            };
            let off = match self.call_owner(&st, &f.path, 0, &req)? {
                Response::Count(o) => o,
                other => return Err(unexpected(other)),
            };
            let n = self.pwrite(fd, buf, off)?;
            *lock(&f.pos) = off + n as u64;
            return Ok(n);
        }
        let mut pos = lock(&f.pos);
        let n = self.pwrite(fd, buf, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    /// Current size of an open file as this client sees it.
    pub(super) fn file_size(&self, st: &PoolState, f: &OpenFile, refresh: bool) -> Result<u64> {
        let (published, local) = {
            let s = lock(&f.state);
            (s.published, s.written_end)
        };
        let mut size = published.max(local).max(self.local_size(&f.path));
        if refresh {
            let m = self.stat_meta(st, &f.path)?;
            lock(&f.state).published = m.size;
            size = size.max(m.size);
        }
        Ok(size)
    }

    /// `pread(2)`: holes read as zeros; reads end at the file size. Chunks
    /// of servers on this host come through the landing area (see
    /// [`crate::shm::Landing`]), at most [`LAND_SLOTS_PER_READ`] slots of
    /// it per call.
    pub fn pread(&self, fd: i32, buf: &mut [u8], off: u64) -> Result<usize> {
        let f = self.file(fd)?;
        if !f.readable() {
            return fail(
                libc::EBADF,
                format!("descriptor {fd} is not open for reading"),
            );
        }
        if f.meta.is_dir() {
            return fail(libc::EISDIR, format!("{}: is a directory", f.path));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let st = self.state();
        // Writes buffered (CHFS_BUF_SIZE) through this descriptor or any
        // other of this client open on the same file go to the servers
        // first, so a read sees every write this process has made. (Only
        // a client that ever buffered looks at the other descriptors: that
        // takes the descriptor table's lock and a pass over it per read.)
        if self.inner.buffering.load(Ordering::Relaxed) {
            for g in self.open_files(&f.path) {
                if !lock(&g.state).buf.is_empty() {
                    self.flush_file(&st, &g)?;
                }
            }
        }
        if let Some(n) = self.read_ahead(&st, &f, buf, off)? {
            return Ok(n);
        }
        let mut size = self.file_size(&st, &f, false)?;
        if off + buf.len() as u64 > size {
            size = self.file_size(&st, &f, true)?;
        }
        if off >= size {
            return Ok(0);
        }
        let len = ((size - off) as usize).min(buf.len());
        let cs = f.meta.chunk_size as u64;
        let flags = rw_flags(&f.meta, lock(&f.state).wrote);
        let chunks = ((off + len as u64).saturating_sub(1) / cs - off / cs + 1) as usize;
        if chunks > 1 && cs <= super::byserver::CHUNK_MAX {
            if let Some(n) = self.read_by_server(&st, &f, &mut buf[..len], off, flags)? {
                return Ok(n);
            }
        }
        let mut ops = Vec::with_capacity(chunks);
        // Each chunk's part of `buf`: its data goes straight from the
        // socket there when this thread reads the reply itself.
        let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(chunks);
        let mut rest = &mut buf[..len];
        let mut done = 0usize;
        while done < len {
            let pos = off + done as u64;
            let idx = pos / cs;
            let in_chunk = (pos % cs) as u32;
            let n = ((cs - in_chunk as u64) as usize).min(len - done);
            let req = Request::Read {
                path: f.path.clone(),
                fileid: f.meta.fileid,
                idx,
                off: in_chunk,
                len: n as u32,
                chunk_size: f.meta.chunk_size,
                flags,
                epoch: f.meta.epoch(),
            };
            ops.push(Op::req(st.owner_of_hash(&f.path, f.hash, idx), &req));
            let (d, r) = std::mem::take(&mut rest).split_at_mut(n);
            dsts.push(d);
            rest = r;
            done += n;
        }
        self.count(ops.len());
        let pool = &self.inner.pool;
        // Chunks of local servers come through the landing area (the
        // server copies them there, this thread into `buf`: cheaper than
        // the socket's two copies), one after the other in its slots, as
        // far as slots are free. `place`: each chunk's (slot, offset).
        use crate::shm::{LAND_MIN, SLOT};
        let mut slots: Vec<crate::shm::Slot> = Vec::new();
        let mut place: Vec<Option<(usize, usize)>> = Vec::with_capacity(ops.len());
        let mut room = 0usize;
        for (o, d) in ops.iter().zip(&dsts) {
            let n = d.len();
            let mut p = None;
            if n >= LAND_MIN {
                if let Some(area) = pool.landing(&st, o.server) {
                    if room < n && slots.len() < LAND_SLOTS_PER_READ {
                        if let Some(s) = area.take(SLOT) {
                            slots.push(s);
                            room = SLOT;
                        }
                    }
                    if room >= n && !slots.is_empty() {
                        p = Some((slots.len() - 1, SLOT - room));
                        room -= n;
                    }
                }
            }
            place.push(p);
        }
        let results = {
            let mut rest: Vec<&mut [u8]> = slots.iter_mut().map(|s| s.bytes_mut()).collect();
            let mut to: Vec<&mut [u8]> = Vec::with_capacity(ops.len());
            for (d, p) in dsts.iter_mut().zip(&place) {
                match p {
                    Some((k, _)) => {
                        let (a, b) = std::mem::take(&mut rest[*k]).split_at_mut(d.len());
                        rest[*k] = b;
                        to.push(a);
                    }
                    None => to.push(&mut **d),
                }
            }
            pool.read_into(&st, &ops, &mut to)
        };
        let mut first_err = None;
        // Slots a failed read named: a server may still write them.
        let mut lost = vec![false; slots.len()];
        // Chunks whose landing a broken connection failed: read again
        // straight into `buf` (on a new connection, not landed).
        let mut again = Vec::new();
        for (i, ((r, d), p)) in results.into_iter().zip(&mut dsts).zip(&place).enumerate() {
            let r = match (r, p) {
                (Err(e), Some((s, _))) if crate::pool::retry_safe(&e, op::READ) => {
                    lost[*s] = true;
                    again.push(i);
                    continue;
                }
                (r, _) => r,
            };
            let from = p.map(|(s, at)| &slots[s].bytes()[at..]);
            match r.and_then(|l| fill_read(d, l, from)) {
                Ok(()) => {}
                Err(e) => {
                    if let Some((s, _)) = *p {
                        lost[s] = true;
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        for (s, lost) in slots.into_iter().zip(lost) {
            if lost {
                s.quarantine();
            }
        }
        if !again.is_empty() && first_err.is_none() {
            let ops: Vec<Op<'_>> = again
                .iter()
                .map(|&i| Op {
                    server: ops[i].server,
                    op: ops[i].op,
                    head: ops[i].head.clone(),
                    tail: &[],
                })
                .collect();
            let mut to: Vec<&mut [u8]> = dsts
                .into_iter()
                .enumerate()
                .filter(|(i, _)| again.contains(i))
                .map(|(_, d)| d)
                .collect();
            for (r, d) in pool.read_into(&st, &ops, &mut to).into_iter().zip(to) {
                fill_read(d, r?, None)?;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(len),
        }
    }

    /// `read(2)` at the descriptor's position.
    pub fn read(&self, fd: i32, buf: &mut [u8]) -> Result<usize> {
        let f = self.file(fd)?;
        let mut pos = lock(&f.pos);
        let n = self.pread(fd, buf, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    /// `lseek(2)`.
    pub fn seek(&self, fd: i32, off: i64, whence: Whence) -> Result<u64> {
        let f = self.file(fd)?;
        let st = self.state();
        let base = match whence {
            Whence::Set => 0,
            Whence::Cur => *lock(&f.pos) as i64,
            Whence::End => self.file_size(&st, &f, true)? as i64,
        };
        let new = base
            .checked_add(off)
            .filter(|n| *n >= 0)
            .ok_or_else(|| Error::new(libc::EINVAL, "seek before the start of the file"))?;
        *lock(&f.pos) = new as u64;
        Ok(new as u64)
    }

    /// `fstat(2)`.
    pub fn fstat(&self, fd: i32) -> Result<Stat> {
        let f = self.file(fd)?;
        let st = self.state();
        let m = self.stat_meta(&st, &f.path)?;
        Ok(self.to_stat(&f.path, m))
    }

    /// Status of an open descriptor from what this client already knows
    /// (the entry as returned when it was opened or created, with the size
    /// this client wrote), without a round trip. Attributes changed by
    /// others since the open are not seen: use [`Client::fstat`] for those.
    pub fn fstat_cached(&self, fd: i32) -> Result<Stat> {
        let f = self.file(fd)?;
        let mut m = f.meta;
        {
            let s = lock(&f.state);
            m.size = m.size.max(s.published).max(s.written_end);
        }
        Ok(self.to_stat(&f.path, m))
    }

    /// `ftruncate(2)`.
    pub fn ftruncate(&self, fd: i32, len: u64) -> Result<()> {
        let f = self.file(fd)?;
        if !f.writable() {
            return fail(
                libc::EINVAL,
                format!("descriptor {fd} is not open for writing"),
            );
        }
        let st = self.state();
        let m = self.stat_meta(&st, &f.path)?;
        self.truncate_resolved(&st, &f.path, &m, len).map(drop)
    }

    /// Path of an open descriptor.
    pub fn fd_path(&self, fd: i32) -> Result<String> {
        Ok(self.file(fd)?.path.clone())
    }

    /// Flushes every open descriptor of this client (buffered writes and
    /// sizes), as `close` would, without waiting for anything else (used by
    /// the FUSE mount at unmount: the backend write-back is the pool's
    /// business, `chfs sync` / `chfsctl stop` wait for it).
    pub fn flush_all(&self) -> Result<()> {
        let st = self.state();
        let files: Vec<_> = lock(&self.inner.fds).iter().flatten().cloned().collect();
        let mut first = None;
        for f in files {
            if let Err(e) = self.flush_file(&st, &f) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}
