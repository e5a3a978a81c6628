//! Byte accounting against a capacity, shared by the engines.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use crate::dirindex::Padded;
use crate::{Result, StoreError};

/// A small number for the calling thread, dealt in turn as threads first
/// ask: threads take different stripes of a [`Striped`] counter (and
/// different pmem arenas) so they rarely share a cache line.
pub(crate) fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    MINE.with(|m| *m)
}

const STRIPES: usize = 8;

/// A statistics counter changed by many threads at once (entries, bytes):
/// each thread adds to its own stripe, so no cache line travels between
/// CPUs on every store operation; reading sums the stripes.
pub(crate) struct Striped([Padded<AtomicI64>; STRIPES]);

impl Striped {
    pub fn new(v: u64) -> Self {
        let s = Striped(std::array::from_fn(|_| Padded(AtomicI64::new(0))));
        s.0[0].0.store(v as i64, Ordering::Relaxed);
        s
    }

    pub fn add(&self, v: u64) {
        if v == 0 {
            // (a locked instruction less on every create of an empty entry)
            return;
        }
        self.0[thread_slot() % STRIPES]
            .0
            .fetch_add(v as i64, Ordering::Relaxed);
    }

    pub fn sub(&self, v: u64) {
        if v == 0 {
            return;
        }
        self.0[thread_slot() % STRIPES]
            .0
            .fetch_sub(v as i64, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        let sum: i64 = self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum();
        sum.max(0) as u64
    }
}

/// Bytes of chunk data in use, bounded by a capacity (0 = no limit).
// One per store: its size does not matter, an indirection on every update
// would.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Usage {
    /// A capacity is enforced: one counter, checked against it.
    Bounded(Bounded),
    /// No limit here (none at all, or the medium enforces its own): a
    /// striped counter, and the capacity only reported.
    Counted(Striped, u64),
}

/// A counter checked against a capacity. Alone in its cache lines, so its
/// updates do not evict the engine's read-mostly fields from other CPUs'
/// caches.
#[repr(align(128))]
pub(crate) struct Bounded {
    bytes: AtomicU64,
    capacity: u64,
}

impl Usage {
    /// Nothing in use yet of `capacity` (0 = no limit).
    pub fn new(capacity: u64) -> Self {
        if capacity == 0 {
            return Usage::Counted(Striped::new(0), 0);
        }
        Usage::Bounded(Bounded {
            bytes: AtomicU64::new(0),
            capacity,
        })
    }

    /// Counts bytes without a limit, reporting `capacity` (a medium that
    /// runs out of space by itself).
    pub fn counted(capacity: u64) -> Self {
        Usage::Counted(Striped::new(0), capacity)
    }

    /// Takes `add` more bytes, or fails with ENOSPC leaving usage unchanged.
    pub fn reserve(&self, add: u64) -> Result<()> {
        let b = match self {
            Usage::Counted(s, _) => {
                s.add(add);
                return Ok(());
            }
            Usage::Bounded(b) => b,
        };
        if add == 0 {
            return Ok(());
        }
        let mut cur = b.bytes.load(Ordering::Relaxed);
        loop {
            if cur + add > b.capacity {
                return Err(StoreError::NoSpace {
                    used: cur,
                    capacity: b.capacity,
                });
            }
            match b.bytes.compare_exchange_weak(
                cur,
                cur + add,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(c) => cur = c,
            }
        }
    }

    /// Gives `sub` bytes back.
    pub fn release(&self, sub: u64) {
        match self {
            Usage::Counted(s, _) => s.sub(sub),
            Usage::Bounded(_) if sub == 0 => {}
            Usage::Bounded(b) => {
                b.bytes.fetch_sub(sub, Ordering::Relaxed);
            }
        }
    }

    /// Adds bytes without checking the capacity (undoing a release).
    pub fn reserve_unchecked(&self, add: u64) {
        match self {
            Usage::Counted(s, _) => s.add(add),
            Usage::Bounded(b) => {
                b.bytes.fetch_add(add, Ordering::Relaxed);
            }
        }
    }

    /// Accounts a chunk changing from `old` to `new` bytes (ENOSPC when
    /// it grows beyond the capacity).
    pub fn change(&self, old: u64, new: u64) -> Result<()> {
        if new > old {
            self.reserve(new - old)
        } else {
            self.release(old - new);
            Ok(())
        }
    }

    /// Undoes [`Self::change`].
    pub fn undo(&self, old: u64, new: u64) {
        if new > old {
            self.release(new - old);
        } else {
            self.reserve_unchecked(old - new);
        }
    }

    /// Bytes in use.
    pub fn bytes(&self) -> u64 {
        match self {
            Usage::Counted(s, _) => s.get(),
            Usage::Bounded(b) => b.bytes.load(Ordering::Relaxed),
        }
    }

    /// The capacity (0 = no limit).
    pub fn capacity(&self) -> u64 {
        match self {
            Usage::Counted(_, c) => *c,
            Usage::Bounded(b) => b.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counters_sum_over_threads() {
        let c = std::sync::Arc::new(Striped::new(5));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(3);
                        c.sub(1);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(c.get(), 5 + 4 * 2000);
        // A thread may take away what another added.
        let c2 = c.clone();
        std::thread::spawn(move || c2.sub(8005)).join().unwrap();
        assert_eq!(c.get(), 0);
    }
}
