//! Protocol-level errors and the errno-carrying reply that crosses the wire.

use std::fmt;

/// A failure reported by a server for one request: a POSIX errno value and a
/// human-readable message. It travels unchanged from the place the failure
/// happened to the user (no re-mapping on the way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// POSIX errno value (e.g. `libc::ENOENT`).
    pub errno: i32,
    /// What went wrong, for logs and error messages.
    pub message: String,
}

impl ErrorReply {
    /// Builds a reply from an errno and a message.
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }
}

impl ErrorReply {
    /// The reply for I/O error `e` while doing `what`: its errno
    /// ([`io_errno`]) and "`what`: `e`".
    pub fn io(what: impl fmt::Display, e: &std::io::Error) -> Self {
        Self::new(io_errno(e), format!("{what}: {e}"))
    }
}

/// The errno of an I/O error: the OS error it carries, else the one of its
/// kind (a timeout is ETIMEDOUT, not EIO), else EIO. The one conversion
/// from `std::io::Error` to an errno.
pub fn io_errno(e: &std::io::Error) -> i32 {
    use std::io::ErrorKind as K;
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::NotConnected => libc::ENOTCONN,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::BrokenPipe => libc::EPIPE,
        K::AlreadyExists => libc::EEXIST,
        K::WouldBlock => libc::EAGAIN,
        K::InvalidInput => libc::EINVAL,
        K::TimedOut => libc::ETIMEDOUT,
        K::Interrupted => libc::EINTR,
        K::Unsupported => libc::EOPNOTSUPP,
        K::OutOfMemory => libc::ENOMEM,
        K::StorageFull => libc::ENOSPC,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::FileTooLarge => libc::EFBIG,
        K::ResourceBusy => libc::EBUSY,
        K::Deadlock => libc::EDEADLK,
        K::CrossesDevices => libc::EXDEV,
        K::TooManyLinks => libc::EMLINK,
        K::InvalidFilename => libc::ENAMETOOLONG,
        K::ArgumentListTooLong => libc::E2BIG,
        _ => libc::EIO,
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, errno_name(self.errno))
    }
}

impl std::error::Error for ErrorReply {}

/// Errors decoding or validating bytes received from a peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The peer did not start with the chfs-rs magic bytes.
    #[error("bad magic bytes: not a chfs-rs peer")]
    BadMagic,
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: peer speaks {peer}, we speak {ours}")]
    VersionMismatch {
        /// Version announced by the peer.
        peer: u16,
        /// Our version.
        ours: u16,
    },
    /// A frame announced more bytes than the hard maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: u64,
        /// Maximum allowed.
        max: u64,
    },
    /// A message ended before all of its fields were read.
    #[error("truncated message: needed {needed} more bytes")]
    Truncated {
        /// Bytes missing.
        needed: usize,
    },
    /// Unknown request or response opcode.
    #[error("unknown opcode {0}")]
    UnknownOp(u16),
    /// A field held a value that is not allowed.
    #[error("malformed message: {0}")]
    Malformed(String),
}

impl ProtoError {
    /// The errno a user sees when this error ends a request.
    pub fn errno(&self) -> i32 {
        libc::EPROTO
    }
}

/// Symbolic name of an errno value ("ENOENT"), for messages.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTSUP => "ENOTSUP",
        libc::EPROTO => "EPROTO",
        libc::EILSEQ => "EILSEQ",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::ENOTCONN => "ENOTCONN",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::ESTALE => "ESTALE",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn io_errors_keep_their_errno_or_get_their_kinds() {
        assert_eq!(
            io_errno(&Error::from_raw_os_error(libc::ENOSPC)),
            libc::ENOSPC
        );
        // Errors made by Rust code carry a kind, not an OS error.
        assert_eq!(
            io_errno(&Error::new(ErrorKind::TimedOut, "t")),
            libc::ETIMEDOUT
        );
        assert_eq!(
            io_errno(&Error::new(ErrorKind::NotFound, "n")),
            libc::ENOENT
        );
        assert_eq!(io_errno(&Error::from(ErrorKind::UnexpectedEof)), libc::EIO);
        assert_eq!(io_errno(&Error::other("o")), libc::EIO);
        let r = ErrorReply::io(
            "backend listing of /d",
            &Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(r.errno, libc::EACCES);
        assert!(
            r.message.starts_with("backend listing of /d: "),
            "{}",
            r.message
        );
    }
}
