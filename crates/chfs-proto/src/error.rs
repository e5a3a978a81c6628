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
