//! What every handler uses: the reply type, store errors as replies,
//! blocking backend I/O, chunk-size checks, the EIO of a lost chunk, the
//! invalidations sent to contact servers.

use std::sync::Arc;
use std::time::Duration;

use chfs_proto::frame::FLAG_FORWARDED;
use chfs_proto::{ErrorReply, Request, Response, MAX_CHUNK_SIZE};
use chfs_store::StoreError;
use tracing::{debug, warn};

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

/// Longest wait for a contact server to acknowledge an invalidation (one
/// that does not keeps its answer until it expires).
pub(super) const INVALIDATE_WAIT: Duration = Duration::from_secs(2);

/// The server list changed: the contact servers keeping answers about
/// entries this server no longer owns are told to drop them (the new
/// owner does not know them, so it would not tell them of a later
/// change), waiting for them as for a change.
pub(super) async fn placement_changed(sh: &Arc<Shared>) {
    if !sh.watchers.used() {
        return;
    }
    let p = sh.placement();
    let moved = sh.watchers.take_unless(|path| {
        sh.is_node_local(path) || (p.me.is_some() && p.me == Some(p.ring.owner(path, 0)))
    });
    if !moved.is_empty() {
        debug!(
            entries = moved.len(),
            "contacts told of entries owned elsewhere now"
        );
        invalidate(sh, moved).await;
    }
}

/// Sends `Invalidate` of each path to its contacts, and waits for them
/// (at most [`INVALIDATE_WAIT`]).
pub(super) async fn invalidate(sh: &Arc<Shared>, watched: Vec<(String, Vec<String>)>) {
    let mut waits = Vec::new();
    for (p, contacts) in watched {
        for c in contacts {
            let sh = sh.clone();
            let req = Request::Invalidate { path: p.clone() };
            waits.push(tokio::spawn(async move {
                let r =
                    tokio::time::timeout(INVALIDATE_WAIT, sh.peers.call(&c, &req, FLAG_FORWARDED))
                        .await;
                if !matches!(r, Ok(Ok(_))) {
                    debug!(contact = %c, "a contact server was not told of a change");
                }
            }));
        }
    }
    for w in waits {
        let _ = w.await;
    }
}
