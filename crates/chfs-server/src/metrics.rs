//! The server's counters, in one place: each is reported by `Status`
//! (`chfs_proto::msg::ServerStatus`, `Client::server_status`).

use std::sync::atomic::{AtomicU64, Ordering};

/// The server's counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests served (all kinds).
    pub requests: AtomicU64,
    /// Times the heap's free memory went back to the system once the
    /// server was idle (`crate::heap`).
    pub heap_trims: AtomicU64,
    /// Requests forwarded to their owner.
    pub forwarded: AtomicU64,
    /// Connections refused at the handshake.
    pub refused: AtomicU64,
    /// Write requests served.
    pub writes: AtomicU64,
    /// Read requests served.
    pub reads: AtomicU64,
    /// Write requests whose data was copied from the client's memory
    /// (cross-memory attach, local clients).
    pub cma_writes: AtomicU64,
    /// Of those, writes copied from a shared-memory window the client
    /// attached (`ShmAttach`).
    pub shm_writes: AtomicU64,
    /// Reads whose data went into a local client's landing window
    /// (`FLAG_LAND`).
    pub shm_reads: AtomicU64,
    /// Reads and writes refused with EIO because the chunk may have been lost
    /// with an earlier incarnation of this server's store.
    pub lost: AtomicU64,
    /// Requests refused because the connection's role may not make them.
    pub denied: AtomicU64,
    /// Connections refused: too many from one host or local user.
    pub over_limit: AtomicU64,
    /// Connections closed for idleness (or a request stalled half way).
    pub idle_closed: AtomicU64,
    /// Requests that waited for their connection's in-flight or memory budget.
    pub throttled: AtomicU64,
    /// Relayed lookups answered as a contact server.
    pub lookups: AtomicU64,
    /// Of those, answered from the contact cache.
    pub lookup_hits: AtomicU64,
    /// Lookups sent to owners for them.
    pub lookup_forwards: AtomicU64,
    /// Fabric sessions open now.
    pub fabric_sessions: AtomicU64,
    /// Client endpoints in the fabric address vector now (updated once a
    /// second).
    pub fabric_peers: AtomicU64,
    /// Fabric sessions ended for idleness (clients that died without
    /// saying goodbye).
    pub fabric_expired: AtomicU64,
    /// Messages of sessions unknown here, answered so that their client
    /// opens a new one.
    pub fabric_no_session: AtomicU64,
    /// Of those, not answered: over the bound (`fabric::NO_SESSION_PER_SEC`,
    /// `fabric::IDLE_PEERS_MAX`).
    pub fabric_no_session_dropped: AtomicU64,
    /// Replies dropped by the outbox (`fabric::Outbox`): their peer had
    /// the most posted and queued already.
    pub fabric_replies_dropped: AtomicU64,
    /// Requests larger than a message (`FLAG_LENT`) pulled from their
    /// senders.
    pub fabric_lent_pulls: AtomicU64,
    /// Most RMA operations in flight for one peer at once (at most
    /// `fabric::RMA_PER_PEER`).
    pub fabric_rma_most: AtomicU64,
    /// Hellos not answered: too many handshake messages in flight
    /// (`fabric::WELCOMES_MAX`, a flood).
    pub fabric_hellos_dropped: AtomicU64,
    /// Chunk data moved by RMA: writes' data read from clients, reads'
    /// data written into them.
    pub rma_pulls: AtomicU64,
    pub rma_pushes: AtomicU64,
    /// RMA pushes that went through a copy because the chunk's memory
    /// could not be registered.
    pub reg_fallbacks: AtomicU64,
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
}
