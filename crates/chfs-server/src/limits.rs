//! Limits against a misbehaving client: requests and bytes in flight per
//! connection (back-pressure, not growth), connections per client host or
//! local user, idle connections, vanished TCP peers.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_proto::frame::{CmaRef, Header, FLAG_CMA};
use chfs_proto::Request;
use chfs_sys::lock;

use crate::config::Config;
use crate::metrics::Counters;

/// The configured limits (see the `chfsd` options of the same names).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// `--max-inflight`.
    pub max_inflight: u32,
    /// `--conn-memory`, in KiB.
    pub conn_memory_kib: u32,
    /// `--max-conns-per-peer` (0: none).
    pub max_conns_per_peer: u32,
    /// `--idle-timeout` (None: never).
    pub idle: Option<Duration>,
}

impl Limits {
    pub fn from_config(cfg: &Config) -> Limits {
        Limits {
            max_inflight: cfg.max_inflight.max(1),
            conn_memory_kib: u32::try_from(cfg.conn_memory.div_ceil(1024))
                .unwrap_or(u32::MAX >> 4)
                .clamp(1, u32::MAX >> 4),
            max_conns_per_peer: cfg.max_conns_per_peer,
            idle: (cfg.idle_timeout > 0).then(|| Duration::from_secs(cfg.idle_timeout)),
        }
    }
}

/// What one connection may hold in the server at once: counters, not a
/// semaphore (no lock on the common path), and a wake-up for the
/// connection's reader when it waits.
pub(crate) struct Budget {
    inner: Arc<BudgetInner>,
    limits: Limits,
}

struct BudgetInner {
    requests: AtomicU32,
    kib: AtomicU64,
    /// The reader waits for room.
    waiting: AtomicBool,
    room: tokio::sync::Notify,
}

/// A request's share of its connection's budget, given back once its reply
/// has been sent.
pub(crate) struct Permits {
    inner: Arc<BudgetInner>,
    kib: u64,
}

impl Drop for Permits {
    fn drop(&mut self) {
        self.inner.requests.fetch_sub(1, Ordering::AcqRel);
        self.inner.kib.fetch_sub(self.kib, Ordering::AcqRel);
        if self.inner.waiting.load(Ordering::Acquire) {
            self.inner.waiting.store(false, Ordering::Release);
            // (stored if the reader is not waiting yet: no lost wake-up)
            self.inner.room.notify_one();
        }
    }
}

impl Budget {
    pub fn new(limits: &Limits) -> Budget {
        Budget {
            inner: Arc::new(BudgetInner {
                requests: AtomicU32::new(0),
                kib: AtomicU64::new(0),
                waiting: AtomicBool::new(false),
                room: tokio::sync::Notify::new(),
            }),
            limits: limits.clone(),
        }
    }

    /// Takes a request of `bytes` (its data and its reply's): at once if
    /// the connection's budget allows, else after waiting (the connection
    /// is not read meanwhile) and counting it in `throttled`.
    pub async fn admit(&self, bytes: u64, counters: &Counters) -> Permits {
        let max_kib = self.limits.conn_memory_kib as u64;
        let kib = bytes.div_ceil(1024).max(1);
        let mut counted = false;
        loop {
            let n = self.inner.requests.fetch_add(1, Ordering::AcqRel);
            let k = self.inner.kib.fetch_add(kib, Ordering::AcqRel);
            // A request larger than the whole budget is served alone.
            if n < self.limits.max_inflight && (k + kib <= max_kib || k == 0) {
                return Permits {
                    inner: self.inner.clone(),
                    kib,
                };
            }
            self.inner.requests.fetch_sub(1, Ordering::AcqRel);
            self.inner.kib.fetch_sub(kib, Ordering::AcqRel);
            if !counted {
                Counters::inc(&counters.throttled);
                counted = true;
            }
            self.inner.waiting.store(true, Ordering::Release);
            // Room may have been made meanwhile: look again before waiting.
            let n = self.inner.requests.load(Ordering::Acquire);
            let k = self.inner.kib.load(Ordering::Acquire);
            if n < self.limits.max_inflight && (k + kib <= max_kib || k == 0) {
                continue;
            }
            self.inner.room.notified().await;
        }
    }
}

/// Closes connections with nothing in the server and no request for the
/// idle timeout, or stalled half way through a request for as long: one
/// thread per server looks at every connection every quarter of the
/// timeout (no timer per frame, none in the runtimes' wheels) and shuts
/// idle ones down, which ends their reads.
#[derive(Default)]
pub(crate) struct Watchdogs {
    conns: Mutex<Vec<std::sync::Weak<Watched>>>,
    started: std::sync::OnceLock<()>,
}

/// One watched connection.
pub(crate) struct Watched {
    frames: AtomicU64,
    budget: Arc<BudgetInner>,
    /// A duplicate of the socket (so it cannot be another by the time it
    /// is shut down).
    fd: OwnedFd,
    on_close: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Watched {
    /// A frame arrived.
    pub fn touch(&self) {
        // One writer (the connection's reader): no read-modify-write.
        self.frames
            .store(self.frames.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

impl Watchdogs {
    /// Watches a connection (`fd`: a duplicate of its socket) with
    /// `budget`; None without an idle timeout. `on_close` runs if it is
    /// closed for idleness.
    pub fn watch(
        self: &Arc<Self>,
        fd: OwnedFd,
        budget: &Budget,
        on_close: impl FnOnce() + Send + 'static,
    ) -> Option<Arc<Watched>> {
        let idle = budget.limits.idle?;
        let w = Arc::new(Watched {
            frames: AtomicU64::new(0),
            budget: budget.inner.clone(),
            fd,
            on_close: Mutex::new(Some(Box::new(on_close))),
        });
        lock(&self.conns).push(Arc::downgrade(&w));
        let me = Arc::downgrade(self);
        self.started.get_or_init(|| {
            let _ = std::thread::Builder::new()
                .name("chfsd-idle".into())
                .spawn(move || watchdog(me, idle));
        });
        Some(w)
    }
}

fn watchdog(dogs: std::sync::Weak<Watchdogs>, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(100));
    // (connection, frames seen, since when unchanged)
    let mut seen: Vec<(std::sync::Weak<Watched>, u64, Instant)> = Vec::new();
    loop {
        std::thread::sleep(tick);
        let Some(d) = dogs.upgrade() else { return };
        let now = Instant::now();
        {
            let mut g = lock(&d.conns);
            for w in g.drain(..) {
                seen.push((w, u64::MAX, now));
            }
        }
        drop(d);
        seen.retain_mut(|(w, frames, since)| {
            let Some(c) = w.upgrade() else { return false };
            let f = c.frames.load(Ordering::Relaxed);
            if f != *frames || c.budget.requests.load(Ordering::Acquire) > 0 {
                *frames = f;
                *since = now;
                return true;
            }
            if now.duration_since(*since) < idle {
                return true;
            }
            if let Some(cb) = lock(&c.on_close).take() {
                cb();
            }
            // SAFETY: shutdown(2) on the descriptor `c` owns.
            unsafe { libc::shutdown(c.fd.as_raw_fd(), libc::SHUT_RDWR) };
            false
        });
    }
}

/// The bytes a request with cross-memory attach holds in the server: its
/// payload and the data it copies from the client's memory.
pub(crate) fn cost(h: &Header, payload: &Bytes) -> u64 {
    let mut n = payload.len() as u64;
    if h.flags & FLAG_CMA != 0 {
        if let Ok((_, r)) = CmaRef::split_off(payload) {
            n += r.len;
        }
    }
    n
}

/// The bytes any other request holds in the server: its payload (`len`
/// bytes, decoded as `req`) and the data of its reply.
pub(crate) fn cost_of(len: usize, req: &Request) -> u64 {
    let mut n = len as u64;
    if let Request::Read { len, .. } = req {
        n += (*len).min(chfs_proto::MAX_CHUNK_SIZE) as u64;
    }
    n += req.spans_len().min(chfs_proto::MAX_CHUNK_SIZE as u64);
    n
}

/// Connections open per client host (TCP) or local user.
#[derive(Default)]
pub(crate) struct PeerCounts {
    counts: Mutex<HashMap<String, u32>>,
}

/// A counted connection; uncounted when dropped.
pub(crate) struct PeerGuard {
    counts: Arc<PeerCounts>,
    key: String,
}

impl PeerCounts {
    /// Connections open now, and the client hosts and local users they
    /// come from.
    pub fn open(&self) -> (u64, u64) {
        let g = lock(&self.counts);
        (g.values().map(|&n| n as u64).sum(), g.len() as u64)
    }

    /// Counts a connection from `key` unless `max` (0: no limit) are open.
    pub fn enter(self: &Arc<Self>, key: String, max: u32) -> Option<PeerGuard> {
        let mut g = lock(&self.counts);
        let n = g.entry(key.clone()).or_insert(0);
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerGuard {
            counts: self.clone(),
            key,
        })
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut g = lock(&self.counts.counts);
        if let Some(n) = g.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                g.remove(&self.key);
            }
        }
    }
}

/// Turns on TCP keepalive probes (idle 60 s, then every 10 s, 3 of them):
/// a connection whose peer vanished without closing it (a node that
/// crashed) is closed within about 90 s.
pub(crate) fn keepalive(fd: std::os::fd::RawFd) {
    let set = |level: libc::c_int, opt: libc::c_int, v: libc::c_int| {
        // SAFETY: setsockopt on a socket the caller owns, reading a c_int
        // from a live local of the size given; a failure leaves the
        // default.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 60);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}
