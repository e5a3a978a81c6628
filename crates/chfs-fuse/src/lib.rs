//! `chfuse`: a FUSE 3 mount of a chfs-rs pool.
//!
//! [`core::Core`] is the file system: it turns kernel-level operations into
//! [`chfs_client::Client`] calls, in its own types (no FUSE library), so it
//! is tested without a mount. Two transports translate kernel requests
//! into its calls: [`fs::ChfsFs`], fuser's /dev/fuse loop, and FUSE over
//! io_uring (`ring`, where the kernel offers it). [`mount`] mounts it,
//! serves it with several threads, and unmounts on SIGINT/SIGTERM/SIGHUP.
//! The binary `chfuse` adds the command line and backgrounding.

pub mod core;
pub mod fs;
pub mod mount;
mod ring;

pub use fs::{ChfsFs, FsOptions};
pub use mount::{unmount, MountConfig, MountError};
