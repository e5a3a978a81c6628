//! State shared by every connection and request of a server: the store,
//! the placement, peers, counters, limits and cache-mode state.
//!
//! The bottom layer of the server proper: it imports no handler,
//! connection or listener module, only the foundations (config, cache,
//! limits, metrics, peer). See the crate documentation for the order.

use std::sync::{Arc, Mutex, RwLock};

use chfs_proto::handshake::Keys;
use chfs_proto::msg::RebalanceState;
use chfs_proto::ring::{Ring, ServerList};
use chfs_store::{Chunk, Store, StoreError};
use tokio::sync::watch;

use crate::config::StoreKind;
use crate::metrics::Counters;
use crate::peer::Peers;

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
    /// Answers of relayed lookups fetched from owners, and those in flight.
    pub contact: crate::relay::Contact,
    /// Contact servers keeping answers about entries held here.
    pub watchers: crate::relay::Watchers,
    /// The node-local area's path (None: none).
    pub node_local: Option<String>,
    pub counters: Counters,
    pub join_lock: tokio::sync::Mutex<()>,
    pub shutdown: watch::Sender<bool>,
    /// Cache mode state (backend, dirty set, flusher).
    pub cache: Option<Arc<crate::cache::Cache>>,
    /// The storage engine (`--store`).
    pub store_kind: StoreKind,
    /// Directory or file of a persistent store (for its free space).
    pub store_path: Option<std::path::PathBuf>,
    /// Progress of rebalance passes (after the list grew).
    pub rebalancer: Rebalancer,
    /// The keys of the pool's roles (None: no secret, the pool is open).
    pub keys: Option<Keys>,
    /// Who may connect through the local socket.
    pub local_users: crate::config::LocalUsers,
    /// Limits against misbehaving clients.
    pub limits: crate::limits::Limits,
    /// Connections open per client host or local user.
    pub peers_open: Arc<crate::limits::PeerCounts>,
    /// Closes idle connections.
    pub watchdogs: Arc<crate::limits::Watchdogs>,
    /// Opcodes answered as unknown (`--unknown-op`, for tests).
    pub unknown_ops: Vec<u16>,
    /// Landing reads still to answer by closing their connection
    /// (`--test-drop-landings`, for tests).
    pub drop_landings: std::sync::atomic::AtomicU32,
}

impl Shared {
    /// Is `path` in the node-local area (kept here, never forwarded,
    /// moved or written back)?
    pub fn is_node_local(&self, path: &str) -> bool {
        self.node_local
            .as_deref()
            .is_some_and(|d| chfs_proto::path::is_within(path, d))
    }

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

/// Progress of this server's rebalance passes (run by the handlers'
/// `rebalance` module).
#[derive(Default)]
pub(crate) struct Rebalancer {
    pub state: Mutex<RebalanceState>,
}
