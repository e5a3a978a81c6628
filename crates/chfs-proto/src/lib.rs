//! The chfs-rs wire protocol.
//!
//! Everything two chfs-rs processes must agree on lives here and nowhere else:
//! the connection handshake ([`handshake`]), the frame layout ([`frame`]),
//! the request/response messages ([`msg`]), the 64-byte metadata record
//! ([`meta`]), path rules ([`path`]) and the placement of chunks on servers
//! ([`ring`]). The crate does no I/O of its own, so both the blocking client
//! and the async server use it.

pub mod codec;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod meta;
pub mod msg;
pub mod path;
pub mod ring;

pub use error::{ErrorReply, ProtoError};
pub use meta::Meta;
pub use msg::{Request, Response};

/// Protocol version spoken by this build. Bumped on any incompatible change
/// (2: `FLAG_CMA` and `ServerStatus::cma_writes`; 3: `ShmAttach` and
/// `ServerStatus::shm_writes`; 4: file epochs in `Read`/`Write`,
/// `ServerList::since`, `Join::fresh`, `SetSize::if_size`,
/// `ServerStatus::since`/`lost`; 5: challenge-response handshake with
/// roles, `Response::Sized`; 6: `SetSize::stray`, errnos in the flush and
/// rebalance states, `ServerStatus::forwarded`/`reads`/`writes`; 8:
/// `Lookup`, `WatchStat`, `Invalidate`, `ServerStatus::lookups`/`lookup_hits`/`lookup_forwards`/
/// `node_local_entries`/`node_local_bytes`; 9: `NodeLocal`; 10:
/// `ServerStatus::fabric_sessions`/`fabric_expired`/`rma_pulls`/
/// `rma_pushes`/`reg_fallbacks`; 11: `ServerStatus::fabric_peers`/
/// `fabric_no_session`/`fabric_no_session_dropped`, and over the fabric
/// lent frames, `FLAG_LENT` and `OP_RELEASE` of chfs-fabric's `rpc`; 12:
/// `ServerStatus::fabric_replies_dropped`/`fabric_lent_pulls`/
/// `fabric_rma_most`/`fabric_hellos_dropped`; 13: `FLAG_LAND` and
/// `ServerStatus::shm_reads`).
pub const PROTOCOL_VERSION: u16 = 13;

/// Largest chunk size a file may have (64 MiB).
pub const MAX_CHUNK_SIZE: u32 = 64 << 20;

/// Default chunk size (64 KiB, as in CHFS).
pub const DEFAULT_CHUNK_SIZE: u32 = 64 << 10;

/// Default TCP port of `chfsd`.
pub const DEFAULT_PORT: u16 = 50000;

/// Name of the abstract Unix socket (Linux, no file) on which the server
/// advertised as `addr` (`host:port`) also listens, for clients on its
/// host. Abstract names belong to a network namespace, so only processes
/// that share the server's network can reach it.
pub fn local_socket_name(addr: &str) -> String {
    format!("chfsd@{addr}")
}
