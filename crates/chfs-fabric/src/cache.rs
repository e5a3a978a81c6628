//! The registration cache: registrations of memory owned elsewhere (a
//! chunk's shared buffer), keyed by address range, so memory sent or
//! written from again and again (or a slice of it) is registered once.
//!
//! Registering costs a system call and, on RDMA hardware, pinning pages
//! and programming the NIC's translation tables (tens of microseconds for
//! a megabyte), so registering per transfer would eat the gain of RMA.
//! Each entry owns (a clone of) the buffer it registered ([`StableBuf`]),
//! so the memory cannot be freed and reused at the same address while the
//! registration exists: a hit can never name stale memory, the hazard
//! caches of raw user pointers need memory-release hooks for. The cache
//! holds at most `limit` bytes; beyond, the least recently used entries
//! are dropped (an operation still using one keeps it alive until it
//! completes).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::ffi::{Domain, Pinned, RemoteKey, StableBuf};

/// A registered range: `len` bytes at `off` in a registration.
#[derive(Clone)]
pub struct Registered {
    /// The registration (it keeps the memory alive).
    pub pinned: Arc<Pinned>,
    /// Offset of the range in it.
    pub off: usize,
    /// Length of the range.
    pub len: usize,
}

impl Registered {
    /// The range's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.pinned.bytes()[self.off..self.off + self.len]
    }

    /// What a peer needs to read the range with RMA.
    pub fn remote_key(&self) -> Result<RemoteKey> {
        self.pinned.remote_key(self.off, self.len)
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("range", &self.pinned.range())
            .field("off", &self.off)
            .field("len", &self.len)
            .finish()
    }
}

/// The cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered by an existing registration.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Registrations the provider refused.
    pub failures: u64,
    /// Entries dropped to stay under the limit.
    pub evictions: u64,
    /// Entries held now.
    pub entries: u64,
    /// Bytes registered through the entries held now.
    pub bytes: u64,
}

struct Entry {
    pinned: Arc<Pinned>,
    last_use: u64,
}

struct Inner {
    /// Entries by start address.
    by_start: BTreeMap<usize, Entry>,
    /// The same entries by last use (the clock is unique per use): the
    /// least recently used is the first, found without a scan of every
    /// entry (a cache of 64 KiB chunks holds thousands).
    by_use: BTreeMap<u64, usize>,
    bytes: usize,
    clock: u64,
}

impl Inner {
    /// Removes the entry starting at `start`, if any.
    fn remove(&mut self, start: usize) {
        if let Some(e) = self.by_start.remove(&start) {
            self.by_use.remove(&e.last_use);
            self.bytes -= e.pinned.range().1;
        }
    }
}

/// A registration cache of one domain.
pub struct RegCache {
    domain: Arc<Domain>,
    limit: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    failures: AtomicU64,
    evictions: AtomicU64,
}

impl RegCache {
    /// A cache of at most `limit` registered bytes on `domain`.
    pub fn new(domain: &Arc<Domain>, limit: usize) -> RegCache {
        RegCache {
            domain: domain.clone(),
            limit,
            inner: Mutex::new(Inner {
                by_start: BTreeMap::new(),
                by_use: BTreeMap::new(),
                bytes: 0,
                clock: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The registration covering `buf`'s bytes: an entry whose range
    /// contains them, or a new one owning `buf`. (An entry owning the same
    /// memory, a clone of the same `Bytes`, covers it: two live
    /// allocations never overlap, so a covering entry is that memory.)
    /// Where the provider refuses to register it, gives `buf` back with
    /// the error.
    pub fn get<B: StableBuf>(&self, buf: B) -> std::result::Result<Registered, (Error, B)> {
        let (start, len) = {
            let b = buf.as_ref();
            (b.as_ptr() as usize, b.len())
        };
        {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.clock += 1;
            let now = inner.clock;
            let inner = &mut *inner;
            if let Some((_, e)) = inner.by_start.range_mut(..=start).next_back() {
                let (s, l) = e.pinned.range();
                if start + len <= s + l {
                    inner.by_use.remove(&e.last_use);
                    inner.by_use.insert(now, s);
                    e.last_use = now;
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Registered {
                        pinned: e.pinned.clone(),
                        off: start - s,
                        len,
                    });
                }
            }
        }
        let pinned = Pinned::new(&self.domain, buf).inspect_err(|_| {
            self.failures.fetch_add(1, Ordering::Relaxed);
        })?;
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        // Entries inside the new range are covered by it from now on.
        let inside: Vec<usize> = inner
            .by_start
            .range(start..start + len)
            .filter(|(_, e)| {
                let (s, l) = e.pinned.range();
                s + l <= start + len
            })
            .map(|(&s, _)| s)
            .collect();
        for s in inside {
            inner.remove(s);
        }
        inner.remove(start);
        inner.by_start.insert(
            start,
            Entry {
                pinned: pinned.clone(),
                last_use: now,
            },
        );
        inner.by_use.insert(now, start);
        inner.bytes += len;
        while inner.bytes > self.limit && inner.by_start.len() > 1 {
            // The least recently used other than the one just added (the
            // newest: the last by use).
            let Some((_, &s)) = inner.by_use.iter().next() else {
                break;
            };
            if s == start {
                break;
            }
            inner.remove(s);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Registered {
            pinned,
            off: 0,
            len,
        })
    }

    /// Drops every entry (operations in flight keep theirs until done).
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_start.clear();
        inner.by_use.clear();
        inner.bytes = 0;
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: inner.by_start.len() as u64,
            bytes: inner.bytes as u64,
        }
    }
}
