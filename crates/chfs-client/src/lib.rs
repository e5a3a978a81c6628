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
mod cloexec;
pub mod config;
mod conn;
mod error;
mod fabric_link;
mod link;
mod names;
pub mod poll;
mod pool;
mod relay;
mod shm;
mod stream;
mod types;

pub use chfs_proto::msg::FlushState;
pub use client::{Client, ClientStats, StageSource, TreeListing, WalkError};
pub use config::{ClientConfig, CpuLanes, Lookup, Polling};
pub use error::{Error, Result};
pub use shm::SharedBuffer;
pub use types::{DirEntry, Stat, StatFs, TimeSet, Whence};

/// This process's id, known (0: not yet, or a fork since) without a
/// system call per operation: the C API checks it at every call to tell
/// a forked child, and a connection at every large write (getpid(2) was
/// 3 of a create's 8 system calls through the C API, 17 of a 1 MiB
/// write's 65).
static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static PID_AT_FORK: std::sync::Once = std::sync::Once::new();

/// `pthread_atfork` child handler: the child asks again.
extern "C" fn forget_pid() {
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// The calling process's id, as `std::process::id()`, remembered until
/// a fork through fork(3). (A child made by a raw clone(2) system call
/// that then uses the library is not told from its parent, as with
/// glibc's own cache before 2.25.)
pub fn process_id() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    match PID.load(Relaxed) {
        0 => {
            // Registered before the first id is stored, so that every
            // fork after a store runs the handler.
            PID_AT_FORK.call_once(|| {
                // SAFETY: registers a handler that only stores to an
                // atomic, which is async-signal-safe in a forked child.
                unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
            });
            let p = std::process::id();
            PID.store(p, Relaxed);
            p
        }
        p => p,
    }
}

/// Open flags accepted by [`Client::open`] (Linux values).
pub mod flags {
    pub use libc::{
        O_APPEND, O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY,
    };
    /// Mask of the access mode bits.
    pub const O_ACCMODE: i32 = libc::O_ACCMODE;
}
