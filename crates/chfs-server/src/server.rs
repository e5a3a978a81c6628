//! Starting and running a server: the store (and cache mode) it opens,
//! binding, joining the pool, and the handle of a server running in this
//! process. The top layer: it builds the [`Shared`] state and hands it to
//! the listener.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use chfs_proto::handshake::{Credential, Keys};
use chfs_proto::ring::{Ring, ServerList};
use chfs_proto::{ErrorReply, Request, Response};
use chfs_store::{MemStore, Store};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{Config, StoreKind};
use crate::listener::{accept_loop, bind_local};
use crate::metrics::Counters;
use crate::peer::Peers;
use crate::state::{Placement, Shared};

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
    match cfg.store {
        StoreKind::Mem => Ok((Arc::new(MemStore::new(cfg.size)), true)),
        StoreKind::Pmem => {
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
        StoreKind::Posix => {
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
    let node_local = match cfg.node_local_prefix.trim() {
        "" => None,
        p => match chfs_proto::path::normalize(p) {
            Ok(n) if n != "/" => Some(n),
            Ok(_) => {
                return Err(ServerError::Config(
                    "--node-local-prefix /: the node-local area cannot be the whole namespace"
                        .into(),
                ))
            }
            Err(e) => {
                return Err(ServerError::Config(format!(
                    "--node-local-prefix {p}: {}",
                    e.message
                )))
            }
        },
    };
    let mut unknown_ops = Vec::new();
    for name in &cfg.unknown_ops {
        match chfs_proto::msg::op::ALL
            .iter()
            .find(|&&o| chfs_proto::msg::op::name(o) == Some(name.as_str()))
        {
            Some(&o) => unknown_ops.push(o),
            None => {
                return Err(ServerError::Config(format!(
                    "--unknown-op {name}: no such opcode"
                )))
            }
        }
    }
    let (store, fresh) = open_store(&cfg)?;
    let cache = open_cache(&cfg, &*store)?;
    // `--host ofi+tcp://IP:PORT` (a fabric server's own address, as a
    // restart on the same address gives it): the endpoint binds that, the
    // TCP listener a free port of the IP.
    let (want, fabric_at) = match cfg.host.as_deref().map(str::parse::<chfs_fabric::Address>) {
        Some(Ok(a)) => {
            let sa = a.socket_addr().ok_or_else(|| {
                ServerError::Config(format!("--host {a}: not an IP address and port"))
            })?;
            if cfg.protocol.0.is_some_and(|p| p != a.protocol) {
                return Err(ServerError::Config(format!(
                    "--host {a} is not an address of --protocol {}",
                    cfg.protocol.0.map_or("tcp", |p| p.name())
                )));
            }
            let ip = match sa.ip() {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            (format!("{ip}:0"), Some((a.protocol, sa.port())))
        }
        _ => (cfg.listen_addr(), None),
    };
    let listener = TcpListener::bind(&want)
        .await
        .map_err(|source| ServerError::Listen {
            addr: want.clone(),
            source,
        })?;
    let port = listener.local_addr()?.port();
    let host = want.rsplit_once(':').map_or(want.as_str(), |(h, _)| h);
    // A fabric server is known in the pool by its endpoint's address
    // (`ofi+tcp://IP:PORT`): clients given it use the fabric. The TCP
    // listener stays (chfsctl, clients without the fabric).
    let protocol = fabric_at.map(|(p, _)| p).or(cfg.protocol.0);
    let fabric_port = fabric_at.map(|(_, port)| port);
    let fabric = match protocol {
        None => None,
        Some(p) => Some(Arc::new(
            crate::fabric_ep::open(p, host.trim_matches(['[', ']']), fabric_port, cfg.poll)
                .map_err(|e| ServerError::Config(format!("--protocol {p}: {e}")))?,
        )),
    };
    let me = match &fabric {
        Some(ep) => ep.address().to_string(),
        None => format!("{host}:{port}"),
    };
    let (shutdown, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        store,
        placement: RwLock::new(Arc::new(Placement {
            ring: Ring::new(ServerList::default()),
            me: None,
        })),
        me: me.clone(),
        peers: Peers::new(cred, Duration::from_millis(cfg.rpc_timeout_msec.max(1))).fabric(
            cfg.test_peers_remote,
            usize::try_from(cfg.rdma_thresh).unwrap_or(usize::MAX),
        ),
        contact: crate::relay::Contact::new(Duration::from_millis(cfg.lookup_cache_msec)),
        node_local,
        watchers: Default::default(),
        counters: Counters::default(),
        join_lock: Default::default(),
        shutdown,
        cache,
        store_kind: cfg.store,
        store_path: cfg.path.clone(),
        rebalancer: Default::default(),
        keys,
        local_users: cfg.local_users.clone(),
        limits: crate::limits::Limits::from_config(&cfg),
        unknown_ops,
        drop_landings: cfg.test_drop_landings.into(),
        peers_open: Default::default(),
        watchdogs: Default::default(),
    });
    if !fresh {
        // The node-local area is temporary: what a killed or crashed
        // server of a persistent store left there is discarded.
        crate::handler::discard_node_local(&shared);
    }
    if let Some(c) = &shared.cache {
        tokio::spawn(
            c.clone()
                .run_flusher(shared.store.clone(), shared.shutdown.subscribe()),
        );
    }
    tokio::spawn(crate::heap::trim_when_idle(shared.clone()));
    let local = bind_local(&me);
    if let Some(ep) = fabric {
        crate::fabric::start(shared.clone(), ep, tokio::runtime::Handle::current());
    }
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
    // Workers poll the runtime's epoll instance before they sleep
    // (`--poll-usec`): it is the one the runtime's construction creates.
    let park = std::sync::Arc::new(crate::park::ParkPoll::new(cfg.poll));
    let (p1, p2) = (park.clone(), park.clone());
    b.on_thread_park(move || p1.before_park())
        .on_thread_unpark(move || p2.after_unpark());
    let before = chfs_sys::poll::epoll_fds().unwrap_or_default();
    let rt = b.enable_all().thread_name("chfsd").build()?;
    let created: Vec<_> = chfs_sys::poll::epoll_fds()
        .unwrap_or_default()
        .into_iter()
        .filter(|fd| !before.contains(fd))
        .collect();
    match created[..] {
        [fd] if !cfg.poll.is_zero() => park.set_epoll_fd(fd),
        _ if !cfg.poll.is_zero() => {
            tracing::warn!("--poll-usec: the runtime's epoll instance not found; not polling")
        }
        _ => {}
    }
    let pid_file = cfg.pid_file.clone();
    let r = rt.block_on(async move {
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
        Ok(())
    });
    // Not waiting for blocking calls still running: a fabric send to a
    // peer that is gone (the answer to a hello of a client that exited
    // meanwhile) waits out its 10 s; the process would outlive its closed
    // port by that long, when `chfsctl stop` reports it gone.
    rt.shutdown_timeout(EXIT_GRACE);
    // The PID file goes last: `chfsctl stop` waits for the process it
    // names and takes a missing file for a server already gone, so
    // removing it before the runtime's grace let stop return while this
    // process still ran (seen in CI).
    if let Some(p) = &pid_file {
        let _ = std::fs::remove_file(p);
    }
    r
}

/// How long an exiting server waits for its blocking calls.
const EXIT_GRACE: Duration = Duration::from_secs(1);
