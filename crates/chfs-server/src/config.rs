//! `chfsd` configuration: one definition feeding flags, environment
//! variables and defaults.

use std::path::PathBuf;

use chfs_proto::ring::Hashing;
use clap::Parser;

/// chfsd — a chfs-rs server: stores the chunks it owns and serves clients.
#[derive(Debug, Clone, Parser)]
#[command(name = "chfsd", version, disable_help_flag = true)]
pub struct Config {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,

    /// Address to listen on and advertise, HOST[:PORT]. Port 0 picks a free
    /// port. Default: this host's name, port 50000. A fabric address
    /// (`ofi+tcp://IP:PORT`, what a fabric server advertises) binds the
    /// endpoint there and the TCP listener to a free port of the IP.
    #[arg(short = 'h', long = "host", env = "CHFS_SERVER_HOST")]
    pub host: Option<String>,

    /// Transport for clients, as CHFS's `-p`: `tcp` (ours, the default) or
    /// a libfabric one (`ofi+tcp`, `ofi+verbs`, `ofi+cxi`, `ofi+shm`,
    /// `ofi+efa`, `ofi+psm3`, `ofi+sockets`). A fabric server opens an
    /// endpoint on the --host address (any free port) beside its TCP
    /// listener and advertises the endpoint's address
    /// (`ofi+tcp://IP:PORT`) as its name in the pool: clients given it
    /// use the fabric.
    #[arg(short = 'p', long = "protocol", env = "CHFS_PROTOCOL", default_value = "tcp", value_parser = parse_protocol)]
    pub protocol: Transport,

    /// Address of any running server of the pool to join (HOST:PORT). Without
    /// it this server starts a new pool.
    #[arg(short = 'j', long = "join", env = "CHFS_JOIN")]
    pub join: Option<String>,

    /// File holding the shared secret clients and servers must present.
    #[arg(long = "secret-file", env = "CHFS_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,

    /// Shared secret (prefer --secret-file: the environment of a process can
    /// be read by its owner).
    #[arg(long = "secret", env = "CHFS_SECRET", hide_env_values = true)]
    pub secret: Option<String>,

    /// Users whose processes may connect through the local (Unix) socket:
    /// `owner` (this server's user and root), `any`, or a comma-separated
    /// list of uids (besides the owner and root), for pools shared by
    /// several users.
    #[arg(long = "local-users", env = "CHFS_LOCAL_USERS", default_value = "owner", value_parser = parse_users)]
    pub local_users: LocalUsers,

    /// Placement of chunks on servers: modular or consistent. Only the first
    /// server's choice counts; joining servers adopt the pool's.
    #[arg(long, default_value = "modular")]
    pub hashing: Hashing,

    /// Storage engine: mem (DRAM), pmem (a memory-mapped persistent region:
    /// DAX device, file on a DAX mount, or any file; needs --path, and
    /// --size when it is created) or posix (one file per chunk under the
    /// directory --path). pmem and posix survive restarts.
    #[arg(long, env = "CHFS_STORE", default_value = "mem")]
    pub store: StoreKind,

    /// Where a persistent store lives: for pmem a file or device (a
    /// directory gets `chfs.pmem` inside), for posix a directory.
    #[arg(long = "path", env = "CHFS_STORE_PATH")]
    pub path: Option<PathBuf>,

    /// Store capacity in bytes (suffixes K, M, G, T); 0 = no limit but memory.
    #[arg(short = 's', long = "size", default_value = "0", value_parser = parse_size)]
    pub size: u64,

    /// Worker threads of the server runtime (0 = number of CPUs).
    #[arg(short = 'T', long = "threads", default_value_t = 0)]
    pub threads: usize,

    /// Longest time in microseconds a server thread with nothing to do
    /// polls for the next request before it sleeps (bounded adaptive
    /// polling, yielding the CPU to anything else that wants it: the
    /// window halves to nothing while the server is idle and doubles back
    /// while requests come soon after it slept; never on CPU lanes); with
    /// `-p ofi+*`, how long after a completion the fabric progress thread
    /// reads its queue without sleeping: auto = 100 where the server may
    /// use two or more CPUs, else 0; 0 = never.
    #[arg(long = "poll-usec", env = "CHFSD_POLL_USEC", default_value = "auto", value_parser = parse_poll)]
    pub poll: std::time::Duration,

    /// Keep the server's heap (the DRAM store's chunk data, request and
    /// reply buffers) on transparent huge pages where the kernel gives
    /// them to processes that ask (`madvise` in
    /// /sys/kernel/mm/transparent_hugepage/enabled; with `always` every
    /// heap gets them anyway): on = chfsd starts itself again with
    /// `glibc.malloc.hugetlb=1` added to GLIBC_TUNABLES (glibc reads its
    /// tunables only at start; 2.35 or later), until glibc took it (2.35
    /// and 2.36 take it only in some starts), unless GLIBC_TUNABLES sets
    /// it otherwise (not under valgrind, which follows no exec by
    /// default); off = 4 KiB pages. Filling fresh memory costs a page
    /// fault per 2 MiB instead of per 4 KiB (2-3x faster on the
    /// development VM), but IO500 writes were slower with it there, hence
    /// off by default.
    #[arg(long = "huge-pages", env = "CHFSD_HUGE_PAGES", default_value = "off", value_name = "on|off", action = clap::ArgAction::Set, value_parser = parse_on_off)]
    pub huge_pages: bool,

    /// Requests of one connection in the server at once (being served, or
    /// answered but not yet sent because the client does not read): a
    /// connection with this many is not read until one is sent
    /// (back-pressure).
    #[arg(long = "max-inflight", env = "CHFS_MAX_INFLIGHT", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_inflight: u32,

    /// Over a fabric transport (`-p ofi+*`): chunk data of at least this
    /// many bytes that this server forwards to a peer on another host (a
    /// client's write or read of a chunk it does not own, a rebalance's or
    /// a rename's moved chunk) moves by RMA, the peer reading it from (or
    /// writing it into) memory this server registered for the call,
    /// instead of in the message; as a client's CHFS_RDMA_THRESH. Data too
    /// large for a message moves by RMA whatever this is.
    #[arg(long = "rdma-thresh", env = "CHFS_RDMA_THRESH", default_value_t = 32 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub rdma_thresh: u64,

    /// Tests only: reach every peer known by a fabric address over the
    /// fabric, as if it ran on another host (not through its local socket).
    #[arg(long = "test-peers-remote", hide = true)]
    pub test_peers_remote: bool,

    /// Bytes one connection may hold in the server at once: the data of
    /// its requests being served and of their replies not yet sent
    /// (suffixes K, M, G); beyond, its requests wait (back-pressure). A
    /// single larger request is served alone.
    #[arg(long = "conn-memory", env = "CHFS_CONN_MEMORY", default_value = "256M", value_parser = parse_size)]
    pub conn_memory: u64,

    /// Connections at once from one client host (TCP: its address) or, on
    /// the local socket, one user; more are refused (EAGAIN). 0 = no limit.
    #[arg(
        long = "max-conns-per-peer",
        env = "CHFS_MAX_CONNS_PER_PEER",
        default_value_t = 4096
    )]
    pub max_conns_per_peer: u32,

    /// A connection with no request for this many seconds is closed
    /// (clients reconnect at their next request), and one that stops half
    /// way through a request for as long is abandoned; TCP connections
    /// whose peer vanished are found by keepalive probes within about
    /// 90 s. 0 = never.
    #[arg(
        long = "idle-timeout",
        env = "CHFS_IDLE_TIMEOUT",
        default_value_t = 3600
    )]
    pub idle_timeout: u64,

    /// Timeout of server-to-server requests, in milliseconds.
    #[arg(
        short = 't',
        long = "rpc-timeout-msec",
        env = "CHFS_RPC_TIMEOUT_MSEC",
        default_value_t = 30_000
    )]
    pub rpc_timeout_msec: u64,

    /// As a contact server of relayed lookups (clients with
    /// CHFS_LOOKUP_LOCAL or CHFS_LOOKUP_RELAY_GROUP): the longest time in
    /// milliseconds an answer fetched from an entry's owner is kept and
    /// given to later lookups of that path (each client asks for at most
    /// its own CHFS_LOOKUP_CACHE_MSEC). 0 = no cache: every relayed lookup
    /// goes to the owner, identical ones in flight at once still sharing
    /// one request.
    #[arg(
        long = "lookup-cache-msec",
        env = "CHFSD_LOOKUP_CACHE_MSEC",
        default_value_t = 1000
    )]
    pub lookup_cache_msec: u64,

    /// The node-local area: entries under this path are kept by a server
    /// on the node of the client that creates them and are visible on
    /// that node only (clients send them to their local server, which
    /// never forwards them, moves them to another server or writes them
    /// to the backend); every server has its own, emptied when it is
    /// asked to stop. Clients must use the same prefix
    /// (CHFS_NODE_LOCAL_PREFIX). Empty: no node-local area.
    #[arg(
        long = "node-local-prefix",
        env = "CHFS_NODE_LOCAL_PREFIX",
        default_value = chfs_proto::path::NODE_LOCAL_PREFIX
    )]
    pub node_local_prefix: String,

    /// For compatibility tests: answer these requests (opcode names, as
    /// `LIST_TREE`) as a server that does not know them does (EPROTO, the
    /// connection closed).
    #[arg(long = "unknown-op", hide = true)]
    pub unknown_ops: Vec<String>,

    /// Tests only: close the connection instead of serving each of the
    /// first N reads into a client's landing area (`FLAG_LAND`): a
    /// connection that drops while such a read waits.
    #[arg(long = "test-drop-landings", hide = true, default_value_t = 0)]
    pub test_drop_landings: u32,

    /// Write the server's address to this file once it serves.
    #[arg(short = 'S', long = "server-info-file")]
    pub info_file: Option<PathBuf>,

    /// Write the server's process id to this file.
    #[arg(short = 'P', long = "pid-file")]
    pub pid_file: Option<PathBuf>,

    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long = "log-level", env = "CHFS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log file (default: standard error). Plain text; colours only when
    /// standard error is a terminal.
    #[arg(short = 'l', long = "log-file")]
    pub log_file: Option<PathBuf>,

    /// Detach once serving: the foreground process prints the server's
    /// address on standard output and exits 0 when the server is ready (or
    /// prints the error and exits 1); the server runs on in the background
    /// with standard streams on /dev/null (logs go to --log-file).
    #[arg(long = "daemon")]
    pub daemon: bool,

    /// Backend directory (cache mode): the pool caches this directory's
    /// namespace, reads missing files through from it, and writes new and
    /// modified files back to it.
    #[arg(short = 'b', long = "backend", env = "CHFS_BACKEND_PATH")]
    pub backend: Option<PathBuf>,

    /// Subdirectory of the backend to cache (relative to --backend).
    #[arg(long = "subdir", env = "CHFS_SUBDIR_PATH")]
    pub subdir: Option<String>,

    /// What namespace changes do to the backend: mirror (unlink, rmdir and
    /// rename reach the backend too) or keep (only new and modified files
    /// are written; removals hide the backend copy, renaming a backend entry
    /// gives EXDEV).
    #[arg(long = "backend-policy", default_value = "mirror")]
    pub backend_policy: crate::cache::Policy,

    /// Flush dirty data after this many ms without client requests; a
    /// negative value flushes at once.
    #[arg(
        long = "flush-idle-msec",
        env = "CHFS_FLUSH_IDLE_MSEC",
        default_value_t = 1000,
        allow_hyphen_values = true
    )]
    pub flush_idle_msec: i64,

    /// Chunks flushed to the backend concurrently.
    #[arg(
        short = 'F',
        long = "flush-threads",
        env = "CHFS_FLUSH_THREADS",
        default_value_t = 2
    )]
    pub flush_threads: usize,

    /// On lookup, compare a clean cached file's backend mtime and size and
    /// drop the cached copy if the backend changed.
    #[arg(long = "revalidate", env = "CHFS_REVALIDATE")]
    pub revalidate: bool,

    /// Chunk size of files imported from the backend.
    #[arg(long = "chunk-size", env = "CHFS_CHUNK_SIZE", default_value_t = chfs_proto::DEFAULT_CHUNK_SIZE)]
    pub chunk_size: u32,
}

impl Config {
    /// Configuration for an in-process server on loopback (tests).
    pub fn loopback() -> Self {
        Self::parse_from(["chfsd", "--host", "127.0.0.1:0"])
    }

    /// The shared secret, if any (file first, then the variable).
    pub fn load_secret(&self) -> std::io::Result<Vec<u8>> {
        if let Some(f) = &self.secret_file {
            let s = std::fs::read(f)?;
            return Ok(trim(&s).to_vec());
        }
        Ok(self
            .secret
            .as_deref()
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_default())
    }

    /// The address to bind and advertise.
    pub fn listen_addr(&self) -> String {
        let host = match &self.host {
            Some(h) => h.clone(),
            None => hostname(),
        };
        with_default_port(&host)
    }
}

/// The transport of `--protocol`: our TCP (None) or a fabric protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport(pub Option<chfs_fabric::Protocol>);

fn parse_protocol(s: &str) -> Result<Transport, String> {
    match s {
        "tcp" => Ok(Transport(None)),
        p => p
            .parse()
            .map(|p| Transport(Some(p)))
            .map_err(|e| format!("{e} (or tcp)")),
    }
}

/// Appends the default port when `host` has none.
pub fn with_default_port(host: &str) -> String {
    // A fabric address (`ofi+tcp://IP:PORT`) is whole as it is.
    if host.starts_with("ofi+") {
        return host.to_string();
    }
    let bare_v6 = host.matches(':').count() > 1 && !host.starts_with('[');
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !bare_v6
    {
        host.to_string()
    } else {
        format!("{host}:{}", chfs_proto::DEFAULT_PORT)
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &s[..end]
}

/// This host's name.
pub fn hostname() -> String {
    chfs_sys::hostname().unwrap_or_else(|_| "localhost".into())
}

/// A storage engine ([`Config::store`]), parsed once from `--store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `mem`: DRAM ([`chfs_store::MemStore`]).
    Mem,
    /// `pmem`: a memory-mapped persistent region
    /// ([`chfs_store::PmemStore`]).
    Pmem,
    /// `posix`: one file per chunk under a directory
    /// ([`chfs_store::PosixStore`]).
    Posix,
}

impl StoreKind {
    /// Every engine, in the order `--help` and errors name them.
    pub const ALL: [StoreKind; 3] = [StoreKind::Mem, StoreKind::Pmem, StoreKind::Posix];

    /// The name `--store` takes (and the engine reports in status).
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Mem => "mem",
            StoreKind::Pmem => "pmem",
            StoreKind::Posix => "posix",
        }
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for StoreKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        StoreKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = StoreKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown store {s:?} (available: {})", names.join(", "))
            })
    }
}

/// Who may connect through the local socket ([`Config::local_users`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalUsers {
    /// Anyone.
    Any,
    /// The server's user, root, and these uids.
    Owner(Vec<u32>),
}

impl LocalUsers {
    /// May a process of `uid` connect?
    pub fn allows(&self, uid: u32) -> bool {
        // SAFETY: getuid cannot fail and touches no memory.
        let me = unsafe { libc::getuid() };
        match self {
            LocalUsers::Any => true,
            LocalUsers::Owner(more) => uid == me || uid == 0 || more.contains(&uid),
        }
    }
}

fn parse_users(s: &str) -> Result<LocalUsers, String> {
    match s {
        "any" => Ok(LocalUsers::Any),
        "owner" | "" => Ok(LocalUsers::Owner(Vec::new())),
        list => list
            .split(',')
            .map(|u| {
                u.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{u:?} is not a uid (owner, any, or uids)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(LocalUsers::Owner),
    }
}

/// Parses a size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?} (a number with optional K, M, G or T)"))
}

/// `on`/`off` (also 1/0, yes/no, true/false).
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "yes" | "true" => Ok(true),
        "off" | "0" | "no" | "false" => Ok(false),
        s => Err(format!("{s:?}: expected on or off")),
    }
}

/// The longest polling window `--poll-usec` asks for here: `auto` is 100
/// us where the process may use 2+ CPUs (a poller then leaves a CPU to
/// the clients), else none.
pub fn parse_poll(s: &str) -> Result<std::time::Duration, String> {
    match s.trim() {
        "auto" => Ok(chfs_sys::poll::auto_max()),
        s => s
            .parse::<u64>()
            .map(std::time::Duration::from_micros)
            .map_err(|_| format!("{s:?}: expected auto or a number of microseconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("17").unwrap(), 17);
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn store_kinds() {
        for k in StoreKind::ALL {
            assert_eq!(k.to_string().parse::<StoreKind>(), Ok(k));
        }
        assert_eq!(
            "nvme".parse::<StoreKind>(),
            Err(r#"unknown store "nvme" (available: mem, pmem, posix)"#.to_string())
        );
        let c = Config::try_parse_from(["chfsd", "--store", "posix"]).unwrap();
        assert_eq!(c.store, StoreKind::Posix);
        let e = Config::try_parse_from(["chfsd", "--store", "MEM"]).unwrap_err();
        assert!(
            e.to_string()
                .contains(r#"unknown store "MEM" (available: mem, pmem, posix)"#),
            "{e}"
        );
    }

    #[test]
    fn ports() {
        assert_eq!(with_default_port("node1"), "node1:50000");
        assert_eq!(with_default_port("node1:7"), "node1:7");
    }

    #[test]
    fn poll_settings() {
        use std::time::Duration;
        assert_eq!(parse_poll("0"), Ok(Duration::ZERO));
        assert_eq!(parse_poll("50"), Ok(Duration::from_micros(50)));
        assert!(parse_poll("fast").is_err());
        assert!(parse_poll("auto").is_ok());
    }
}
