//! `chfsd`: a chfs-rs server.
//!
//! A server owns the chunks that placement ([`chfs_proto::ring`]) assigns to
//! it, keeps them in a [`chfs_store::Store`], serves clients over the wire
//! protocol, forwards requests for keys it does not own to their owner, and
//! takes part in pool membership (join, list distribution).
//!
//! Modules form layers; each uses only the layers below it (no cycle):
//!
//! 1. foundations, which know nothing of a running server: `metrics`,
//!    `net`, `local_io`, `shm`, `backend`, `fabric_ep` (opening libfabric
//!    endpoints; sessions with fabric peers on other hosts) ← `cache` ←
//!    `config` ← `limits`, `park` (polling before a runtime worker sleeps);
//!    `peer` (server-to-server calls; `net`, `local_io`, `fabric_ep`) ←
//!    `relay` (the contact cache of relayed lookups);
//! 2. `state`: what every connection and request shares (`Shared`:
//!    store, placement, peers, counters, limits, cache mode) ← `heap`
//!    (freed memory given back to the system once the server is idle);
//! 3. `handler`: serving one request (`common` ← `namespace`, `pool`,
//!    `rebalance` ← `handle`);
//! 4. `connection`: serving one admitted connection (reader loop, reply
//!    writer, access checks; `cma` for data in a local client's memory);
//! 5. `fabric`: serving clients over a libfabric endpoint (`chfsd -p
//!    ofi+tcp`): the progress thread, sessions and their handshake,
//!    requests whose data moves by RMA;
//! 6. `listener`: accepting TCP and local connections, handshakes,
//!    per-peer limits, CPU `lanes`;
//! 7. `server`: opening the store, starting, running, stopping.
//!
//! `tests/layers.rs` checks this order.

mod backend;
pub mod cache;
pub mod config;
mod connection;
mod fabric;
mod fabric_ep;
mod handler;
mod heap;
mod limits;
mod listener;
mod local_io;
pub mod metrics;
pub mod net;
mod park;
mod peer;
mod relay;
mod server;
mod shm;
mod state;

pub use config::{Config, StoreKind};
pub use server::{run, run_with_ready, start, RunningServer, ServerError};
