//! Giving the memory of removed chunks back to the system once the server
//! is idle.
//!
//! While chfsd serves, what it frees stays in its heap for the next
//! writes: glibc gives back the top of the heap only when more than 512
//! MiB is free there (`chfsd`'s `tune_malloc`), and free memory within
//! the heap, below chunks still stored, never. So a server whose first
//! files were removed while later ones stay kept the memory of the
//! removed ones for good. Once no request has come for [`IDLE`], what the
//! heap holds free goes back to the system (`malloc_trim`: the heap's top
//! and the whole free pages within it), so a server between a job's
//! phases, or after its files were removed, holds only what it stores.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use crate::state::Shared;

/// How long the server must have had no request before its heap's free
/// memory goes back to the system.
pub(crate) const IDLE: Duration = Duration::from_secs(2);

/// Free memory below this stays (trimming it is not worth a pass over
/// the heap).
const KEEP: usize = 8 << 20;

/// Runs until the server stops: every [`IDLE`] / 4, trims the heap if no
/// request came during the last [`IDLE`] and it holds at least [`KEEP`]
/// free; once per idle spell.
pub(crate) async fn trim_when_idle(shared: Arc<Shared>) {
    let mut stop = shared.shutdown.subscribe();
    let tick = IDLE / 4;
    let (mut seen, mut quiet) = (u64::MAX, Duration::ZERO);
    // The request count when the heap was last looked at: not again
    // before more requests came.
    let mut looked_at = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => return,
        }
        let now = shared.counters.requests.load(Ordering::Relaxed);
        if now != seen {
            (seen, quiet) = (now, Duration::ZERO);
            continue;
        }
        quiet += tick;
        if quiet < IDLE || looked_at == Some(now) {
            continue;
        }
        // (Looked at once per idle spell: mallinfo2 walks the heap's free
        // lists.)
        looked_at = Some(now);
        let free = chfs_sys::heap::free_bytes();
        if free < KEEP {
            continue;
        }
        // (It holds the allocator's locks for its pass: off the runtime's
        // threads, while nothing else runs anyway.)
        let _ = tokio::task::spawn_blocking(chfs_sys::heap::trim).await;
        crate::metrics::Counters::inc(&shared.counters.heap_trims);
        debug!(
            free_before = free,
            free_after = chfs_sys::heap::free_bytes(),
            "idle: heap trimmed"
        );
    }
}
