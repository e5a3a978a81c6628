//! Listening, connections, membership and lifecycle.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::{Header, FLAG_CMA, FLAG_ERROR, FLAG_FORWARDED};
use chfs_proto::handshake::{Credential, Keys, Role};
use chfs_proto::msg::{encode_error, op};
use chfs_proto::ring::{Ring, ServerList};
use chfs_proto::{ErrorReply, Request, Response};
use chfs_store::{Chunk, MemStore, Store, StoreError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::metrics::Counters;
use crate::net;
use crate::peer::Peers;

/// Errors starting or running a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Invalid configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// Could not bind or accept.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Could not join the pool.
    #[error("cannot join the pool through {seed}: {reply}")]
    Join {
        /// Server contacted.
        seed: String,
        /// Its answer.
        reply: ErrorReply,
    },
    /// Other I/O error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Current placement plus this server's position in it.
pub(crate) struct Placement {
    pub ring: Ring,
    pub me: Option<usize>,
}

impl Placement {
    /// Does this server own the entry (chunk 0) of `path`?
    pub fn owns(&self, path: &str) -> bool {
        self.me.is_some() && self.me == Some(self.ring.owner(path, 0))
    }

    /// The list version at which this server's store replaced a lost one
    /// (0: it holds everything ever written to it).
    pub fn since(&self) -> u64 {
        self.me.map_or(0, |i| self.ring.list().since(i))
    }

    /// Why a chunk of a file of `epoch` ([`Meta::epoch`]), read or written
    /// with `rw::*` `flags`, that this server does not hold may have been
    /// lost rather than never written; None when it is a hole. See
    /// SEMANTICS.md, "Faults".
    ///
    /// [`Meta::epoch`]: chfs_proto::Meta::epoch
    pub fn may_have_lost(&self, epoch: u32, flags: u16) -> Option<String> {
        let since = self.since();
        let version = self.ring.list().version;
        if flags & chfs_proto::msg::rw::DAMAGED != 0 {
            Some(
                "the file lost chunks when a server restarted with an empty store, \
                 and no server holds this one"
                    .to_string(),
            )
        } else if since > epoch as u64 {
            Some(format!(
                "the chunk may have been lost: this server started with an empty store, \
                 replacing an earlier one (server list version {since}), after the file \
                 was created (version {epoch})"
            ))
        } else if epoch as u64 > version {
            Some(format!(
                "the chunk may have been lost: the file was created at server list \
                 version {epoch}, this server holds version {version} (it was restarted \
                 outside the pool, or has not yet heard of the pool's last change)"
            ))
        } else {
            None
        }
    }
}

/// State shared by every connection of a server.
pub(crate) struct Shared {
    pub store: Arc<dyn Store>,
    pub placement: RwLock<Arc<Placement>>,
    pub me: String,
    pub peers: Peers,
    pub counters: Counters,
    pub join_lock: tokio::sync::Mutex<()>,
    pub shutdown: watch::Sender<bool>,
    /// Cache mode state (backend, dirty set, flusher).
    pub cache: Option<Arc<crate::cache::Cache>>,
    /// Directory or file of a persistent store (for its free space).
    pub store_path: Option<std::path::PathBuf>,
    /// Progress of rebalance passes (after the list grew).
    pub rebalancer: crate::rebalance::Rebalancer,
    /// Threads serving local connections on their clients' CPUs.
    pub lanes: crate::lanes::Lanes,
    /// The keys of the pool's roles (None: no secret, the pool is open).
    keys: Option<Keys>,
    /// Who may connect through the local socket.
    local_users: crate::config::LocalUsers,
    /// Limits against misbehaving clients.
    pub limits: crate::limits::Limits,
    /// Connections open per client host or local user.
    peers_open: Arc<crate::limits::PeerCounts>,
    /// Closes idle connections.
    watchdogs: Arc<crate::limits::Watchdogs>,
}

impl Shared {
    pub fn placement(&self) -> Arc<Placement> {
        self.placement
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stores a chunk moved here as is (rename, rebalance, a move put
    /// back); one that was dirty (cache mode) is registered for write-back
    /// here.
    pub fn put_chunk(&self, path: &str, idx: u64, chunk: Chunk) -> Result<(), StoreError> {
        let dirty = chunk.meta.flags & chfs_proto::meta::FLAG_DIRTY != 0;
        self.store.put(path, idx, chunk)?;
        match self.cache.as_deref() {
            Some(c) if dirty => c.mark_dirty(&*self.store, path, idx),
            _ => Ok(()),
        }
    }

    pub fn set_list(&self, list: ServerList) {
        let me = list.servers.iter().position(|s| *s == self.me);
        let p = Arc::new(Placement {
            ring: Ring::new(list),
            me,
        });
        *self.placement.write().unwrap_or_else(|p| p.into_inner()) = p;
    }
}

/// A server running in this process.
pub struct RunningServer {
    /// The address it serves and advertises.
    pub addr: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Asks the server to stop and waits until it has.
    pub async fn stop(self) {
        let _ = self.shared.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Waits until the server stops (after a `Shutdown` request).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Current server list.
    pub fn servers(&self) -> ServerList {
        self.shared.placement().ring.list().clone()
    }
}

/// Opens the store; true when it is new (holds nothing written before this
/// start: the DRAM engine always, a persistent one when just created).
fn open_store(cfg: &Config) -> Result<(Arc<dyn Store>, bool), ServerError> {
    let need_path = || {
        cfg.path
            .clone()
            .ok_or_else(|| ServerError::Config(format!("--store {} needs --path", cfg.store)))
    };
    let failed = |p: &std::path::Path, e: chfs_store::StoreError| {
        ServerError::Config(format!(
            "cannot open {} store at {}: {e}",
            cfg.store,
            p.display()
        ))
    };
    match cfg.store.as_str() {
        "mem" => Ok((Arc::new(MemStore::new(cfg.size)), true)),
        "pmem" => {
            let p = need_path()?;
            let s = chfs_store::PmemStore::open(&p, cfg.size).map_err(|e| failed(&p, e))?;
            let r = s.recovery();
            info!(path = %p.display(), created = r.created, records = r.records, corrupt = r.corrupt,
                  superseded = r.superseded, unreadable = r.unreadable, free = r.free_bytes,
                  persist = %r.persist, "pmem store opened");
            if r.corrupt > 0 {
                warn!(
                    corrupt = r.corrupt,
                    "chunks failed their checksum and read as EIO"
                );
            }
            let created = r.created;
            Ok((Arc::new(s), created))
        }
        "posix" => {
            let p = need_path()?;
            let s = chfs_store::PosixStore::open(&p, cfg.size).map_err(|e| failed(&p, e))?;
            let r = s.recovery();
            info!(path = %p.display(), created = r.created, records = r.records, corrupt = r.corrupt,
                  superseded = r.superseded, unreadable = r.unreadable, "posix store opened");
            if r.corrupt > 0 {
                warn!(
                    corrupt = r.corrupt,
                    "chunks failed their checksum and read as EIO"
                );
            }
            let created = r.created;
            Ok((Arc::new(s), created))
        }
        other => Err(ServerError::Config(format!(
            "unknown store {other:?} (available: mem, pmem, posix)"
        ))),
    }
}

fn open_cache(
    cfg: &Config,
    store: &dyn Store,
) -> Result<Option<Arc<crate::cache::Cache>>, ServerError> {
    let Some(b) = &cfg.backend else {
        return Ok(None);
    };
    let mut root = b.clone();
    if let Some(sub) = &cfg.subdir {
        let sub = sub.trim_matches('/');
        if sub.split('/').any(|c| c == "..") {
            return Err(ServerError::Config(format!(
                "--subdir {sub:?} must not contain '..'"
            )));
        }
        if !sub.is_empty() {
            root = root.join(sub);
        }
    }
    if cfg.chunk_size == 0 || cfg.chunk_size > chfs_proto::MAX_CHUNK_SIZE {
        return Err(ServerError::Config(format!(
            "--chunk-size {} out of range",
            cfg.chunk_size
        )));
    }
    let cc = crate::cache::CacheConfig {
        backend: root.clone(),
        policy: cfg.backend_policy,
        flush_idle_ms: cfg.flush_idle_msec,
        flush_threads: cfg.flush_threads,
        revalidate: cfg.revalidate,
        chunk_size: cfg.chunk_size,
    };
    let cache = crate::cache::Cache::open(cc)
        .map_err(|e| ServerError::Config(format!("backend directory {}: {e}", root.display())))?;
    let n = cache.rescan(store).map_err(|e| {
        ServerError::Config(format!("cannot rescan the store for dirty chunks: {e}"))
    })?;
    info!(backend = %root.display(), dirty = n, "cache mode");
    Ok(Some(Arc::new(cache)))
}

/// Binds, joins the pool and starts serving; returns once the server is
/// ready.
pub async fn start(cfg: Config) -> Result<RunningServer, ServerError> {
    let secret = cfg
        .load_secret()
        .map_err(|e| ServerError::Config(format!("cannot read secret: {e}")))?;
    let cred =
        Credential::parse(&secret).map_err(|e| ServerError::Config(format!("secret: {e}")))?;
    let keys = match &cred {
        Credential::Secret(s) => Some(Keys::from_secret(s)),
        Credential::ClientKey(_) => return Err(ServerError::Config(
            "the secret given (CHFS_SECRET_FILE) is a client key: a server needs the pool secret"
                .into(),
        )),
        Credential::None => {
            warn!("no secret (CHFS_SECRET_FILE): this server serves every process that can reach its port, local or remote, and lets any of them read, write, stop or join the pool");
            None
        }
    };
    let (store, fresh) = open_store(&cfg)?;
    let cache = open_cache(&cfg, &*store)?;
    let want = cfg.listen_addr();
    let listener = TcpListener::bind(&want)
        .await
        .map_err(|source| ServerError::Listen {
            addr: want.clone(),
            source,
        })?;
    let port = listener.local_addr()?.port();
    let host = want.rsplit_once(':').map_or(want.as_str(), |(h, _)| h);
    let me = format!("{host}:{port}");
    let (shutdown, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        store,
        placement: RwLock::new(Arc::new(Placement {
            ring: Ring::new(ServerList::default()),
            me: None,
        })),
        me: me.clone(),
        peers: Peers::new(cred, Duration::from_millis(cfg.rpc_timeout_msec.max(1))),
        counters: Counters::default(),
        join_lock: Default::default(),
        shutdown,
        cache,
        store_path: cfg.path.clone(),
        rebalancer: Default::default(),
        lanes: Default::default(),
        keys,
        local_users: cfg.local_users.clone(),
        limits: crate::limits::Limits::from_config(&cfg),
        peers_open: Default::default(),
        watchdogs: Default::default(),
    });
    if let Some(c) = &shared.cache {
        tokio::spawn(
            c.clone()
                .run_flusher(shared.store.clone(), shared.shutdown.subscribe()),
        );
    }
    let local = bind_local(&me);
    let task = tokio::spawn(accept_loop(shared.clone(), listener, local));
    match &cfg.join {
        None => shared.set_list(ServerList {
            version: 1,
            hashing: cfg.hashing,
            servers: vec![me.clone()],
            since: Vec::new(),
        }),
        Some(seed) => {
            let seed = crate::config::with_default_port(seed);
            match shared
                .peers
                .call(
                    &seed,
                    &Request::Join {
                        addr: me.clone(),
                        fresh,
                    },
                    0,
                )
                .await
            {
                Ok(Response::Servers(list)) => shared.set_list(list),
                Ok(other) => {
                    return Err(ServerError::Join {
                        seed,
                        reply: ErrorReply::new(
                            libc::EPROTO,
                            format!("unexpected answer {other:?}"),
                        ),
                    })
                }
                Err(reply) => return Err(ServerError::Join { seed, reply }),
            }
        }
    }
    let p = shared.placement();
    info!(addr = %me, servers = p.ring.len(), version = p.ring.list().version, store = shared.store.name(), "chfsd serving");
    Ok(RunningServer {
        addr: me,
        shared,
        task,
    })
}

/// The abstract Unix socket for clients on this host
/// ([`chfs_proto::local_socket_name`]); None (TCP only) if it cannot be
/// bound, e.g. another server advertises the same address in this network
/// namespace.
fn bind_local(me: &str) -> Option<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = chfs_proto::local_socket_name(me);
    let r = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            UnixListener::from_std(l)
        });
    match r {
        Ok(l) => Some(l),
        Err(e) => {
            warn!(%name, "no local socket, clients on this host use TCP: {e}");
            None
        }
    }
}

async fn unix_accept(l: Option<&UnixListener>) -> std::io::Result<UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, local: Option<UnixListener>) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let sh = shared.clone();
                    tokio::spawn(async move { serve_tcp(sh, stream, peer.to_string()).await });
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            r = unix_accept(local.as_ref()) => match r {
                Ok(stream) => {
                    let sh = shared.clone();
                    tokio::spawn(async move { serve_unix(sh, stream).await });
                }
                Err(e) => {
                    warn!("accept on the local socket failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
    info!(addr = %shared.me, "chfsd stopped listening");
    // A server that stops leaves its (persistent) store durable.
    let st = shared.store.clone();
    match tokio::task::spawn_blocking(move || st.sync()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!("syncing the store at shutdown failed: {e}"),
        Err(e) => warn!("syncing the store at shutdown failed: {e}"),
    }
}

/// One outgoing response: header, head bytes, a data tail, and the
/// request's share of the connection's budget (given back once sent).
type Out = (Header, Vec<u8>, Bytes, Option<crate::limits::Permits>);

fn response_frame(id: u64, op: u16, r: Result<Response, ErrorReply>) -> Out {
    let mut head = Vec::with_capacity(80);
    let (flags, tail) = match r {
        Ok(Response::Data(d)) => {
            Response::Data(Bytes::new()).encode(&mut head);
            (0, d)
        }
        Ok(resp) => {
            resp.encode(&mut head);
            (0, Bytes::new())
        }
        Err(e) => {
            encode_error(&mut head, &e);
            (FLAG_ERROR, Bytes::new())
        }
    };
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
    let mut out = response_frame(id, op, r);
    out.3 = Some(permits);
    out
}

/// Data tails at least this large are not copied into the reply buffer.
const BIG_TAIL: usize = 16 << 10;

/// Writes `a` then `b` with vectored writes until both are sent.
async fn write_all_vectored(
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

/// The handshake of a new connection: what it may do ([`Access`]), or
/// None if refused (`refuse`: refused whatever it says).
async fn admitted<S>(
    shared: &Shared,
    stream: &mut S,
    peer: &str,
    refuse: Option<ErrorReply>,
) -> Option<Access>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match net::timeout(
        Duration::from_secs(10),
        net::accept_handshake(stream, shared.keys.as_ref(), refuse),
    )
    .await
    {
        Ok(role) => {
            debug!(%peer, ?role, "connection accepted");
            Some(Access(role))
        }
        Err(e) => {
            Counters::inc(&shared.counters.refused);
            warn!(%peer, "connection refused: {e}");
            None
        }
    }
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
            op::JOIN | op::UPDATE_SERVERS | op::ADOPT_CHUNK | op::PUT_CHUNK => {
                "servers of the pool"
            }
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

async fn serve_tcp(shared: Arc<Shared>, mut stream: TcpStream, peer: String) {
    use std::os::fd::AsRawFd;
    let _ = stream.set_nodelay(true);
    crate::limits::keepalive(stream.as_raw_fd());
    let host = stream
        .peer_addr()
        .map_or_else(|_| peer.clone(), |a| a.ip().to_string());
    let (guard, refuse) = enter_peer(&shared, host);
    if let Some(access) = admitted(&shared, &mut stream, &peer, refuse).await {
        let fd = dup_fd(&stream);
        let (rd, wr) = stream.into_split();
        serve_conn(shared, rd, wr, peer, None, None, access, fd).await;
    }
    drop(guard);
}

/// A duplicate of a socket's descriptor (None if the process is out of
/// them: the connection then has no idle watchdog).
pub(crate) fn dup_fd(s: &impl std::os::fd::AsFd) -> Option<std::os::fd::OwnedFd> {
    s.as_fd().try_clone_to_owned().ok()
}

/// Counts a connection of client host or local user `key`; past
/// `--max-conns-per-peer`, the refusal its handshake gets.
fn enter_peer(
    shared: &Shared,
    key: String,
) -> (Option<crate::limits::PeerGuard>, Option<ErrorReply>) {
    let max = shared.limits.max_conns_per_peer;
    match shared.peers_open.enter(key.clone(), max) {
        Some(g) => (Some(g), None),
        None => {
            Counters::inc(&shared.counters.over_limit);
            (
                None,
                Some(ErrorReply::new(
                    libc::EAGAIN,
                    format!("{key} has {max} connections to this server already (chfsd --max-conns-per-peer)"),
                )),
            )
        }
    }
}

/// Send buffer of local connections: read replies carry whole chunks, and
/// a Unix stream queues at most the sender's buffer (208 KiB by default;
/// the kernel caps the request at `net.core.wmem_max`).
const UNIX_SEND_BUFFER: libc::c_int = 4 << 20;

/// A local connection: after the handshake, on the CPU lane its first
/// request asks for ([`crate::lanes`]), else on the shared runtime.
async fn serve_unix(shared: Arc<Shared>, mut stream: UnixStream) {
    use std::os::fd::AsRawFd;
    let v = UNIX_SEND_BUFFER;
    let len = std::mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: setsockopt on the socket this task owns, reading a c_int from
    // a live local; failure leaves the default buffer.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            len,
        )
    };
    let (peer, cma, uid) = match stream.peer_cred() {
        Ok(c) => (
            format!("local pid {} uid {}", c.pid().unwrap_or(0), c.uid()),
            crate::cma::peer_pid(&c),
            Some(c.uid()),
        ),
        Err(_) => ("local".to_string(), None, None),
    };
    let (guard, over) = enter_peer(&shared, format!("local user {}", uid.unwrap_or(u32::MAX)));
    let refuse = match uid {
        _ if over.is_some() => over,
        Some(u) if shared.local_users.allows(u) => None,
        Some(u) => Some(ErrorReply::new(
            libc::EACCES,
            format!("user {u} may not use this server's local socket (chfsd --local-users)"),
        )),
        None => Some(ErrorReply::new(
            libc::EACCES,
            "the local peer's credentials are unknown",
        )),
    };
    let Some(access) = admitted(&shared, &mut stream, &peer, refuse).await else {
        return;
    };
    // Counted while the connection lives (a lane's included).
    let peer_guard = guard;
    // The first request may ask for a CPU lane (read on its own: nothing
    // after it is buffered here).
    let (h, payload) = match net::read_frame(&mut stream).await {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(e) => {
            warn!(%peer, "closing connection: {e}");
            return;
        }
    };
    if h.op != op::LANE || h.flags != 0 {
        serve_local(shared, stream, peer, cma, Some((h, payload)), access).await;
        drop(peer_guard);
        return;
    }
    let n = crate::lanes::cpus();
    let lane = match Request::decode(op::LANE, payload) {
        // Started before the answer, so an accepted lane is there.
        Ok(Request::Lane { cpu }) if cpu < n => shared.lanes.get(&shared, cpu).map_err(|e| {
            ErrorReply::new(
                e.raw_os_error().unwrap_or(libc::EAGAIN),
                format!("cannot start the lane of CPU {cpu}: {e}"),
            )
        }),
        Ok(_) => Err(ErrorReply::new(
            libc::EINVAL,
            format!("no CPU lane here for that CPU (CPUs 0-{})", n - 1),
        )),
        Err(e) => Err(ErrorReply::new(
            e.errno(),
            format!("malformed request: {e}"),
        )),
    };
    let reply = match &lane {
        Ok(_) => Ok(Response::Ok),
        Err(e) => Err(e.clone()),
    };
    // Neither answer carries a data tail.
    let (rh, head, _, _) = response_frame(h.id, h.op, reply);
    if let Err(e) = write_all_vectored(&mut stream, &rh.encode(), &head).await {
        warn!(%peer, "closing connection: {e}");
        return;
    }
    let Ok(lane) = lane else {
        // Refused: the connection goes on without a lane.
        serve_local(shared, stream, peer, cma, None, access).await;
        drop(peer_guard);
        return;
    };
    let handed = stream.into_std().and_then(|stream| {
        lane.hand_over(crate::lanes::Incoming {
            stream,
            peer: peer.clone(),
            cma,
            access,
            _peer_guard: peer_guard,
        })
    });
    if let Err(e) = handed {
        warn!(%peer, "closing connection: {e}");
    }
}

/// Serves a local connection on the shared runtime.
async fn serve_local(
    shared: Arc<Shared>,
    stream: UnixStream,
    peer: String,
    cma: Option<libc::pid_t>,
    first: Option<(Header, Bytes)>,
    access: Access,
) {
    let fd = dup_fd(&stream);
    match crate::local_io::split(stream) {
        Ok((rd, wr)) => serve_conn(shared, rd, wr, peer, cma, first, access, fd).await,
        Err(e) => warn!(%peer, "closing connection: {e}"),
    }
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
    let mut rd = tokio::io::BufReader::with_capacity(256 << 10, rd);
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    let writer = tokio::spawn(async move {
        // Small replies are gathered while more are queued; a large data
        // tail is written from where it lies, with what is gathered, in
        // one vectored write (no copy into the buffer).
        let mut wr = wr;
        let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
        // Budget shares of replies gathered in `buf`, given back once it
        // is written.
        let mut held: Vec<crate::limits::Permits> = Vec::new();
        while let Some((h, head, tail, permits)) = rx.recv().await {
            held.extend(permits);
            buf.extend_from_slice(&h.encode());
            buf.extend_from_slice(&head);
            let r = if tail.len() >= BIG_TAIL {
                let r = write_all_vectored(&mut wr, &buf, &tail).await;
                buf.clear();
                held.clear();
                r
            } else {
                buf.extend_from_slice(&tail);
                if rx.is_empty() || buf.len() >= 256 << 10 {
                    let r = wr.write_all(&buf).await;
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
    });
    let mut first = first;
    let mut window: Option<Arc<crate::shm::Window>> = None;
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
            None => net::read_frame(&mut rd).await,
        };
        if let Some(w) = &watchdog {
            w.touch();
        }
        if let Ok(Some((h, _))) = &frame {
            if let Some(e) = access.refusal(h.op, h.flags & FLAG_FORWARDED != 0) {
                Counters::inc(&shared.counters.denied);
                warn!(%peer, op = h.op, "{}", e.message);
                let _ = tx.send(response_frame(h.id, h.op, Err(e)));
                continue;
            }
        }
        match frame {
            Ok(Some((h, payload))) if h.flags & FLAG_CMA != 0 => {
                let permits = budget
                    .admit(crate::limits::cost(&h, &payload, None), &shared.counters)
                    .await;
                let (sh, tx, w) = (shared.clone(), tx.clone(), window.clone());
                tokio::spawn(async move {
                    let r = crate::cma::serve(&sh, cma, w.as_deref(), h, payload).await;
                    let _ = tx.send(response_with(h.id, h.op, r, permits));
                });
            }
            // Answered here, in order: the connection's later writes see
            // the window.
            Ok(Some((h, payload))) if h.op == op::SHM_ATTACH && h.flags == 0 => {
                let r = attach_window(cma, window.is_some(), payload).map(|w| {
                    window = Some(Arc::new(w));
                    Response::Ok
                });
                if let Err(e) = &r {
                    debug!(%peer, "shared memory refused: {}", e.message);
                }
                let _ = tx.send(response_frame(h.id, h.op, r));
            }
            Ok(Some((h, payload))) => match Request::decode(h.op, payload.clone()) {
                Ok(req) => {
                    let permits = budget
                        .admit(
                            crate::limits::cost(&h, &payload, Some(&req)),
                            &shared.counters,
                        )
                        .await;
                    drop(payload);
                    let (sh, tx) = (shared.clone(), tx.clone());
                    tokio::spawn(async move {
                        let forwarded = h.flags & FLAG_FORWARDED != 0;
                        let r = crate::handler::handle(&sh, req, forwarded).await;
                        let _ = tx.send(response_with(h.id, h.op, r, permits));
                    });
                }
                Err(e) => {
                    warn!(%peer, op = h.op, "malformed request, closing connection: {e}");
                    let _ = tx.send(response_frame(
                        h.id,
                        h.op,
                        Err(ErrorReply::new(
                            e.errno(),
                            format!("malformed request: {e}"),
                        )),
                    ));
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
    debug!(%peer, "connection closed");
}

/// Maps the window a [`Request::ShmAttach`] names, for a peer allowed
/// cross-memory attach (`pid`), once per connection.
fn attach_window(
    pid: Option<libc::pid_t>,
    attached: bool,
    payload: Bytes,
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
        Ok(Request::ShmAttach { fd, base, len }) => crate::shm::Window::attach(pid, fd, base, len),
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

/// Runs a server until SIGINT/SIGTERM or a `Shutdown` request (the `chfsd`
/// binary).
pub fn run(cfg: Config) -> Result<(), ServerError> {
    run_with_ready(cfg, |_| {})
}

/// Like [`run`], calling `ready` with the server's address once it serves
/// (after the pid and server-info files are written).
pub fn run_with_ready(cfg: Config, ready: impl FnOnce(&str)) -> Result<(), ServerError> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if cfg.threads > 0 {
        b.worker_threads(cfg.threads);
    }
    let rt = b.enable_all().thread_name("chfsd").build()?;
    rt.block_on(async move {
        let mut srv = start(cfg.clone()).await?;
        if let Some(p) = &cfg.pid_file {
            std::fs::write(p, format!("{}\n", std::process::id()))?;
        }
        if let Some(f) = &cfg.info_file {
            let tmp = f.with_extension("tmp");
            std::fs::write(&tmp, format!("{}\n", srv.addr))?;
            std::fs::rename(&tmp, f)?;
        }
        ready(&srv.addr);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { info!("SIGINT: stopping"); }
            _ = term.recv() => { info!("SIGTERM: stopping"); }
            _ = srv.wait() => {}
        }
        if let Some(c) = srv.shared.cache.clone() {
            // Last chance to write back what is still dirty.
            c.force("/");
            for _ in 0..600 {
                let s = c.state("/");
                if s.chunks == 0 || (s.failing == s.chunks && s.failing > 0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let s = c.state("/");
            if s.chunks > 0 {
                tracing::error!(
                    chunks = s.chunks,
                    bytes = s.bytes,
                    "stopping with dirty data not written to the backend: {}",
                    s.last_error
                );
            }
        }
        let _ = srv.shared.shutdown.send(true);
        if let Some(p) = &cfg.pid_file {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    })
}
