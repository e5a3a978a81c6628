//! Client configuration: one table defines every setting, its environment
//! variable, its default and its meaning. [`ClientConfig::from_env`] reads
//! them; [`SETTINGS`] documents them: [`env_help`] renders it for the
//! tools' `--help`, and a test checks that README.md lists every one.

use std::time::Duration;

use crate::error::{fail, Result};

/// One documented setting.
pub struct Setting {
    /// Environment variable.
    pub env: &'static str,
    /// Default, as text.
    pub default: &'static str,
    /// Meaning.
    pub help: &'static str,
}

/// Every client setting.
pub const SETTINGS: &[Setting] = &[
    Setting { env: "CHFS_SERVER", default: "(required)", help: "one or more server addresses (host:port, comma separated; a scheme such as tcp:// is ignored; ofi+tcp://IP:PORT and the other ofi+ addresses that fabric servers (chfsd -p) advertise are reached over libfabric); the full server list is fetched from them" },
    Setting { env: "CHFS_CHUNK_SIZE", default: "65536", help: "chunk size in bytes of files this client creates" },
    Setting { env: "CHFS_BUF_SIZE", default: "0", help: "client write buffer per open file in bytes; small writes are aggregated into one RPC (0 = off)" },
    Setting { env: "CHFS_READ_AHEAD", default: "1048576", help: "bytes of records read ahead per descriptor (of a regular file open for reading) whose reads follow a pattern (reads of one length at a constant stride, sequential ones too; from the third such read): the next records come in one request per chunk, and the reads that follow are answered without a round trip; the records are kept by that descriptor only, for at most 1 s, and dropped at fsync and when this process writes, truncates, removes or renames the file; not used by the FUSE mount and the Python package (0 = off)" },
    Setting { env: "CHFS_OPEN_DATA", default: "65536", help: "largest file whose bytes come with the answer to its open (of a file that exists, for reading, without O_TRUNC), in the same round trip, when the file lies in its first chunk: its reads are then answered without a request of their own; the bytes are kept by that descriptor only, under the same rules as CHFS_READ_AHEAD (for at most 1 s, dropped at fsync and when this process changes the file), and only while read-ahead is on (0 = off)" },
    Setting { env: "CHFS_RPC_TIMEOUT_MSEC", default: "30000", help: "time after which an unanswered request fails with ETIMEDOUT (0 = 30000)" },
    Setting { env: "CHFS_NODE_LIST_CACHE_TIMEOUT", default: "120", help: "seconds the server list is cached before it is fetched again" },
    Setting { env: "CHFS_ASYNC_ACCESS", default: "1", help: "issue the chunk RPCs of one read/write concurrently (0 = one after another)" },
    Setting { env: "CHFS_ASYNC_WINDOW", default: "64", help: "most chunk RPCs of one read/write in flight at once" },
    Setting { env: "CHFS_DIR_CACHE_MSEC", default: "1000", help: "how long a directory known to exist is trusted when creating entries in it (0 = always check)" },
    Setting { env: "CHFS_LOCAL_SOCKET", default: "1", help: "reach servers on this host through their Unix socket instead of TCP (0 = always TCP)" },
    Setting { env: "CHFS_CMA", default: "1", help: "let servers on this host that run as the same user copy large writes (16 KiB and up) straight from this process's memory with process_vm_readv instead of through the socket, or from a shared-memory window the process set up (chfuse's ring buffers) with cache-bypassing stores; and let them place reads' data (records read ahead, chunks of 16 KiB or more) in a shared-memory area of this process (32 MiB of address space, its pages used as needed) instead of sending them through the socket (0 = always through the socket)" },
    Setting { env: "CHFS_CPU_LANES", default: "auto", help: "reach servers on this host over one connection per CPU of the calling thread, each served by a server thread pinned to that CPU, so a request and its reply stay on one CPU: auto = for threads pinned to one CPU (MPI ranks bound to cores), 1 = for every thread, 0 = never" },
    Setting { env: "CHFS_POLL_USEC", default: "auto", help: "longest time in microseconds a caller waiting for a reply asks its socket without sleeping (bounded adaptive polling: the window shrinks to nothing while replies take longer and grows back when they come quickly; never on a CPU lane); over a fabric (ofi+*), how long after a completion a waiter reads the completion queue without sleeping (the process's first client sets it for its endpoint): auto = 100 where the process may run on two or more CPUs, else 0; 0 = never poll" },
    Setting { env: "CHFS_LOOKUP_LOCAL", default: "0", help: "1 = connect to the local chfsd only for lookups: open and stat go to a server on this host (one of them, by local rank, when there are several), which answers from its contact cache or asks the entry's owner, one request for identical lookups in flight; data and changes still go to their owners; no server on this host = direct" },
    Setting { env: "CHFS_LOOKUP_RELAY_GROUP", default: "0", help: "N >= 2: group number for relayed lookups: the servers form N groups (index modulo N) and this client's lookups go to the server of its own group in the owner's row (as CHFS), which answers from its contact cache or asks the owner; 0 or 1 = direct (every lookup to the owner)" },
    Setting { env: "CHFS_LOOKUP_RELAY_GROUP_AUTO", default: "0", help: "1 = relayed lookups with the group number set automatically: the square root of the number of servers, rounded up" },
    Setting { env: "CHFS_LOOKUP_CACHE_MSEC", default: "1000", help: "with relayed lookups, the oldest answer a contact server may give this client from its cache (owners tell contacts of changes, so changes are seen at once; this bounds what a contact the owner could not reach may give, and for this long this client's lookups of paths it changed skip the contact); 0 = the contact always asks the owner" },
    Setting { env: "CHFS_NODE_LOCAL_PREFIX", default: "/.nodelocal", help: "the node-local area: entries under this path are kept by the server on this host (the first in the list when there are several) and seen on this host only, as LLIO's node-local area; the servers must be given the same (chfsd --node-local-prefix); renames between it and the rest give EXDEV; emptied when the servers are stopped; empty = none" },
    Setting { env: "CHFS_CONN_IDLE_SEC", default: "60", help: "a connection to a server unused for this many seconds is closed when this client opens another one, so a client holds connections only to the servers it uses (its contacts, the owners of the data it touches); it is opened again on next use (0 = never closed)" },
    Setting { env: "CHFS_RDMA_THRESH", default: "32768", help: "over a fabric transport (servers at ofi+ addresses), chunk data of at least this many bytes moves by RMA that the server initiates (it reads a write's data from, and writes a read's data into, memory this client registered) instead of in the request or reply message; smaller chunks go in the message" },
    Setting { env: "CHFS_SECRET", default: "(none)", help: "the pool's client key (chfs-client-key:HEX) or secret, proving this process may use the pool (prefer CHFS_SECRET_FILE)" },
    Setting { env: "CHFS_SECRET_FILE", default: "(none)", help: "file holding the pool's client key or secret, as chfsctl start exports it (takes precedence over CHFS_SECRET)" },
];

/// The settings as a help section ("Environment:" and one entry per
/// variable with its default), for programs' `--help`.
pub fn env_help() -> String {
    let mut s = String::from("Environment (client settings):\n");
    for x in SETTINGS {
        s.push_str(&format!(
            "  {} [default: {}]\n      {}\n",
            x.env, x.default, x.help
        ));
    }
    s
}

/// Client configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Contact servers (`host:port`).
    pub servers: Vec<String>,
    /// Chunk size of new files.
    pub chunk_size: u32,
    /// Write buffer size per open file (0 = off).
    pub buf_size: usize,
    /// Bytes of strided records read ahead per descriptor
    /// (`CHFS_READ_AHEAD`, 0 = off).
    pub read_ahead: usize,
    /// Largest file whose bytes come with its open (`CHFS_OPEN_DATA`,
    /// 0 = off; only with read-ahead on).
    pub open_data: u32,
    /// Request timeout.
    pub rpc_timeout: Duration,
    /// Chunk data of at least this many bytes moves by RMA over a fabric
    /// transport (`CHFS_RDMA_THRESH`).
    pub rdma_thresh: usize,
    /// How long the server list is cached.
    pub node_list_cache_timeout: Duration,
    /// Issue the chunk RPCs of one call concurrently.
    pub async_access: bool,
    /// Most chunk RPCs in flight per call.
    pub window: usize,
    /// How long a known directory is trusted.
    pub dir_cache: Duration,
    /// The pool secret or a client key (`chfs-client-key:HEX`), as read
    /// from `CHFS_SECRET_FILE` / `CHFS_SECRET`; empty: none.
    pub secret: Vec<u8>,
    /// The role this client authenticates as (applications: client; the
    /// administrator's tools: admin, which needs the pool secret).
    pub role: chfs_proto::handshake::Role,
    /// Reach servers on this host through their Unix socket.
    pub local_socket: bool,
    /// Let local servers copy written data straight from this process's
    /// memory (`process_vm_readv`, when they run as the same user) instead
    /// of through the socket.
    pub cma: bool,
    /// Which threads reach local servers over per-CPU connections served
    /// on that CPU (see `Client::set_cpu_lanes`).
    pub cpu_lanes: CpuLanes,
    /// How long a caller waiting for a reply polls (`CHFS_POLL_USEC`).
    pub poll: Polling,
    /// Where lookups (open, stat) go (`CHFS_LOOKUP_LOCAL`,
    /// `CHFS_LOOKUP_RELAY_GROUP`, `CHFS_LOOKUP_RELAY_GROUP_AUTO`).
    pub lookup: Lookup,
    /// Oldest cached answer a contact server may give
    /// (`CHFS_LOOKUP_CACHE_MSEC`).
    pub lookup_cache: Duration,
    /// The node-local area's path (`CHFS_NODE_LOCAL_PREFIX`; None: none).
    pub node_local: Option<String>,
    /// A connection unused this long is closed when another is opened
    /// (zero: never).
    pub conn_idle: Duration,
    /// Which of several candidate contact servers this client uses (the
    /// local server among several on this host, the group): by default
    /// the process's local rank in an MPI or Slurm job, else its pid.
    pub contact_seed: Option<u64>,
}

/// Where a client sends lookups (see `crate::relay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lookup {
    /// To the owner of the entry (CHFS's direct lookup).
    Direct,
    /// To a server on this host (`CHFS_LOOKUP_LOCAL=1`).
    Local,
    /// To a server of this client's relay group of this many
    /// (`CHFS_LOOKUP_RELAY_GROUP=N`).
    RelayGroup(u32),
    /// Relay groups, as many as the square root of the number of servers
    /// (`CHFS_LOOKUP_RELAY_GROUP_AUTO=1`).
    RelayAuto,
}

/// Polling for replies before sleeping (`CHFS_POLL_USEC`; see the
/// crate's `poll` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Polling {
    /// Never: a waiter sleeps at once.
    Off,
    /// Up to [`crate::poll::AUTO_MAX`] where the process may run on two
    /// or more CPUs (a poller then leaves a CPU to the server), else off.
    Auto,
    /// Up to this long.
    Upto(Duration),
}

impl Polling {
    /// The longest window this setting allows here.
    pub fn max(self) -> Duration {
        match self {
            Polling::Off => Duration::ZERO,
            Polling::Upto(d) => d,
            Polling::Auto => chfs_sys::poll::auto_max(),
        }
    }
}

/// Which calling threads use CPU lanes (`CHFS_CPU_LANES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuLanes {
    /// None: one shared connection per server.
    Never,
    /// Threads whose affinity is a single CPU (checked once per thread).
    Pinned,
    /// Every thread, on whatever CPU it runs at the call.
    Always,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            chunk_size: chfs_proto::DEFAULT_CHUNK_SIZE,
            buf_size: 0,
            read_ahead: 1 << 20,
            open_data: 64 << 10,
            rpc_timeout: Duration::from_millis(30_000),
            rdma_thresh: 32 * 1024,
            node_list_cache_timeout: Duration::from_secs(120),
            async_access: true,
            window: 64,
            dir_cache: Duration::from_millis(1000),
            secret: Vec::new(),
            role: chfs_proto::handshake::Role::Client,
            local_socket: true,
            cma: true,
            cpu_lanes: CpuLanes::Pinned,
            poll: Polling::Auto,
            lookup: Lookup::Direct,
            lookup_cache: Duration::from_millis(1000),
            contact_seed: None,
            conn_idle: Duration::from_secs(60),
            node_local: Some(chfs_proto::path::NODE_LOCAL_PREFIX.to_string()),
        }
    }
}

/// A 0-or-1 setting; anything else is an error naming the variable.
fn flag(name: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => fail(libc::EINVAL, format!("{name}={v:?}: expected 0 or 1")),
    }
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.trim()
        .parse()
        .or_else(|_| fail(libc::EINVAL, format!("{name}={v:?} is not a valid number")))
}

/// Splits a `CHFS_SERVER` value into `host:port` addresses.
pub fn parse_servers(v: &str) -> Vec<String> {
    v.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            // A fabric address names its transport: kept whole.
            if s.starts_with("ofi+") {
                return s.trim_end_matches('/').to_string();
            }
            let s = s.rsplit_once("://").map_or(s, |(_, a)| a);
            let s = s.trim_end_matches('/');
            if s.rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                s.to_string()
            } else {
                format!("{s}:{}", chfs_proto::DEFAULT_PORT)
            }
        })
        .collect()
}

impl ClientConfig {
    /// Reads the configuration from the environment, validating every value.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `get` (testable without touching the
    /// process environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Self::default();
        if let Some(v) = get("CHFS_SERVER") {
            c.servers = parse_servers(&v);
        }
        if let Some(v) = get("CHFS_CHUNK_SIZE") {
            c.set_chunk_size(num("CHFS_CHUNK_SIZE", &v)?)?;
        }
        if let Some(v) = get("CHFS_BUF_SIZE") {
            c.buf_size = num("CHFS_BUF_SIZE", &v)?;
        }
        if let Some(v) = get("CHFS_READ_AHEAD") {
            c.read_ahead = num("CHFS_READ_AHEAD", &v)?;
        }
        if let Some(v) = get("CHFS_OPEN_DATA") {
            c.open_data = num("CHFS_OPEN_DATA", &v)?;
        }
        if let Some(v) = get("CHFS_RDMA_THRESH") {
            c.rdma_thresh = num::<usize>("CHFS_RDMA_THRESH", &v)?.max(1);
        }
        if let Some(v) = get("CHFS_RPC_TIMEOUT_MSEC") {
            let ms: u64 = num("CHFS_RPC_TIMEOUT_MSEC", &v)?;
            c.rpc_timeout = Duration::from_millis(if ms == 0 { 30_000 } else { ms });
        }
        if let Some(v) = get("CHFS_NODE_LIST_CACHE_TIMEOUT") {
            c.node_list_cache_timeout =
                Duration::from_secs(num("CHFS_NODE_LIST_CACHE_TIMEOUT", &v)?);
        }
        if let Some(v) = get("CHFS_ASYNC_ACCESS") {
            c.async_access = num::<i64>("CHFS_ASYNC_ACCESS", &v)? != 0;
        }
        if let Some(v) = get("CHFS_ASYNC_WINDOW") {
            c.window = num::<usize>("CHFS_ASYNC_WINDOW", &v)?.max(1);
        }
        if let Some(v) = get("CHFS_LOCAL_SOCKET") {
            c.local_socket = num::<i64>("CHFS_LOCAL_SOCKET", &v)? != 0;
        }
        if let Some(v) = get("CHFS_CMA") {
            c.cma = num::<i64>("CHFS_CMA", &v)? != 0;
        }
        if let Some(v) = get("CHFS_CPU_LANES") {
            c.cpu_lanes = match v.trim() {
                "auto" => CpuLanes::Pinned,
                _ if num::<i64>("CHFS_CPU_LANES", &v)? != 0 => CpuLanes::Always,
                _ => CpuLanes::Never,
            };
        }
        if let Some(v) = get("CHFS_POLL_USEC") {
            c.poll = match v.trim() {
                "auto" => Polling::Auto,
                _ => match num::<u64>("CHFS_POLL_USEC", &v)? {
                    0 => Polling::Off,
                    us => Polling::Upto(Duration::from_micros(us)),
                },
            };
        }
        if let Some(v) = get("CHFS_DIR_CACHE_MSEC") {
            c.dir_cache = Duration::from_millis(num("CHFS_DIR_CACHE_MSEC", &v)?);
        }
        let local = get("CHFS_LOOKUP_LOCAL")
            .map(|v| flag("CHFS_LOOKUP_LOCAL", &v))
            .transpose()?
            .unwrap_or(false);
        let group: u32 = get("CHFS_LOOKUP_RELAY_GROUP")
            .map(|v| num("CHFS_LOOKUP_RELAY_GROUP", &v))
            .transpose()?
            .unwrap_or(0);
        let auto = get("CHFS_LOOKUP_RELAY_GROUP_AUTO")
            .map(|v| flag("CHFS_LOOKUP_RELAY_GROUP_AUTO", &v))
            .transpose()?
            .unwrap_or(false);
        // As CHFS: local first, then relay groups (automatic first).
        c.lookup = if local {
            Lookup::Local
        } else if auto {
            Lookup::RelayAuto
        } else if group >= 2 {
            Lookup::RelayGroup(group)
        } else {
            Lookup::Direct
        };
        if let Some(v) = get("CHFS_LOOKUP_CACHE_MSEC") {
            let ms: u32 = num("CHFS_LOOKUP_CACHE_MSEC", &v)?;
            c.lookup_cache = Duration::from_millis(ms.into());
        }
        if let Some(v) = get("CHFS_NODE_LOCAL_PREFIX") {
            c.node_local = match v.trim() {
                "" => None,
                p => match chfs_proto::path::normalize(p) {
                    Ok(n) if n != "/" => Some(n),
                    _ => {
                        return fail(
                            libc::EINVAL,
                            format!(
                            "CHFS_NODE_LOCAL_PREFIX={v:?}: expected an absolute path other than /"
                        ),
                        )
                    }
                },
            };
        }
        if let Some(v) = get("CHFS_CONN_IDLE_SEC") {
            c.conn_idle = Duration::from_secs(num("CHFS_CONN_IDLE_SEC", &v)?);
        }
        if let Some(f) = get("CHFS_SECRET_FILE") {
            match std::fs::read(&f) {
                Ok(s) => c.secret = String::from_utf8_lossy(&s).trim_end().as_bytes().to_vec(),
                Err(e) => {
                    return fail(
                        libc::EACCES,
                        format!("cannot read CHFS_SECRET_FILE {f}: {e}"),
                    )
                }
            }
        } else if let Some(s) = get("CHFS_SECRET") {
            c.secret = s.into_bytes();
        }
        Ok(c)
    }

    /// Sets the chunk size of new files, refusing 0 and sizes above the
    /// protocol maximum.
    pub fn set_chunk_size(&mut self, cs: u64) -> Result<()> {
        if cs == 0 || cs > chfs_proto::MAX_CHUNK_SIZE as u64 {
            return fail(
                libc::EINVAL,
                format!(
                    "chunk size {cs} out of range (1..={})",
                    chfs_proto::MAX_CHUNK_SIZE
                ),
            );
        }
        self.chunk_size = cs as u32;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_parse() {
        assert_eq!(
            parse_servers("tcp://h1:5,h2,ofi+tcp://10.0.0.5:40001/"),
            ["h1:5", "h2:50000", "ofi+tcp://10.0.0.5:40001"]
        );
        assert_eq!(parse_servers(" a:1 , b:2 "), ["a:1", "b:2"]);
    }

    #[test]
    fn env_is_validated() {
        let c = ClientConfig::from_lookup(|k| match k {
            "CHFS_SERVER" => Some("h:1".into()),
            "CHFS_CHUNK_SIZE" => Some("4096".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.chunk_size, 4096);
        assert_eq!(c.cpu_lanes, CpuLanes::Pinned);
        for (v, want) in [
            ("0", CpuLanes::Never),
            ("1", CpuLanes::Always),
            ("auto", CpuLanes::Pinned),
        ] {
            let c =
                ClientConfig::from_lookup(|k| (k == "CHFS_CPU_LANES").then(|| v.into())).unwrap();
            assert_eq!(c.cpu_lanes, want, "{v}");
        }
        let e = ClientConfig::from_lookup(|k| (k == "CHFS_CPU_LANES").then(|| "yes".into()))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        let e = ClientConfig::from_lookup(|k| (k == "CHFS_CHUNK_SIZE").then(|| "abc".into()))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        let e = ClientConfig::from_lookup(|k| (k == "CHFS_CHUNK_SIZE").then(|| "0".into()))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
    }

    #[test]
    fn lookup_settings() {
        let cfg = |kv: &[(&str, &str)]| {
            let kv: Vec<(String, String)> = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            ClientConfig::from_lookup(move |k| {
                kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            })
        };
        assert_eq!(cfg(&[]).unwrap().lookup, Lookup::Direct);
        assert_eq!(
            cfg(&[("CHFS_LOOKUP_RELAY_GROUP", "4")]).unwrap().lookup,
            Lookup::RelayGroup(4)
        );
        assert_eq!(
            cfg(&[("CHFS_LOOKUP_RELAY_GROUP", "1")]).unwrap().lookup,
            Lookup::Direct
        );
        assert_eq!(
            cfg(&[
                ("CHFS_LOOKUP_RELAY_GROUP", "4"),
                ("CHFS_LOOKUP_RELAY_GROUP_AUTO", "1")
            ])
            .unwrap()
            .lookup,
            Lookup::RelayAuto
        );
        assert_eq!(
            cfg(&[("CHFS_LOOKUP_LOCAL", "1"), ("CHFS_LOOKUP_RELAY_GROUP", "4")])
                .unwrap()
                .lookup,
            Lookup::Local
        );
        let c = cfg(&[("CHFS_LOOKUP_CACHE_MSEC", "250")]).unwrap();
        assert_eq!(c.lookup_cache, Duration::from_millis(250));
        for (k, v) in [
            ("CHFS_LOOKUP_LOCAL", "2"),
            ("CHFS_LOOKUP_LOCAL", "yes"),
            ("CHFS_LOOKUP_RELAY_GROUP", "-3"),
            ("CHFS_LOOKUP_RELAY_GROUP_AUTO", "on"),
            ("CHFS_LOOKUP_CACHE_MSEC", "soon"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL, "{k}={v}");
            assert!(e.message().contains(k), "{e}");
        }
    }
}
