//! Errors of the fabric transport, each with the errno a caller of the
//! file system would see.

use std::time::Duration;

/// Result of the crate's calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transport cannot be used in this build or on this machine:
    /// built without libfabric, or no provider of that name here.
    #[error("fabric transport unavailable: {0}")]
    Unavailable(String),
    /// An address string that is not `ofi+PROTOCOL://...`, or not of this
    /// endpoint's protocol.
    #[error("bad fabric address {input:?}: {why}")]
    BadAddress {
        /// The string given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// A call was given something it cannot use (a range outside a
    /// buffer, a message larger than the receive buffers, memory of
    /// another domain).
    #[error("invalid argument: {0}")]
    InvalidInput(String),
    /// A libfabric call failed when it was made.
    #[error("{call}: {message} (libfabric error {code})")]
    Call {
        /// The libfabric call.
        call: &'static str,
        /// Its error, positive (`FI_E*`; the errno for the standard ones).
        code: i32,
        /// `fi_strerror` of it.
        message: String,
    },
    /// An operation was accepted but completed with an error: the peer is
    /// gone or refused, the message was truncated, the operation was
    /// cancelled.
    #[error("{op} failed: {message} (libfabric error {code}, provider error {prov_errno})")]
    Failed {
        /// The operation (send, recv, read, write).
        op: &'static str,
        /// Its error, positive (`FI_E*`).
        code: i32,
        /// The provider's own error number.
        prov_errno: i32,
        /// `fi_strerror` of `code`.
        message: String,
    },
    /// No completion within the time allowed; the operation may still be
    /// in flight (its buffers stay with the endpoint until it ends).
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// The operation waited for.
        op: &'static str,
        /// How long it was waited for.
        after: Duration,
        /// The provider had accepted the operation when the time ran out
        /// (its completion was waited for): it may still be carried out,
        /// a send may still reach the peer. `false`: the provider's queue
        /// stayed full, it never took the operation.
        posted: bool,
    },
    /// The provider had accepted the operation, but its completion could
    /// not be learnt (reading the completion queue failed): it may have
    /// been carried out, a send may have reached the peer.
    #[error("{op}: its outcome is unknown: {cause}")]
    Unsettled {
        /// The operation waited for.
        op: &'static str,
        /// Why its completion could not be read.
        cause: Box<Error>,
    },
}

/// libfabric's first error number of its own (`FI_ERRNO_OFFSET`); below
/// it the codes are errno values.
const FI_ERRNO_OFFSET: i32 = 256;
/// `FI_ETRUNC`: a message longer than the receive buffer.
pub(crate) const FI_ETRUNC: i32 = 265;

impl Error {
    /// The errno to report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Unavailable(_) => libc::EPROTONOSUPPORT,
            Error::BadAddress { .. } | Error::InvalidInput(_) => libc::EINVAL,
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::Unsettled { cause, .. } => cause.errno(),
            Error::Call { code, .. } | Error::Failed { code, .. } => match *code {
                c if c > 0 && c < FI_ERRNO_OFFSET => c,
                FI_ETRUNC => libc::EMSGSIZE,
                _ => libc::EIO,
            },
        }
    }

    /// May the message of a send that failed with this error still reach
    /// the peer? Where the provider had accepted it and the wait for
    /// its completion timed out ([`Error::Timeout`] with `posted`): the
    /// provider keeps the message and may send it later (a peer that was
    /// stopped and goes on); and where its completion could not be read
    /// ([`Error::Unsettled`]). Everything else was refused before the
    /// provider took it, or ended by the provider (a completion with an
    /// error: it sends no more of it; over tcp and shm that is a message
    /// not written whole, which the peer never takes).
    pub fn may_have_left(&self) -> bool {
        matches!(
            self,
            Error::Timeout { posted: true, .. } | Error::Unsettled { .. }
        )
    }

    /// The peer cannot be reached or has gone: connection refused, reset,
    /// unreachable, or an operation on it timed out.
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self.errno(),
            libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::ECONNABORTED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENOTCONN
                | libc::EPIPE
                | libc::ETIMEDOUT
                | libc::EIO
                | libc::ECANCELED
        )
    }
}
