//! Options of a mount: kernel caching, I/O mode, transport ([`FsOptions`]).

use std::time::Duration;

/// Behaviour of the mount that is not file-system logic.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// How long the kernel may cache attributes (size, mode, times) before
    /// asking again. Longer = fewer requests, staler view of other nodes.
    pub attr_timeout: Duration,
    /// How long the kernel may cache a name -> inode binding. Longer =
    /// faster path walks; a file removed or renamed on another node stays
    /// visible here for up to this long.
    pub entry_timeout: Duration,
    /// How long a name may be reported absent from a listing of its
    /// directory instead of asking its server (the client's negative lookup
    /// cache; entries created through this mount are always seen), and how
    /// long the kernel keeps a name found absent as a negative entry. A file
    /// created on another node may stay invisible here for up to this
    /// long. Zero asks the servers for every missing name.
    pub negative_timeout: Duration,
    /// Kernel write-back cache: small writes are gathered in the page cache
    /// and sent later (faster small writes; data reaches the servers at
    /// flush/fsync/close, and O_APPEND is no longer atomic across nodes).
    pub writeback_cache: bool,
    /// Bypass the page cache for file data (`FOPEN_DIRECT_IO`, the
    /// default): a read(2) or write(2) of 1 MiB is one request of 1 MiB,
    /// every read sees the servers' current data, and mmap still works
    /// (`FUSE_DIRECT_IO_ALLOW_MMAP`). Off: the kernel page cache and
    /// read-ahead serve repeated and small reads.
    pub direct_io: bool,
    /// Serve kernel requests through FUSE over io_uring when the kernel
    /// offers it (Linux 6.14+ with `fuse.enable_uring=1`): one queue per
    /// CPU, each request handled by a thread on the CPU that issued it, so
    /// a request costs no wake-up across CPUs. Falls back to reading
    /// /dev/fuse when the kernel does not offer it.
    pub io_uring: bool,
    /// With io_uring, each ring thread (pinned to its queue's CPU) reaches
    /// the servers on this host over its own connections, which they serve
    /// on a thread pinned to the same CPU (CPU lanes): a request and its
    /// reply hand over on one CPU instead of waking a thread on another.
    /// Off: one shared connection per server for every thread.
    pub cpu_lanes: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::from_secs(1),
            writeback_cache: false,
            direct_io: true,
            io_uring: true,
            cpu_lanes: true,
        }
    }
}
