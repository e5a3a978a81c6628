//! Byte accounting against a capacity, shared by the engines.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Result, StoreError};

/// Bytes of chunk data in use, bounded by a capacity (0 = no limit).
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
        if self.capacity == 0 || add == 0 {
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
