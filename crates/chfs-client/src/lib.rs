//! chfs-rs client library.
//!
//! [`Client`] is a thread-safe handle to a pool of `chfsd` servers: it finds
//! every server from one contact address, places chunks with the same hash
//! the servers use, keeps one connection per server with many requests in
//! flight, splits reads and writes into per-chunk RPCs issued concurrently,
//! and keeps a file-descriptor table. Errors are [`Error`]s carrying the
//! errno a POSIX caller expects. The library never prints or exits.

pub mod cabi;
mod client;
pub mod config;
mod conn;
mod error;
mod names;
pub mod poll;
mod pool;
mod relay;
mod shm;
mod stream;
mod types;

pub use chfs_proto::msg::FlushState;
pub use client::{Client, ClientStats, StageSource, WalkError};
pub use config::{ClientConfig, CpuLanes, Lookup, Polling};
pub use error::{Error, Result};
pub use shm::SharedBuffer;
pub use types::{DirEntry, Stat, StatFs, TimeSet, Whence};

/// Open flags accepted by [`Client::open`] (Linux values).
pub mod flags {
    pub use libc::{
        O_APPEND, O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY,
    };
    /// Mask of the access mode bits.
    pub const O_ACCMODE: i32 = libc::O_ACCMODE;
}
