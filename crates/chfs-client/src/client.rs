//! The file-system operations: [`Client`], the handle every operation
//! goes through, with what its operations share (the descriptor table's
//! entries, the caches, the counters) and the plumbing of requests to the
//! servers (`call_owner`, `pipeline`, `broadcast`). The operations
//! themselves are `impl Client` blocks in the submodules:
//!
//! - `namespace`: resolving paths, the negative lookup cache, creating,
//!   removing and renaming entries;
//! - `attr`: attributes by path (`stat`, `chmod`, `truncate`, `access`);
//! - `dir`: directory listings;
//! - `io`: the descriptor table and the reads and writes through it;
//! - `admin`: the servers of the pool, their status, rebalancing, stopping;
//! - `cache`: `sync`, the backend write-back (cache mode) and fetching
//!   from the backend;
//! - `stagein`: what a path given to stage-in stands for;
//! - `walk`: a parallel walk of a tree, one server at a time (find).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chfs_proto::meta::now_ns;
use chfs_proto::meta::FLAG_CACHED;
use chfs_proto::path::{self, normalize};
use chfs_proto::ring::path_hash;
use chfs_proto::{Meta, Request, Response};
use chfs_sys::lock;

use crate::config::ClientConfig;
use crate::error::{fail, Error, Result};
use crate::pool::{Op, Pool, PoolState};

mod admin;
mod ahead;
mod attr;
mod byserver;
mod cache;
mod dir;
mod io;
mod namespace;
mod stagein;
mod tree;
mod walk;
pub use stagein::StageSource;
pub use tree::TreeListing;
pub use walk::WalkError;

const MAX_SYMLINKS: usize = 40;

/// Unpublished state of an open file.
#[derive(Default)]
struct FileState {
    /// Largest size known to be recorded in the entry.
    published: u64,
    /// End of the furthest byte written through this descriptor.
    written_end: u64,
    /// Data chunks were written: the entry's size/mtime need publishing.
    need_publish: bool,
    /// Publish the size with every write that grows the file (sent with
    /// the chunk writes) instead of at close: close then has nothing to do.
    eager_publish: bool,
    /// Write buffer (`CHFS_BUF_SIZE`): offset and bytes.
    buf_off: u64,
    buf: Vec<u8>,
    /// Data was written through this descriptor (a cached backend file
    /// is then modified: see [`rw_flags`]).
    wrote: bool,
}

struct OpenFile {
    path: String,
    hash: u64,
    meta: Meta,
    flags: i32,
    pos: Mutex<u64>,
    state: Mutex<FileState>,
    /// Strided read-ahead (regular files open for reading; `ahead.rs`).
    ahead: Option<Mutex<ahead::ReadAhead>>,
}

impl OpenFile {
    fn readable(&self) -> bool {
        self.flags & libc::O_ACCMODE != libc::O_WRONLY
    }
    fn writable(&self) -> bool {
        self.flags & libc::O_ACCMODE != libc::O_RDONLY
    }
}

/// Counters of this client (for tests and benchmarks).
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientStats {
    /// Requests sent.
    pub rpcs: u64,
    /// Replies (or parts of large ones) that arrived while the waiter
    /// polled, and waits that polled in vain and then slept
    /// (`CHFS_POLL_USEC`).
    pub poll_hits: u64,
    pub poll_misses: u64,
    /// Over the fabric: requests whose bulk data (from
    /// `CHFS_RDMA_THRESH`) the server moved straight from or into the
    /// caller's memory, lent for the request; and those whose data went
    /// through a window of the client's, with a copy (`ofi+shm`, or a
    /// read whose answer is not landed in a caller's buffer).
    pub rma_lent: u64,
    pub rma_copied: u64,
    /// Slots of the landing area (where local servers place reads' data,
    /// `FLAG_LAND`) given up for good: their reads failed, and a server
    /// might still write them.
    pub landing_lost: u64,
}

struct Inner {
    pool: Pool,
    chunk_size: AtomicU32,
    buf_size: AtomicU64,
    /// Writes have ever been buffered (a read then looks for buffered
    /// writes on the file's other descriptors too).
    buffering: AtomicBool,
    fds: Mutex<Vec<Option<Arc<OpenFile>>>>,
    dirs: Mutex<HashMap<String, Instant>>,
    rpcs: AtomicU64,
    fileid_seq: AtomicU32,
    /// Recently absent names (see [`Client::lookup`]); off unless enabled.
    names: crate::names::NameCache,
    /// Paths this client changed lately: their lookups skip the contact
    /// server (relayed lookups, `crate::relay`).
    own: crate::relay::OwnChanges,
    /// The pool's backend directory as this host sees it, once asked
    /// (see [`Client::stagein`]).
    backend_dir: Mutex<Option<Option<std::path::PathBuf>>>,
    /// A server did not serve a tree listing (older, cache mode) under
    /// the server list of this version + 1 (0: none seen): `list_tree`
    /// does not ask again until the list changes (an older server closes
    /// the connection on an unknown request, failing what else was in
    /// flight on it).
    no_tree: AtomicU64,
    /// 1 + the server list version with which a server refused
    /// directory versions (0: none did).
    no_versions: AtomicU64,
    /// Bytes of records read ahead per descriptor
    /// (`CHFS_READ_AHEAD`, 0 = off; `ahead.rs`).
    read_ahead: AtomicU64,
    /// Generations of the data of paths this client changed (read-ahead
    /// buffers older than a change are dropped).
    gens: ahead::DataGens,
    /// Servers that do not know `ReadSpans`, `StatData` or `WriteSpans`.
    older: ahead::OlderServers,
}

/// A handle to a chfs-rs pool. Cheap to clone; all clones share
/// connections and the descriptor table; safe to use from many threads.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Owner given to entries this handle creates (default: effective ids).
    creds: Option<(u32, u32)>,
}

/// Puts a read's answer in `d`: its data, and zeros past a short one;
/// `from`: where landed data lies when not in `d` itself (a room of the
/// landing area).
fn fill_read(d: &mut [u8], l: crate::conn::Landing, from: Option<&[u8]>) -> Result<()> {
    use crate::conn::Landing;
    let k = match l {
        Landing::Landed(k) => {
            let k = k.min(d.len());
            if let Some(src) = from {
                d[..k].copy_from_slice(&src[..k]);
            }
            k
        }
        Landing::Reply(Response::Data(x)) => {
            let k = x.len().min(d.len());
            d[..k].copy_from_slice(&x[..k]);
            k
        }
        Landing::Reply(other) => return Err(unexpected(other)),
    };
    d[k..].fill(0);
    Ok(())
}

/// [`fill_read`] for an answer received into `parts` (one after the
/// other): data a waiter read whole is put in them, and zeros past a
/// short one.
fn fill_parts(parts: &mut [&mut [u8]], l: crate::conn::Landing) -> Result<()> {
    use crate::conn::Landing;
    let (mut k, data) = match l {
        Landing::Landed(k) => (k, None),
        Landing::Reply(Response::Data(x)) => (x.len(), Some(x)),
        Landing::Reply(other) => return Err(unexpected(other)),
    };
    let mut src = data.as_deref().unwrap_or(&[]);
    for p in parts.iter_mut() {
        let n = k.min(p.len());
        if data.is_some() {
            let m = n.min(src.len());
            p[..m].copy_from_slice(&src[..m]);
            src = &src[m..];
        }
        p[n..].fill(0);
        k -= n;
    }
    Ok(())
}

fn unexpected(r: Response) -> Error {
    Error::new(libc::EPROTO, format!("unexpected reply {r:?}"))
}

fn expect_meta(r: Result<Response>) -> Result<Meta> {
    match r? {
        Response::Meta(m) | Response::Sized { meta: m, .. } => Ok(m),
        other => Err(unexpected(other)),
    }
}

fn ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

impl Client {
    /// Connects using the environment (`CHFS_SERVER`, ...).
    pub fn from_env() -> Result<Client> {
        Self::connect(ClientConfig::from_env()?)
    }

    /// Connects with an explicit configuration.
    pub fn connect(cfg: ClientConfig) -> Result<Client> {
        let chunk_size = AtomicU32::new(cfg.chunk_size);
        let buffering = AtomicBool::new(cfg.buf_size > 0);
        let buf_size = AtomicU64::new(cfg.buf_size as u64);
        let read_ahead = AtomicU64::new(cfg.read_ahead as u64);
        let own = crate::relay::OwnChanges::new(
            cfg.lookup != crate::config::Lookup::Direct,
            cfg.lookup_cache,
        );
        let pool = Pool::connect(cfg)?;
        let seed = (now_ns() as u64 ^ ((std::process::id() as u64) << 32)) as u32;
        Ok(Client {
            inner: Arc::new(Inner {
                pool,
                chunk_size,
                buf_size,
                buffering,
                fds: Mutex::new(Vec::new()),
                dirs: Mutex::new(HashMap::new()),
                rpcs: AtomicU64::new(0),
                fileid_seq: AtomicU32::new(seed),
                names: Default::default(),
                own,
                backend_dir: Mutex::new(None),
                no_tree: AtomicU64::new(0),
                no_versions: AtomicU64::new(0),
                read_ahead,
                gens: Default::default(),
                older: Default::default(),
            }),
            creds: None,
        })
    }

    /// A handle sharing this client's connections and descriptors that
    /// creates entries owned by `uid`/`gid` (used by adapters serving
    /// requests of other users, such as the FUSE mount).
    pub fn as_user(&self, uid: u32, gid: u32) -> Client {
        Client {
            inner: self.inner.clone(),
            creds: Some((uid, gid)),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        self.inner.pool.cfg()
    }

    /// Open connections that use a server's Unix socket (servers on this
    /// host, `CHFS_LOCAL_SOCKET`), and all open connections.
    pub fn local_connections(&self) -> (usize, usize) {
        let st = self.state();
        let open: Vec<bool> = st
            .conns
            .iter()
            .filter_map(|c| lock(c).as_ref().map(|c| c.is_local()))
            .collect();
        (open.iter().filter(|l| **l).count(), open.len())
    }

    /// The servers (indices in placement order) this client holds a
    /// shared connection to now (they are opened on first use and closed
    /// when idle, `CHFS_CONN_IDLE_SEC`).
    pub fn connected_servers(&self) -> Vec<usize> {
        let st = self.state();
        self.inner
            .pool
            .open_connections(&st)
            .into_iter()
            .enumerate()
            .filter(|(_, open)| *open)
            .map(|(i, _)| i)
            .collect()
    }

    /// Which calling threads reach servers on this host over one
    /// connection per CPU, each served by a server thread pinned to that
    /// CPU (`Request::Lane`), so a request and its reply hand over on one
    /// CPU (`CHFS_CPU_LANES`; by default threads pinned to one CPU).
    /// Servers that refuse are reached as before.
    pub fn set_cpu_lanes(&self, lanes: crate::CpuLanes) {
        self.inner.pool.set_lanes(lanes);
    }

    /// Memory of `len` bytes that servers on this host map too (a sealed
    /// memory file): a large write whose data lies there is copied by the
    /// server from its own mapping, with stores that bypass the cache,
    /// instead of with `process_vm_readv`. For a process that receives
    /// data into buffers of its own choosing before writing it (chfuse
    /// places its FUSE ring buffers here). One per client (EBUSY after);
    /// it stays mapped while the client or the returned handle lives.
    /// Servers that cannot map it (another user, an older server) read it
    /// like any other memory.
    pub fn shared_buffer(&self, len: usize) -> Result<crate::SharedBuffer> {
        let window = Arc::new(crate::shm::Window::new(len)?);
        self.inner.pool.set_window(window.clone())?;
        Ok(crate::SharedBuffer { window })
    }

    /// Open CPU-lane connections (see [`Client::set_cpu_lanes`]).
    pub fn lane_connections(&self) -> usize {
        self.inner.pool.lane_connections(&self.state())
    }

    /// Chunk size of files created from now on.
    pub fn set_chunk_size(&self, cs: u32) -> Result<()> {
        if cs == 0 || cs > chfs_proto::MAX_CHUNK_SIZE {
            return fail(libc::EINVAL, format!("chunk size {cs} out of range"));
        }
        self.inner.chunk_size.store(cs, Ordering::Relaxed);
        Ok(())
    }

    /// Write buffer size per open file (0 = off).
    pub fn set_buf_size(&self, n: usize) {
        self.inner.buf_size.store(n as u64, Ordering::Relaxed);
        if n > 0 {
            self.inner.buffering.store(true, Ordering::Relaxed);
        }
    }

    /// Bytes of records read ahead per descriptor when its
    /// reads follow a strided pattern (0 = off; `CHFS_READ_AHEAD`).
    /// Descriptors open at the change keep their buffer until its next
    /// check.
    pub fn set_read_ahead(&self, n: usize) {
        self.inner.read_ahead.store(n as u64, Ordering::Relaxed);
    }

    /// Bytes of small writes gathered per descriptor (0 = none).
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size.load(Ordering::Relaxed) as usize
    }

    /// Counters of this client.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            rpcs: self.inner.rpcs.load(Ordering::Relaxed),
            poll_hits: self.inner.pool.poll_counts().0,
            poll_misses: self.inner.pool.poll_counts().1,
            rma_lent: self.inner.pool.rma_counts().0,
            rma_copied: self.inner.pool.rma_counts().1,
            landing_lost: self.inner.pool.landing_quarantined() as u64,
        }
    }

    fn state(&self) -> Arc<PoolState> {
        self.inner.pool.state()
    }

    fn count(&self, n: usize) {
        self.inner.rpcs.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One request to the owner of chunk `idx` of `path`.
    fn call_owner(&self, st: &PoolState, path: &str, idx: u64, req: &Request) -> Result<Response> {
        use chfs_proto::msg::op;
        if matches!(
            req.op(),
            op::CREATE | op::SET_SIZE | op::SET_ATTR | op::REMOVE_ENTRY | op::APPEND_RESERVE
        ) {
            // Changes the entry: this client's lookups of it skip the
            // contact's cache for a while.
            self.inner.own.changed(path);
        }
        let _changing = matches!(
            req.op(),
            op::CREATE | op::SET_SIZE | op::REMOVE_ENTRY | op::WRITE | op::PUT_CHUNK
        )
        .then(|| self.inner.gens.changing(path));
        self.count(1);
        self.inner.pool.call(st, st.owner(path, idx), req)
    }

    fn pipeline(&self, st: &PoolState, ops: Vec<Op<'_>>) -> Vec<Result<Response>> {
        self.count(ops.len());
        self.inner.pool.pipeline(st, ops)
    }

    /// Sends `req` about `path` to every server that may hold some of it
    /// (all, or for the node-local area the server on this host).
    fn broadcast_for(
        &self,
        st: &PoolState,
        path: &str,
        req: &Request,
    ) -> Result<Vec<Result<Response>>> {
        use chfs_proto::msg::op;
        let _changing = matches!(req.op(), op::TRUNCATE_CHUNKS | op::REMOVE_CHUNKS)
            .then(|| self.inner.gens.changing(path));
        let ops: Vec<Op<'_>> = st
            .servers_for(path)?
            .into_iter()
            .map(|i| Op::req(i, req))
            .collect();
        Ok(self.pipeline(st, ops))
    }

    fn broadcast(&self, st: &PoolState, req: &Request) -> Vec<Result<Response>> {
        use chfs_proto::msg::op;
        let _changing = matches!(
            req.op(),
            op::TRUNCATE_CHUNKS | op::REMOVE_CHUNKS | op::RENAME_MOVE
        )
        .then(|| self.inner.gens.changing_all());
        self.count(st.ring.len());
        self.inner.pool.broadcast(st, req)
    }

    fn new_fileid(&self) -> u32 {
        let v = self
            .inner
            .fileid_seq
            .fetch_add(0x9E37_79B9, Ordering::Relaxed);
        let h = path_hash(&format!("{v}:{}:{}", crate::process_id(), now_ns())) as u32;
        h.max(1)
    }
}

/// An errno a server reported, EIO for none.
fn nonzero(errno: i32) -> i32 {
    if errno > 0 {
        errno
    } else {
        libc::EIO
    }
}

/// Read/write flags for chunks of a file with entry `m`: read-through from
/// the backend for cached copies of backend files, and whether the file
/// was changed in the cache (by anyone before `m` was read, or by this
/// descriptor: `wrote`).
fn rw_flags(m: &Meta, wrote: bool) -> u16 {
    use chfs_proto::meta::{FLAG_DAMAGED, FLAG_MODIFIED};
    use chfs_proto::msg::rw;
    let damaged = if m.flags & FLAG_DAMAGED != 0 {
        rw::DAMAGED
    } else {
        0
    };
    if m.flags & FLAG_CACHED == 0 {
        damaged
    } else if wrote || m.flags & FLAG_MODIFIED != 0 {
        rw::BACKEND | rw::MODIFIED | damaged
    } else {
        rw::BACKEND | damaged
    }
}

/// A symbolic link's target from its stored bytes.
fn link_text(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec())
        .map_err(|_| Error::new(libc::EILSEQ, "symlink target is not UTF-8"))
}

/// The path a symbolic link at `link` with `target` points to.
fn link_target(link: &str, target: &str) -> Result<String> {
    if target.starts_with('/') {
        Ok(normalize(target)?)
    } else {
        Ok(normalize(&format!("{}/{target}", path::parent(link)))?)
    }
}
