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
/// Alone in its cache lines, so its updates do not evict the engine's
/// read-mostly fields from other CPUs' caches.
#[repr(align(128))]
pub(crate) struct Usage {
    bytes: AtomicU64,
    capacity: u64,
}

impl Usage {
    pub fn new(capacity: u64, bytes: u64) -> Self {
        Self {
            bytes: AtomicU64::new(bytes),
            capacity,
        }
    }

    /// Takes `add` more bytes, or fails with ENOSPC leaving usage unchanged.
    pub fn reserve(&self, add: u64) -> Result<()> {
        if add == 0 {
            return Ok(());
        }
        if self.capacity == 0 {
            self.bytes.fetch_add(add, Ordering::Relaxed);
            return Ok(());
        }
        let mut cur = self.bytes.load(Ordering::Relaxed);
        loop {
            if cur + add > self.capacity {
                return Err(StoreError::NoSpace {
                    used: cur,
                    capacity: self.capacity,
                });
            }
            match self.bytes.compare_exchange_weak(
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
        if sub == 0 {
            return;
        }
        self.bytes.fetch_sub(sub, Ordering::Relaxed);
    }

    /// Adds bytes without checking the capacity (undoing a release).
    pub fn reserve_unchecked(&self, add: u64) {
        self.bytes.fetch_add(add, Ordering::Relaxed);
    }

    /// Bytes in use.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The capacity (0 = no limit).
    pub fn capacity(&self) -> u64 {
        self.capacity
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
