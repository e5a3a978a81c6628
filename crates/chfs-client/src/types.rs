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

/// Seconds and nanoseconds of a time in ns since the epoch (nanoseconds
/// always in 0..1e9, also before the epoch).
fn ns_split(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

impl Stat {
    /// As a C `struct stat`, the one mapping every C adapter uses (the C
    /// API, the preload layer); `st_dev` is 0 (an adapter may set its
    /// own).
    pub fn to_libc(&self) -> libc::stat {
        // SAFETY: `struct stat` is plain old data; all-zero is a valid
        // value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_ino = self.ino as _;
        st.st_mode = self.mode as _;
        st.st_nlink = self.nlink as _;
        st.st_uid = self.uid;
        st.st_gid = self.gid;
        st.st_rdev = self.rdev as _;
        st.st_size = self.size as _;
        st.st_blksize = self.blksize as _;
        st.st_blocks = self.blocks as _;
        let (a, an) = ns_split(self.atime);
        let (m, mn) = ns_split(self.mtime);
        let (c, cn) = ns_split(self.ctime);
        st.st_atime = a as _;
        st.st_atime_nsec = an as _;
        st.st_mtime = m as _;
        st.st_mtime_nsec = mn as _;
        st.st_ctime = c as _;
        st.st_ctime_nsec = cn as _;
        st
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
    /// Of `entries`: entries (files and directories) in the node-local
    /// areas of every server.
    pub node_local_entries: u64,
    /// Of `used`: the sizes of the files in the node-local areas of every
    /// server.
    pub node_local_bytes: u64,
    /// The node-local area of this node (the server on this host that
    /// keeps it): entries and file bytes, or None without one.
    pub this_node: Option<(u64, u64)>,
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

#[cfg(test)]
mod c_stat_tests {
    use super::*;

    #[test]
    fn a_status_maps_to_struct_stat_with_times_split_exactly() {
        let s = Stat {
            ino: 7,
            mode: libc::S_IFREG | 0o640,
            nlink: 1,
            uid: 10,
            gid: 20,
            rdev: 0,
            size: 12345,
            blksize: 65536,
            blocks: 25,
            atime: 1_500_000_000_123_456_789,
            mtime: -1,
            ctime: 2_000_000_001,
        };
        let c = s.to_libc();
        assert_eq!(
            (c.st_ino, c.st_mode, c.st_uid, c.st_gid, c.st_size),
            (7, libc::S_IFREG | 0o640, 10, 20, 12345)
        );
        assert_eq!((c.st_blksize, c.st_blocks, c.st_dev), (65536, 25, 0));
        assert_eq!((c.st_atime, c.st_atime_nsec), (1_500_000_000, 123_456_789));
        // Before the epoch: seconds round down, nanoseconds stay positive.
        assert_eq!((c.st_mtime, c.st_mtime_nsec), (-1, 999_999_999));
        assert_eq!((c.st_ctime, c.st_ctime_nsec), (2, 1));
    }
}
