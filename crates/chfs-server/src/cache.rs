//! Cache mode (CHFS/Cache): read-through from a backend directory, dirty
//! tracking, and I/O-aware write-back by flush workers.
//!
//! * A path missing from the cache but present in the backend is imported
//!   on first lookup by the owner of its entry (`FLAG_CACHED`); the bytes of
//!   each chunk are fetched by the chunk's owner when first read or written
//!   (`rw::BACKEND`).
//! * Every write marks its chunk dirty (`FLAG_DIRTY` in the stored header and
//!   a generation counter here). Flush workers write dirty chunks to the
//!   backend at their offsets and clear the flag only if the chunk did not
//!   change meanwhile; failures stay dirty and are retried with back-off.
//! * Flushing runs when the server has served no client request for
//!   `flush_idle` (negative: at once) and stops as soon as requests arrive,
//!   unless a client asked for a flush (`Flush`, used by `chfs_sync`).
//! * The dirty set is rebuilt from the store's flags at start, so with a
//!   persistent engine a restart resumes flushing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chfs_proto::meta::{now_ns, FLAG_CACHED, FLAG_DIRTY, FLAG_PARTIAL, FLAG_WHITEOUT};
use chfs_proto::msg::FlushState;
use chfs_proto::path::is_within;
use chfs_proto::Meta;
use chfs_store::{Chunk, Store, StoreError};
use chfs_sys::lock;
use tracing::{debug, info, warn};

use crate::backend::{meta_from_stat, Backend};

/// What namespace changes do to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The cache behaves as the backend namespace: unlink, rmdir and rename
    /// are applied to the backend too (at once), new and modified entries
    /// at flush time.
    Mirror,
    /// The backend is only written for new and modified files and
    /// directories; removals leave the backend copy (hidden by a whiteout),
    /// renaming a backend entry gives EXDEV (so `mv` copies).
    Keep,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mirror" => Ok(Policy::Mirror),
            "keep" => Ok(Policy::Keep),
            _ => Err(format!("unknown backend policy {s:?} (mirror or keep)")),
        }
    }
}

/// Cache-mode settings.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Backend directory (already joined with the subdirectory).
    pub backend: PathBuf,
    /// Namespace policy.
    pub policy: Policy,
    /// Idle time before flushing starts; negative = flush at once.
    pub flush_idle_ms: i64,
    /// Chunks flushed concurrently.
    pub flush_threads: usize,
    /// Compare backend mtime/size of clean cached files on lookup.
    pub revalidate: bool,
    /// Chunk size of files imported from the backend.
    pub chunk_size: u32,
}

struct Dirty {
    gen: u64,
    bytes: u64,
    failures: u32,
    next_try: Option<Instant>,
    /// The last failure's errno and message.
    last_error: Option<(i32, String)>,
}

/// Cache state of one server.
pub struct Cache {
    pub(crate) backend: Backend,
    pub(crate) cfg: CacheConfig,
    dirty: Mutex<BTreeMap<(String, u64), Dirty>>,
    fetch_locks: Vec<Mutex<()>>,
    forced: Mutex<Vec<String>>,
    last_request_ms: AtomicI64,
    started: Instant,
    pub(crate) kick: tokio::sync::Notify,
    gen: AtomicI64,
}

fn io_err(path: &str, what: &str, e: std::io::Error) -> StoreError {
    StoreError::refused(
        chfs_proto::error::io_errno(&e),
        format!("backend {what} of {path}: {e}"),
    )
}

impl Cache {
    /// Opens the backend directory.
    pub fn open(cfg: CacheConfig) -> std::io::Result<Cache> {
        let backend = Backend::open(&cfg.backend)?;
        Ok(Cache {
            backend,
            cfg,
            dirty: Mutex::new(BTreeMap::new()),
            fetch_locks: (0..64).map(|_| Mutex::new(())).collect(),
            forced: Mutex::new(Vec::new()),
            last_request_ms: AtomicI64::new(0),
            started: Instant::now(),
            kick: tokio::sync::Notify::new(),
            gen: AtomicI64::new(1),
        })
    }

    fn now_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// Records client activity (postpones idle-time flushing).
    pub fn touch(&self) {
        self.last_request_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn idle(&self) -> bool {
        self.cfg.flush_idle_ms < 0
            || self.now_ms() - self.last_request_ms.load(Ordering::Relaxed)
                >= self.cfg.flush_idle_ms
    }

    fn fetch_lock(&self, path: &str, idx: u64) -> MutexGuard<'_, ()> {
        let h = chfs_proto::ring::path_hash(path).wrapping_add(idx);
        lock(&self.fetch_locks[(h % self.fetch_locks.len() as u64) as usize])
    }

    /// Marks chunk `idx` of `path` dirty (in the store and here).
    pub fn mark_dirty(&self, store: &dyn Store, path: &str, idx: u64) -> Result<(), StoreError> {
        let m = store.update_meta(path, idx, &mut |m| {
            m.flags |= FLAG_DIRTY;
            Ok(())
        })?;
        let bytes = if idx == 0 {
            m.size.min(m.chunk_size as u64)
        } else {
            m.chunk_size as u64
        };
        let gen = self.gen.fetch_add(1, Ordering::Relaxed) as u64;
        let mut d = lock(&self.dirty);
        let e = d.entry((path.to_string(), idx)).or_insert(Dirty {
            gen,
            bytes,
            failures: 0,
            next_try: None,
            last_error: None,
        });
        e.gen = gen;
        e.bytes = bytes;
        Ok(())
    }

    /// Forgets dirty chunks of `path` with index >= `from` (removed data).
    pub fn forget(&self, path: &str, from: u64) {
        let mut d = lock(&self.dirty);
        let keys: Vec<_> = d
            .range((path.to_string(), from)..=(path.to_string(), u64::MAX))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            d.remove(&k);
        }
    }

    /// Forgets one dirty chunk (moved away by rename).
    pub fn forget_one(&self, path: &str, idx: u64) {
        lock(&self.dirty).remove(&(path.to_string(), idx));
    }

    /// Rebuilds the dirty set from the store's flags (at start).
    pub fn rescan(&self, store: &dyn Store) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut paths = store.paths_below("/")?;
        paths.push("/".into());
        for p in paths {
            for idx in store.chunk_indices(&p)? {
                if let Some(m) = store.meta(&p, idx)? {
                    if m.flags & FLAG_DIRTY != 0 {
                        self.mark_dirty(store, &p, idx)?;
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    /// Imports `path` from the backend if it exists there; `None` if not.
    /// Called by the owner of the entry on a miss.
    /// The entry of a regular file gets `epoch` (the server list version).
    pub fn import(
        &self,
        store: &dyn Store,
        path: &str,
        epoch: u64,
    ) -> Result<Option<Meta>, StoreError> {
        let Some(st) = self
            .backend
            .lstat(path)
            .map_err(|e| io_err(path, "lookup", e))?
        else {
            return Ok(None);
        };
        let fileid = (chfs_proto::ring::path_hash(path) as u32 ^ now_ns() as u32).max(1);
        let mut meta = meta_from_stat(&st, self.cfg.chunk_size, fileid);
        meta.set_epoch(epoch);
        let data = if meta.is_symlink() {
            self.backend
                .readlink(path)
                .map_err(|e| io_err(path, "readlink", e))?
        } else {
            Vec::new()
        };
        let (m, _) = store.create(path, meta, &data, false)?;
        debug!(path, "imported from the backend");
        Ok(Some(m))
    }

    /// Revalidation: a clean cached file whose backend copy changed (mtime
    /// or size) is imported again with a new fileid, so its old chunks read
    /// as stale everywhere.
    pub fn revalidate(
        &self,
        store: &dyn Store,
        path: &str,
        m: Meta,
        epoch: u64,
    ) -> Result<Meta, StoreError> {
        if !self.cfg.revalidate
            || m.flags & FLAG_CACHED == 0
            || m.flags & FLAG_DIRTY != 0
            || !m.is_reg()
        {
            return Ok(m);
        }
        let Some(st) = self
            .backend
            .lstat(path)
            .map_err(|e| io_err(path, "lookup", e))?
        else {
            return Ok(m);
        };
        if crate::backend::mtime_ns(&st) == m.mtime && st.st_size as u64 == m.size {
            return Ok(m);
        }
        info!(path, "backend copy changed: dropping the cached copy");
        let _ = store.take(path, 0)?;
        Ok(self.import(store, path, epoch)?.unwrap_or(m))
    }

    /// Makes sure chunk `idx` of a cached file is present (fetching it from
    /// the backend), before it is read or written.
    pub fn ensure_chunk(
        &self,
        store: &dyn Store,
        path: &str,
        idx: u64,
        fileid: u32,
        cs: u32,
        mode: u32,
    ) -> Result<(), StoreError> {
        if idx == 0 {
            match store.meta(path, 0)? {
                Some(m) if m.flags & FLAG_PARTIAL != 0 => {}
                _ => return Ok(()),
            }
            let _g = self.fetch_lock(path, 0);
            let Some(m) = store.meta(path, 0)? else {
                return Ok(());
            };
            if m.flags & FLAG_PARTIAL == 0 {
                return Ok(());
            }
            let data = self
                .backend
                .read(path, 0, m.chunk_size as usize)
                .map_err(|e| io_err(path, "read", e))?;
            let data_len = data.len();
            store.put(
                path,
                0,
                Chunk {
                    meta: Meta {
                        flags: m.flags & !FLAG_PARTIAL,
                        ..m
                    },
                    data: data.into(),
                },
            )?;
            debug!(path, bytes = data_len, "fetched chunk 0 from the backend");
            return Ok(());
        }
        let present = |m: Option<Meta>| m.is_some_and(|m| m.fileid == fileid);
        if present(store.meta(path, idx)?) {
            return Ok(());
        }
        let _g = self.fetch_lock(path, idx);
        if present(store.meta(path, idx)?) {
            return Ok(());
        }
        let data = self
            .backend
            .read(path, idx * cs as u64, cs as usize)
            .map_err(|e| io_err(path, "read", e))?;
        let meta = Meta {
            flags: FLAG_CACHED,
            mode,
            chunk_size: cs,
            fileid,
            mtime: now_ns(),
            ..Default::default()
        };
        store.put(
            path,
            idx,
            Chunk {
                meta,
                data: data.into(),
            },
        )?;
        Ok(())
    }

    /// Write-back state of the dirty chunks under `prefix`.
    pub fn state(&self, prefix: &str) -> FlushState {
        let d = lock(&self.dirty);
        let mut s = FlushState::default();
        for ((p, _), e) in d.iter() {
            if is_within(p, prefix) {
                s.chunks += 1;
                s.bytes += e.bytes;
                if let Some((errno, msg)) = &e.last_error {
                    s.failing += 1;
                    s.last_error = msg.clone();
                    s.last_errno = *errno;
                }
            }
        }
        s
    }

    /// Asks for the chunks under `prefix` to be flushed now.
    pub fn force(&self, prefix: &str) {
        let mut f = lock(&self.forced);
        if !f.iter().any(|p| p == prefix) {
            f.push(prefix.to_string());
        }
        // Retry failing chunks at once.
        for ((p, _), e) in lock(&self.dirty).iter_mut() {
            if is_within(p, prefix) {
                e.next_try = None;
            }
        }
        self.kick.notify_one();
    }

    /// Chunks to flush now: under a forced prefix, or all when idle.
    fn pick(&self, max: usize) -> Vec<((String, u64), u64)> {
        let forced: Vec<String> = lock(&self.forced).clone();
        let idle = self.idle();
        let now = Instant::now();
        let d = lock(&self.dirty);
        let mut out = Vec::new();
        for (k, e) in d.iter() {
            if e.next_try.is_some_and(|t| t > now) {
                continue;
            }
            if idle || forced.iter().any(|p| is_within(&k.0, p)) {
                out.push((k.clone(), e.gen));
                if out.len() >= max {
                    break;
                }
            }
        }
        drop(d);
        if out.is_empty() && !forced.is_empty() {
            // Forced prefixes with nothing left to do are done.
            let d = lock(&self.dirty);
            lock(&self.forced).retain(|p| d.keys().any(|(k, _)| is_within(k, p)));
        }
        out
    }

    /// Flushes one chunk; returns whether it was written.
    fn flush_one(&self, store: &dyn Store, path: &str, idx: u64, gen: u64) -> bool {
        let r = (|| -> Result<bool, StoreError> {
            let Some(m) = store.meta(path, idx)? else {
                return Ok(false);
            };
            if m.flags & FLAG_WHITEOUT != 0 {
                return Ok(false);
            }
            if idx == 0 {
                let data = if m.flags & FLAG_PARTIAL != 0 || !(m.is_reg() || m.is_symlink()) {
                    None
                } else {
                    store.read(path, 0, m.fileid, 0, m.chunk_size)?
                };
                self.backend
                    .write_entry(path, &m, data.as_deref())
                    .map_err(|e| io_err(path, "write", e))?;
            } else {
                let Some(data) = store.read(path, idx, m.fileid, 0, m.chunk_size)? else {
                    return Ok(false);
                };
                self.backend
                    .write_chunk(path, idx * m.chunk_size as u64, &data, &m)
                    .map_err(|e| io_err(path, "write", e))?;
            }
            Ok(true)
        })();
        let mut d = lock(&self.dirty);
        let key = (path.to_string(), idx);
        match r {
            Ok(written) => {
                if d.get(&key).is_some_and(|e| e.gen == gen) {
                    d.remove(&key);
                    drop(d);
                    let _ = store.update_meta(path, idx, &mut |m| {
                        m.flags &= !FLAG_DIRTY;
                        Ok(())
                    });
                }
                written
            }
            Err(e) => {
                if let Some(ent) = d.get_mut(&key) {
                    ent.failures += 1;
                    let backoff = Duration::from_millis(250u64 << ent.failures.min(8));
                    ent.next_try = Some(Instant::now() + backoff);
                    let msg = e.to_string();
                    if ent.last_error.as_ref().map(|(_, m)| m) != Some(&msg) {
                        warn!(
                            path,
                            idx, "flush failed (kept dirty, retrying in {backoff:?}): {msg}"
                        );
                    }
                    ent.last_error = Some((e.errno(), msg));
                }
                false
            }
        }
    }

    /// The flush worker loop of a server.
    pub async fn run_flusher(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let threads = self.cfg.flush_threads.max(1);
        loop {
            let batch = self.pick(threads * 8);
            if batch.is_empty() {
                let wait = if self.cfg.flush_idle_ms < 0 {
                    50
                } else {
                    (self.cfg.flush_idle_ms as u64 / 4).clamp(20, 250)
                };
                tokio::select! {
                    _ = self.kick.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
            let forced: Vec<String> = lock(&self.forced).clone();
            let mut it = batch.into_iter();
            loop {
                let group: Vec<_> = it.by_ref().take(threads).collect();
                if group.is_empty() {
                    break;
                }
                let mut tasks = Vec::new();
                for ((path, idx), gen) in group {
                    // Yield to client I/O: stop unless idle or asked for.
                    if !self.idle() && !forced.iter().any(|p| is_within(&path, p)) {
                        continue;
                    }
                    let (c, s) = (self.clone(), store.clone());
                    tasks.push(tokio::task::spawn_blocking(move || {
                        c.flush_one(&*s, &path, idx, gen)
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            }
            if *stop.borrow() {
                return;
            }
        }
    }
}
