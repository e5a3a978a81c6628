//! Rebalancing after the server list grew (`chfsctl -A`).
//!
//! Placement is a function of the server list, so when servers join, some
//! chunks a server holds now belong to another server and clients (which
//! ask the owner) no longer find them. A rebalance pass sends each such
//! chunk to its owner with [`Request::AdoptChunk`], which keeps a copy the
//! owner already holds (written there after the list changed, so newer),
//! and drops the local copy only once the owner has answered. A chunk that
//! cannot be sent stays here, is counted as failed, and the next pass
//! retries it.
//!
//! The pass runs in the background; [`Request::Rebalance`] starts one and
//! reports progress, and the client polls until no server is running one.
//! While a pass runs, a chunk in flight may be briefly absent from both
//! servers' listings: rebalance between job steps, not during I/O.

use std::sync::Arc;

use chfs_proto::frame::FLAG_FORWARDED;
use chfs_proto::msg::RebalanceState;
use chfs_proto::{ErrorReply, Request, Response};
use chfs_store::Chunk;
use chfs_sys::lock;
use tracing::{info, warn};

use crate::state::Shared;

/// Handles [`Request::Rebalance`]: with `start`, starts a pass unless one
/// is running (a pass over a balanced store only lists it); reports the
/// state.
pub(crate) fn request(sh: &Arc<Shared>, start: bool) -> Response {
    let version = sh.placement().ring.list().version;
    let mut st = lock(&sh.rebalancer.state);
    if start && !st.running {
        *st = RebalanceState {
            running: true,
            version,
            ..Default::default()
        };
        let sh = sh.clone();
        tokio::spawn(async move { pass(&sh).await });
    }
    Response::Rebalance(st.clone())
}

/// Adopts a chunk sent by a rebalance pass unless this key is held here.
pub(crate) fn adopt(sh: &Shared, path: &str, idx: u64, chunk: Chunk) -> Result<bool, ErrorReply> {
    let st = &*sh.store;
    let err = |e| super::common::store_err(path, e);
    if st.meta(path, idx).map_err(err)?.is_some() {
        return Ok(false);
    }
    sh.put_chunk(path, idx, chunk).map_err(err)?;
    Ok(true)
}

async fn pass(sh: &Arc<Shared>) {
    let place = sh.placement();
    let st = sh.store.clone();
    let mut paths = match st.paths_below("/") {
        Ok(p) => p,
        Err(e) => return finish(sh, 0, 0, 1, (e.errno(), format!("listing the store: {e}"))),
    };
    paths.sort();
    let (mut moved, mut kept, mut failed) = (0u64, 0u64, 0u64);
    let mut last_error = (0, String::new());
    for p in paths {
        if sh.is_node_local(&p) {
            // Kept on this node whatever the list.
            continue;
        }
        let idxs = match st.chunk_indices(&p) {
            Ok(i) => i,
            Err(e) => {
                failed += 1;
                last_error = (e.errno(), format!("{p}: {e}"));
                continue;
            }
        };
        for idx in idxs {
            let owner = place.ring.owner(&p, idx);
            if place.me == Some(owner) {
                continue;
            }
            let Ok(Some(chunk)) = st.take(&p, idx) else {
                continue;
            };
            if let Some(c) = sh.cache.as_deref() {
                c.forget_one(&p, idx);
            }
            let addr = &place.ring.list().servers[owner];
            let req = Request::AdoptChunk {
                path: p.clone(),
                idx,
                meta: chunk.meta,
                data: chunk.data.clone(),
            };
            match sh.peers.call(addr, &req, FLAG_FORWARDED).await {
                Ok(Response::Bool(true)) => moved += 1,
                Ok(_) => kept += 1,
                Err(e) => {
                    // Put it back so nothing is lost; the next pass retries.
                    if let Err(b) = sh.put_chunk(&p, idx, chunk) {
                        warn!(path = %p, idx, error = %b, "cannot put back a chunk that failed to move");
                    }
                    failed += 1;
                    last_error = (e.errno, format!("{p} chunk {idx} to {addr}: {e}"));
                }
            }
            let mut s = lock(&sh.rebalancer.state);
            (s.moved, s.kept, s.failed) = (moved, kept, failed);
        }
    }
    finish(sh, moved, kept, failed, last_error);
}

fn finish(
    sh: &Shared,
    moved: u64,
    kept: u64,
    failed: u64,
    (last_errno, last_error): (i32, String),
) {
    let mut s = lock(&sh.rebalancer.state);
    info!(
        version = s.version,
        moved, kept, failed, "rebalance pass done"
    );
    if failed > 0 {
        warn!(failed, error = %last_error, "rebalance left chunks behind");
    }
    *s = RebalanceState {
        running: false,
        version: s.version,
        moved,
        kept,
        failed,
        last_error,
        last_errno,
    };
}
