//! The core's own vocabulary: what the transports translate kernel
//! requests into and replies out of. Nothing here knows `fuser` or the
//! kernel ABI; every conversion is a field copy.

use std::fmt;

use chfs_client::Stat;

pub use chfs_client::TimeSet;

/// An inode number as the kernel knows it: the client's `st_ino` (a hash
/// of the path at first lookup), probed on a collision; the root is
/// [`Ino::ROOT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    /// The root directory.
    pub const ROOT: Ino = Ino(1);
}

/// A handle of an open file or directory, as handed to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fh(pub u64);

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    RegularFile,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A FIFO.
    NamedPipe,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A Unix socket.
    Socket,
}

impl FileKind {
    /// The kind named by the `S_IFMT` bits of `mode` (a regular file when
    /// they name none of the others).
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::NamedPipe,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFSOCK => FileKind::Socket,
            _ => FileKind::RegularFile,
        }
    }

    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::NamedPipe => libc::S_IFIFO,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::RegularFile => libc::S_IFREG,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }
}

/// Attributes of an inode, as the kernel is told them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number (the kernel's, not necessarily the client's `st_ino`).
    pub ino: Ino,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access time, ns since the epoch (negative: before it).
    pub atime: i64,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Status change time, ns since the epoch.
    pub ctime: i64,
    /// File type.
    pub kind: FileKind,
    /// Permission bits (`0o7777`).
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device special file.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
}

impl Attr {
    /// The attributes of `s` under inode number `ino`.
    pub fn from_stat(ino: Ino, s: &Stat) -> Attr {
        Attr {
            ino,
            size: s.size,
            blocks: s.blocks,
            atime: s.atime,
            mtime: s.mtime,
            ctime: s.ctime,
            kind: FileKind::from_mode(s.mode),
            perm: (s.mode & 0o7777) as u16,
            nlink: s.nlink,
            uid: s.uid,
            gid: s.gid,
            rdev: s.rdev as u32,
            blksize: s.blksize,
        }
    }

    /// `st_mode`: type and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// Who asks: the requesting process's ids (new entries are theirs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Process id (0 when the kernel does not say).
    pub pid: u32,
}

/// A failed operation: the errno the kernel is answered with (always
/// positive).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error(i32);

impl Error {
    /// Operation not permitted.
    pub const EPERM: Error = Error(libc::EPERM);
    /// No such file or directory.
    pub const ENOENT: Error = Error(libc::ENOENT);
    /// Input/output error.
    pub const EIO: Error = Error(libc::EIO);
    /// Bad file descriptor (an unknown handle).
    pub const EBADF: Error = Error(libc::EBADF);
    /// Invalid argument.
    pub const EINVAL: Error = Error(libc::EINVAL);
    /// File name too long.
    pub const ENAMETOOLONG: Error = Error(libc::ENAMETOOLONG);
    /// Function not implemented.
    pub const ENOSYS: Error = Error(libc::ENOSYS);
    /// Operation not supported.
    pub const EOPNOTSUPP: Error = Error(libc::EOPNOTSUPP);
    /// Illegal byte sequence (a name that is not UTF-8).
    pub const EILSEQ: Error = Error(libc::EILSEQ);

    /// The error of errno `e`; EIO when `e` is not positive (as fuser's
    /// `Errno::from_i32`).
    pub const fn from_errno(e: i32) -> Error {
        if e > 0 {
            Error(e)
        } else {
            Error(libc::EIO)
        }
    }

    /// The errno value (positive).
    pub const fn errno(self) -> i32 {
        self.0
    }
}

impl From<chfs_client::Error> for Error {
    fn from(e: chfs_client::Error) -> Error {
        Error::from_errno(e.errno())
    }
}

impl From<&chfs_client::Error> for Error {
    fn from(e: &chfs_client::Error) -> Error {
        Error::from_errno(e.errno())
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({})", chfs_proto::error::errno_name(self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            std::io::Error::from_raw_os_error(self.0),
            chfs_proto::error::errno_name(self.0)
        )
    }
}

impl std::error::Error for Error {}

/// The result of a core operation.
pub type Result<T> = std::result::Result<T, Error>;

/// An attribute change (truncate, chmod, chown, utimens); `None` and
/// [`TimeSet::Omit`] leave a field alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// New size (truncate).
    pub size: Option<u64>,
    /// New permission bits (the file type bits are kept).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: TimeSet,
    /// New modification time.
    pub mtime: TimeSet,
    /// The open file the change comes through (a truncate then goes
    /// through its descriptor).
    pub fh: Option<Fh>,
}

/// A file or directory opened: its handle and how the kernel should
/// treat it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The handle.
    pub fh: Fh,
    /// Bypass the page cache (`FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// No flush request at close(2) (`FOPEN_NOFLUSH`).
    pub noflush: bool,
}

/// What `statfs` reports, in 4 KiB blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks (also those available to unprivileged users).
    pub free: u64,
    /// Total inodes (entries stored plus free blocks).
    pub files: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}
