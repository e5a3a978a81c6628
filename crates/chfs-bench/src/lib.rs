//! chfs-bench: IO500-style benchmark of a chfs-rs pool (native client, one
//! worker process per rank) and of any directory (plain POSIX calls), with
//! a reference measured side by side in the same invocation.
//!
//! Phases run in IO500's order with IO500's access patterns
//! ([`pattern`]), scored as IO500 does ([`score`]). The leader
//! ([`leader`]) starts the workers ([`worker`]) and talks to them over
//! pipes (JSON lines); results go to a table, a JSON file and an SVG chart
//! ([`report`]). [`sweep`] is the single-process bandwidth sweep.
//!
//! The package's other measurements are subcommands of the same program,
//! measuring through the same targets ([`fs`]) where they measure a file
//! system: [`demo`] (what `scripts/demo.sh` runs), [`fuse`] (a chfuse
//! mount against the native client), [`store`] (the storage engines at the
//! store level), [`store_servers`] (the engines through servers, and a
//! server's memory) and [`cache`] (cache mode).

pub mod cache;
pub mod demo;
pub mod error;
pub mod floor;
pub mod fs;
pub mod fuse;
pub mod leader;
#[cfg(feature = "mpi")]
pub mod mpi_ranks;
pub mod pattern;
pub mod report;
pub mod scale;
pub mod score;
pub mod scratch;
pub mod store;
pub mod store_servers;
pub mod sweep;
pub mod worker;

pub use error::{BenchError, Result};
