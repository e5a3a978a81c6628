//! The file-system operations.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chfs_proto::meta::now_ns;
use chfs_proto::meta::{FLAG_BACKEND_ONLY, FLAG_CACHED};
use chfs_proto::msg::{encode_write_head, op, RemoveKind, SetAttr, WriteHead};
use chfs_proto::msg::{FlushState, RebalanceState};
use chfs_proto::path::{self, normalize};
use chfs_proto::ring::path_hash;
use chfs_proto::{Meta, Request, Response};

use crate::config::ClientConfig;
use crate::conn::lock;
use crate::error::{fail, Error, Result};
use crate::pool::{Op, Pool, PoolState};
use crate::types::{DirEntry, Stat, StatFs, TimeSet, Whence};

mod stagein;
pub use stagein::StageSource;

const MAX_SYMLINKS: usize = 40;
const READDIR_PAGE: u32 = 4096;

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
}

struct Inner {
    pool: Pool,
    chunk_size: AtomicU32,
    buf_size: AtomicU64,
    fds: Mutex<Vec<Option<Arc<OpenFile>>>>,
    dirs: Mutex<HashMap<String, Instant>>,
    rpcs: AtomicU64,
    fileid_seq: AtomicU32,
    /// Recently absent names (see [`Client::lookup`]); off unless enabled.
    names: crate::names::NameCache,
    /// The pool's backend directory as this host sees it, once asked
    /// (see [`Client::stagein`]).
    backend_dir: Mutex<Option<Option<std::path::PathBuf>>>,
}

/// A handle to a chfs-rs pool. Cheap to clone; all clones share
/// connections and the descriptor table; safe to use from many threads.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Owner given to entries this handle creates (default: effective ids).
    creds: Option<(u32, u32)>,
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
        let buf_size = AtomicU64::new(cfg.buf_size as u64);
        let pool = Pool::connect(cfg)?;
        let seed = (now_ns() as u64 ^ ((std::process::id() as u64) << 32)) as u32;
        Ok(Client {
            inner: Arc::new(Inner {
                pool,
                chunk_size,
                buf_size,
                fds: Mutex::new(Vec::new()),
                dirs: Mutex::new(HashMap::new()),
                rpcs: AtomicU64::new(0),
                fileid_seq: AtomicU32::new(seed),
                names: Default::default(),
                backend_dir: Mutex::new(None),
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

    /// Number of servers in the pool.
    pub fn server_count(&self) -> usize {
        self.state().ring.len()
    }

    /// Server addresses, in placement order.
    pub fn servers(&self) -> Vec<String> {
        self.state().ring.list().servers.clone()
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
    }

    /// Counters of this client.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            rpcs: self.inner.rpcs.load(Ordering::Relaxed),
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
        self.count(1);
        self.inner.pool.call(st, st.ring.owner(path, idx), req)
    }

    fn pipeline(&self, st: &PoolState, ops: Vec<Op<'_>>) -> Vec<Result<Response>> {
        self.count(ops.len());
        self.inner.pool.pipeline(st, ops)
    }

    fn broadcast(&self, st: &PoolState, req: &Request) -> Vec<Result<Response>> {
        self.count(st.ring.len());
        self.inner.pool.broadcast(st, req)
    }

    fn new_fileid(&self) -> u32 {
        let v = self
            .inner
            .fileid_seq
            .fetch_add(0x9E37_79B9, Ordering::Relaxed);
        let h = path_hash(&format!("{v}:{}:{}", std::process::id(), now_ns())) as u32;
        h.max(1)
    }

    // ----- metadata -------------------------------------------------------

    fn stat_meta(&self, st: &PoolState, path: &str) -> Result<Meta> {
        expect_meta(self.call_owner(
            st,
            path,
            0,
            &Request::Stat {
                path: path.to_string(),
            },
        ))
    }

    /// Follows symbolic links in the last component.
    fn resolve(&self, st: &PoolState, mut path: String) -> Result<(String, Meta)> {
        for _ in 0..MAX_SYMLINKS {
            let m = self.stat_meta(st, &path)?;
            if !m.is_symlink() {
                return Ok((path, m));
            }
            let target = self.read_link_meta(st, &path, &m)?;
            path = link_target(&path, &target)?;
        }
        fail(
            libc::ELOOP,
            format!("{path}: too many levels of symbolic links"),
        )
    }

    /// Largest unpublished size of `path` among this client's open files.
    fn local_size(&self, path: &str) -> u64 {
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

    fn to_stat(&self, path: &str, mut m: Meta) -> Stat {
        if m.is_reg() {
            m.size = m.size.max(self.local_size(path));
        }
        Stat::from_meta(path, &m)
    }

    /// `stat(2)`: follows a final symbolic link.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?)?;
        Ok(self.to_stat(&p, m))
    }

    /// Turns on the negative lookup cache used by [`Client::lookup`]: a
    /// name is reported absent without asking its server when a listing of
    /// its directory no older than `ttl` (plus this client's own changes
    /// since) does not hold it. Zero turns it off. Meant for adapters whose
    /// kernel caches entries for `ttl` anyway (the FUSE mount).
    pub fn set_negative_ttl(&self, ttl: std::time::Duration) {
        self.inner.names.set_ttl(ttl);
    }

    /// Like [`Client::lstat`], but may answer `ENOENT` from the negative
    /// lookup cache (see [`Client::set_negative_ttl`]): an entry created by
    /// another client can stay invisible here for up to the cache's ttl.
    /// Entries this client created are always seen.
    pub fn lookup(&self, path: &str) -> Result<Stat> {
        use crate::names::Known;
        let p = normalize(path)?;
        let names = &self.inner.names;
        match names.lookup(&p) {
            Known::Absent => return fail(libc::ENOENT, format!("{p}: no such file or directory")),
            Known::Present(m) => return Ok(self.to_stat(&p, m)),
            Known::Ask => {}
        }
        let st = self.state();
        let r = self.stat_meta(&st, &p);
        let found = match &r {
            Ok(_) => true,
            Err(e) if e.errno() == libc::ENOENT => false,
            Err(_) => return r.map(|m| self.to_stat(&p, m)),
        };
        if names.asked(&p, found) {
            self.list_names(&st, path::parent(&p));
        }
        r.map(|m| self.to_stat(&p, m))
    }

    /// Lists `dir` into the lookup cache.
    fn list_names(&self, st: &PoolState, dir: &str) {
        let names = &self.inner.names;
        if let Some(at) = names.begin_listing(dir) {
            let list = self.list_metas(st, dir).ok().map(|all| {
                all.into_iter()
                    .map(|(name, (m, backend_only))| (name, (!backend_only).then_some(m)))
                    .collect()
            });
            names.end_listing(dir, at, list);
        }
    }

    /// `lstat(2)`.
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.stat_meta(&st, &p)?;
        Ok(self.to_stat(&p, m))
    }

    /// Checks that the parent of `path` is a directory (cached for a while).
    fn check_parent(&self, st: &PoolState, path: &str) -> Result<()> {
        let dir = path::parent(path);
        if dir == "/" || path == "/" {
            return Ok(());
        }
        let ttl = self.inner.pool.cfg().dir_cache;
        if let Some(t) = lock(&self.inner.dirs).get(dir) {
            if t.elapsed() < ttl {
                return Ok(());
            }
        }
        match self.stat_meta(st, dir) {
            Ok(m) if m.is_dir() => {
                if !ttl.is_zero() {
                    let mut d = lock(&self.inner.dirs);
                    if d.len() > 65536 {
                        d.clear();
                    }
                    d.insert(dir.to_string(), Instant::now());
                }
                Ok(())
            }
            Ok(m) if m.is_symlink() => fail(
                libc::ENOTSUP,
                format!("{dir}: symbolic links inside paths are not followed by the native client"),
            ),
            Ok(_) => fail(libc::ENOTDIR, format!("{dir}: not a directory")),
            Err(e) if e.errno() == libc::ENOENT => {
                // Error path only: a non-directory further up means ENOTDIR.
                let mut up = path::parent(dir);
                while up != "/" {
                    match self.stat_meta(st, up) {
                        Ok(m) if m.is_dir() => break,
                        Ok(_) => return fail(libc::ENOTDIR, format!("{up}: not a directory")),
                        Err(_) => up = path::parent(up),
                    }
                }
                fail(libc::ENOENT, format!("{dir}: no such directory"))
            }
            Err(e) => Err(e),
        }
    }

    fn forget_dirs(&self, path: &str) {
        lock(&self.inner.dirs).retain(|d, _| !path::is_within(d, path));
    }

    fn create_entry(
        &self,
        st: &PoolState,
        path: &str,
        meta: Meta,
        excl: bool,
        data: &[u8],
    ) -> Result<(Meta, bool)> {
        if path == "/" {
            return fail(libc::EEXIST, "/: exists");
        }
        self.check_parent(st, path)?;
        let req = Request::Create {
            path: path.to_string(),
            meta,
            excl,
            data: bytes::Bytes::copy_from_slice(data),
        };
        let r = self.call_owner(st, path, 0, &req);
        match &r {
            Ok(_) => self.inner.names.added(path),
            Err(e) if e.errno() == libc::EEXIST => self.inner.names.added(path),
            Err(_) => {}
        }
        match r? {
            Response::Created { meta, created } => Ok((meta, created)),
            other => Err(unexpected(other)),
        }
    }

    fn new_meta(&self, mode: u32, chunk_size: u32) -> Meta {
        let (uid, gid) = self.creds.unwrap_or_else(ids);
        let now = now_ns();
        Meta {
            mode,
            uid,
            gid,
            chunk_size,
            mtime: now,
            ctime: now,
            atime: now,
            fileid: self.new_fileid(),
            ..Default::default()
        }
    }

    /// `mkdir(2)`.
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.new_meta(
            libc::S_IFDIR | (mode & 0o7777),
            self.inner.chunk_size.load(Ordering::Relaxed),
        );
        let sent = Instant::now();
        self.create_entry(&st, &p, m, true, &[])?;
        self.inner.names.new_dir(&p, sent);
        Ok(())
    }

    /// `rmdir(2)`: fails with `ENOTEMPTY` if any server holds an entry in it.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        if p == "/" {
            return fail(libc::EBUSY, "/: cannot remove the root directory");
        }
        let m = self.stat_meta(&st, &p)?;
        if !m.is_dir() {
            return fail(libc::ENOTDIR, format!("{p}: not a directory"));
        }
        self.check_empty(&st, &p)?;
        self.call_owner(
            &st,
            &p,
            0,
            &Request::RemoveEntry {
                path: p.clone(),
                kind: RemoveKind::Dir,
            },
        )?;
        self.forget_dirs(&p);
        self.inner.names.removed(&p);
        self.inner.names.forget_below(&p);
        Ok(())
    }

    fn check_empty(&self, st: &PoolState, p: &str) -> Result<()> {
        for r in self.broadcast(
            st,
            &Request::HasChildren {
                path: p.to_string(),
            },
        ) {
            match r? {
                Response::Bool(false) => {}
                Response::Bool(true) => {
                    return fail(libc::ENOTEMPTY, format!("{p}: directory not empty"))
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    /// `unlink(2)`.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        let m = expect_meta(self.call_owner(
            &st,
            &p,
            0,
            &Request::RemoveEntry {
                path: p.clone(),
                kind: RemoveKind::NotDir,
            },
        ))?;
        self.inner.names.removed(&p);
        self.remove_data_chunks(&st, &p, &m, m.size.max(self.local_size(&p)))
    }

    /// Removes the data chunks (index >= 1) of a file of `size` bytes.
    fn remove_data_chunks(&self, st: &PoolState, p: &str, m: &Meta, size: u64) -> Result<()> {
        let cs = m.chunk_size.max(1) as u64;
        let nchunks = size.div_ceil(cs);
        if nchunks <= 1 {
            return Ok(());
        }
        let mut servers: Vec<usize> = (1..nchunks.min(st.ring.len() as u64 + 1))
            .map(|i| st.ring.owner(p, i))
            .collect();
        servers.sort_unstable();
        servers.dedup();
        let req = Request::RemoveChunks {
            path: p.to_string(),
            from_idx: 1,
        };
        let ops = servers.into_iter().map(|s| Op::req(s, &req)).collect();
        for r in self.pipeline(st, ops) {
            r?;
        }
        Ok(())
    }

    /// `symlink(2)`: creates `path` pointing at `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        if target.is_empty() {
            return fail(libc::ENOENT, "empty symlink target");
        }
        if target.len() > path::MAX_PATH {
            return fail(libc::ENAMETOOLONG, "symlink target too long");
        }
        let mut m = self.new_meta(
            libc::S_IFLNK | 0o777,
            self.inner
                .chunk_size
                .load(Ordering::Relaxed)
                .max(path::MAX_PATH as u32 + 1),
        );
        m.size = target.len() as u64;
        self.create_entry(&st, &p, m, true, target.as_bytes())?;
        Ok(())
    }

    fn read_link_meta(&self, st: &PoolState, p: &str, m: &Meta) -> Result<String> {
        let req = Request::Read {
            path: p.to_string(),
            fileid: m.fileid,
            idx: 0,
            off: 0,
            len: m.size as u32,
            chunk_size: m.chunk_size,
            flags: rw_flags(m, false),
            epoch: m.epoch(),
        };
        match self.call_owner(st, p, 0, &req)? {
            Response::Data(d) => String::from_utf8(d.to_vec())
                .map_err(|_| Error::new(libc::EILSEQ, "symlink target is not UTF-8")),
            other => Err(unexpected(other)),
        }
    }

    /// `readlink(2)`.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.stat_meta(&st, &p)?;
        if !m.is_symlink() {
            return fail(libc::EINVAL, format!("{p}: not a symbolic link"));
        }
        self.read_link_meta(&st, &p, &m)
    }

    /// `mknod(2)`: FIFOs, sockets and device files are stored as metadata;
    /// a regular file is created empty.
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        let ft = mode & libc::S_IFMT;
        let ft = if ft == 0 { libc::S_IFREG } else { ft };
        if ![
            libc::S_IFREG,
            libc::S_IFIFO,
            libc::S_IFSOCK,
            libc::S_IFCHR,
            libc::S_IFBLK,
        ]
        .contains(&ft)
        {
            return fail(
                libc::EINVAL,
                format!("{p}: mknod of file type {ft:o} is not allowed"),
            );
        }
        let mut m = self.new_meta(
            ft | (mode & 0o7777),
            self.inner.chunk_size.load(Ordering::Relaxed),
        );
        m.rdev = rdev as u32;
        self.create_entry(&st, &p, m, true, &[])?;
        Ok(())
    }

    fn set_attr(&self, path: &str, attr: SetAttr, follow: bool) -> Result<Stat> {
        let st = self.state();
        let mut p = normalize(path)?;
        if follow {
            p = self.resolve(&st, p)?.0;
        }
        if attr.atime != TimeSet::Omit || attr.mtime != TimeSet::Omit {
            // Publish our unwritten data first, or publishing it later
            // (close) would overwrite the times being set now.
            for f in self.open_files(&p) {
                self.flush_file(&st, &f)?;
            }
        }
        let r = self.call_owner(
            &st,
            &p,
            0,
            &Request::SetAttr {
                path: p.clone(),
                attr,
            },
        );
        self.inner.names.touched(&p);
        let m = expect_meta(r)?;
        Ok(self.to_stat(&p, m))
    }

    /// `chmod(2)` (follows a final symbolic link).
    pub fn chmod(&self, path: &str, mode: u32) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
            true,
        )
    }

    /// `lchown(2)`-style ownership change (`None` keeps a field).
    pub fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                uid,
                gid,
                ..Default::default()
            },
            false,
        )
    }

    /// `utimensat(2)` without following a final symbolic link.
    pub fn utimens(&self, path: &str, atime: TimeSet, mtime: TimeSet) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                atime,
                mtime,
                ..Default::default()
            },
            false,
        )
    }

    /// Sets several attributes at once (used by the FUSE adapter).
    pub fn setattr(&self, path: &str, attr: SetAttr) -> Result<Stat> {
        self.set_attr(path, attr, false)
    }

    /// `truncate(2)`.
    pub fn truncate(&self, path: &str, len: u64) -> Result<()> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?)?;
        self.truncate_resolved(&st, &p, &m, len).map(drop)
    }

    /// Truncates; returns the entry as it is now (a file cut to zero
    /// starts a new epoch, see [`Meta::epoch`]).
    fn truncate_resolved(&self, st: &PoolState, p: &str, m: &Meta, len: u64) -> Result<Meta> {
        if m.is_dir() {
            return fail(libc::EISDIR, format!("{p}: is a directory"));
        }
        if !m.is_reg() {
            return fail(libc::EINVAL, format!("{p}: not a regular file"));
        }
        // Buffered and unpublished writes of our own descriptors first.
        for f in self.open_files(p) {
            self.flush_file(st, &f)?;
        }
        // A cached backend file is fetched whole before it is cut, so the
        // part that stays is complete once the backend is no longer read.
        if m.flags & FLAG_CACHED != 0 && len > 0 {
            self.stagein_file(st, p, m)?;
        }
        self.inner.names.touched(p);
        let req = Request::TruncateChunks {
            path: p.to_string(),
            size: len,
            chunk_size: m.chunk_size,
        };
        for r in self.broadcast(st, &req) {
            r?;
        }
        let r = self.call_owner(
            st,
            p,
            0,
            &Request::SetSize {
                path: p.to_string(),
                size: len,
                grow_only: false,
                if_size: None,
            },
        );
        self.inner.names.touched(p);
        let m = expect_meta(r)?;
        for f in self.open_files(p) {
            let mut s = lock(&f.state);
            s.written_end = s.written_end.min(len);
            s.published = len;
        }
        Ok(m)
    }

    fn open_files(&self, path: &str) -> Vec<Arc<OpenFile>> {
        lock(&self.inner.fds)
            .iter()
            .flatten()
            .filter(|f| f.path == path)
            .cloned()
            .collect()
    }

    /// Lists a directory (merged over all servers, each name once, sorted).
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?)?;
        if !m.is_dir() {
            return fail(libc::ENOTDIR, format!("{p}: not a directory"));
        }
        Ok(self
            .list_metas(&st, &p)?
            .into_iter()
            .map(|(name, (meta, _))| DirEntry {
                stat: self.to_stat(&path::join(&p, &name), meta),
                name,
            })
            .collect())
    }

    /// Every entry of directory `p` with its header and whether it exists
    /// only in the backend (cache mode), merged over all servers.
    fn list_metas(&self, st: &PoolState, p: &str) -> Result<BTreeMap<String, (Meta, bool)>> {
        let mut all = BTreeMap::new();
        let n = st.ring.len();
        let mut after: Vec<Option<String>> = vec![Some(String::new()); n];
        while after.iter().any(Option::is_some) {
            let servers: Vec<usize> = (0..n).filter(|&i| after[i].is_some()).collect();
            let ops = servers
                .iter()
                .map(|&i| {
                    let a = after[i].clone().unwrap_or_default();
                    Op::req(
                        i,
                        &Request::Readdir {
                            path: p.to_string(),
                            after: a,
                            max: READDIR_PAGE,
                        },
                    )
                })
                .collect();
            for (&i, r) in servers.iter().zip(self.pipeline(st, ops)) {
                match r? {
                    Response::Entries { entries, done } => {
                        after[i] = if done {
                            None
                        } else {
                            entries.last().map(|e| e.name.clone())
                        };
                        for e in entries {
                            let backend_only = e.meta.flags & FLAG_BACKEND_ONLY != 0;
                            let s = e.meta;
                            // A cached entry wins over the backend's listing.
                            match all.entry(e.name) {
                                std::collections::btree_map::Entry::Vacant(v) => {
                                    v.insert((s, backend_only));
                                }
                                std::collections::btree_map::Entry::Occupied(mut o) => {
                                    if o.get().1 && !backend_only {
                                        o.insert((s, false));
                                    }
                                }
                            }
                        }
                    }
                    other => return Err(unexpected(other)),
                }
            }
        }
        Ok(all)
    }

    /// Lists the part of a directory held by server `index` (for parallel
    /// find). Does not check that `path` is a directory.
    pub fn readdir_index(&self, path: &str, index: usize) -> Result<Vec<DirEntry>> {
        self.readdir_index_op(path, index, false)
    }

    /// As [`Client::readdir_index`], but only the entries that are
    /// directories (the server filters them; for walking the tree without
    /// reading every entry). A server older than this request fails it
    /// with `EPROTO`.
    pub fn readdir_dirs_index(&self, path: &str, index: usize) -> Result<Vec<DirEntry>> {
        self.readdir_index_op(path, index, true)
    }

    fn readdir_index_op(&self, path: &str, index: usize, dirs: bool) -> Result<Vec<DirEntry>> {
        let st = self.state();
        let p = normalize(path)?;
        if index >= st.ring.len() {
            return fail(
                libc::EINVAL,
                format!("server index {index} out of range (0..{})", st.ring.len()),
            );
        }
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let (path, from, max) = (p.clone(), after.clone(), READDIR_PAGE);
            let req = if dirs {
                Request::ReaddirDirs {
                    path,
                    after: from,
                    max,
                }
            } else {
                Request::Readdir {
                    path,
                    after: from,
                    max,
                }
            };
            self.count(1);
            match self.inner.pool.call(&st, index, &req)? {
                Response::Entries { entries, done } => {
                    if let Some(l) = entries.last() {
                        after = l.name.clone();
                    }
                    for e in entries {
                        let full = path::join(&p, &e.name);
                        out.push(DirEntry {
                            stat: Stat::from_meta(&full, &e.meta),
                            name: e.name,
                        });
                    }
                    if done {
                        return Ok(out);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// `rename(2)`: files and directories; the destination is replaced
    /// (an empty directory by a directory, a non-directory by a
    /// non-directory). Chunks move to their new owners.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_flags(from, to, false)
    }

    /// `renameat2(2)` with optional `RENAME_NOREPLACE`.
    pub fn rename_flags(&self, from: &str, to: &str, noreplace: bool) -> Result<()> {
        let st = self.state();
        let old = normalize(from)?;
        let new = normalize(to)?;
        if old == "/" || new == "/" {
            return fail(libc::EBUSY, "cannot rename the root directory");
        }
        let src = self.stat_meta(&st, &old)?;
        if old == new {
            return Ok(());
        }
        if src.is_dir() && path::is_within(&new, &old) {
            return fail(
                libc::EINVAL,
                format!("cannot move {old} into itself ({new})"),
            );
        }
        self.check_parent(&st, &new)?;
        match self.stat_meta(&st, &new) {
            Ok(dst) => {
                if noreplace {
                    return fail(libc::EEXIST, format!("{new}: exists"));
                }
                if src.is_dir() {
                    if !dst.is_dir() {
                        return fail(libc::ENOTDIR, format!("{new}: not a directory"));
                    }
                    self.rmdir(&new)?;
                } else {
                    if dst.is_dir() {
                        return fail(libc::EISDIR, format!("{new}: is a directory"));
                    }
                    self.unlink(&new)?;
                }
            }
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        for f in self.open_files(&old) {
            self.flush_file(&st, &f)?;
        }
        let req = Request::RenameMove {
            old: old.clone(),
            new: new.clone(),
            is_dir: src.is_dir(),
        };
        // The owner of the source entry first: it may refuse (cache mode) or
        // rename the backend copy; then every other server moves its chunks.
        let owner = st.ring.owner(&old, 0);
        self.count(1);
        self.inner.pool.call(&st, owner, &req)?;
        let names = &self.inner.names;
        names.added(&new);
        names.removed(&old);
        if src.is_dir() {
            names.forget_below(&old);
            names.forget_below(&new);
        }
        let others = (0..st.ring.len())
            .filter(|&i| i != owner)
            .map(|i| Op::req(i, &req))
            .collect();
        let mut first_err = None;
        for r in self.pipeline(&st, others) {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        self.forget_dirs(&old);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `access(2)` against the caller's effective ids.
    pub fn access(&self, path: &str, mode: i32) -> Result<()> {
        let s = self.stat(path)?;
        if mode == libc::F_OK {
            return Ok(());
        }
        let (uid, gid) = self.creds.unwrap_or_else(ids);
        if uid == 0 {
            if mode & libc::X_OK != 0 && s.mode & 0o111 == 0 && !s.is_dir() {
                return fail(libc::EACCES, format!("{path}: not executable"));
            }
            return Ok(());
        }
        let bits = if s.uid == uid {
            (s.mode >> 6) & 7
        } else if s.gid == gid {
            (s.mode >> 3) & 7
        } else {
            s.mode & 7
        };
        if (mode as u32) & !bits & 7 != 0 {
            return fail(libc::EACCES, format!("{path}: permission denied"));
        }
        Ok(())
    }

    /// `statfs(2)`: capacity and use summed over all servers.
    pub fn statfs(&self) -> Result<StatFs> {
        let st = self.state();
        let mut fs = StatFs {
            servers: st.ring.len() as u32,
            ..Default::default()
        };
        for r in self.broadcast(&st, &Request::Status) {
            match r? {
                Response::Status(s) => {
                    fs.total += s.capacity.max(s.bytes);
                    fs.used += s.bytes;
                    fs.entries += s.entries;
                }
                other => return Err(unexpected(other)),
            }
        }
        fs.free = fs.total - fs.used;
        Ok(fs)
    }

    /// Status of every server (address, engine, use, requests).
    pub fn server_status(&self) -> Vec<(String, Result<chfs_proto::msg::ServerStatus>)> {
        let st = self.state();
        let servers = st.ring.list().servers.clone();
        servers
            .into_iter()
            .zip(self.broadcast(&st, &Request::Status))
            .map(|(a, r)| {
                let r = r.and_then(|r| match r {
                    Response::Status(s) => Ok(s),
                    other => Err(unexpected(other)),
                });
                (a, r)
            })
            .collect()
    }

    // ----- file descriptors ----------------------------------------------

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
        let meta = loop {
            let (m, created) = if flags & libc::O_CREAT != 0 {
                let nm = self.new_meta(libc::S_IFREG | (mode & 0o7777), cs);
                self.create_entry(&st, &p, nm, flags & libc::O_EXCL != 0, &[])?
            } else {
                (self.stat_meta(&st, &p)?, false)
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
                let target = self.read_link_meta(&st, &p, &m)?;
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
            path: p,
            meta,
            flags,
            pos: Mutex::new(0),
            state: Mutex::new(FileState {
                published: meta.size,
                ..Default::default()
            }),
        };
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

    /// Bytes of small writes gathered per descriptor (0 = none).
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size.load(Ordering::Relaxed) as usize
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
            let o = st.ring.owner(path, idx);
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

    fn flush_file(&self, st: &PoolState, f: &OpenFile) -> Result<()> {
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
        let mut ops = Vec::new();
        let mut lens = Vec::new();
        let mut done = 0usize;
        let mut data_chunks = false;
        s.wrote = true;
        let flags = rw_flags(&f.meta, true);
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / cs;
            let in_chunk = (pos % cs) as u32;
            let n = ((cs - in_chunk as u64) as usize).min(buf.len() - done);
            let mut head = Vec::with_capacity(48 + f.path.len());
            encode_write_head(
                &mut head,
                &WriteHead {
                    path: &f.path,
                    fileid: f.meta.fileid,
                    chunk_size: f.meta.chunk_size,
                    mode: f.meta.mode,
                    idx,
                    off: in_chunk,
                    flags,
                    epoch: f.meta.epoch(),
                },
            );
            ops.push(Op {
                server: st.ring.owner_of_hash(f.hash, idx),
                op: op::WRITE,
                head,
                tail: &buf[done..done + n],
            });
            lens.push(n);
            data_chunks |= idx > 0;
            done += n;
        }
        let full_end = off + buf.len() as u64;
        // The size is published with the data (no round trip of its own);
        // should a chunk then fail, it is taken back below.
        let publish = s.eager_publish && data_chunks && full_end > s.published;
        if publish {
            ops.push(Op::req(
                st.ring.owner_of_hash(f.hash, 0),
                &Request::SetSize {
                    path: f.path.clone(),
                    size: full_end,
                    grow_only: true,
                    if_size: None,
                },
            ));
        }
        let mut results = self.pipeline(st, ops);
        let published = if publish { results.pop() } else { None };
        let mut stored = 0usize;
        let mut first_err = None;
        for (r, n) in results.into_iter().zip(lens) {
            let e = match r {
                Ok(Response::Written(_)) if first_err.is_none() => {
                    stored += n;
                    continue;
                }
                Ok(Response::Written(_)) => continue,
                Ok(other) => unexpected(other),
                Err(e) => e,
            };
            first_err.get_or_insert(e);
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
            .filter(|e| *e <= i64::MAX as u64)
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
    fn file_size(&self, st: &PoolState, f: &OpenFile, refresh: bool) -> Result<u64> {
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

    /// `pread(2)`: holes read as zeros; reads end at the file size.
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
        {
            let has_buf = !lock(&f.state).buf.is_empty();
            if has_buf {
                self.flush_file(&st, &f)?;
            }
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
        let mut ops = Vec::new();
        let mut spans = Vec::new();
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
            ops.push(Op::req(st.ring.owner_of_hash(f.hash, idx), &req));
            spans.push((done, n));
            done += n;
        }
        for (r, (at, n)) in self.pipeline(&st, ops).into_iter().zip(spans) {
            match r? {
                Response::Data(d) => {
                    let k = d.len().min(n);
                    buf[at..at + k].copy_from_slice(&d[..k]);
                    buf[at + k..at + n].fill(0);
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(len)
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

    /// `chfs_sync`: flushes every open descriptor (buffers and sizes), asks
    /// every server to make its store durable (`Sync`: meaningful for the
    /// persistent engines) and, in cache mode, waits until the servers wrote
    /// every dirty chunk back to the backend ([`Client::wait_flushed`] on
    /// `/`).
    pub fn sync(&self) -> Result<()> {
        self.flush_all()?;
        let st = self.state();
        for r in self.broadcast(&st, &Request::Sync) {
            match r? {
                Response::Ok => {}
                other => return Err(unexpected(other)),
            }
        }
        self.wait_flushed("/", None)
    }

    /// Moves every chunk to the server that owns it by the pool's current
    /// list (after servers joined, `chfsctl -A`) and waits until every
    /// server is done. Returns the counts summed over the servers; fails
    /// when chunks could not be moved (they stay where they were, readable
    /// by nobody until a later rebalance succeeds). Run it while no job
    /// does I/O: a chunk in flight is briefly on neither server.
    pub fn rebalance(&self) -> Result<RebalanceState> {
        let old = self.state();
        self.inner.pool.refresh(&old)?;
        let st = self.state();
        let mut pause = std::time::Duration::from_millis(5);
        let mut start = true;
        loop {
            let mut sum = RebalanceState {
                version: st.ring.list().version,
                ..Default::default()
            };
            let mut unreachable = None;
            for r in self.broadcast(&st, &Request::Rebalance { start }) {
                match r {
                    // The others still finish their passes first.
                    Err(e) => unreachable = unreachable.or(Some(e)),
                    Ok(Response::Rebalance(b)) => {
                        sum.running |= b.running;
                        sum.moved += b.moved;
                        sum.kept += b.kept;
                        sum.failed += b.failed;
                        if !b.last_error.is_empty() {
                            sum.last_error = b.last_error;
                        }
                    }
                    Ok(other) => return Err(unexpected(other)),
                }
            }
            if !sum.running {
                if let Some(e) = unreachable {
                    return Err(e);
                }
                if sum.failed > 0 {
                    return fail(
                        errno_in(&sum.last_error),
                        format!(
                            "{} chunks could not be moved to their owners: {}",
                            sum.failed, sum.last_error
                        ),
                    );
                }
                return Ok(sum);
            }
            start = false;
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
        }
    }

    fn flush_states(&self, st: &PoolState, req: &Request) -> Result<FlushState> {
        let mut sum = FlushState::default();
        for r in self.broadcast(st, req) {
            match r? {
                Response::FlushState(f) => {
                    sum.chunks += f.chunks;
                    sum.bytes += f.bytes;
                    sum.failing += f.failing;
                    if !f.last_error.is_empty() {
                        sum.last_error = f.last_error;
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(sum)
    }

    /// Write-back state (cache mode) of everything under `path`, summed over
    /// all servers: dirty chunks and bytes not yet in the backend.
    pub fn flush_status(&self, path: &str) -> Result<FlushState> {
        let st = self.state();
        self.flush_states(
            &st,
            &Request::FlushStatus {
                prefix: normalize(path)?,
            },
        )
    }

    /// Asks every server to write back everything under `path` now and
    /// waits until it is in the backend. Fails with the backend's errno if
    /// writing back keeps failing without progress for 10 s, or with
    /// ETIMEDOUT after `timeout`.
    pub fn wait_flushed(&self, path: &str, timeout: Option<std::time::Duration>) -> Result<()> {
        let st = self.state();
        let prefix = normalize(path)?;
        let start = Instant::now();
        let mut s = self.flush_states(
            &st,
            &Request::Flush {
                prefix: prefix.clone(),
            },
        )?;
        let mut pause = std::time::Duration::from_millis(5);
        let (mut best, mut since) = (s.chunks, Instant::now());
        while s.chunks > 0 {
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return fail(
                    libc::ETIMEDOUT,
                    format!(
                        "{prefix}: {} chunks ({} bytes) still not written back",
                        s.chunks, s.bytes
                    ),
                );
            }
            if s.failing > 0 && since.elapsed() > std::time::Duration::from_secs(10) {
                let errno = errno_in(&s.last_error);
                return fail(
                    errno,
                    format!(
                        "{prefix}: {} chunks cannot be written back: {}",
                        s.failing, s.last_error
                    ),
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
            s = self.flush_states(
                &st,
                &Request::Flush {
                    prefix: prefix.clone(),
                },
            )?;
            if s.chunks < best {
                best = s.chunks;
                since = Instant::now();
            }
        }
        Ok(())
    }

    /// Fetches a path of the pool from the backend into the cache (cache
    /// mode), every chunk by its owner, in parallel; a directory
    /// recursively. Files already cached (or not from the backend) are not
    /// fetched. Returns the bytes of the files below `path`. This is the
    /// second half of [`Client::stagein`]'s rule, without the local file
    /// system.
    pub fn fetch_from_backend(&self, path: &str) -> Result<u64> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.stat_meta(&st, &p)?;
        if m.is_dir() {
            let mut n = 0;
            for e in self.readdir(&p)? {
                n += self.fetch_from_backend(&path::join(&p, &e.name))?;
            }
            return Ok(n);
        }
        if m.is_reg() {
            self.stagein_file(&st, &p, &m)?;
            return Ok(m.size);
        }
        Ok(0)
    }

    fn stagein_file(&self, st: &PoolState, p: &str, m: &Meta) -> Result<()> {
        if m.flags & FLAG_CACHED == 0 {
            return Ok(());
        }
        let cs = m.chunk_size.max(1) as u64;
        let n = m.size.div_ceil(cs).max(1);
        let hash = path_hash(p);
        let ops = (0..n)
            .map(|idx| {
                let req = Request::Read {
                    path: p.to_string(),
                    fileid: m.fileid,
                    idx,
                    off: 0,
                    len: 0,
                    chunk_size: m.chunk_size,
                    flags: rw_flags(m, false) | chfs_proto::msg::rw::FETCH_ONLY,
                    epoch: m.epoch(),
                };
                Op::req(st.ring.owner_of_hash(hash, idx), &req)
            })
            .collect();
        for r in self.pipeline(st, ops) {
            r?;
        }
        Ok(())
    }

    /// Asks every server of the pool to stop.
    pub fn shutdown_servers(&self) -> Result<()> {
        let st = self.state();
        for r in self.broadcast(&st, &Request::Shutdown) {
            r?;
        }
        Ok(())
    }
}

/// The errno named in a flush error message ("... (os error 13)").
fn errno_in(msg: &str) -> i32 {
    msg.rsplit_once("os error ")
        .and_then(|(_, r)| r.trim_end_matches(')').parse().ok())
        .unwrap_or(libc::EIO)
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

/// The path a symbolic link at `link` with `target` points to.
fn link_target(link: &str, target: &str) -> Result<String> {
    if target.starts_with('/') {
        Ok(normalize(target)?)
    } else {
        Ok(normalize(&format!("{}/{target}", path::parent(link)))?)
    }
}
