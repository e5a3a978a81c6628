//! Plain data types of the client API.

use chfs_proto::ring::path_hash;
use chfs_proto::Meta;

/// File status, as `stat(2)` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Inode number (a hash of the path: stable while the path is).
    pub ino: u64,
    /// File type and permission bits.
    pub mode: u32,
    /// Link count (1; directories 2).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device special file.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// Preferred I/O size: the file's chunk size.
    pub blksize: u32,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Status change time, ns since the epoch.
    pub ctime: i64,
}

impl Stat {
    /// Builds a status from an entry's metadata.
    pub fn from_meta(path: &str, m: &Meta) -> Self {
        let is_dir = m.is_dir();
        Stat {
            ino: path_hash(path) | 1,
            mode: m.mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: m.uid,
            gid: m.gid,
            rdev: m.device() as u64,
            size: m.size,
            blksize: m.chunk_size.max(512),
            blocks: m.size.div_ceil(512),
            atime: if m.atime == 0 { m.mtime } else { m.atime },
            mtime: m.mtime,
            ctime: m.ctime,
        }
    }

    /// Is it a directory?
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    /// Is it a regular file?
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    /// Is it a symbolic link?
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: String,
    /// Status (size as published by writers that closed or synced).
    pub stat: Stat,
}

/// File-system capacity, as `statfs(2)` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    /// Total bytes over all servers.
    pub total: u64,
    /// Bytes used.
    pub used: u64,
    /// Bytes free.
    pub free: u64,
    /// Entries (chunks) stored.
    pub entries: u64,
    /// Number of servers.
    pub servers: u32,
}

/// Timestamp change for [`crate::Client::utimens`].
pub use chfs_proto::msg::TimeSet;

/// Position for [`crate::Client::seek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    /// From the start (`SEEK_SET`).
    Set,
    /// From the current position (`SEEK_CUR`).
    Cur,
    /// From the end (`SEEK_END`).
    End,
}
