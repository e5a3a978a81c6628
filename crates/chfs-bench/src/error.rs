//! Errors of the benchmark.

use std::io;

/// Result with a [`BenchError`].
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Everything that can make a benchmark fail.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A chfs-rs client operation failed.
    #[error("chfs {op} {path}: {source}")]
    Chfs {
        /// Operation.
        op: &'static str,
        /// Path (relative to the benchmark directory).
        path: String,
        /// Cause.
        #[source]
        source: chfs_client::Error,
    },
    /// A POSIX call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// Operation.
        op: &'static str,
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A read returned fewer bytes than were written.
    #[error("{path}: short read at offset {off}: {got} of {want} bytes")]
    ShortRead {
        /// Path.
        path: String,
        /// Offset.
        off: u64,
        /// Bytes returned.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// Data read back is not what the writer stamped into it.
    #[error("{path}: data check failed at offset {off}: expected {want:?}, found {got:?}")]
    Verify {
        /// Path.
        path: String,
        /// Offset.
        off: u64,
        /// Expected (rank, record).
        want: (u64, u64),
        /// Found (rank, record).
        got: (u64, u64),
    },
    /// An entry has an unexpected size.
    #[error("{path}: size {got}, expected {want}")]
    Size {
        /// Path.
        path: String,
        /// Size found.
        got: u64,
        /// Size expected.
        want: u64,
    },
    /// A storage engine operation failed (`chfs-bench store`).
    #[error("store {op} {path}: {source}")]
    Store {
        /// Operation.
        op: &'static str,
        /// Key path.
        path: String,
        /// Cause.
        #[source]
        source: chfs_store::StoreError,
    },
    /// What was read back or measured is not what a check expects.
    #[error("{0}")]
    Check(String),
    /// A worker process failed or broke the protocol.
    #[error("worker {rank}: {msg}")]
    Worker {
        /// Rank of the worker.
        rank: usize,
        /// What happened.
        msg: String,
    },
    /// Stopped by a signal (SIGINT, SIGTERM or SIGHUP).
    #[error("interrupted")]
    Interrupted,
    /// Invalid parameters or environment.
    #[error("{0}")]
    Config(String),
    /// JSON encoding or decoding.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// Wraps a chfs client error.
    pub fn chfs(op: &'static str, path: &str, source: chfs_client::Error) -> Self {
        BenchError::Chfs {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// Wraps a storage engine error.
    pub fn store(op: &'static str, path: &str, source: chfs_store::StoreError) -> Self {
        BenchError::Store {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// Wraps an I/O error.
    pub fn io(op: &'static str, path: impl std::fmt::Display, source: io::Error) -> Self {
        BenchError::Io {
            op,
            path: path.to_string(),
            source,
        }
    }
}
