//! Requests and responses.
//!
//! A request payload is the fields of its variant in order; the opcode in the
//! frame header says which variant. Bulk data (written bytes, symlink
//! targets, read results) is always the *tail* of the payload, not
//! length-prefixed, so senders can transmit it from the caller's buffer and
//! receivers can slice it without copying.
//!
//! A response payload starts with a one-byte tag naming its variant. An error
//! response (frame flag [`crate::frame::FLAG_ERROR`]) is an errno (`i32`)
//! and a message.

use bytes::Bytes;

use crate::codec::{Put, Reader};
use crate::meta::{Meta, META_LEN};
use crate::ring::{Hashing, ServerList};
use crate::{ErrorReply, ProtoError};

/// The opcode table: each request's opcode constant, its name and its
/// [`Request`] variant, in one place. It generates the `op` constants,
/// [`op::ALL`], [`op::name`] and [`Request::op`] (a code given twice is an
/// unreachable pattern in `op::name`, a warning CI's `clippy -D warnings`
/// refuses, and fails `the_opcode_table_names_every_opcode_once`).
macro_rules! opcodes {
    ($($name:ident = $code:literal => $variant:ident,)*) => {
        /// Opcodes, one per [`Request`] variant.
        pub mod op {
            $(
                #[doc = concat!("[`super::Request::", stringify!($variant), "`]")]
                pub const $name: u16 = $code;
            )*
            /// Every opcode, in table order.
            pub const ALL: &[u16] = &[$($code),*];
            /// The name of an opcode (`"WRITE"`), for logs; `None` for an
            /// unknown one.
            pub fn name(op: u16) -> Option<&'static str> {
                match op {
                    $($code => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }

        impl Request {
            /// The opcode of this request.
            pub fn op(&self) -> u16 {
                match self {
                    $(Request::$variant { .. } => op::$name,)*
                }
            }
        }
    };
}

opcodes! {
    PING = 1 => Ping,
    GET_SERVERS = 2 => GetServers,
    JOIN = 3 => Join,
    UPDATE_SERVERS = 4 => UpdateServers,
    STATUS = 5 => Status,
    SHUTDOWN = 6 => Shutdown,
    CREATE = 10 => Create,
    STAT = 11 => Stat,
    WRITE = 12 => Write,
    READ = 13 => Read,
    SET_SIZE = 14 => SetSize,
    SET_ATTR = 15 => SetAttr,
    REMOVE_ENTRY = 16 => RemoveEntry,
    REMOVE_CHUNKS = 17 => RemoveChunks,
    TRUNCATE_CHUNKS = 18 => TruncateChunks,
    READDIR = 19 => Readdir,
    HAS_CHILDREN = 20 => HasChildren,
    RENAME_MOVE = 21 => RenameMove,
    PUT_CHUNK = 22 => PutChunk,
    APPEND_RESERVE = 23 => AppendReserve,
    READDIR_DIRS = 27 => ReaddirDirs,
    SYNC = 24 => Sync,
    FLUSH_STATUS = 25 => FlushStatus,
    FLUSH = 26 => Flush,
    REBALANCE = 28 => Rebalance,
    ADOPT_CHUNK = 29 => AdoptChunk,
    LANE = 30 => Lane,
    SHM_ATTACH = 31 => ShmAttach,
    LOOKUP = 32 => Lookup,
    WATCH_STAT = 33 => WatchStat,
    INVALIDATE = 34 => Invalidate,
    NODE_LOCAL = 35 => NodeLocal,
    LIST_TREE = 36 => ListTree,
    DIR_VERSION = 37 => DirVersion,
    READ_SPANS = 38 => ReadSpans,
    STAT_DATA = 39 => StatData,
    WRITE_SPANS = 40 => WriteSpans,
    READ_SPANS_PLACED = 41 => ReadSpansPlaced,
}

/// Most spans one [`Request::ReadSpans`] or [`Request::WriteSpans`] may
/// name.
pub const MAX_SPANS: usize = 65536;

/// Does a request of opcode `op`, decoded from a frame's payload, keep a
/// slice of it (its data)? Those of every other opcode copy out what they
/// need, so that a server may read their frames into a buffer it uses
/// again (checked for every variant by the round-trip test).
pub fn keeps_payload(op: u16) -> bool {
    matches!(
        op,
        op::CREATE | op::WRITE | op::WRITE_SPANS | op::PUT_CHUNK | op::ADOPT_CHUNK
    )
}

/// Flags of [`Request::Read`] and [`Request::Write`] (cache mode).
pub mod rw {
    /// The file is a cached copy of a backend file: a chunk missing here is
    /// fetched from the backend (read-through) before it is read or written.
    pub const BACKEND: u16 = 1;
    /// Only make sure the chunk is cached; return no bytes (stage-in).
    pub const FETCH_ONLY: u16 = 2;
    /// With `BACKEND`: the file was written in the cache
    /// ([`crate::meta::FLAG_MODIFIED`], or by this client): a chunk a
    /// replaced server lacks is not fetched from the backend again (EIO).
    pub const MODIFIED: u16 = 4;
    /// The file's entry has [`crate::meta::FLAG_DAMAGED`]: a chunk the
    /// server does not hold is lost, not a hole (EIO).
    pub const DAMAGED: u16 = 8;
}

/// Flags of [`Request::ListTree`].
pub mod tree {
    /// Return each entry's metadata record too (else only its file type).
    pub const META: u8 = 1;
    /// Only directories (the other entries are passed over, not counted
    /// against the page's `max`). A server older than the flag lists
    /// every entry: a client keeps the directories of the reply.
    pub const DIRS: u8 = 2;
}

/// One page of a [`Request::ListTree`] reply: entries as full paths in
/// byte order, kept in one buffer (no allocation per entry).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreePage {
    /// The paths, one after the other.
    pub paths: String,
    /// Where each path ends in `paths`.
    pub ends: Vec<u32>,
    /// Each entry's file type: its mode's `S_IFMT` bits shifted right by
    /// 12 (4 a directory, 8 a regular file, 10 a symbolic link).
    pub kinds: Vec<u8>,
    /// Each entry's metadata record ([`tree::META`]; else empty).
    pub metas: Vec<Meta>,
    /// True when no entries follow.
    pub done: bool,
}

impl TreePage {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Path of entry `i`.
    pub fn path(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.paths[start..self.ends[i] as usize]
    }

    /// Adds an entry (`meta` is kept when the page carries metadata). A
    /// path longer than 65,535 bytes (the wire's limit; a normalised path
    /// has at most [`crate::path::MAX_PATH`]) is left out.
    pub fn push(&mut self, path: &str, meta: &Meta, with_meta: bool) {
        let kind = ((meta.mode >> 12) & 0xf) as u8;
        self.push_entry(path, kind, with_meta.then_some(meta));
    }

    /// Adds an entry of file type `kind` (see [`TreePage::kinds`]), with
    /// its header when the page carries them (as [`TreePage::push`]).
    pub fn push_entry(&mut self, path: &str, kind: u8, meta: Option<&Meta>) {
        if path.len() > u16::MAX as usize {
            return;
        }
        self.paths.push_str(path);
        self.ends.push(self.paths.len() as u32);
        self.kinds.push(kind);
        if let Some(m) = meta {
            self.metas.push(*m);
        }
    }

    /// Is entry `i` a directory?
    pub fn is_dir(&self, i: usize) -> bool {
        self.kinds[i] == 4
    }

    /// Keeps the first `n` entries; when that drops any, the page is no
    /// longer the last one (`done` false: the reader asks again after
    /// the last path kept).
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        let end = if n == 0 { 0 } else { self.ends[n - 1] as usize };
        self.paths.truncate(end);
        self.ends.truncate(n);
        self.kinds.truncate(n);
        self.metas.truncate(n);
        self.done = false;
    }
}

/// Write-back state of a server (or of a subtree on it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlushState {
    /// Dirty chunks not yet written to the backend.
    pub chunks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Chunks whose last flush attempt failed (retried with back-off).
    pub failing: u64,
    /// The most recent flush error, empty if none.
    pub last_error: String,
    /// Its errno (0 if none).
    pub last_errno: i32,
}

/// Progress of a server's [`Request::Rebalance`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebalanceState {
    /// A pass is running.
    pub running: bool,
    /// Version of the server list the last pass placed chunks by.
    pub version: u64,
    /// Chunks sent to their owners by the last pass.
    pub moved: u64,
    /// Chunks dropped because their owner already held a copy (written
    /// there after the list changed, so newer).
    pub kept: u64,
    /// Chunks that could not be sent (they stay here).
    pub failed: u64,
    /// The most recent error, empty if none.
    pub last_error: String,
    /// Its errno (0 if none).
    pub last_errno: i32,
}

/// How to change a timestamp in [`SetAttr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeSet {
    /// Leave unchanged (`UTIME_OMIT`).
    #[default]
    Omit,
    /// Set to the server's current time (`UTIME_NOW`).
    Now,
    /// Set to this time (ns since the epoch).
    At(i64),
}

/// Attribute changes (chmod, chown, utimens); `None` leaves a field alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// New permission bits (file type bits are kept).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: TimeSet,
    /// New modification time.
    pub mtime: TimeSet,
}

/// What [`Request::RemoveEntry`] may remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveKind {
    /// Anything but a directory (unlink): a directory gives `EISDIR`.
    NotDir,
    /// Only a directory (rmdir): anything else gives `ENOTDIR`.
    Dir,
}

/// One directory entry as returned by [`Request::Readdir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name within the directory.
    pub name: String,
    /// Metadata of the entry (size as published).
    pub meta: Meta,
}

/// What a server reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerStatus {
    /// Address the server serves on.
    pub addr: String,
    /// Storage engine name.
    pub store: String,
    /// Number of stored chunks (entries).
    pub entries: u64,
    /// Bytes of chunk data stored.
    pub bytes: u64,
    /// Capacity of the store in bytes (0 = limited only by memory).
    pub capacity: u64,
    /// Requests served since start.
    pub requests: u64,
    /// Of those, requests forwarded to the server owning their key.
    pub forwarded: u64,
    /// Relayed lookups ([`Request::Lookup`]) this server answered as a
    /// contact server, of those the ones answered from its contact cache,
    /// and the lookups it sent to owners for them (identical lookups in
    /// flight at once share one).
    pub lookups: u64,
    pub lookup_hits: u64,
    pub lookup_forwards: u64,
    /// Entries in this server's node-local area, and the bytes of its
    /// files.
    pub node_local_entries: u64,
    pub node_local_bytes: u64,
    /// Fabric transport (`chfsd -p ofi+*`): sessions open now, sessions
    /// ended for idleness (clients gone without a goodbye), chunk data
    /// moved by RMA (writes' data pulled from clients, reads' pushed into
    /// them), and pushes that went through a copy because the chunk's
    /// memory could not be registered. All 0 without a fabric endpoint.
    pub fabric_sessions: u64,
    pub fabric_expired: u64,
    pub rma_pulls: u64,
    pub rma_pushes: u64,
    pub reg_fallbacks: u64,
    /// Fabric: client endpoints in the address vector now (updated once
    /// a second), messages of unknown sessions answered `OP_NO_SESSION`,
    /// and those not answered because the bound on such answers was
    /// reached (a flood of strangers).
    pub fabric_peers: u64,
    pub fabric_no_session: u64,
    pub fabric_no_session_dropped: u64,
    /// Fabric: replies dropped because their peer took no more (over
    /// chfsd's per-peer bound of replies posted and queued), and
    /// requests larger than a message pulled from their senders.
    pub fabric_replies_dropped: u64,
    pub fabric_lent_pulls: u64,
    /// Fabric: the most RMA operations the server had in flight for one
    /// peer at once (bounded per peer).
    pub fabric_rma_most: u64,
    /// Fabric: hellos not answered because too many handshake messages
    /// were on their way (a flood of hellos naming dead addresses).
    pub fabric_hellos_dropped: u64,
    /// Reads whose data the server placed in a local client's landing
    /// window ([`crate::frame::FLAG_LAND`]) instead of the reply, since
    /// start.
    pub shm_reads: u64,
    /// The server's resident memory (bytes), what its heap holds free
    /// (freed, not yet given back to the system), and the times it gave
    /// that back once idle.
    pub rss: u64,
    pub heap_free: u64,
    pub heap_trims: u64,
    /// Chunk reads served.
    pub reads: u64,
    /// Chunk writes served.
    pub writes: u64,
    /// Writes whose data the server copied from a local client's memory
    /// (cross-memory attach) since start.
    pub cma_writes: u64,
    /// Of those, the writes copied from a shared-memory window
    /// ([`Request::ShmAttach`]) since start.
    pub shm_writes: u64,
    /// Server list version the server holds.
    pub list_version: u64,
    /// List version at which this server's store replaced an earlier
    /// incarnation's (0: it holds everything ever written to it).
    pub since: u64,
    /// Reads and writes refused with EIO because the chunk may have been
    /// lost with that earlier incarnation.
    pub lost: u64,
    /// Connections refused at the handshake (wrong or missing secret,
    /// another protocol version, a local user not allowed).
    pub refused: u64,
    /// Requests refused because the connection's role may not make them.
    pub denied: u64,
    /// Connections refused because their host (or local user) had too
    /// many (`--max-conns-per-peer`).
    pub over_limit: u64,
    /// Connections closed after `--idle-timeout` without requests (or
    /// stalled half way through one).
    pub idle_closed: u64,
    /// Requests that waited because their connection had `--max-inflight`
    /// requests or `--conn-memory` bytes in the server (back-pressure).
    pub throttled: u64,
    /// Times a server thread about to sleep polled (`chfsd --poll-usec`)
    /// and the next event came meanwhile, and times it polled in vain and
    /// slept.
    pub poll_hits: u64,
    pub poll_misses: u64,
    /// CPU time the server process has used, user and system, in ns.
    pub cpu_ns: u64,
    /// Connections open now (clients, peers and administrators, each
    /// connection once), and the hosts and local users they come from.
    pub connections: u64,
    pub peers: u64,
    /// Backend directory in cache mode (empty otherwise).
    pub backend: String,
    /// Write-back state.
    pub flush: FlushState,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Liveness check.
    Ping,
    /// Fetch the ordered server list.
    GetServers,
    /// A server at `addr` asks to join the pool. A member's address with
    /// `fresh` (its store is new: a DRAM server restarted, a persistent
    /// store recreated) replaces the earlier incarnation: the list gets a
    /// new version, recorded as that server's [`ServerList::since`].
    Join {
        /// Address of the joining server.
        addr: String,
        /// Its store holds nothing written before this start.
        fresh: bool,
    },
    /// The pool leader pushes a new membership list.
    UpdateServers {
        /// The new list.
        list: ServerList,
    },
    /// Fetch the server's status.
    Status,
    /// Stop the server (after draining in-flight requests).
    Shutdown,
    /// Create the entry (chunk 0) of a file, directory, symlink or special
    /// file. With `excl`, an existing entry gives `EEXIST`; without it, the
    /// existing entry is returned. `data` is the initial content of chunk 0
    /// (the target of a symlink).
    Create {
        /// Normalised path.
        path: String,
        /// Initial metadata (mode, owner, chunk size, times, fileid).
        meta: Meta,
        /// Fail with `EEXIST` if the entry exists.
        excl: bool,
        /// Initial chunk-0 data.
        data: Bytes,
    },
    /// Metadata of an entry (chunk 0).
    Stat {
        /// Normalised path.
        path: String,
    },
    /// Metadata of an entry and, for a regular file of at most `max`
    /// bytes held in its first chunk, that file's bytes (for a symbolic
    /// link, its target, whatever `max` says)
    /// ([`Response::MetaData`]): an open that reads a small file in the
    /// same round trip. The server leaves the data out (a bare
    /// [`Response::Meta`]) whenever a plain read could need more than
    /// this server's store (a cached or damaged file, a chunk it may have
    /// lost, one it does not hold).
    StatData {
        /// Normalised path.
        path: String,
        /// Largest file whose bytes come with the answer.
        max: u32,
    },
    /// Write `data` at offset `off` of chunk `idx`. Writes into chunk 0 also
    /// grow the file size; writes to other chunks leave size publication to
    /// the client ([`Request::SetSize`]).
    Write {
        /// Normalised path.
        path: String,
        /// File incarnation id (from the entry).
        fileid: u32,
        /// Chunk size of the file.
        chunk_size: u32,
        /// File mode (for a newly created data chunk).
        mode: u32,
        /// Chunk index.
        idx: u64,
        /// Offset within the chunk.
        off: u32,
        /// `rw::*` flags.
        flags: u16,
        /// The file's epoch ([`Meta::epoch`]): a server replaced after it
        /// refuses a partial write into a chunk it does not hold (EIO).
        epoch: u32,
        /// The bytes (payload tail).
        data: Bytes,
    },
    /// Read up to `len` bytes at offset `off` of chunk `idx`. A missing or
    /// stale chunk returns no bytes (a hole), unless the server was
    /// replaced after the file's `epoch` began (its chunk may be lost):
    /// then `EIO`.
    Read {
        /// Normalised path.
        path: String,
        /// File incarnation id.
        fileid: u32,
        /// Chunk index.
        idx: u64,
        /// Offset within the chunk.
        off: u32,
        /// Bytes wanted.
        len: u32,
        /// Chunk size of the file (to locate the chunk in a backend file).
        chunk_size: u32,
        /// `rw::*` flags.
        flags: u16,
        /// The file's epoch ([`Meta::epoch`]).
        epoch: u32,
    },
    /// Set the size recorded in the entry; with `grow_only` only if larger.
    /// The reply is [`Response::Sized`].
    SetSize {
        /// Normalised path.
        path: String,
        /// New size.
        size: u64,
        /// Only grow (publishing written data), never shrink.
        grow_only: bool,
        /// Mark the file [`crate::meta::FLAG_STRAY`]: a write that failed
        /// stored chunks past the size.
        stray: bool,
        /// Change the size only while it is exactly this (a client taking
        /// back the size it published with a write that then failed).
        if_size: Option<u64>,
    },
    /// chmod / chown / utimens.
    SetAttr {
        /// Normalised path.
        path: String,
        /// Changes.
        attr: SetAttr,
    },
    /// Remove the entry (chunk 0) of a path; returns its metadata.
    RemoveEntry {
        /// Normalised path.
        path: String,
        /// Directory or not.
        kind: RemoveKind,
    },
    /// Remove this server's data chunks of `path` with index >= `from_idx`.
    RemoveChunks {
        /// Normalised path.
        path: String,
        /// First index removed.
        from_idx: u64,
    },
    /// Cut this server's data chunks of a file to `size` bytes.
    TruncateChunks {
        /// Normalised path.
        path: String,
        /// New file size.
        size: u64,
        /// Chunk size of the file.
        chunk_size: u32,
    },
    /// List this server's entries in directory `path`, in name order,
    /// starting after `after`, at most `max`.
    Readdir {
        /// Normalised directory path.
        path: String,
        /// Resume after this name (exclusive); empty = from the start.
        after: String,
        /// Maximum entries returned.
        max: u32,
    },
    /// As [`Request::Readdir`], but only the entries that are directories
    /// (for a parallel find that walks the tree without reading every
    /// entry): at most `max` of them, resuming after `after`; the reply is
    /// [`Response::Entries`]. Servers older than this op close the
    /// connection with `EPROTO` (unknown opcode).
    ReaddirDirs {
        /// Normalised directory path.
        path: String,
        /// Resume after this name (exclusive); empty = from the start.
        after: String,
        /// Maximum entries returned.
        max: u32,
    },
    /// Does this server hold any entry inside directory `path`?
    HasChildren {
        /// Normalised directory path.
        path: String,
    },
    /// Move this server's chunks of `old` (and everything below it) to
    /// `new`, sending each chunk to its new owner.
    RenameMove {
        /// Old normalised path.
        old: String,
        /// New normalised path.
        new: String,
        /// The source is a directory: move its whole subtree.
        is_dir: bool,
    },
    /// Store a chunk as is (server to server, used by rename).
    PutChunk {
        /// Normalised path.
        path: String,
        /// Chunk index.
        idx: u64,
        /// Metadata header of the chunk.
        meta: Meta,
        /// Chunk bytes (payload tail).
        data: Bytes,
    },
    /// Atomically reserve `len` bytes at the end of a file (O_APPEND);
    /// returns the offset where the caller writes.
    AppendReserve {
        /// Normalised path.
        path: String,
        /// Bytes to reserve.
        len: u64,
    },
    /// Write-back state of this server's chunks under `prefix`.
    FlushStatus {
        /// Normalised path of a file or directory (`/` for everything).
        prefix: String,
    },
    /// Start flushing this server's dirty chunks under `prefix` now, without
    /// waiting for idleness; returns the state at the time of the request.
    Flush {
        /// Normalised path of a file or directory (`/` for everything).
        prefix: String,
    },
    /// Make everything this server stored so far durable on its medium
    /// (fsync; a no-op for the DRAM engine).
    Sync,
    /// Send every chunk this server holds but no longer owns (the server
    /// list grew) to its owner. With `start`, begins a pass in the
    /// background unless one is running; without, only reports. The reply is
    /// [`Response::Rebalance`] (poll until not running).
    Rebalance {
        /// Start a pass if needed (else report only).
        start: bool,
    },
    /// Store a chunk moved by a rebalance unless this server already holds
    /// that key (server to server; the copy here is newer and is kept).
    AdoptChunk {
        /// Normalised path.
        path: String,
        /// Chunk index.
        idx: u64,
        /// Metadata header of the chunk.
        meta: Meta,
        /// Chunk bytes (payload tail).
        data: Bytes,
    },
    /// First request of a local connection whose client thread runs on
    /// CPU `cpu` (and stays there): serve this connection on a thread of
    /// that CPU, so a request and its reply hand over on one CPU. Refused
    /// (EINVAL) anywhere else; the connection then stays as it was.
    Lane {
        /// The client thread's CPU.
        cpu: u32,
    },
    /// On a local connection of the server's own user: the client's memory
    /// `[base, base + len)` is a shared mapping of the start of the memory
    /// file (memfd, sealed against shrinking) the client holds open as
    /// descriptor `fd`, and stays so while the connection lives. The
    /// server maps the file too and copies writes whose data lies there
    /// (`FLAG_CMA`) from its own mapping instead of with
    /// `process_vm_readv`. Once per connection; EPERM elsewhere.
    ShmAttach {
        /// The memory file's descriptor number in the client.
        fd: i32,
        /// Where the client maps it.
        base: u64,
        /// Length of the mapping.
        len: u64,
    },
    /// A relayed lookup (`CHFS_LOOKUP_LOCAL`, `CHFS_LOOKUP_RELAY_GROUP`):
    /// the entry of `path`, asked of a *contact* server, which answers it
    /// itself when it owns the entry, else from its contact cache (an
    /// answer it fetched from the owner at most `max_age_ms` ago), else by
    /// asking the owner, one request for all identical lookups in flight.
    /// The reply is that of [`Request::Stat`].
    Lookup {
        /// Normalised path.
        path: String,
        /// Oldest cached answer the client accepts, in ms (0: ask the
        /// owner).
        max_age_ms: u32,
    },
    /// A contact server asks the owner for the entry of `path` (server to
    /// server, for a [`Request::Lookup`]) and will keep the answer for up
    /// to `keep_ms`: until then the owner tells `contact` of a change of
    /// the entry ([`Request::Invalidate`]) before it answers the change.
    /// The reply is that of [`Request::Stat`].
    WatchStat {
        /// Normalised path.
        path: String,
        /// The contact server's address.
        contact: String,
        /// How long the contact may keep the answer, in ms.
        keep_ms: u32,
    },
    /// The owner of the entry of `path` changed it (server to server):
    /// the contact server drops what it keeps of it.
    Invalidate {
        /// Normalised path.
        path: String,
    },
    /// A client tells the server on its host the path of its node-local
    /// area (`CHFS_NODE_LOCAL_PREFIX`, empty when off); the server answers
    /// [`Response::Ok`] when its own is the same, else an error naming
    /// both.
    NodeLocal {
        /// The client's node-local prefix (empty: none).
        prefix: String,
    },
    /// Every entry this server holds below directory `prefix` (at any
    /// depth, not `prefix` itself), as full paths in byte order, starting
    /// after the path `after` (empty: from the start), at most `max`: one
    /// request per server and page for a whole tree instead of one per
    /// directory. The reply is [`Response::Tree`]. An entry is listed
    /// whether or not its parent directory's entry exists (the caller
    /// drops orphans); a server's node-local area is listed only below
    /// it. Servers older than this op close the connection with `EPROTO`
    /// (unknown opcode); a server in cache mode refuses it with
    /// `EOPNOTSUPP` (its listings merge the backend's, directory by
    /// directory). Either way the client walks directory by directory.
    ListTree {
        /// Normalised directory path.
        prefix: String,
        /// Resume after this full path (exclusive); empty = from the start.
        after: String,
        /// Maximum entries returned.
        max: u32,
        /// `tree::*` flags.
        flags: u8,
    },
    /// The version of the set of names of the entries this server holds
    /// in directory `path` ([`Response::DirVersion`]): a client keeps a
    /// listing of a large directory valid while no other client changed
    /// it, without listing it again. Servers older than this op close the
    /// connection with `EPROTO` (unknown opcode); a server in cache mode
    /// refuses it with `EOPNOTSUPP` (the backend changes without
    /// versions). Either way the client relists as before.
    DirVersion {
        /// Normalised directory path.
        path: String,
    },
    /// Read several ranges of chunks of one file that this server owns
    /// (`spans`: chunk index, offset within the chunk, length; at most
    /// [`MAX_SPANS`], their lengths adding up to at most
    /// [`crate::MAX_CHUNK_SIZE`]) in one request: the reply is
    /// [`Response::Data`] holding each span's bytes in order, each padded
    /// with zeros to its full length (a hole, or past the chunk's end,
    /// reads as zeros, as a client fills a short [`Request::Read`]). The
    /// same rules as `Read` otherwise (`EIO` for a chunk a replaced server
    /// may have lost). Forwarded to the owner of the first span's chunk;
    /// a server that does not own every chunk named refuses it with
    /// `ESTALE` (the client's server list is out of date: it reads chunk
    /// by chunk). A client's read-ahead of strided records. Servers older
    /// than this op close the connection with `EPROTO` (unknown opcode):
    /// the client then reads record by record from that server.
    ReadSpans {
        /// Normalised path.
        path: String,
        /// File incarnation id.
        fileid: u32,
        /// Chunk size of the file (to locate the chunk in a backend file).
        chunk_size: u32,
        /// `rw::*` flags.
        flags: u16,
        /// The file's epoch ([`Meta::epoch`]).
        epoch: u32,
        /// (chunk index, offset within the chunk, length) of each range.
        spans: Vec<(u64, u32, u32)>,
    },
    /// Write several ranges of chunks of one file that this server owns
    /// (`spans`: chunk index, offset within the chunk, length; at most
    /// [`MAX_SPANS`]) in one request: `data` holds each span's bytes in
    /// order (their lengths add up to its length; empty in a message whose
    /// data moves by RMA, `FLAG_RMA`). Each span is written
    /// as a [`Request::Write`] of it would be, in order; the first that
    /// fails ends the request with its error (the spans before it are
    /// written). Answered [`Response::Written`] with the bytes written.
    /// Forwarded to the owner of the first span's chunk; a server that
    /// does not own every chunk named refuses it with `ESTALE` (the
    /// client's server list is out of date: it writes chunk by chunk). A
    /// client's write of several chunks to a server over a fabric (one
    /// request and one pull instead of one each per chunk). Servers older
    /// than this op answer `EPROTO` (unknown opcode): the client then
    /// writes chunk by chunk to that server.
    WriteSpans {
        /// Normalised path.
        path: String,
        /// File incarnation id.
        fileid: u32,
        /// Chunk size of the file.
        chunk_size: u32,
        /// File mode (for a newly created data chunk).
        mode: u32,
        /// `rw::*` flags.
        flags: u16,
        /// The file's epoch ([`Meta::epoch`]).
        epoch: u32,
        /// (chunk index, offset within the chunk, length) of each range.
        spans: Vec<(u64, u32, u32)>,
        /// The bytes of the spans, one after the other (payload tail).
        data: Bytes,
    },
    /// A [`Request::ReadSpans`] whose data moves by RMA (`FLAG_RMA`) into
    /// the client's memory at the spans' places in the file rather than
    /// one after the other: span `i` at `pos(i) - pos(0)` of the memory
    /// named, where `pos` is `chunk * chunk_size + offset`. The spans must
    /// follow one another in the file (each past the end of the one
    /// before; else `EINVAL`), and the memory named must reach the last
    /// span's end (else `EMSGSIZE`). A pread's parts of one server land
    /// in the caller's buffer as they are, between those of other
    /// servers, with no copy on either side. Without `FLAG_RMA` it is
    /// answered as a `ReadSpans`. Servers older than this op answer
    /// `EPROTO` (unknown opcode): the client then sends `ReadSpans`.
    ReadSpansPlaced {
        /// Normalised path.
        path: String,
        /// File incarnation id.
        fileid: u32,
        /// Chunk size of the file.
        chunk_size: u32,
        /// `rw::*` flags.
        flags: u16,
        /// The file's epoch ([`Meta::epoch`]).
        epoch: u32,
        /// (chunk index, offset within the chunk, length) of each range,
        /// in file order.
        spans: Vec<(u64, u32, u32)>,
    },
}

impl Request {
    /// The bytes a [`Request::ReadSpans`] (or `ReadSpansPlaced`) answers
    /// with (0 for any other).
    pub fn spans_len(&self) -> u64 {
        match self {
            Request::ReadSpans { spans, .. } | Request::ReadSpansPlaced { spans, .. } => {
                spans.iter().map(|s| s.2 as u64).sum()
            }
            _ => 0,
        }
    }

    /// A [`Request::ReadSpans`] as the `ReadSpansPlaced` of the same
    /// spans; any other request as it is.
    pub fn into_placed(self) -> Request {
        match self {
            Request::ReadSpans {
                path,
                fileid,
                chunk_size,
                flags,
                epoch,
                spans,
            } => Request::ReadSpansPlaced {
                path,
                fileid,
                chunk_size,
                flags,
                epoch,
                spans,
            },
            other => other,
        }
    }
}

/// Where each span of a [`Request::ReadSpansPlaced`] goes in the memory
/// its data is moved into: (offset, length) per span, from the first
/// span's place in the file; `EINVAL` when a span starts before the end
/// of the one before it (or a place does not fit in 64 bits).
pub fn span_places(
    chunk_size: u32,
    spans: &[(u64, u32, u32)],
) -> Result<Vec<(u64, u64)>, ErrorReply> {
    let bad = |why: &str| ErrorReply::new(libc::EINVAL, format!("placed spans: {why}"));
    let pos = |&(idx, off, _): &(u64, u32, u32)| {
        idx.checked_mul(chunk_size as u64)
            .and_then(|p| p.checked_add(off as u64))
            .ok_or_else(|| bad("a place past 2^64"))
    };
    let Some(first) = spans.first() else {
        return Ok(Vec::new());
    };
    let base = pos(first)?;
    let mut end = base;
    let mut places = Vec::with_capacity(spans.len());
    for s in spans {
        let at = pos(s)?;
        if at < end {
            return Err(bad("not in file order"));
        }
        end = at + s.2 as u64;
        places.push((at - base, s.2 as u64));
    }
    Ok(places)
}

/// A directory's version on one server ([`Request::DirVersion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirVersion {
    /// When the directory got its first entry on this server (a number
    /// from a sequence of the server's store, never given twice, not a
    /// time); 0 when it has no entries there.
    pub born: u64,
    /// Adds and removals of names since `born`.
    pub changes: u64,
    /// The version of the server list this server uses (a server that
    /// changed list may have moved entries or served requests for others).
    pub list: u64,
}

/// A successful response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Done, nothing to return.
    Ok,
    /// The server list.
    Servers(ServerList),
    /// Server status.
    Status(Box<ServerStatus>),
    /// Metadata of an entry.
    Meta(Meta),
    /// Result of a create: the entry and whether this request created it.
    Created {
        /// The entry.
        meta: Meta,
        /// True if it did not exist before.
        created: bool,
    },
    /// Bytes written.
    Written(u32),
    /// Bytes read (payload tail).
    Data(Bytes),
    /// Directory entries.
    Entries {
        /// The entries, in name order.
        entries: Vec<DirEntry>,
        /// True when no entries follow.
        done: bool,
    },
    /// A yes/no answer.
    Bool(bool),
    /// A count or offset.
    Count(u64),
    /// Write-back state.
    FlushState(FlushState),
    /// Rebalance progress.
    Rebalance(RebalanceState),
    /// Result of a [`Request::SetSize`]: the entry after it, and the size
    /// it had before.
    Sized {
        /// The entry.
        meta: Meta,
        /// Its size before the request.
        before: u64,
    },
    /// A page of [`Request::ListTree`].
    Tree(TreePage),
    /// The answer to [`Request::DirVersion`].
    DirVersion(DirVersion),
    /// The answer to [`Request::StatData`] that carries the file's bytes
    /// (as many as its size; fewer when its end is a hole).
    MetaData {
        /// The entry.
        meta: Meta,
        /// The file's bytes from offset 0.
        data: Bytes,
    },
}

fn put_meta(out: &mut Vec<u8>, m: &Meta) {
    out.extend_from_slice(&m.encode());
}

fn get_meta(r: &mut Reader) -> Result<Meta, ProtoError> {
    Meta::decode(&r.array::<META_LEN>()?)
}

fn put_list(out: &mut Vec<u8>, l: &ServerList) {
    out.put_u64(l.version);
    out.put_u8(l.hashing.code());
    out.put_u32(l.servers.len() as u32);
    for (i, s) in l.servers.iter().enumerate() {
        out.put_str(s);
        out.put_u64(l.since(i));
    }
}

fn get_list(r: &mut Reader) -> Result<ServerList, ProtoError> {
    let version = r.u64()?;
    let h = r.u8()?;
    let hashing =
        Hashing::from_code(h).ok_or_else(|| ProtoError::Malformed(format!("hashing {h}")))?;
    let n = r.u32()? as usize;
    if n > crate::ring::MAX_SERVERS {
        return Err(ProtoError::Malformed(format!(
            "{n} servers (at most {})",
            crate::ring::MAX_SERVERS
        )));
    }
    // Reserve only for the servers the payload can hold (each at least a
    // string length and a u64): the count is the peer's claim.
    let fit = n.min(r.remaining() / (4 + 8));
    let mut servers = Vec::with_capacity(fit);
    let mut since = Vec::with_capacity(fit);
    for _ in 0..n {
        servers.push(r.string()?);
        since.push(r.u64()?);
    }
    if since.iter().all(|&v| v == 0) {
        since.clear();
    }
    Ok(ServerList {
        version,
        hashing,
        servers,
        since,
    })
}

fn put_time(out: &mut Vec<u8>, t: TimeSet) {
    match t {
        TimeSet::Omit => out.put_u8(0),
        TimeSet::Now => out.put_u8(1),
        TimeSet::At(v) => {
            out.put_u8(2);
            out.put_i64(v)
        }
    }
}

fn get_time(r: &mut Reader) -> Result<TimeSet, ProtoError> {
    Ok(match r.u8()? {
        0 => TimeSet::Omit,
        1 => TimeSet::Now,
        2 => TimeSet::At(r.i64()?),
        v => return Err(ProtoError::Malformed(format!("time tag {v}"))),
    })
}

fn put_opt(out: &mut Vec<u8>, v: Option<u32>) {
    match v {
        None => out.put_u8(0),
        Some(v) => {
            out.put_u8(1);
            out.put_u32(v)
        }
    }
}

fn get_opt(r: &mut Reader) -> Result<Option<u32>, ProtoError> {
    Ok(if r.bool()? { Some(r.u32()?) } else { None })
}

/// The fixed fields of a [`Request::Write`] (see there).
#[derive(Debug, Clone, Copy)]
pub struct WriteHead<'a> {
    /// Normalised path.
    pub path: &'a str,
    /// File incarnation id.
    pub fileid: u32,
    /// Chunk size of the file.
    pub chunk_size: u32,
    /// File mode.
    pub mode: u32,
    /// Chunk index.
    pub idx: u64,
    /// Offset within the chunk.
    pub off: u32,
    /// `rw::*` flags.
    pub flags: u16,
    /// The file's epoch.
    pub epoch: u32,
}

/// Encodes the fixed fields of a [`Request::Write`]; the data follows as the
/// payload tail. Lets a client send user bytes without copying them.
pub fn encode_write_head(out: &mut Vec<u8>, h: &WriteHead<'_>) {
    out.put_str(h.path);
    out.put_u32(h.fileid);
    out.put_u32(h.chunk_size);
    out.put_u32(h.mode);
    out.put_u64(h.idx);
    out.put_u32(h.off);
    out.put_u16(h.flags);
    out.put_u32(h.epoch);
}

/// The fields of a [`Request::WriteSpans`] before its data.
pub struct WriteSpansHead<'a> {
    /// Normalised path.
    pub path: &'a str,
    /// File incarnation id.
    pub fileid: u32,
    /// Chunk size of the file.
    pub chunk_size: u32,
    /// File mode.
    pub mode: u32,
    /// `rw::*` flags.
    pub flags: u16,
    /// The file's epoch.
    pub epoch: u32,
    /// (chunk index, offset within the chunk, length) of each range.
    pub spans: &'a [(u64, u32, u32)],
}

/// Encodes the fields of a [`Request::WriteSpans`] before its data, which
/// follows as the payload tail (as [`encode_write_head`]).
pub fn encode_write_spans_head(out: &mut Vec<u8>, h: &WriteSpansHead<'_>) {
    out.put_str(h.path);
    out.put_u32(h.fileid);
    out.put_u32(h.chunk_size);
    out.put_u32(h.mode);
    out.put_u16(h.flags);
    out.put_u32(h.epoch);
    put_spans(out, h.spans);
}

fn put_spans(out: &mut Vec<u8>, spans: &[(u64, u32, u32)]) {
    out.put_u32(spans.len() as u32);
    for (idx, off, len) in spans {
        out.put_u64(*idx);
        out.put_u32(*off);
        out.put_u32(*len);
    }
}

/// (chunk index, offset within the chunk, length) of each range of a
/// [`Request::ReadSpans`] or [`Request::WriteSpans`].
type Spans = Vec<(u64, u32, u32)>;

/// The spans of a [`Request::ReadSpans`] or [`Request::WriteSpans`], and
/// their lengths' sum.
fn get_spans(r: &mut Reader) -> Result<(Spans, u64), ProtoError> {
    let n = r.u32()? as usize;
    if n > MAX_SPANS || n * 16 > r.remaining() {
        return Err(ProtoError::Malformed(format!(
            "{n} spans ({} bytes left, at most {MAX_SPANS})",
            r.remaining()
        )));
    }
    let mut spans = Vec::with_capacity(n);
    let mut total = 0u64;
    for _ in 0..n {
        let s = (r.u64()?, r.u32()?, r.u32()?);
        total += s.2 as u64;
        spans.push(s);
    }
    Ok((spans, total))
}

fn put_flush(out: &mut Vec<u8>, f: &FlushState) {
    out.put_u64(f.chunks);
    out.put_u64(f.bytes);
    out.put_u64(f.failing);
    out.put_str(&f.last_error);
    out.put_u32(f.last_errno as u32);
}

fn get_flush(r: &mut Reader) -> Result<FlushState, ProtoError> {
    Ok(FlushState {
        chunks: r.u64()?,
        bytes: r.u64()?,
        failing: r.u64()?,
        last_error: r.string()?,
        last_errno: r.u32()? as i32,
    })
}

impl Request {
    /// The path whose chunk this request addresses, with the chunk index,
    /// for requests that have a single owner (and may be forwarded).
    pub fn key(&self) -> Option<(&str, u64)> {
        match self {
            Request::Create { path, .. }
            | Request::Stat { path }
            | Request::StatData { path, .. }
            | Request::WatchStat { path, .. }
            | Request::SetSize { path, .. }
            | Request::SetAttr { path, .. }
            | Request::RemoveEntry { path, .. }
            | Request::AppendReserve { path, .. } => Some((path, 0)),
            Request::Write { path, idx, .. }
            | Request::Read { path, idx, .. }
            | Request::PutChunk { path, idx, .. }
            | Request::AdoptChunk { path, idx, .. } => Some((path, *idx)),
            Request::ReadSpans { path, spans, .. }
            | Request::ReadSpansPlaced { path, spans, .. }
            | Request::WriteSpans { path, spans, .. } => {
                Some((path, spans.first().map_or(0, |s| s.0)))
            }
            _ => None,
        }
    }

    /// The path a request is about (of an entry, or a directory listed,
    /// or a rename's source), if one.
    pub fn path(&self) -> Option<&str> {
        match self {
            Request::Readdir { path, .. }
            | Request::ReaddirDirs { path, .. }
            | Request::HasChildren { path }
            | Request::RemoveChunks { path, .. }
            | Request::TruncateChunks { path, .. }
            | Request::Lookup { path, .. }
            | Request::DirVersion { path } => Some(path),
            Request::ListTree { prefix, .. } => Some(prefix),
            Request::RenameMove { old, .. } => Some(old),
            r => r.key().map(|(p, _)| p),
        }
    }

    /// Encodes the payload (fields, then the data tail).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Ping
            | Request::GetServers
            | Request::Status
            | Request::Shutdown
            | Request::Sync => {}
            Request::Rebalance { start } => out.put_u8(*start as u8),
            Request::Lane { cpu } => out.put_u32(*cpu),
            Request::ShmAttach { fd, base, len } => {
                out.put_u32(*fd as u32);
                out.put_u64(*base);
                out.put_u64(*len);
            }
            Request::Join { addr, fresh } => {
                out.put_str(addr);
                out.put_u8(*fresh as u8);
            }
            Request::UpdateServers { list } => put_list(out, list),
            Request::Create {
                path,
                meta,
                excl,
                data,
            } => {
                out.put_str(path);
                put_meta(out, meta);
                out.put_u8(*excl as u8);
                out.extend_from_slice(data);
            }
            Request::Stat { path } | Request::HasChildren { path } => out.put_str(path),
            Request::Lookup { path, max_age_ms } => {
                out.put_str(path);
                out.put_u32(*max_age_ms);
            }
            Request::StatData { path, max } => {
                out.put_str(path);
                out.put_u32(*max);
            }
            Request::WatchStat {
                path,
                contact,
                keep_ms,
            } => {
                out.put_str(path);
                out.put_str(contact);
                out.put_u32(*keep_ms);
            }
            Request::Invalidate { path } | Request::DirVersion { path } => out.put_str(path),
            Request::NodeLocal { prefix } => out.put_str(prefix),
            Request::ListTree {
                prefix,
                after,
                max,
                flags,
            } => {
                out.put_str(prefix);
                out.put_str(after);
                out.put_u32(*max);
                out.put_u8(*flags);
            }
            Request::Write {
                path,
                fileid,
                chunk_size,
                mode,
                idx,
                off,
                flags,
                epoch,
                data,
            } => {
                encode_write_head(
                    out,
                    &WriteHead {
                        path,
                        fileid: *fileid,
                        chunk_size: *chunk_size,
                        mode: *mode,
                        idx: *idx,
                        off: *off,
                        flags: *flags,
                        epoch: *epoch,
                    },
                );
                out.extend_from_slice(data);
            }
            Request::Read {
                path,
                fileid,
                idx,
                off,
                len,
                chunk_size,
                flags,
                epoch,
            } => {
                out.put_str(path);
                out.put_u32(*fileid);
                out.put_u64(*idx);
                out.put_u32(*off);
                out.put_u32(*len);
                out.put_u32(*chunk_size);
                out.put_u16(*flags);
                out.put_u32(*epoch);
            }
            Request::ReadSpans {
                path,
                fileid,
                chunk_size,
                flags,
                epoch,
                spans,
            }
            | Request::ReadSpansPlaced {
                path,
                fileid,
                chunk_size,
                flags,
                epoch,
                spans,
            } => {
                out.put_str(path);
                out.put_u32(*fileid);
                out.put_u32(*chunk_size);
                out.put_u16(*flags);
                out.put_u32(*epoch);
                put_spans(out, spans);
            }
            Request::WriteSpans {
                path,
                fileid,
                chunk_size,
                mode,
                flags,
                epoch,
                spans,
                data,
            } => {
                encode_write_spans_head(
                    out,
                    &WriteSpansHead {
                        path,
                        fileid: *fileid,
                        chunk_size: *chunk_size,
                        mode: *mode,
                        flags: *flags,
                        epoch: *epoch,
                        spans,
                    },
                );
                out.extend_from_slice(data);
            }
            Request::SetSize {
                path,
                size,
                grow_only,
                stray,
                if_size,
            } => {
                out.put_str(path);
                out.put_u64(*size);
                out.put_u8(*grow_only as u8);
                out.put_u8(*stray as u8);
                match if_size {
                    None => out.put_u8(0),
                    Some(v) => {
                        out.put_u8(1);
                        out.put_u64(*v);
                    }
                }
            }
            Request::SetAttr { path, attr } => {
                out.put_str(path);
                put_opt(out, attr.mode);
                put_opt(out, attr.uid);
                put_opt(out, attr.gid);
                put_time(out, attr.atime);
                put_time(out, attr.mtime);
            }
            Request::RemoveEntry { path, kind } => {
                out.put_str(path);
                out.put_u8(match kind {
                    RemoveKind::NotDir => 0,
                    RemoveKind::Dir => 1,
                });
            }
            Request::RemoveChunks { path, from_idx } => {
                out.put_str(path);
                out.put_u64(*from_idx);
            }
            Request::TruncateChunks {
                path,
                size,
                chunk_size,
            } => {
                out.put_str(path);
                out.put_u64(*size);
                out.put_u32(*chunk_size);
            }
            Request::Readdir { path, after, max } | Request::ReaddirDirs { path, after, max } => {
                out.put_str(path);
                out.put_str(after);
                out.put_u32(*max);
            }
            Request::RenameMove { old, new, is_dir } => {
                out.put_str(old);
                out.put_str(new);
                out.put_u8(*is_dir as u8);
            }
            Request::PutChunk {
                path,
                idx,
                meta,
                data,
            }
            | Request::AdoptChunk {
                path,
                idx,
                meta,
                data,
            } => {
                out.put_str(path);
                out.put_u64(*idx);
                put_meta(out, meta);
                out.extend_from_slice(data);
            }
            Request::AppendReserve { path, len } => {
                out.put_str(path);
                out.put_u64(*len);
            }
            Request::FlushStatus { prefix } | Request::Flush { prefix } => out.put_str(prefix),
        }
    }

    /// Decodes a payload received with opcode `op`.
    pub fn decode(op: u16, payload: Bytes) -> Result<Self, ProtoError> {
        let mut r = Reader::new(payload);
        let req = match op {
            op::PING => Request::Ping,
            op::SYNC => Request::Sync,
            op::REBALANCE => Request::Rebalance { start: r.bool()? },
            op::LANE => Request::Lane { cpu: r.u32()? },
            op::SHM_ATTACH => Request::ShmAttach {
                fd: r.u32()? as i32,
                base: r.u64()?,
                len: r.u64()?,
            },
            op::LOOKUP => Request::Lookup {
                path: r.string()?,
                max_age_ms: r.u32()?,
            },
            op::STAT_DATA => Request::StatData {
                path: r.string()?,
                max: r.u32()?,
            },
            op::WATCH_STAT => Request::WatchStat {
                path: r.string()?,
                contact: r.string()?,
                keep_ms: r.u32()?,
            },
            op::INVALIDATE => Request::Invalidate { path: r.string()? },
            op::NODE_LOCAL => Request::NodeLocal {
                prefix: r.string()?,
            },
            op::LIST_TREE => Request::ListTree {
                prefix: r.string()?,
                after: r.string()?,
                max: r.u32()?,
                flags: r.u8()?,
            },
            op::DIR_VERSION => Request::DirVersion { path: r.string()? },
            op::GET_SERVERS => Request::GetServers,
            op::STATUS => Request::Status,
            op::SHUTDOWN => Request::Shutdown,
            op::JOIN => Request::Join {
                addr: r.string()?,
                fresh: r.bool()?,
            },
            op::UPDATE_SERVERS => Request::UpdateServers {
                list: get_list(&mut r)?,
            },
            op::CREATE => {
                let path = r.string()?;
                let meta = get_meta(&mut r)?;
                let excl = r.bool()?;
                let data = r.rest();
                return Ok(Request::Create {
                    path,
                    meta,
                    excl,
                    data,
                });
            }
            op::STAT => Request::Stat { path: r.string()? },
            op::HAS_CHILDREN => Request::HasChildren { path: r.string()? },
            op::WRITE => {
                let path = r.string()?;
                let fileid = r.u32()?;
                let chunk_size = r.u32()?;
                let mode = r.u32()?;
                let idx = r.u64()?;
                let off = r.u32()?;
                let flags = r.u16()?;
                let epoch = r.u32()?;
                let data = r.rest();
                return Ok(Request::Write {
                    flags,
                    epoch,
                    path,
                    fileid,
                    chunk_size,
                    mode,
                    idx,
                    off,
                    data,
                });
            }
            op::READ => Request::Read {
                path: r.string()?,
                fileid: r.u32()?,
                idx: r.u64()?,
                off: r.u32()?,
                len: r.u32()?,
                chunk_size: r.u32()?,
                flags: r.u16()?,
                epoch: r.u32()?,
            },
            op::WRITE_SPANS => {
                let path = r.string()?;
                let fileid = r.u32()?;
                let chunk_size = r.u32()?;
                let mode = r.u32()?;
                let flags = r.u16()?;
                let epoch = r.u32()?;
                let (spans, total) = get_spans(&mut r)?;
                let data = r.rest();
                // (None: they move by RMA, `FLAG_RMA`.)
                if total != data.len() as u64 && !data.is_empty() {
                    return Err(ProtoError::Malformed(format!(
                        "spans of {total} bytes with {} bytes of data",
                        data.len()
                    )));
                }
                return Ok(Request::WriteSpans {
                    path,
                    fileid,
                    chunk_size,
                    mode,
                    flags,
                    epoch,
                    spans,
                    data,
                });
            }
            op::READ_SPANS | op::READ_SPANS_PLACED => {
                let path = r.string()?;
                let fileid = r.u32()?;
                let chunk_size = r.u32()?;
                let flags = r.u16()?;
                let epoch = r.u32()?;
                let (spans, total) = get_spans(&mut r)?;
                if total > crate::MAX_CHUNK_SIZE as u64 {
                    return Err(ProtoError::Malformed(format!(
                        "spans of {total} bytes (at most {})",
                        crate::MAX_CHUNK_SIZE
                    )));
                }
                let r = Request::ReadSpans {
                    path,
                    fileid,
                    chunk_size,
                    flags,
                    epoch,
                    spans,
                };
                if op == op::READ_SPANS_PLACED {
                    r.into_placed()
                } else {
                    r
                }
            }
            op::FLUSH_STATUS => Request::FlushStatus {
                prefix: r.string()?,
            },
            op::FLUSH => Request::Flush {
                prefix: r.string()?,
            },
            op::SET_SIZE => Request::SetSize {
                path: r.string()?,
                size: r.u64()?,
                grow_only: r.bool()?,
                stray: r.bool()?,
                if_size: if r.bool()? { Some(r.u64()?) } else { None },
            },
            op::SET_ATTR => Request::SetAttr {
                path: r.string()?,
                attr: SetAttr {
                    mode: get_opt(&mut r)?,
                    uid: get_opt(&mut r)?,
                    gid: get_opt(&mut r)?,
                    atime: get_time(&mut r)?,
                    mtime: get_time(&mut r)?,
                },
            },
            op::REMOVE_ENTRY => {
                let path = r.string()?;
                let kind = match r.u8()? {
                    0 => RemoveKind::NotDir,
                    1 => RemoveKind::Dir,
                    v => return Err(ProtoError::Malformed(format!("remove kind {v}"))),
                };
                Request::RemoveEntry { path, kind }
            }
            op::REMOVE_CHUNKS => Request::RemoveChunks {
                path: r.string()?,
                from_idx: r.u64()?,
            },
            op::TRUNCATE_CHUNKS => Request::TruncateChunks {
                path: r.string()?,
                size: r.u64()?,
                chunk_size: r.u32()?,
            },
            op::READDIR => Request::Readdir {
                path: r.string()?,
                after: r.string()?,
                max: r.u32()?,
            },
            op::RENAME_MOVE => Request::RenameMove {
                old: r.string()?,
                new: r.string()?,
                is_dir: r.bool()?,
            },
            op::PUT_CHUNK | op::ADOPT_CHUNK => {
                let path = r.string()?;
                let idx = r.u64()?;
                let meta = get_meta(&mut r)?;
                let data = r.rest();
                return Ok(if op == op::PUT_CHUNK {
                    Request::PutChunk {
                        path,
                        idx,
                        meta,
                        data,
                    }
                } else {
                    Request::AdoptChunk {
                        path,
                        idx,
                        meta,
                        data,
                    }
                });
            }
            op::READDIR_DIRS => Request::ReaddirDirs {
                path: r.string()?,
                after: r.string()?,
                max: r.u32()?,
            },
            op::APPEND_RESERVE => Request::AppendReserve {
                path: r.string()?,
                len: r.u64()?,
            },
            other => return Err(ProtoError::UnknownOp(other)),
        };
        r.finish()?;
        Ok(req)
    }
}

/// First byte of a [`Response::Data`] payload: the data follows it to the
/// end of the frame (a client may read it straight into its own buffer).
pub const DATA_TAG: u8 = tag::DATA;

mod tag {
    pub const OK: u8 = 0;
    pub const SERVERS: u8 = 1;
    pub const STATUS: u8 = 2;
    pub const META: u8 = 3;
    pub const CREATED: u8 = 4;
    pub const WRITTEN: u8 = 5;
    pub const DATA: u8 = 6;
    pub const ENTRIES: u8 = 7;
    pub const BOOL: u8 = 8;
    pub const COUNT: u8 = 9;
    pub const FLUSH: u8 = 10;
    pub const REBALANCE: u8 = 11;
    pub const SIZED: u8 = 12;
    pub const TREE: u8 = 13;
    pub const DIR_VERSION: u8 = 14;
    pub const META_DATA: u8 = 15;
}

impl Response {
    /// Encodes the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Response::Ok => out.put_u8(tag::OK),
            Response::Servers(l) => {
                out.put_u8(tag::SERVERS);
                put_list(out, l)
            }
            Response::Status(s) => {
                out.put_u8(tag::STATUS);
                out.put_str(&s.addr);
                out.put_str(&s.store);
                out.put_u64(s.entries);
                out.put_u64(s.bytes);
                out.put_u64(s.capacity);
                out.put_u64(s.requests);
                out.put_u64(s.forwarded);
                out.put_u64(s.reads);
                out.put_u64(s.writes);
                out.put_u64(s.cma_writes);
                out.put_u64(s.shm_writes);
                out.put_u64(s.list_version);
                out.put_u64(s.since);
                out.put_u64(s.lost);
                out.put_u64(s.refused);
                out.put_u64(s.denied);
                out.put_u64(s.over_limit);
                out.put_u64(s.idle_closed);
                out.put_u64(s.throttled);
                out.put_u64(s.poll_hits);
                out.put_u64(s.poll_misses);
                out.put_u64(s.cpu_ns);
                out.put_u64(s.connections);
                out.put_u64(s.peers);
                out.put_u64(s.lookups);
                out.put_u64(s.lookup_hits);
                out.put_u64(s.lookup_forwards);
                out.put_u64(s.node_local_entries);
                out.put_u64(s.node_local_bytes);
                out.put_u64(s.fabric_sessions);
                out.put_u64(s.fabric_expired);
                out.put_u64(s.rma_pulls);
                out.put_u64(s.rma_pushes);
                out.put_u64(s.reg_fallbacks);
                out.put_u64(s.fabric_peers);
                out.put_u64(s.fabric_no_session);
                out.put_u64(s.fabric_no_session_dropped);
                out.put_u64(s.fabric_replies_dropped);
                out.put_u64(s.fabric_lent_pulls);
                out.put_u64(s.fabric_rma_most);
                out.put_u64(s.fabric_hellos_dropped);
                out.put_u64(s.shm_reads);
                out.put_u64(s.rss);
                out.put_u64(s.heap_free);
                out.put_u64(s.heap_trims);
                out.put_str(&s.backend);
                put_flush(out, &s.flush);
            }
            Response::Meta(m) => {
                out.put_u8(tag::META);
                put_meta(out, m)
            }
            Response::Created { meta, created } => {
                out.put_u8(tag::CREATED);
                put_meta(out, meta);
                out.put_u8(*created as u8)
            }
            Response::Written(n) => {
                out.put_u8(tag::WRITTEN);
                out.put_u32(*n)
            }
            Response::Data(d) => {
                out.put_u8(tag::DATA);
                out.extend_from_slice(d)
            }
            Response::Entries { entries, done } => {
                out.put_u8(tag::ENTRIES);
                out.put_u8(*done as u8);
                out.put_u32(entries.len() as u32);
                for e in entries {
                    out.put_str(&e.name);
                    put_meta(out, &e.meta);
                }
            }
            Response::Bool(b) => {
                out.put_u8(tag::BOOL);
                out.put_u8(*b as u8)
            }
            Response::FlushState(f) => {
                out.put_u8(tag::FLUSH);
                put_flush(out, f)
            }
            Response::Count(c) => {
                out.put_u8(tag::COUNT);
                out.put_u64(*c)
            }
            Response::Sized { meta, before } => {
                out.put_u8(tag::SIZED);
                put_meta(out, meta);
                out.put_u64(*before);
            }
            Response::MetaData { meta, data } => {
                out.put_u8(tag::META_DATA);
                put_meta(out, meta);
                out.extend_from_slice(data);
            }
            Response::Tree(t) => put_tree(out, t),
            Response::DirVersion(v) => {
                out.put_u8(tag::DIR_VERSION);
                out.put_u64(v.born);
                out.put_u64(v.changes);
                out.put_u64(v.list);
            }
            Response::Rebalance(b) => {
                out.put_u8(tag::REBALANCE);
                out.put_u8(b.running as u8);
                out.put_u64(b.version);
                out.put_u64(b.moved);
                out.put_u64(b.kept);
                out.put_u64(b.failed);
                out.put_str(&b.last_error);
                out.put_u32(b.last_errno as u32);
            }
        }
    }

    /// Decodes a success payload.
    pub fn decode(payload: Bytes) -> Result<Self, ProtoError> {
        let mut r = Reader::new(payload);
        let resp = match r.u8()? {
            tag::OK => Response::Ok,
            tag::SERVERS => Response::Servers(get_list(&mut r)?),
            tag::STATUS => Response::Status(Box::new(ServerStatus {
                addr: r.string()?,
                store: r.string()?,
                entries: r.u64()?,
                bytes: r.u64()?,
                capacity: r.u64()?,
                requests: r.u64()?,
                forwarded: r.u64()?,
                reads: r.u64()?,
                writes: r.u64()?,
                cma_writes: r.u64()?,
                shm_writes: r.u64()?,
                list_version: r.u64()?,
                since: r.u64()?,
                lost: r.u64()?,
                refused: r.u64()?,
                denied: r.u64()?,
                over_limit: r.u64()?,
                idle_closed: r.u64()?,
                throttled: r.u64()?,
                poll_hits: r.u64()?,
                poll_misses: r.u64()?,
                cpu_ns: r.u64()?,
                connections: r.u64()?,
                peers: r.u64()?,
                lookups: r.u64()?,
                lookup_hits: r.u64()?,
                lookup_forwards: r.u64()?,
                node_local_entries: r.u64()?,
                node_local_bytes: r.u64()?,
                fabric_sessions: r.u64()?,
                fabric_expired: r.u64()?,
                rma_pulls: r.u64()?,
                rma_pushes: r.u64()?,
                reg_fallbacks: r.u64()?,
                fabric_peers: r.u64()?,
                fabric_no_session: r.u64()?,
                fabric_no_session_dropped: r.u64()?,
                fabric_replies_dropped: r.u64()?,
                fabric_lent_pulls: r.u64()?,
                fabric_rma_most: r.u64()?,
                fabric_hellos_dropped: r.u64()?,
                shm_reads: r.u64()?,
                rss: r.u64()?,
                heap_free: r.u64()?,
                heap_trims: r.u64()?,
                backend: r.string()?,
                flush: get_flush(&mut r)?,
            })),
            tag::META => Response::Meta(get_meta(&mut r)?),
            tag::SIZED => Response::Sized {
                meta: get_meta(&mut r)?,
                before: r.u64()?,
            },
            tag::META_DATA => {
                let meta = get_meta(&mut r)?;
                return Ok(Response::MetaData {
                    meta,
                    data: r.rest(),
                });
            }
            tag::CREATED => Response::Created {
                meta: get_meta(&mut r)?,
                created: r.bool()?,
            },
            tag::WRITTEN => Response::Written(r.u32()?),
            tag::DATA => return Ok(Response::Data(r.rest())),
            tag::ENTRIES => {
                let done = r.bool()?;
                let n = r.u32()? as usize;
                // As many as the payload can hold (each at least a name
                // length and a record), not what the count claims.
                let mut entries = Vec::with_capacity(n.min(r.remaining() / (4 + META_LEN)));
                for _ in 0..n {
                    entries.push(DirEntry {
                        name: r.string()?,
                        meta: get_meta(&mut r)?,
                    });
                }
                Response::Entries { entries, done }
            }
            tag::TREE => Response::Tree(get_tree(&mut r)?),
            tag::DIR_VERSION => Response::DirVersion(DirVersion {
                born: r.u64()?,
                changes: r.u64()?,
                list: r.u64()?,
            }),
            tag::BOOL => Response::Bool(r.bool()?),
            tag::COUNT => Response::Count(r.u64()?),
            tag::FLUSH => Response::FlushState(get_flush(&mut r)?),
            tag::REBALANCE => Response::Rebalance(RebalanceState {
                running: r.bool()?,
                version: r.u64()?,
                moved: r.u64()?,
                kept: r.u64()?,
                failed: r.u64()?,
                last_error: r.string()?,
                last_errno: r.u32()? as i32,
            }),
            t => return Err(ProtoError::Malformed(format!("response tag {t}"))),
        };
        r.finish()?;
        Ok(resp)
    }
}

/// A [`Response::Tree`]: tag, `done`, whether metadata records follow
/// the entries, the count, then per entry the bytes its path shares with
/// the previous entry's (u16), the length of the rest (u16), the rest,
/// the file type (u8) and, with metadata, the 64-byte record. Paths in a
/// directory share most of their bytes: the page is about a third of the
/// size of one with whole paths.
fn put_tree(out: &mut Vec<u8>, t: &TreePage) {
    let with_meta = !t.metas.is_empty();
    out.put_u8(tag::TREE);
    out.put_u8(t.done as u8);
    out.put_u8(with_meta as u8);
    out.put_u32(t.ends.len() as u32);
    out.reserve(t.paths.len() / 2 + t.ends.len() * (5 + if with_meta { META_LEN } else { 0 }));
    let mut prev: &[u8] = &[];
    for i in 0..t.ends.len() {
        let p = t.path(i).as_bytes();
        let shared = common_prefix(p, prev).min(u16::MAX as usize);
        let rest = &p[shared..];
        out.put_u16(shared as u16);
        out.put_u16(rest.len() as u16);
        out.extend_from_slice(rest);
        out.put_u8(t.kinds[i]);
        if with_meta {
            put_meta(out, &t.metas[i]);
        }
        prev = p;
    }
}

/// How many bytes `a` and `b` start with in common (8 at a time).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or_default());
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let d = x ^ y;
        if d != 0 {
            return i + (d.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

fn get_tree(r: &mut Reader) -> Result<TreePage, ProtoError> {
    let done = r.bool()?;
    let with_meta = r.bool()?;
    let n = r.u32()? as usize;
    // As many as the payload can hold, not what the count claims.
    let fit = n.min(r.remaining() / (5 + if with_meta { META_LEN } else { 0 }));
    let mut t = TreePage {
        done,
        ends: Vec::with_capacity(fit),
        kinds: Vec::with_capacity(fit),
        metas: Vec::with_capacity(if with_meta { fit } else { 0 }),
        ..Default::default()
    };
    let mut paths: Vec<u8> = Vec::with_capacity(r.remaining());
    let mut start = 0usize;
    for _ in 0..n {
        let shared = r.u16()? as usize;
        let len = r.u16()? as usize;
        if shared > paths.len() - start {
            return Err(ProtoError::Malformed(format!(
                "tree entry shares {shared} bytes of a {}-byte path",
                paths.len() - start
            )));
        }
        let here = paths.len();
        paths.extend_from_within(start..start + shared);
        r.copied(len, |b| paths.extend_from_slice(b))?;
        start = here;
        if paths.len() > u32::MAX as usize {
            return Err(ProtoError::Malformed("tree page too large".into()));
        }
        t.ends.push(paths.len() as u32);
        t.kinds.push(r.u8()?);
        if with_meta {
            t.metas.push(get_meta(r)?);
        }
    }
    t.paths = String::from_utf8(paths)
        .map_err(|_| ProtoError::Malformed("tree path not UTF-8".into()))?;
    // Each path must be a string of its own, not only all of them together.
    if !t.ends.iter().all(|&e| t.paths.is_char_boundary(e as usize)) {
        return Err(ProtoError::Malformed("tree path not UTF-8".into()));
    }
    Ok(t)
}

/// Encodes an error payload.
pub fn encode_error(out: &mut Vec<u8>, e: &ErrorReply) {
    out.extend_from_slice(&e.errno.to_le_bytes());
    out.put_str(&e.message);
}

/// Decodes an error payload.
pub fn decode_error(payload: Bytes) -> Result<ErrorReply, ProtoError> {
    let mut r = Reader::new(payload);
    let errno = r.i32()?;
    let message = r.string()?;
    r.finish()?;
    Ok(ErrorReply { errno, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_page_cut_keeps_whole_entries_and_is_not_the_last() {
        let m = |mode| Meta {
            mode,
            ..Default::default()
        };
        for with_meta in [false, true] {
            let mut p = TreePage::default();
            p.push("/a", &m(0o040755), with_meta);
            p.push("/a/bb", &m(0o100644), with_meta);
            p.push("/a/ccc", &m(0o120777), with_meta);
            p.done = true;
            let whole = p.clone();
            p.truncate(3);
            assert_eq!(p, whole, "nothing dropped: still the last page");
            p.truncate(2);
            assert!(!p.done);
            assert_eq!(
                (p.len(), p.path(1), p.paths.as_str()),
                (2, "/a/bb", "/a/a/bb")
            );
            assert_eq!(p.kinds, [4, 8]);
            assert_eq!(p.metas.len(), if with_meta { 2 } else { 0 });
            let mut b = Vec::new();
            Response::Tree(p.clone()).encode(&mut b);
            assert_eq!(
                Response::decode(Bytes::from(b)).unwrap(),
                Response::Tree(p.clone())
            );
            p.truncate(0);
            assert!(p.is_empty() && p.paths.is_empty() && !p.done);
        }
    }

    #[test]
    fn the_opcode_table_names_every_opcode_once() {
        let mut seen = std::collections::BTreeSet::new();
        for &o in op::ALL {
            assert!(seen.insert(o), "opcode {o} twice");
            let name = op::name(o).unwrap();
            assert!(!name.is_empty());
        }
        assert_eq!(op::name(op::WRITE), Some("WRITE"));
        assert_eq!(op::name(0), None);
        assert_eq!(Request::Sync.op(), op::SYNC);
    }

    #[test]
    fn common_prefixes() {
        for (a, b, n) in [
            ("", "", 0),
            ("a", "", 0),
            ("/tree/d0001/f00001", "/tree/d0001/f00002", 17),
            ("/tree/d0001/f00001", "/tree/d0001/f00001", 18),
            ("/tree/d0001/f00001", "/tree/d0001/f0000", 17),
            ("abcdefgh", "abcdefgx", 7),
            ("abcdefghijklmnop", "abcdefghijklmnoq", 15),
            ("xbcdefghijklmnop", "abcdefghijklmnoq", 0),
        ] {
            assert_eq!(common_prefix(a.as_bytes(), b.as_bytes()), n, "{a} {b}");
            assert_eq!(common_prefix(b.as_bytes(), a.as_bytes()), n, "{b} {a}");
        }
    }

    #[test]
    fn tree_pages_refuse_bad_front_coding() {
        let page = |entries: &[(u16, &[u8])]| {
            let mut b = vec![tag::TREE, 1, 0];
            b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for (shared, rest) in entries {
                b.extend_from_slice(&shared.to_le_bytes());
                b.extend_from_slice(&(rest.len() as u16).to_le_bytes());
                b.extend_from_slice(rest);
                b.push(8);
            }
            Response::decode(Bytes::from(b))
        };
        let ok = page(&[(0, b"/a"), (2, b"b"), (1, b"c")]).unwrap();
        let Response::Tree(t) = ok else { panic!() };
        assert_eq!((t.path(0), t.path(1), t.path(2)), ("/a", "/ab", "/c"));
        // More shared bytes than the previous path has.
        assert!(page(&[(0, b"/a"), (3, b"b")]).is_err());
        assert!(page(&[(1, b"/a")]).is_err());
        // "/é" cut inside the character: each path must be UTF-8 alone.
        assert!(page(&[(0, b"/\xc3"), (0, b"\xa9")]).is_err());
        assert!(page(&[(0, "/é".as_bytes()), (2, b"x")]).is_err());
        // A count larger than the payload.
        let mut b = vec![tag::TREE, 1, 0];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Response::decode(Bytes::from(b)).is_err());
    }

    thread_local! {
        /// The opcodes `rt` has checked on this thread.
        static SEEN: std::cell::RefCell<std::collections::BTreeSet<u16>> =
            const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
    }

    fn rt(req: Request) {
        SEEN.with(|s| s.borrow_mut().insert(req.op()));
        let mut b = Vec::new();
        req.encode(&mut b);
        assert_eq!(
            Request::decode(req.op(), Bytes::from(b.clone())).unwrap(),
            req
        );
        // Whether the decoded request still refers to the payload's
        // buffer is what `keeps_payload` says.
        if b.is_empty() {
            return;
        }
        let mut whole = bytes::BytesMut::from(&b[..]);
        let payload = whole.split().freeze();
        let decoded = Request::decode(req.op(), payload).unwrap();
        let free = whole.try_reclaim(b.len());
        assert_eq!(keeps_payload(req.op()), !free, "{:?}", op::name(req.op()));
        drop(decoded);
        assert!(whole.try_reclaim(b.len()));
    }

    /// A `WriteSpans` whose data is not as long as its spans add up to is
    /// malformed (one byte short, one too many).
    #[test]
    fn write_spans_data_must_match_the_spans() {
        let mut b = Vec::new();
        encode_write_spans_head(
            &mut b,
            &WriteSpansHead {
                path: "/a",
                fileid: 1,
                chunk_size: 9,
                mode: 0o100644,
                flags: 0,
                epoch: 0,
                spans: &[(1, 0, 3), (2, 0, 2)],
            },
        );
        // (No data at all: it moves by RMA.)
        for (data, ok) in [
            (&b"abcd"[..], false),
            (b"abcde", true),
            (b"abcdef", false),
            (b"", true),
        ] {
            let mut p = b.clone();
            p.extend_from_slice(data);
            let r = Request::decode(op::WRITE_SPANS, Bytes::from(p));
            assert_eq!(r.is_ok(), ok, "{} bytes: {r:?}", data.len());
        }
    }

    #[test]
    fn requests_round_trip() {
        let meta = Meta {
            mode: 0o100644,
            size: 7,
            chunk_size: 4096,
            fileid: 9,
            ..Default::default()
        };
        rt(Request::Ping);
        rt(Request::NodeLocal {
            prefix: "/.nodelocal".into(),
        });
        rt(Request::NodeLocal {
            prefix: String::new(),
        });
        rt(Request::Lane { cpu: 7 });
        rt(Request::Lookup {
            path: "/in/x".into(),
            max_age_ms: 1000,
        });
        rt(Request::WatchStat {
            path: "/in/x".into(),
            contact: "h:1".into(),
            keep_ms: 1000,
        });
        rt(Request::Invalidate {
            path: "/in/x".into(),
        });
        rt(Request::ShmAttach {
            fd: 5,
            base: 0x7f00_0000_1000,
            len: 3 << 20,
        });
        rt(Request::Join {
            addr: "h:1".into(),
            fresh: true,
        });
        rt(Request::UpdateServers {
            list: ServerList {
                version: 3,
                hashing: Hashing::Consistent,
                servers: vec!["a:1".into(), "b:2".into()],
                since: vec![0, 3],
            },
        });
        rt(Request::Create {
            path: "/a".into(),
            meta,
            excl: true,
            data: Bytes::from_static(b"tgt"),
        });
        rt(Request::Write {
            path: "/a".into(),
            fileid: 1,
            chunk_size: 4,
            mode: 0o644,
            idx: 5,
            off: 2,
            flags: rw::BACKEND,
            epoch: 7,
            data: Bytes::from_static(b"xy"),
        });
        rt(Request::Read {
            path: "/a".into(),
            fileid: 1,
            idx: 2,
            off: 3,
            len: 4,
            chunk_size: 9,
            flags: 0,
            epoch: 3,
        });
        rt(Request::ReadSpans {
            path: "/a".into(),
            fileid: 1,
            chunk_size: 9,
            flags: rw::DAMAGED,
            epoch: 3,
            spans: vec![(2, 0, 2), (4, 5, 4)],
        });
        rt(Request::ReadSpansPlaced {
            path: "/a".into(),
            fileid: 1,
            chunk_size: 9,
            flags: 0,
            epoch: 3,
            spans: vec![(2, 0, 9), (4, 5, 4)],
        });
        rt(Request::WriteSpans {
            path: "/a".into(),
            fileid: 1,
            chunk_size: 9,
            mode: 0o100644,
            flags: rw::MODIFIED,
            epoch: 3,
            spans: vec![(2, 0, 2), (4, 5, 4)],
            data: Bytes::from_static(b"abcdef"),
        });
        for (if_size, stray) in [(None, false), (Some(9), false), (None, true)] {
            rt(Request::SetSize {
                path: "/a".into(),
                size: 4,
                grow_only: true,
                if_size,
                stray,
            });
        }
        rt(Request::SetAttr {
            path: "/a".into(),
            attr: SetAttr {
                mode: Some(0o600),
                uid: None,
                gid: Some(5),
                atime: TimeSet::Now,
                mtime: TimeSet::At(-5),
            },
        });
        rt(Request::RemoveEntry {
            path: "/a".into(),
            kind: RemoveKind::Dir,
        });
        rt(Request::Readdir {
            path: "/".into(),
            after: "x".into(),
            max: 10,
        });
        rt(Request::ReaddirDirs {
            path: "/d".into(),
            after: "y".into(),
            max: 7,
        });
        rt(Request::RenameMove {
            old: "/a".into(),
            new: "/b".into(),
            is_dir: true,
        });
        rt(Request::PutChunk {
            path: "/a".into(),
            idx: 1,
            meta,
            data: Bytes::from_static(b"q"),
        });
        rt(Request::Flush { prefix: "/".into() });
        rt(Request::Sync);
        rt(Request::Rebalance { start: true });
        rt(Request::AdoptChunk {
            path: "/b".into(),
            idx: 2,
            meta,
            data: Bytes::from_static(b"zz"),
        });
        rt(Request::FlushStatus {
            prefix: "/d".into(),
        });
        rt(Request::AppendReserve {
            path: "/a".into(),
            len: 10,
        });
        rt(Request::TruncateChunks {
            path: "/a".into(),
            size: 10,
            chunk_size: 4,
        });
        rt(Request::GetServers);
        rt(Request::Status);
        rt(Request::Shutdown);
        rt(Request::Stat { path: "/a".into() });
        rt(Request::RemoveChunks {
            path: "/a".into(),
            from_idx: 3,
        });
        rt(Request::HasChildren { path: "/d".into() });
        for flags in [0, tree::META] {
            rt(Request::ListTree {
                prefix: "/d".into(),
                after: "/d/x/y".into(),
                max: 100,
                flags,
            });
        }
        rt(Request::DirVersion { path: "/d".into() });
        rt(Request::StatData {
            path: "/a".into(),
            max: 65536,
        });
        // Every opcode was checked (its round trip, and that
        // `keeps_payload` tells whether its decoded value keeps the
        // payload's buffer, which a server reuses for those that don't):
        // a new request must be added here.
        let seen = SEEN.with(|s| s.borrow().clone());
        let missing: Vec<_> = op::ALL
            .iter()
            .filter(|o| !seen.contains(o))
            .map(|&o| op::name(o))
            .collect();
        assert!(missing.is_empty(), "requests not checked: {missing:?}");
    }

    #[test]
    fn responses_round_trip() {
        let meta = Meta {
            mode: 0o40755,
            ..Default::default()
        };
        for resp in [
            Response::Ok,
            Response::Data(Bytes::from_static(b"hello")),
            Response::Created {
                meta,
                created: true,
            },
            Response::Entries {
                entries: vec![DirEntry {
                    name: "n".into(),
                    meta,
                }],
                done: true,
            },
            Response::Status(Box::new(ServerStatus {
                addr: "a".into(),
                entries: 4,
                since: 5,
                lost: 6,
                refused: 7,
                denied: 8,
                over_limit: 9,
                idle_closed: 10,
                throttled: 11,
                poll_hits: 12,
                poll_misses: 13,
                cpu_ns: 14,
                connections: 15,
                peers: 16,
                fabric_sessions: 17,
                rma_pulls: 18,
                reg_fallbacks: 19,
                fabric_no_session_dropped: 20,
                fabric_replies_dropped: 21,
                fabric_lent_pulls: 22,
                fabric_rma_most: 23,
                fabric_hellos_dropped: 24,
                shm_reads: 25,
                rss: 26,
                heap_free: 27,
                heap_trims: 28,
                ..Default::default()
            })),
            Response::Count(7),
            Response::Sized { meta, before: 9 },
            Response::MetaData {
                meta,
                data: Bytes::from_static(b"abc"),
            },
            Response::MetaData {
                meta,
                data: Bytes::new(),
            },
            Response::DirVersion(DirVersion {
                born: 1,
                changes: 2,
                list: 3,
            }),
            Response::FlushState(FlushState {
                chunks: 1,
                bytes: 2,
                failing: 3,
                last_error: "x".into(),
                last_errno: libc::EACCES,
            }),
            Response::Rebalance(RebalanceState {
                running: true,
                version: 3,
                moved: 4,
                kept: 5,
                failed: 6,
                last_error: "y".into(),
                last_errno: libc::ETIMEDOUT,
            }),
        ] {
            let mut b = Vec::new();
            resp.encode(&mut b);
            assert_eq!(Response::decode(Bytes::from(b)).unwrap(), resp);
        }
    }

    #[test]
    fn truncated_and_garbage_payloads_are_errors() {
        let mut b = Vec::new();
        Request::Read {
            path: "/a".into(),
            fileid: 1,
            idx: 2,
            off: 3,
            len: 4,
            chunk_size: 9,
            flags: 0,
            epoch: 5,
        }
        .encode(&mut b);
        for n in 0..b.len() {
            assert!(Request::decode(op::READ, Bytes::copy_from_slice(&b[..n])).is_err());
        }
        assert!(Request::decode(999, Bytes::new()).is_err());
        assert!(Response::decode(Bytes::from_static(&[200, 1, 2])).is_err());
    }

    /// The bytes of a read and a write request, field by field: a change
    /// of the wire format cannot pass unnoticed.
    #[test]
    fn golden_read_and_write_requests() {
        let mut b = Vec::new();
        Request::Read {
            path: "/ab".into(),
            fileid: 0x0102_0304,
            idx: 5,
            off: 6,
            len: 7,
            chunk_size: 8,
            flags: rw::BACKEND,
            epoch: 9,
        }
        .encode(&mut b);
        #[rustfmt::skip]
        let want: &[u8] = &[
            3, 0, 0, 0, b'/', b'a', b'b', // path
            4, 3, 2, 1,                   // fileid
            5, 0, 0, 0, 0, 0, 0, 0,       // idx
            6, 0, 0, 0,                   // off
            7, 0, 0, 0,                   // len
            8, 0, 0, 0,                   // chunk size
            1, 0,                         // flags
            9, 0, 0, 0,                   // epoch
        ];
        assert_eq!(b, want);
        let mut b = Vec::new();
        Request::Write {
            path: "/x".into(),
            fileid: 1,
            chunk_size: 2,
            mode: 0o100644,
            idx: 3,
            off: 4,
            flags: 0,
            epoch: 5,
            data: Bytes::from_static(b"zz"),
        }
        .encode(&mut b);
        #[rustfmt::skip]
        let want: &[u8] = &[
            2, 0, 0, 0, b'/', b'x',      // path
            1, 0, 0, 0,                  // fileid
            2, 0, 0, 0,                  // chunk size
            0xa4, 0x81, 0, 0,            // mode
            3, 0, 0, 0, 0, 0, 0, 0,      // idx
            4, 0, 0, 0,                  // off
            0, 0,                        // flags
            5, 0, 0, 0,                  // epoch
            b'z', b'z',                  // data (payload tail)
        ];
        assert_eq!(b, want);
    }

    #[test]
    fn placed_spans_go_at_their_places_in_the_file() {
        // 64 KiB chunks: a pread from 100,000 of 200,000 bytes, this
        // server's parts chunks 1 and 3.
        let spans = [(1u64, 34_464u32, 31_072u32), (3, 0, 65_536)];
        assert_eq!(
            span_places(65_536, &spans).unwrap(),
            vec![(0, 31_072), (96_608, 65_536)]
        );
        assert_eq!(span_places(65_536, &[]).unwrap(), vec![]);
        // Out of order, overlapping, or past 2^64: refused.
        for bad in [
            vec![(3u64, 0u32, 10u32), (1, 0, 10)],
            vec![(1, 0, 100), (1, 50, 10)],
            vec![(u64::MAX, 0, 1)],
        ] {
            assert_eq!(
                span_places(65_536, &bad).unwrap_err().errno,
                libc::EINVAL,
                "{bad:?}"
            );
        }
        // Adjacent spans are fine.
        assert_eq!(
            span_places(10, &[(0, 5, 5), (1, 0, 10)]).unwrap(),
            vec![(0, 5), (5, 10)]
        );
    }
}
