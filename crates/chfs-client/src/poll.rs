//! Bounded adaptive polling for replies (`CHFS_POLL_USEC`).
//!
//! A caller that blocks in `recv(2)` for a reply is put to sleep, and the
//! reply must then wake it: on many machines (virtual ones especially, whose
//! idle CPUs halt) that wake-up costs as much as the round trip itself. HPC
//! RPC stacks avoid it by polling; so does a [`Poller`], for a bounded and
//! adaptive time: it first asks the socket without blocking until the
//! window passes, and only then sleeps. The window adapts as Linux's
//! `haltpoll` governor does: a reply that came after the caller had gone to
//! sleep, but within the longest window, doubles it (polling a little longer
//! would have caught it); one that came later halves it (polling would not
//! have helped), down to zero. A caller whose replies take long therefore
//! stops polling after a few of them, and an idle process never polls.
//!
//! Connections on a CPU lane never poll: their server runs on the caller's
//! own CPU and polling would only keep it from running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use chfs_sys::poll::AUTO_MAX;
use chfs_sys::poll::START_NS;

/// Counts over the connections of one client: replies (or parts of large
/// ones) that arrived while polling, and waits that polled in vain and
/// then slept; over the fabric, bulk data a server moved by RMA straight
/// from or into the caller's memory (lent), and through a window it was
/// copied into or out of.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub rma_lent: AtomicU64,
    pub rma_copied: AtomicU64,
}

impl Counts {
    /// Adds one to a counter.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The polling state of one connection.
#[derive(Debug)]
pub(crate) struct Poller {
    /// The longest window (0: never poll).
    max_ns: u64,
    /// The current window.
    window_ns: AtomicU64,
    counts: Arc<Counts>,
}

impl Poller {
    /// A poller whose window never exceeds `max` (zero: never polls),
    /// counting into `counts`.
    pub(crate) fn new(max: Duration, counts: Arc<Counts>) -> Poller {
        let max_ns = max.as_nanos().min(u64::MAX as u128) as u64;
        Poller {
            max_ns,
            window_ns: AtomicU64::new(START_NS.min(max_ns)),
            counts,
        }
    }

    /// How long to poll before sleeping now.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }

    /// Data arrived while polling.
    pub(crate) fn hit(&self) {
        self.counts.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Polling (for `polled`) found nothing and the caller then slept for
    /// `slept` until data came: adapt the window.
    pub(crate) fn slept(&self, polled: Duration, slept: Duration) {
        if self.max_ns == 0 {
            return;
        }
        if !polled.is_zero() {
            self.counts.misses.fetch_add(1, Ordering::Relaxed);
        }
        let w = self.window_ns.load(Ordering::Relaxed);
        let next = chfs_sys::poll::next_window(w, slept.as_nanos() as u64, self.max_ns);
        self.window_ns.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_for_quick_replies_and_shrinks_to_nothing_for_slow_ones() {
        let p = Poller::new(Duration::from_micros(100), Arc::default());
        assert_eq!(p.window(), Duration::from_nanos(START_NS));
        // Replies that came soon after sleeping: grow to the cap.
        for _ in 0..10 {
            p.slept(p.window(), Duration::from_micros(10));
        }
        assert_eq!(p.window(), Duration::from_micros(100));
        // Slow replies: halve down to zero, then stay off.
        for _ in 0..10 {
            p.slept(p.window(), Duration::from_millis(1));
        }
        assert_eq!(p.window(), Duration::ZERO);
        // Quick replies bring it back.
        p.slept(Duration::ZERO, Duration::from_micros(20));
        assert_eq!(p.window(), Duration::from_nanos(START_NS));
    }

    #[test]
    fn a_zero_maximum_never_polls() {
        let p = Poller::new(Duration::ZERO, Arc::default());
        assert_eq!(p.window(), Duration::ZERO);
        p.slept(Duration::ZERO, Duration::from_micros(1));
        assert_eq!(p.window(), Duration::ZERO);
    }
}
