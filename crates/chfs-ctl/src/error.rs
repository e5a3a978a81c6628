//! Errors of the command-line tools.

/// An error of chfsctl or one of the ch* tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CtlError {
    /// Bad command line or configuration (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A host could not run a command (unreachable, launcher failed, the
    /// remote command failed).
    #[error("host {host}: {message}")]
    Host {
        /// Host name as given in the hostfile.
        host: String,
        /// What went wrong, with the remote command's error output.
        message: String,
    },
    /// A request to the pool failed.
    #[error("{context}: {source}")]
    Client {
        /// What was being done (naming the server when known).
        context: String,
        /// The client's error.
        source: chfs_client::Error,
    },
    /// Local I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Nothing to act on (no server recorded or named).
    #[error("{0}")]
    NotFound(String),
    /// Several hosts failed; each line names one.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Many(Vec<CtlError>),
}

impl CtlError {
    /// Exit code for the process: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            CtlError::Usage(_) => 2,
            _ => 1,
        }
    }
}
