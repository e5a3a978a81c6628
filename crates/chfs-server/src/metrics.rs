//! Counter names and the counters themselves, in one place.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests served (all kinds).
pub const REQUESTS: &str = "chfsd.requests";
/// Requests forwarded to their owner.
pub const FORWARDED: &str = "chfsd.forwarded";
/// Connections refused at the handshake.
pub const REFUSED: &str = "chfsd.refused_connections";
/// Write requests served.
pub const WRITES: &str = "chfsd.writes";
/// Read requests served.
pub const READS: &str = "chfsd.reads";

/// Write requests whose data was copied from the client's memory
/// (cross-memory attach, local clients).
pub const CMA_WRITES: &str = "chfsd.cma_writes";

/// Of those, writes copied from a shared-memory window the client
/// attached (`ShmAttach`).
pub const SHM_WRITES: &str = "chfsd.shm_writes";

/// Reads and writes refused with EIO because the chunk may have been lost
/// with an earlier incarnation of this server's store.
pub const LOST: &str = "chfsd.lost_chunks";

/// Requests refused because the connection's role may not make them.
pub const DENIED: &str = "chfsd.denied_requests";

/// Connections refused: too many from one host or local user.
pub const OVER_LIMIT: &str = "chfsd.connections_over_limit";
/// Connections closed for idleness (or a request stalled half way).
pub const IDLE_CLOSED: &str = "chfsd.idle_connections_closed";
/// Requests that waited for their connection's in-flight or memory budget.
pub const THROTTLED: &str = "chfsd.throttled_requests";

/// The server's counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// [`REQUESTS`]
    pub requests: AtomicU64,
    /// [`FORWARDED`]
    pub forwarded: AtomicU64,
    /// [`REFUSED`]
    pub refused: AtomicU64,
    /// [`WRITES`]
    pub writes: AtomicU64,
    /// [`READS`]
    pub reads: AtomicU64,
    /// [`CMA_WRITES`]
    pub cma_writes: AtomicU64,
    /// [`SHM_WRITES`]
    pub shm_writes: AtomicU64,
    /// [`LOST`]
    pub lost: AtomicU64,
    /// [`DENIED`]
    pub denied: AtomicU64,
    /// [`OVER_LIMIT`]
    pub over_limit: AtomicU64,
    /// [`IDLE_CLOSED`]
    pub idle_closed: AtomicU64,
    /// [`THROTTLED`]
    pub throttled: AtomicU64,
}

impl Counters {
    /// Increments a counter.
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// All counters with their names.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        vec![
            (REQUESTS, self.requests.load(Ordering::Relaxed)),
            (FORWARDED, self.forwarded.load(Ordering::Relaxed)),
            (REFUSED, self.refused.load(Ordering::Relaxed)),
            (WRITES, self.writes.load(Ordering::Relaxed)),
            (READS, self.reads.load(Ordering::Relaxed)),
            (CMA_WRITES, self.cma_writes.load(Ordering::Relaxed)),
            (SHM_WRITES, self.shm_writes.load(Ordering::Relaxed)),
            (LOST, self.lost.load(Ordering::Relaxed)),
            (DENIED, self.denied.load(Ordering::Relaxed)),
            (OVER_LIMIT, self.over_limit.load(Ordering::Relaxed)),
            (IDLE_CLOSED, self.idle_closed.load(Ordering::Relaxed)),
            (THROTTLED, self.throttled.load(Ordering::Relaxed)),
        ]
    }
}
