//! Server list, placement, one shared connection per server, and per-CPU
//! connections to local servers (CPU lanes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use chfs_proto::ring::{Ring, ServerList};
use chfs_proto::{Request, Response};
use chfs_sys::lock;

use crate::config::{ClientConfig, CpuLanes};
use crate::conn::Landing;
use crate::error::{fail, ConnFault, Error, Result};
use crate::link::{Link, Ticket};
use crate::poll::Counts;
use crate::shm::Window;

/// The current server list with a connection slot per server.
pub(crate) struct PoolState {
    pub ring: Ring,
    pub(crate) conns: Vec<Mutex<Option<Arc<Link>>>>,
    /// Per-CPU connections to local servers (CPU lanes), by server.
    lanes: Vec<Mutex<Lanes>>,
    fetched: Instant,
    /// The contact server of each owner for lookups (None: direct; see
    /// `crate::relay`).
    pub(crate) contacts: Option<Vec<usize>>,
    /// The server on this host that keeps the node-local area (the
    /// first local one), and the area's path.
    local: Option<usize>,
    node_local: Option<String>,
}

/// The "server" of a node-local path when no server runs on this host:
/// its requests fail with ENXIO.
const NO_LOCAL: usize = usize::MAX;

/// The CPU-lane connections to one server.
#[derive(Default, Clone)]
struct Lanes {
    /// The server refused a lane, or could not be reached for one: use the
    /// shared connection.
    refused: bool,
    by_cpu: Vec<Option<Arc<Link>>>,
}

/// One request of a batch: target server, opcode, encoded fields and a
/// borrowed data tail.
pub(crate) struct Op<'a> {
    pub server: usize,
    pub op: u16,
    pub head: Vec<u8>,
    pub tail: &'a [u8],
}

impl<'a> Op<'a> {
    /// A batch entry for a [`Request`].
    pub fn req(server: usize, req: &Request) -> Self {
        let mut head = Vec::with_capacity(64);
        req.encode(&mut head);
        Op {
            server,
            op: req.op(),
            head,
            tail: &[],
        }
    }
}

/// Where a read's data goes ([`Pool::read_into`]): one buffer, or the
/// parts of one (in order; over sockets only).
pub(crate) trait ReadDst {
    /// Sends `op` over `link`, its data to land here.
    fn send<'a>(
        &'a mut self,
        link: &Link,
        op: &Op<'_>,
        area: Option<&crate::shm::Landing>,
    ) -> Result<Ticket<'a>>;
    /// Does it lie in the landing area `a`?
    fn in_area(&self, a: &crate::shm::Landing) -> bool;
}

impl ReadDst for &mut [u8] {
    fn send<'a>(
        &'a mut self,
        link: &Link,
        op: &Op<'_>,
        area: Option<&crate::shm::Landing>,
    ) -> Result<Ticket<'a>> {
        link.send_read(op.op, &op.head, self, area)
    }

    fn in_area(&self, a: &crate::shm::Landing) -> bool {
        a.holds(self.as_ptr(), self.len())
    }
}

/// A read's destination of either kind.
pub(crate) enum Dst<'a> {
    One(&'a mut [u8]),
    /// Places in a caller's buffer, one after the other (sockets only, at
    /// most [`crate::conn::MAX_PARTS`]).
    Parts(Vec<&'a mut [u8]>),
    /// Memory the caller lent on this endpoint, named by this key, for
    /// several requests at once (a `ReadSpansPlaced`; fabric links only).
    Placed(chfs_fabric::RemoteKey, &'a chfs_fabric::Endpoint),
}

impl ReadDst for Dst<'_> {
    fn send<'a>(
        &'a mut self,
        link: &Link,
        op: &Op<'_>,
        area: Option<&crate::shm::Landing>,
    ) -> Result<Ticket<'a>> {
        match self {
            Dst::One(d) => link.send_read(op.op, &op.head, d, area),
            Dst::Parts(parts) => {
                let parts = parts.iter_mut().map(|p| &mut **p).collect();
                link.send_read_parts(op.op, &op.head, parts)
            }
            Dst::Placed(key, on) => link.send_read_placed(op.op, &op.head, *key, on),
        }
    }

    fn in_area(&self, a: &crate::shm::Landing) -> bool {
        match self {
            Dst::One(d) => a.holds(d.as_ptr(), d.len()),
            Dst::Parts(_) | Dst::Placed(..) => false,
        }
    }
}

pub(crate) struct Pool {
    cfg: ClientConfig,
    state: RwLock<Arc<PoolState>>,
    /// Which callers reach local servers over a connection per CPU of the
    /// calling thread ([`CpuLanes`] as u8).
    lanes: AtomicU8,
    /// Memory local servers map too ([`crate::Client::shared_buffer`]).
    window: OnceLock<Arc<Window>>,
    /// Where local servers place reads' data ([`crate::shm::Landing`]),
    /// made on first use; None when it cannot be made (or `CHFS_CMA=0`).
    landing: OnceLock<Option<(u32, Arc<crate::shm::Landing>)>>,
    /// Polling for replies, over every connection ([`crate::poll`]).
    polls: Arc<Counts>,
    /// Chooses among candidate contact servers.
    seed: u64,
    /// Whether the server on this host has the same node-local area
    /// (`Pool::node_local_agreed`): Ok, or the errno and message.
    node_local: OnceLock<std::result::Result<(), (i32, String)>>,
}

fn lanes_code(l: CpuLanes) -> u8 {
    match l {
        CpuLanes::Never => 0,
        CpuLanes::Pinned => 1,
        _ => 2,
    }
}

/// Is the calling thread allowed on one CPU only? (Asked once per thread.)
fn thread_is_pinned() -> bool {
    thread_local! {
        static PINNED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    PINNED.with(|p| match p.get() {
        Some(pinned) => pinned,
        None => {
            let pinned = chfs_sys::cpu::allowed_count().is_ok_and(|n| n == 1);
            p.set(Some(pinned));
            pinned
        }
    })
}

impl Pool {
    /// Contacts the configured servers until one gives the server list.
    pub fn connect(cfg: ClientConfig) -> Result<Pool> {
        if cfg.servers.is_empty() {
            return fail(
                libc::EINVAL,
                "no server given: set CHFS_SERVER (host:port[,host:port...])",
            );
        }
        let polls = Arc::<Counts>::default();
        let list = fetch_list(&cfg, &cfg.servers, None, &polls)?;
        let seed = cfg.contact_seed.unwrap_or_else(crate::relay::default_seed);
        let state = RwLock::new(Arc::new(PoolState::new(list, None, &cfg, seed)));
        Ok(Pool {
            seed,
            lanes: AtomicU8::new(lanes_code(cfg.cpu_lanes)),
            window: OnceLock::new(),
            landing: OnceLock::new(),
            node_local: OnceLock::new(),
            polls,
            cfg,
            state,
        })
    }

    pub fn cfg(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The current state, refreshed from a server when the cache expired.
    pub fn state(&self) -> Arc<PoolState> {
        let st = self.state.read().unwrap_or_else(|p| p.into_inner()).clone();
        if st.fetched.elapsed() < self.cfg.node_list_cache_timeout {
            return st;
        }
        let _ = self.refresh(&st);
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fetches the list again now; keeps connections to unchanged servers.
    pub fn refresh(&self, old: &PoolState) -> Result<()> {
        let list = fetch_list(&self.cfg, &old.ring.list().servers, Some(old), &self.polls)?;
        let new = if list == *old.ring.list() {
            PoolState {
                ring: old.ring.clone(),
                conns: old.clone_conns(&list),
                lanes: old.clone_lanes(&list),
                fetched: Instant::now(),
                contacts: old.contacts.clone(),
                local: old.local,
                node_local: old.node_local.clone(),
            }
        } else {
            PoolState::new(list, Some(old), &self.cfg, self.seed)
        };
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        Ok(())
    }

    /// Replies that came while polling, and polls that ended in sleep.
    pub fn poll_counts(&self) -> (u64, u64) {
        (
            self.polls.hits.load(Ordering::Relaxed),
            self.polls.misses.load(Ordering::Relaxed),
        )
    }

    /// Fabric requests whose bulk data moved straight from or into the
    /// caller's memory, and through a window with a copy.
    pub fn rma_counts(&self) -> (u64, u64) {
        (
            self.polls.rma_lent.load(Ordering::Relaxed),
            self.polls.rma_copied.load(Ordering::Relaxed),
        )
    }

    /// Which callers use CPU lanes.
    pub fn set_lanes(&self, l: CpuLanes) {
        self.lanes.store(lanes_code(l), Ordering::Relaxed);
    }

    /// Does this call go through the calling CPU's lane?
    fn wants_lane(&self) -> bool {
        match self.lanes.load(Ordering::Relaxed) {
            0 => false,
            1 => thread_is_pinned(),
            _ => true,
        }
    }

    /// The connection to server `i`, opened (or re-opened) on demand: the
    /// calling CPU's lane to a local server when lanes are on.
    pub fn conn(&self, st: &PoolState, i: usize) -> Result<Arc<Link>> {
        // (the shared connection tells whether the server is local even
        // when a lane carries the request: only checked when used)
        let shared = self.shared_conn(st, i, false)?;
        let c = match self.wants_lane() && shared.is_local() {
            true => match self.lane_conn(st, i) {
                Some(lane) => lane,
                None => self.shared_conn(st, i, true)?,
            },
            false => self.shared_conn(st, i, true)?,
        };
        if let Some(w) = self.window.get() {
            c.offer_window(w);
        }
        Ok(c)
    }

    /// The landing area, when server `i` is on this host and places
    /// reads' data in it (see [`crate::shm::Landing`]).
    pub fn landing(&self, st: &PoolState, i: usize) -> Option<&Arc<crate::shm::Landing>> {
        let (pid, area) = self
            .landing
            .get_or_init(|| {
                self.cfg
                    .cma
                    .then(|| crate::shm::Landing::new().ok())
                    .flatten()
                    .map(|a| (crate::process_id(), Arc::new(a)))
            })
            .as_ref()?;
        // (A forked child shares the area's pages with its parent.)
        if *pid != crate::process_id() {
            return None;
        }
        let c = self.conn(st, i).ok()?;
        (c.is_local() && c.lands_in(area)).then_some(area)
    }

    /// A slot of the landing area for `len` bytes of a read from server
    /// `i` ([`Pool::landing`]), if one is free.
    pub fn landing_slot(&self, st: &PoolState, i: usize, len: usize) -> Option<crate::shm::Slot> {
        self.landing(st, i)?.take(len)
    }

    /// The landing area, if made.
    fn area(&self) -> Option<&crate::shm::Landing> {
        self.landing.get()?.as_ref().map(|(_, a)| &**a)
    }

    /// Landing-area slots given up for good (their reads failed).
    pub fn landing_quarantined(&self) -> usize {
        self.area().map_or(0, |a| a.quarantined())
    }

    /// Makes `w` the memory local servers are told about (once).
    pub fn set_window(&self, w: Arc<Window>) -> Result<()> {
        self.window
            .set(w)
            .or_else(|_| fail(libc::EBUSY, "this client already has a shared buffer"))
    }

    /// Open lane connections.
    pub fn lane_connections(&self, st: &PoolState) -> usize {
        st.lanes
            .iter()
            .map(|l| {
                lock(l)
                    .by_cpu
                    .iter()
                    .flatten()
                    .filter(|c| c.alive())
                    .count()
            })
            .sum()
    }

    /// The lane of the calling thread's CPU to server `i`, opened on first
    /// use; None when the server refuses lanes.
    fn lane_conn(&self, st: &PoolState, i: usize) -> Option<Arc<Link>> {
        let cpu = chfs_sys::cpu::current()?;
        let mut g = lock(st.lanes.get(i)?);
        if g.refused {
            return None;
        }
        if let Some(Some(c)) = g.by_cpu.get(cpu) {
            if c.usable() {
                return Some(c.clone());
            }
        }
        let counts = self.polls.clone();
        match Link::connect_lane(&st.ring.list().servers[i], &self.cfg, cpu as u32, counts) {
            Ok(c) => {
                let c = Arc::new(c);
                if g.by_cpu.len() <= cpu {
                    g.by_cpu.resize(cpu + 1, None);
                }
                g.by_cpu[cpu] = Some(c.clone());
                Some(c)
            }
            Err(_) => {
                g.refused = true;
                None
            }
        }
    }

    /// The shared connection to server `i`, opened (or re-opened) on
    /// demand; with `check`, one that looks closed by its server
    /// ([`Link::usable`]) is replaced too.
    fn shared_conn(&self, st: &PoolState, i: usize, check: bool) -> Result<Arc<Link>> {
        if i == NO_LOCAL {
            return fail(libc::ENXIO, no_local_server("the node-local area"));
        }
        let slot = st
            .conns
            .get(i)
            .ok_or_else(|| Error::new(libc::EINVAL, format!("no server with index {i}")))?;
        let mut g = lock(slot);
        if let Some(c) = g.as_ref() {
            if if check { c.usable() } else { c.alive() } {
                return Ok(c.clone());
            }
        }
        let counts = self.polls.clone();
        let c = Arc::new(Link::connect(
            &st.ring.list().servers[i],
            &self.cfg,
            counts,
        )?);
        *g = Some(c.clone());
        drop(g);
        self.close_idle(st, i);
        Ok(c)
    }

    /// Closes the shared connections (but that to server `except`) that
    /// nobody is using and that have been idle for `CHFS_CONN_IDLE_SEC`:
    /// a client keeps connections to the servers it uses, not to every
    /// server it ever reached. Slots busy in another thread are skipped.
    fn close_idle(&self, st: &PoolState, except: usize) {
        let idle = self.cfg.conn_idle;
        if idle.is_zero() {
            return;
        }
        for (j, slot) in st.conns.iter().enumerate() {
            if j == except {
                continue;
            }
            if let Ok(mut g) = slot.try_lock() {
                // Held by the slot only (no request in flight on it).
                if g.as_ref()
                    .is_some_and(|c| Arc::strong_count(c) == 1 && c.idle_for() >= idle)
                {
                    *g = None;
                }
            }
        }
    }

    /// Open shared connections, by server (placement order).
    pub fn open_connections(&self, st: &PoolState) -> Vec<bool> {
        st.conns
            .iter()
            .map(|c| lock(c).as_ref().is_some_and(|c| c.alive()))
            .collect()
    }

    /// One request to server `i`, sent once more on a new connection if
    /// the connection broke under it and sending it again is safe
    /// ([`retry_safe`]).
    pub fn call(&self, st: &PoolState, i: usize, req: &Request) -> Result<Response> {
        let _rpc = tracing::debug_span!("rpc", op = req.op(), server = i).entered();
        if let Some(p) = req.path() {
            if st.is_node_local(p)
                || chfs_proto::path::is_within(p, chfs_proto::path::NODE_LOCAL_PREFIX)
            {
                self.node_local_agreed(st)?;
            }
        }
        match self.conn(st, i)?.call(req) {
            Err(e) if retry_safe(&e, req.op()) => self.conn(st, i)?.call(req),
            r => r,
        }
    }

    /// Do this client and the server on its host agree on the node-local
    /// area ([`Request::NodeLocal`])? Asked once, at the first request
    /// about a path in the client's area or in the default one (so that
    /// an area turned on at one side only is found), when a server runs
    /// on this host; the answer (but a failure to ask) is kept.
    fn node_local_agreed(&self, st: &PoolState) -> Result<()> {
        if let Some(v) = self.node_local.get() {
            return v.clone().map_err(|(errno, m)| Error::new(errno, m));
        }
        let Some(local) = st.local else {
            return Ok(());
        };
        let req = Request::NodeLocal {
            prefix: st.node_local.clone().unwrap_or_default(),
        };
        let v = match self.conn(st, local)?.call(&req) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == libc::EINVAL => Err((e.errno(), e.message().to_string())),
            Err(e) => return Err(e),
        };
        let _ = self.node_local.set(v.clone());
        v.map_err(|(errno, m)| Error::new(errno, m))
    }

    /// Read requests, each one's data straight into its buffer of `dsts`
    /// when this thread reads the reply off the connection (see
    /// [`Link::wait_into`]), with at most the window in flight (as
    /// [`Pool::pipeline`]); those a broken connection failed are sent once
    /// more on new connections. Results are in the order of `ops`.
    pub fn read_into<D: ReadDst>(
        &self,
        st: &PoolState,
        ops: &[Op<'_>],
        dsts: &mut [D],
    ) -> Vec<Result<Landing>> {
        let _rpcs = tracing::debug_span!("reads", n = ops.len()).entered();
        let window = if self.cfg.async_access {
            self.cfg.window.max(1)
        } else {
            1
        };
        let mut results: Vec<Option<Result<Landing>>> = (0..ops.len()).map(|_| None).collect();
        self.read_batch(
            st,
            ops,
            (0..ops.len()).collect(),
            window,
            dsts,
            &mut results,
        );
        // (Not those into the landing area: the server of the broken
        // connection might still write that memory; the caller reads them
        // again elsewhere.)
        let area = self.area();
        let again: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(i, r)| matches!(r, Some(Err(e)) if retry_safe(e, ops[*i].op)))
            .filter(|(i, _)| !area.is_some_and(|a| dsts[*i].in_area(a)))
            .map(|(i, _)| i)
            .collect();
        if !again.is_empty() {
            self.read_batch(st, ops, again, window, dsts, &mut results);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(libc::EIO, "request not sent"))))
            .collect()
    }

    fn read_batch<D: ReadDst>(
        &self,
        st: &PoolState,
        ops: &[Op<'_>],
        which: Vec<usize>,
        window: usize,
        dsts: &mut [D],
        results: &mut [Option<Result<Landing>>],
    ) {
        // Each destination goes with its request (over the fabric the
        // server may write it by RMA while the request is in flight);
        // `which` is in ascending order.
        let mut slots = dsts.iter_mut().enumerate();
        let area = self.area();
        let mut inflight: VecDeque<(usize, Arc<Link>, Ticket<'_>)> = VecDeque::new();
        for i in which {
            if inflight.len() >= window {
                if let Some((j, c, t)) = inflight.pop_front() {
                    results[j] = Some(c.wait_landed(t));
                }
            }
            let op = &ops[i];
            let Some((_, dst)) = slots.find(|(k, _)| *k == i) else {
                results[i] = Some(Err(Error::new(libc::EIO, "reads of a batch out of order")));
                continue;
            };
            match self
                .conn(st, op.server)
                .and_then(|c| dst.send(&c, op, area).map(|t| (c, t)))
            {
                Ok((c, t)) => inflight.push_back((i, c, t)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        for (j, c, t) in inflight {
            results[j] = Some(c.wait_landed(t));
        }
    }

    /// Runs a batch with at most `window` requests in flight; results are in
    /// the order of `ops`.
    pub fn pipeline(&self, st: &PoolState, ops: Vec<Op<'_>>) -> Vec<Result<Response>> {
        let _rpcs = tracing::debug_span!("rpcs", n = ops.len()).entered();
        let window = if self.cfg.async_access {
            self.cfg.window.max(1)
        } else {
            1
        };
        let mut results: Vec<Option<Result<Response>>> = (0..ops.len()).map(|_| None).collect();
        self.run_batch(st, &ops, (0..ops.len()).collect(), window, &mut results);
        // Requests a broken connection failed, and safe to send again
        // (see `retry_safe`): once more, on new connections.
        let again: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(i, r)| matches!(r, Some(Err(e)) if retry_safe(e, ops[*i].op)))
            .map(|(i, _)| i)
            .collect();
        if !again.is_empty() {
            self.run_batch(st, &ops, again, window, &mut results);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(libc::EIO, "request not sent"))))
            .collect()
    }

    /// Sends `ops[i]` for each `i` of `which` with at most `window` in
    /// flight; files each result at its index.
    fn run_batch(
        &self,
        st: &PoolState,
        ops: &[Op<'_>],
        which: Vec<usize>,
        window: usize,
        results: &mut [Option<Result<Response>>],
    ) {
        let mut inflight: VecDeque<(usize, Arc<Link>, Ticket<'_>)> = VecDeque::new();
        for i in which {
            if inflight.len() >= window {
                if let Some((j, c, t)) = inflight.pop_front() {
                    results[j] = Some(c.wait(t));
                }
            }
            let op = &ops[i];
            match self
                .conn(st, op.server)
                .and_then(|c| c.send_raw(op.op, &op.head, op.tail).map(|t| (c, t)))
            {
                Ok((c, t)) => inflight.push_back((i, c, t)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        for (j, c, t) in inflight {
            results[j] = Some(c.wait(t));
        }
    }

    /// Sends `req` to every server; results by server index.
    pub fn broadcast(&self, st: &PoolState, req: &Request) -> Vec<Result<Response>> {
        let ops = (0..st.ring.len()).map(|i| Op::req(i, req)).collect();
        self.pipeline(st, ops)
    }
}

/// May a request with opcode `op` that failed with `e` be sent again? When
/// it never left (any request), or when the connection broke after it was
/// sent and carrying it out twice is harmless: reads, stats, listings,
/// writes of the same bytes to the same place, size and attribute
/// settings, chunk removals. Not creates (an exclusive one would find its
/// own entry), removals of entries, renames, append reservations,
/// membership changes.
pub(crate) fn retry_safe(e: &Error, op: u16) -> bool {
    use chfs_proto::msg::op::*;
    match e.conn_fault() {
        ConnFault::None => false,
        ConnFault::NotSent => true,
        ConnFault::Lost => matches!(
            op,
            PING | GET_SERVERS
                | STATUS
                | STAT
                | WRITE
                | WRITE_SPANS
                | READ
                | READ_SPANS
                | SET_SIZE
                | SET_ATTR
                | REMOVE_CHUNKS
                | TRUNCATE_CHUNKS
                | READDIR
                | READDIR_DIRS
                | LIST_TREE
                | DIR_VERSION
                | HAS_CHILDREN
                | FLUSH_STATUS
                | FLUSH
                | SYNC
        ),
    }
}

impl PoolState {
    fn new(list: ServerList, old: Option<&PoolState>, cfg: &ClientConfig, seed: u64) -> Self {
        let local_servers = crate::relay::local_servers(&list.servers);
        let contacts = match cfg.lookup {
            crate::config::Lookup::Direct => None,
            l => crate::relay::contacts(list.servers.len(), l, &local_servers, seed),
        };
        let conns = match old {
            Some(o) => o.clone_conns(&list),
            None => list.servers.iter().map(|_| Mutex::new(None)).collect(),
        };
        let lanes = match old {
            Some(o) => o.clone_lanes(&list),
            None => list.servers.iter().map(|_| Mutex::default()).collect(),
        };
        PoolState {
            ring: Ring::new(list),
            conns,
            lanes,
            fetched: Instant::now(),
            contacts,
            local: local_servers.first().copied(),
            node_local: cfg.node_local.clone(),
        }
    }

    /// The server on this host that keeps the node-local area (None: no
    /// server on this host, or the area is off).
    pub fn local_server(&self) -> Option<usize> {
        self.node_local.as_ref().and(self.local)
    }

    /// Is `p` in the node-local area?
    pub fn is_node_local(&self, p: &str) -> bool {
        self.node_local
            .as_deref()
            .is_some_and(|d| chfs_proto::path::is_within(p, d))
    }

    /// The server keeping chunk `idx` of `p`: its owner, or for the
    /// node-local area the server on this host.
    pub fn owner(&self, p: &str, idx: u64) -> usize {
        if self.is_node_local(p) {
            self.local.unwrap_or(NO_LOCAL)
        } else {
            self.ring.owner(p, idx)
        }
    }

    /// [`PoolState::owner`] with the path's hash already computed.
    pub fn owner_of_hash(&self, p: &str, hash: u64, idx: u64) -> usize {
        if self.is_node_local(p) {
            self.local.unwrap_or(NO_LOCAL)
        } else {
            self.ring.owner_of_hash(hash, idx)
        }
    }

    /// The servers that may hold chunks of `p` or entries below it: all,
    /// or for the node-local area the server on this host.
    pub fn servers_for(&self, p: &str) -> Result<Vec<usize>> {
        if !self.is_node_local(p) {
            return Ok((0..self.ring.len()).collect());
        }
        match self.local {
            Some(i) => Ok(vec![i]),
            None => fail(libc::ENXIO, no_local_server(p)),
        }
    }

    /// The server a lookup of an entry owned by server `owner` goes to
    /// (`owner` itself when lookups are direct).
    pub fn contact(&self, owner: usize) -> usize {
        self.contacts
            .as_ref()
            .and_then(|c| c.get(owner).copied())
            .unwrap_or(owner)
    }

    fn clone_lanes(&self, list: &ServerList) -> Vec<Mutex<Lanes>> {
        list.servers
            .iter()
            .map(|s| {
                let old = self.ring.list().servers.iter().position(|o| o == s);
                Mutex::new(
                    old.map(|i| lock(&self.lanes[i]).clone())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    fn clone_conns(&self, list: &ServerList) -> Vec<Mutex<Option<Arc<Link>>>> {
        list.servers
            .iter()
            .map(|s| {
                let old = self.ring.list().servers.iter().position(|o| o == s);
                Mutex::new(old.and_then(|i| lock(&self.conns[i]).clone()))
            })
            .collect()
    }
}

fn no_local_server(p: &str) -> String {
    format!("{p}: no chfsd of the pool runs on this host to keep the node-local area (CHFS_NODE_LOCAL_PREFIX)")
}

fn fetch_list(
    cfg: &ClientConfig,
    servers: &[String],
    old: Option<&PoolState>,
    polls: &Arc<Counts>,
) -> Result<ServerList> {
    let mut last = None;
    for (i, s) in servers.iter().enumerate() {
        let conn = match old
            .and_then(|o| o.conns.get(i))
            .and_then(|c| lock(c).clone())
            .filter(|c| c.alive())
        {
            Some(c) => Ok(c),
            None => Link::connect(s, cfg, polls.clone()).map(Arc::new),
        };
        match conn.and_then(|c| c.call(&Request::GetServers)) {
            Ok(Response::Servers(l)) if !l.servers.is_empty() => return Ok(l),
            Ok(other) => {
                last = Some(Error::new(
                    libc::EPROTO,
                    format!("server {s}: unexpected answer {other:?}"),
                ))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::new(libc::EINVAL, "no server given")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer is the thread's affinity at its first call, asked once:
    /// it was asked again on every request (a sched_getaffinity system
    /// call each), because the cached value was set on a copy.
    #[test]
    fn a_thread_is_asked_whether_it_is_pinned_once() {
        std::thread::spawn(|| {
            let first = thread_is_pinned();
            // Pin it (or, if it was pinned, nothing changes the answer).
            let cpu = chfs_sys::cpu::current().unwrap_or(0);
            chfs_sys::cpu::pin_current_thread(cpu).unwrap();
            assert_eq!(thread_is_pinned(), first);
        })
        .join()
        .unwrap();
    }
}
