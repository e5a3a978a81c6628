//! The one error type at the POSIX edge: an errno, a message, and the cause.

use std::fmt;

use chfs_proto::error::errno_name;
use chfs_proto::ErrorReply;

/// A failed file-system operation: what a C caller sees as `errno`, plus a
/// message and the underlying cause for Rust callers and logs.
#[derive(Debug)]
pub struct Error {
    errno: i32,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    conn: ConnFault,
}

/// How a request met a broken connection (for transparent retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ConnFault {
    /// Not a connection failure.
    #[default]
    None,
    /// The request never left: any request may be sent again.
    NotSent,
    /// The connection broke after the request was sent: the server may
    /// or may not have carried it out.
    Lost,
}

impl Error {
    /// An error with an errno and a message.
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
            source: None,
            conn: ConnFault::None,
        }
    }

    /// Marks how the connection failed this request.
    pub(crate) fn with_conn_fault(mut self, f: ConnFault) -> Self {
        self.conn = f;
        self
    }

    /// How the connection failed this request.
    pub(crate) fn conn_fault(&self) -> ConnFault {
        self.conn
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(e));
        self
    }

    /// The POSIX errno value.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, errno_name(self.errno))
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ErrorReply> for Error {
    fn from(e: ErrorReply) -> Self {
        Self {
            errno: e.errno,
            message: e.message,
            source: None,
            conn: ConnFault::None,
        }
    }
}

impl From<chfs_proto::path::PathError> for Error {
    fn from(e: chfs_proto::path::PathError) -> Self {
        Self::new(e.errno, e.message)
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand: `Err(Error::new(errno, msg))`.
pub(crate) fn fail<T>(errno: i32, msg: impl Into<String>) -> Result<T> {
    Err(Error::new(errno, msg))
}
