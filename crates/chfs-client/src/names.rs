//! Lookup cache: a recent listing of a directory answers lookups in it.
//!
//! A FUSE mount asks for every name before it creates it (the kernel's
//! lookup precedes create) and again before it removes it once the
//! kernel's entry has expired, so without help a create or unlink through a
//! mount costs two round trips where the native client needs one. This
//! cache answers lookups locally from a snapshot of the directory that is
//! no older than `ttl`, corrected by this client's own changes since:
//!
//! - a directory this client creates starts with an empty snapshot taken
//!   when `mkdir` was sent;
//! - a directory in which lookups keep going to the servers (at least
//!   [`ASKS`] within one `ttl`) is listed once (names with their headers)
//!   and the listing becomes its snapshot, unless it holds more than
//!   [`MAX_NAMES`] names;
//! - names this client creates (create, mkdir, symlink, mknod, rename
//!   target) are added at once, names it removes are dropped, and entries
//!   it changes (writes, size, attributes) lose their cached header, so a
//!   client always sees its own changes;
//! - a snapshot is used only until `ttl` after the moment its listing
//!   started, so a change made by another client becomes visible here at
//!   most `ttl` later (the bound the kernel's entry and attribute timeouts
//!   already give).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chfs_proto::path;
use chfs_proto::Meta;
use chfs_sys::lock;

/// Lookups sent to the servers within one ttl before a directory is listed.
pub const ASKS: u32 = 8;
/// Directories with more names than this are not cached.
pub const MAX_NAMES: usize = 65536;
/// Directories tracked at most (the least recently valid are dropped).
const MAX_DIRS: usize = 4096;

/// A change this client made while a listing was running.
enum Change {
    /// Created or changed: exists, header unknown.
    Touched(String),
    Removed(String),
}

#[derive(Default)]
struct Dir {
    /// Names present when the snapshot's listing started, with their
    /// headers unless changed since, corrected by this client's changes.
    names: HashMap<String, Option<Meta>>,
    /// When the listing started (None: no snapshot).
    valid_at: Option<Instant>,
    /// Lookups sent to the servers since `window`.
    asks: u32,
    window: Option<Instant>,
    /// A listing is in progress: this client's changes meanwhile.
    listing: Option<Vec<Change>>,
    /// Too large to cache until this moment.
    too_big_until: Option<Instant>,
}

/// What [`NameCache::lookup`] knows of a name.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    /// Not in the directory as of at most `ttl` ago.
    Absent,
    /// In the directory with this header as of at most `ttl` ago.
    Present(Meta),
    /// Ask the server.
    Ask,
}

/// See the module documentation.
pub struct NameCache {
    /// Nanoseconds; 0 = off.
    ttl: AtomicU64,
    dirs: Mutex<HashMap<String, Dir>>,
}

impl Default for NameCache {
    fn default() -> Self {
        Self::new(Duration::ZERO)
    }
}

impl NameCache {
    /// A cache whose snapshots are trusted for `ttl` (zero disables it).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl: AtomicU64::new(ttl.as_nanos() as u64),
            dirs: Mutex::new(HashMap::new()),
        }
    }

    /// Changes the ttl (zero disables the cache and forgets everything).
    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl.store(ttl.as_nanos() as u64, Ordering::Relaxed);
        if ttl.is_zero() {
            lock(&self.dirs).clear();
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl.load(Ordering::Relaxed))
    }

    /// Is the cache on?
    pub fn enabled(&self) -> bool {
        !self.ttl().is_zero()
    }

    /// Answers for normalised `path` from a fresh snapshot of its parent.
    pub fn lookup(&self, p: &str) -> Known {
        let ttl = self.ttl();
        if ttl.is_zero() || p == "/" {
            return Known::Ask;
        }
        let (dir, name) = (path::parent(p), path::file_name(p));
        let dirs = lock(&self.dirs);
        match dirs.get(dir) {
            Some(d) if d.valid_at.is_some_and(|t| t.elapsed() < ttl) => match d.names.get(name) {
                None => Known::Absent,
                Some(Some(m)) => Known::Present(*m),
                Some(None) => Known::Ask,
            },
            _ => Known::Ask,
        }
    }

    /// A lookup of `path` went to its server, which found it or not.
    /// Returns true when the parent should now be listed (then call
    /// [`NameCache::begin_listing`]).
    pub fn asked(&self, p: &str, found: bool) -> bool {
        let ttl = self.ttl();
        if ttl.is_zero() || p == "/" {
            return false;
        }
        let dir = path::parent(p);
        let mut dirs = lock(&self.dirs);
        if !dirs.contains_key(dir) && dirs.len() >= MAX_DIRS {
            evict(&mut dirs, ttl);
        }
        let d = dirs.entry(dir.to_string()).or_default();
        if let Some(t) = d.valid_at {
            if t.elapsed() < ttl {
                if !found {
                    // Listed, but the server says it is gone (removed
                    // elsewhere): drop it.
                    d.names.remove(path::file_name(p));
                }
                return false;
            }
        }
        if d.listing.is_some() || d.too_big_until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        if d.window.is_none_or(|w| w.elapsed() >= ttl) {
            d.window = Some(Instant::now());
            d.asks = 0;
        }
        d.asks += 1;
        d.asks >= ASKS
    }

    /// Starts listing directory `dir`; returns the moment the listing
    /// starts, or None when another thread is already listing it.
    pub fn begin_listing(&self, dir: &str) -> Option<Instant> {
        let mut dirs = lock(&self.dirs);
        let d = dirs.entry(dir.to_string()).or_default();
        if d.listing.is_some() {
            return None;
        }
        d.listing = Some(Vec::new());
        Some(Instant::now())
    }

    /// Installs the listing of `dir` started at `at`: names with their
    /// headers (None: ask the server for this one), or None if it failed.
    pub fn end_listing(&self, dir: &str, at: Instant, names: Option<Vec<(String, Option<Meta>)>>) {
        let mut dirs = lock(&self.dirs);
        let Some(d) = dirs.get_mut(dir) else { return };
        let changes = d.listing.take().unwrap_or_default();
        d.asks = 0;
        d.window = None;
        match names {
            Some(names) if names.len() <= MAX_NAMES => {
                let mut map: HashMap<String, Option<Meta>> = names.into_iter().collect();
                for c in changes {
                    match c {
                        Change::Touched(n) => map.insert(n, None),
                        Change::Removed(n) => map.remove(&n),
                    };
                }
                d.names = map;
                d.valid_at = Some(at);
            }
            Some(_) => {
                d.names.clear();
                d.valid_at = None;
                d.too_big_until = Some(Instant::now() + self.ttl() * 30);
            }
            None => {
                d.names.clear();
                d.valid_at = None;
            }
        }
    }

    /// This client created `path` (or found it existing).
    pub fn added(&self, p: &str) {
        self.touched(p);
    }

    /// This client created or changed `path` (data, size, attributes): it
    /// exists, and its header must be asked for.
    pub fn touched(&self, p: &str) {
        if !self.enabled() || p == "/" {
            return;
        }
        let (dir, name) = (path::parent(p), path::file_name(p));
        if let Some(d) = lock(&self.dirs).get_mut(dir) {
            d.names.insert(name.to_string(), None);
            if let Some(l) = &mut d.listing {
                l.push(Change::Touched(name.to_string()));
            }
        }
    }

    /// This client removed `path`.
    pub fn removed(&self, p: &str) {
        if !self.enabled() || p == "/" {
            return;
        }
        let (dir, name) = (path::parent(p), path::file_name(p));
        if let Some(d) = lock(&self.dirs).get_mut(dir) {
            d.names.remove(name);
            if let Some(l) = &mut d.listing {
                l.push(Change::Removed(name.to_string()));
            }
        }
    }

    /// This client created directory `dir` with a request sent at `at`: it
    /// was empty then.
    pub fn new_dir(&self, dir: &str, at: Instant) {
        if !self.enabled() {
            return;
        }
        self.added(dir);
        let ttl = self.ttl();
        let mut dirs = lock(&self.dirs);
        if !dirs.contains_key(dir) && dirs.len() >= MAX_DIRS {
            evict(&mut dirs, ttl);
        }
        let d = dirs.entry(dir.to_string()).or_default();
        if d.listing.is_none() {
            d.names.clear();
            d.valid_at = Some(at);
        }
    }

    /// Forgets every snapshot of `dir` and the directories below it (after
    /// rmdir or rename of a directory).
    pub fn forget_below(&self, dir: &str) {
        if !self.enabled() {
            return;
        }
        lock(&self.dirs).retain(|d, _| !path::is_within(d, dir));
    }
}

/// Makes room: drops stale snapshots first, everything if that is not
/// enough.
fn evict(dirs: &mut HashMap<String, Dir>, ttl: Duration) {
    dirs.retain(|_, d| d.listing.is_some() || d.valid_at.is_some_and(|t| t.elapsed() < ttl));
    if dirs.len() >= MAX_DIRS {
        dirs.retain(|_, d| d.listing.is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> NameCache {
        NameCache::new(Duration::from_secs(60))
    }

    fn meta(size: u64) -> Meta {
        Meta {
            mode: libc::S_IFREG | 0o644,
            size,
            ..Default::default()
        }
    }

    #[test]
    fn disabled_cache_always_asks() {
        let c = NameCache::default();
        c.new_dir("/d", Instant::now());
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        for _ in 0..ASKS * 2 {
            assert!(!c.asked("/d/x", false));
        }
    }

    #[test]
    fn new_directory_is_empty_except_for_own_creations() {
        let c = cache();
        c.new_dir("/d", Instant::now());
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        c.added("/d/x");
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        assert_eq!(c.lookup("/d/y"), Known::Absent);
        c.removed("/d/x");
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        // Other directories are unknown.
        assert_eq!(c.lookup("/e/x"), Known::Ask);
        assert_eq!(c.lookup("/x"), Known::Ask);
    }

    #[test]
    fn snapshots_expire() {
        let c = NameCache::new(Duration::from_millis(30));
        c.new_dir("/d", Instant::now());
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
    }

    #[test]
    fn repeated_asks_trigger_a_listing_that_keeps_concurrent_changes() {
        let c = cache();
        for i in 1..ASKS {
            assert!(!c.asked(&format!("/d/m{i}"), i % 2 == 0), "ask {i}");
        }
        assert!(c.asked("/d/last", false));
        let at = c.begin_listing("/d").expect("first lister");
        assert!(c.begin_listing("/d").is_none(), "one listing at a time");
        // Changed while the listing runs: must win over what it returns.
        c.added("/d/during");
        c.touched("/d/b");
        c.removed("/d/c");
        let listed = ["a", "b", "c"].map(|n| (n.to_string(), Some(meta(5))));
        c.end_listing("/d", at, Some(listed.to_vec()));
        assert_eq!(c.lookup("/d/a"), Known::Present(meta(5)));
        assert_eq!(c.lookup("/d/b"), Known::Ask);
        assert_eq!(c.lookup("/d/c"), Known::Absent);
        assert_eq!(c.lookup("/d/during"), Known::Ask);
        assert_eq!(c.lookup("/d/zzz"), Known::Absent);
        // Changed by this client after the listing: ask.
        c.touched("/d/a");
        assert_eq!(c.lookup("/d/a"), Known::Ask);
        // A listed name the server no longer has is dropped.
        assert!(!c.asked("/d/a", false));
        assert_eq!(c.lookup("/d/a"), Known::Absent);
    }

    #[test]
    fn failed_or_huge_listings_are_not_used() {
        let c = cache();
        let at = c.begin_listing("/d").unwrap();
        c.end_listing("/d", at, None);
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        let at = c.begin_listing("/d").unwrap();
        let many = (0..=MAX_NAMES).map(|i| (i.to_string(), None)).collect();
        c.end_listing("/d", at, Some(many));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        for _ in 0..ASKS * 2 {
            assert!(!c.asked("/d/x", false), "too big: no new listing soon");
        }
    }

    #[test]
    fn removing_or_renaming_a_directory_forgets_its_subtree() {
        let c = cache();
        c.new_dir("/d", Instant::now());
        c.new_dir("/d/e", Instant::now());
        c.new_dir("/f", Instant::now());
        c.forget_below("/d");
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        assert_eq!(c.lookup("/d/e/x"), Known::Ask);
        assert_eq!(c.lookup("/f/x"), Known::Absent);
    }
}
