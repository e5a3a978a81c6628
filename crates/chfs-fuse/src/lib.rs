//! `chfuse`: a FUSE 3 mount of a chfs-rs pool.
//!
//! [`fs::ChfsFs`] translates kernel requests into [`chfs_client::Client`]
//! calls, received through /dev/fuse (fuser) or through FUSE over io_uring
//! (`ring`, where the kernel offers it); [`mount`] mounts it, serves it
//! with several threads, and
//! unmounts on SIGINT/SIGTERM/SIGHUP. The binary `chfuse` adds the command
//! line and backgrounding.

pub mod fs;
pub mod mount;
mod ring;

pub use fs::{ChfsFs, FsOptions};
pub use mount::{unmount, MountConfig, MountError};
