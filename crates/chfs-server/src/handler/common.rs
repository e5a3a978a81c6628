//! What every handler uses: the reply type, store errors as replies,
//! blocking backend I/O, chunk-size checks, the EIO of a lost chunk.

use chfs_proto::{ErrorReply, Response, MAX_CHUNK_SIZE};
use chfs_store::StoreError;
use tracing::warn;

use crate::metrics::Counters;
use crate::state::Shared;

pub(super) type Reply = Result<Response, ErrorReply>;

pub(super) fn store_err(path: &str, e: StoreError) -> ErrorReply {
    ErrorReply::new(e.errno(), format!("{path}: {e}"))
}

pub(super) fn refuse(errno: i32, msg: impl Into<String>) -> StoreError {
    StoreError::refused(errno, msg)
}

/// Runs blocking backend I/O from a handler: with `block_in_place` on the
/// shared multi-thread runtime; in place on a CPU lane (a current-thread
/// runtime, where `block_in_place` is not allowed; the lane's other
/// connections wait meanwhile).
pub(super) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

pub(super) fn check_chunk_size(cs: u32) -> Result<(), ErrorReply> {
    if cs == 0 || cs > MAX_CHUNK_SIZE {
        return Err(ErrorReply::new(
            libc::EINVAL,
            format!("chunk size {cs} out of range (1..={MAX_CHUNK_SIZE})"),
        ));
    }
    Ok(())
}

/// The EIO of a read or write of a chunk this server may have lost.
pub(super) fn lost(sh: &Shared, path: &str, idx: u64, why: &str) -> ErrorReply {
    Counters::inc(&sh.counters.lost);
    warn!(path, idx, "{why}");
    ErrorReply::new(
        libc::EIO,
        format!("chunk {idx} of {path} on server {}: {why}", sh.me),
    )
}
