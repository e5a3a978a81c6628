//! `chfsd`: a chfs-rs server.
//!
//! A server owns the chunks that placement ([`chfs_proto::ring`]) assigns to
//! it, keeps them in a [`chfs_store::Store`], serves clients over the wire
//! protocol, forwards requests for keys it does not own to their owner, and
//! takes part in pool membership (join, list distribution).

mod backend;
pub mod cache;
pub(crate) mod cma;
pub mod config;
mod handler;
mod lanes;
mod limits;
mod local_io;
pub mod metrics;
pub mod net;
mod peer;
mod rebalance;
mod server;
mod shm;

pub use config::Config;
pub use server::{run, run_with_ready, start, RunningServer, ServerError};
