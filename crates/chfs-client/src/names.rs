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
//!   already give);
//! - unless the servers tell that nobody else changed the directory's
//!   names: see below.
//!
//! # Keeping a snapshot by versions
//!
//! Relisting a directory every `ttl` costs as much as the directory is
//! large, so without help only directories of at most [`MAX_NAMES`] names
//! are kept. Each server keeps a version of each directory's set of names
//! it holds (`chfs_store::DirVersion`, `Request::DirVersion`): `born`, a
//! number never given twice by that server (also across restarts), taken
//! when the directory gets its first entry there, and `changes`, the
//! number of names added or removed since; "absent" when it has no
//! entries there. With each snapshot this cache keeps, per server, the
//! version fetched *before* the listing started (the base), and the number
//! of this client's own acknowledged changes of the set on that server
//! since (the server of a name is the owner of its entry). When the
//! snapshot is older than `ttl`, the versions are fetched again (at most
//! once per `ttl`) and the snapshot's names stay valid for another `ttl`
//! from that fetch's start iff for every server
//! `base == now == absent` and no own changes there, or the same `born`
//! and `now.changes == base.changes + own changes`; then the fetched
//! versions become the base. Otherwise the snapshot is dropped and the
//! directory is handled as above.
//!
//! Why this never calls a name absent that exists: a name missing from
//! the snapshot is missing from the listing and was not added by this
//! client since, or was removed by it. If some other client (or a
//! rebalance, or a restart) changed the set of some server between the
//! base and the check, the count of that server's changes since `born`
//! grew by more than this client's own changes, or the directory's life
//! there ended (absent, or a new `born`): a foreign add can only be hidden
//! from the rule by a change counted as own that did not happen, which is
//! why only acknowledged real changes are counted (a create the server
//! says made the entry, a removal it did), never a create of an existing
//! name, never a request whose answer was lost (those are counted as
//! nothing: too few own changes is a mismatch, safe). Counting must also
//! know on which side of a fetch each own change fell: a fetch during
//! which an own change of the directory was in flight ("disturbed") is not
//! used (a base is not taken, a check does not extend), so every counted
//! change was acknowledged before the fetch started or sent after it
//! ended. Two own changes of one name in flight at once may be applied by
//! the server in the other order than they were acknowledged: the snapshot
//! is dropped. Versions are compared only when every server answered with
//! the server list this client uses and its list did not change since the
//! base (a server with another list forwards requests and rebalances
//! move entries; any change of the list drops tracking). A server in
//! cache mode refuses versions (the backend's files change without them)
//! and an older server does not know the request: the client then keeps
//! today's behaviour. A directory this client creates gets "absent" on
//! every server as its base, the same assumption as its empty snapshot.
//!
//! After a snapshot was extended by versions, the headers it holds are no
//! longer used (writes by others change sizes without changing the names):
//! a name it holds is asked for, a name it lacks is absent. Snapshots kept
//! by versions may hold up to [`MAX_TRACKED_NAMES`] names, at most
//! [`MAX_BIG_DIRS`] of them above [`MAX_NAMES`] at once (about 150 bytes
//! per name: under 600 MiB in all at worst).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chfs_proto::path;
use chfs_proto::Meta;
use chfs_sys::lock;

/// Lookups sent to the servers within one ttl before a directory is listed.
pub const ASKS: u32 = 8;
/// Directories with more names than this are not cached, unless kept by
/// versions.
pub const MAX_NAMES: usize = 65536;
/// Directories kept by versions with more names than this are not cached.
pub const MAX_TRACKED_NAMES: usize = 1 << 20;
/// Snapshots of more than [`MAX_NAMES`] names kept at once.
pub const MAX_BIG_DIRS: usize = 4;

/// A directory's version on one server: (born, changes), None when it
/// has no entries there.
pub type Ver = Option<(u64, u64)>;

/// What a fetch of a directory's versions found: the server list version
/// they were fetched with (every server answered with that list) and the
/// version on each server that may hold entries of it (ring index,
/// version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub list: u64,
    pub servers: Vec<(usize, Ver)>,
}

/// A snapshot's base versions and this client's own changes since.
struct Track {
    base: Versions,
    /// Own acknowledged changes since the base, by position in
    /// `base.servers`.
    own: Vec<u64>,
}

/// What an own change did to the name set of its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing (failed, or an existing name).
    None,
    /// One name added or removed (acknowledged by the server).
    One,
    /// Unknown (lost answer, rename): versions can no longer tell.
    Unknown,
}
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
    /// Versions of the snapshot's base (see the module documentation).
    track: Option<Track>,
    /// A fetch of versions runs: whether it was disturbed.
    fetch: Option<bool>,
    /// When the last check of versions started.
    checked: Option<Instant>,
    /// Names of own changes in flight (sent, not acknowledged).
    inflight: Vec<String>,
    /// The snapshot was extended by versions: its headers are not used.
    extended: bool,
}

impl Dir {
    fn drop_snapshot(&mut self) {
        self.names = HashMap::new();
        self.valid_at = None;
        self.track = None;
        self.extended = false;
    }

    fn fresh(&self, ttl: Duration) -> bool {
        self.valid_at.is_some_and(|t| t.elapsed() < ttl)
    }
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
    /// Check the directory's versions ([`NameCache::begin_check`]), then
    /// look up again.
    Check,
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
            Some(d) if d.fresh(ttl) => match d.names.get(name) {
                None => Known::Absent,
                Some(Some(m)) if !d.extended => Known::Present(*m),
                Some(_) => Known::Ask,
            },
            Some(d)
                if d.valid_at.is_some()
                    && d.track.is_some()
                    && d.listing.is_none()
                    && d.fetch.is_none()
                    && d.inflight.is_empty()
                    && d.checked.is_none_or(|t| t.elapsed() >= ttl) =>
            {
                Known::Check
            }
            _ => Known::Ask,
        }
    }

    /// Starts a check of `dir`'s versions (after [`Known::Check`]);
    /// returns its start, or None when it is not to be done now.
    pub fn begin_check(&self, dir: &str) -> Option<Instant> {
        let ttl = self.ttl();
        let mut dirs = lock(&self.dirs);
        let d = dirs.get_mut(dir)?;
        if d.track.is_none()
            || d.listing.is_some()
            || d.fetch.is_some()
            || d.checked.is_some_and(|t| t.elapsed() < ttl)
        {
            return None;
        }
        let now = Instant::now();
        d.checked = Some(now);
        d.fetch = Some(!d.inflight.is_empty());
        Some(now)
    }

    /// Ends the check started at `at` with the versions fetched (None:
    /// the fetch failed or the servers do not keep versions).
    pub fn end_check(&self, dir: &str, at: Instant, now: Option<Versions>) {
        let ttl = self.ttl();
        let mut dirs = lock(&self.dirs);
        let Some(d) = dirs.get_mut(dir) else { return };
        let disturbed = d.fetch.take().unwrap_or(true);
        let (Some(now), Some(track)) = (now, d.track.as_ref()) else {
            // (expired already: its memory is freed at once)
            d.drop_snapshot();
            return;
        };
        if disturbed {
            // An own change was in flight: this fetch cannot tell. A
            // lookup may check again an eighth of the ttl from now, not at
            // once: a directory that this client's threads change all the
            // time would otherwise cost a request to every server at
            // nearly every lookup (at most 8 checks per ttl this way).
            d.checked = Instant::now().checked_sub(ttl.saturating_sub(ttl / 8));
            return;
        }
        if d.valid_at.is_none() {
            return;
        }
        let same = now.list == track.base.list
            && now.servers.len() == track.base.servers.len()
            && now
                .servers
                .iter()
                .zip(&track.base.servers)
                .zip(&track.own)
                .all(|(((i, v), (j, b)), &own)| {
                    i == j
                        && match (b, v) {
                            (None, None) => own == 0,
                            (Some((born, c)), Some((nborn, nc))) => {
                                born == nborn && c.checked_add(own) == Some(*nc)
                            }
                            _ => false,
                        }
                });
        if same {
            let n = now.servers.len();
            d.track = Some(Track {
                base: now,
                own: vec![0; n],
            });
            d.valid_at = Some(at);
            d.extended = true;
        } else {
            // Changed by someone else: as without versions.
            d.drop_snapshot();
        }
    }

    /// The versions of `dir` are about to be fetched for a listing
    /// started with [`NameCache::begin_listing`].
    pub fn begin_base(&self, dir: &str) {
        let mut dirs = lock(&self.dirs);
        if let Some(d) = dirs.get_mut(dir) {
            d.fetch = Some(!d.inflight.is_empty());
        }
    }

    /// The versions fetched before the listing of `dir` (None: failed or
    /// not kept): the base of the snapshot the listing makes, if no own
    /// change was in flight while they were fetched.
    pub fn end_base(&self, dir: &str, v: Option<Versions>) {
        let mut dirs = lock(&self.dirs);
        if let Some(d) = dirs.get_mut(dir) {
            let disturbed = d.fetch.take().unwrap_or(true);
            d.track = match v {
                Some(v) if !disturbed => {
                    let n = v.servers.len();
                    Some(Track {
                        base: v,
                        own: vec![0; n],
                    })
                }
                _ => None,
            };
        }
    }

    /// This client is about to send a change of the name set of the
    /// parent of `path` (create, remove, rename): call
    /// [`NameCache::end_change`] with its outcome.
    pub fn begin_change(&self, p: &str) {
        if !self.enabled() || p == "/" {
            return;
        }
        let (dir, name) = (path::parent(p), path::file_name(p));
        let ttl = self.ttl();
        let mut dirs = lock(&self.dirs);
        if !dirs.contains_key(dir) && dirs.len() >= MAX_DIRS {
            evict(&mut dirs, ttl);
        }
        let d = dirs.entry(dir.to_string()).or_default();
        if let Some(f) = &mut d.fetch {
            *f = true;
        }
        if d.inflight.iter().any(|n| n == name) {
            // Two changes of one name at once: the order the server
            // applies them in is not known here.
            d.drop_snapshot();
        }
        d.inflight.push(name.to_string());
    }

    /// The change of `path` begun with [`NameCache::begin_change`] was
    /// answered: `effect` on the name set of `server` (ring index) of
    /// server list `list`.
    pub fn end_change(&self, p: &str, server: usize, list: u64, effect: Effect) {
        if !self.enabled() || p == "/" {
            return;
        }
        let (dir, name) = (path::parent(p), path::file_name(p));
        let mut dirs = lock(&self.dirs);
        let Some(d) = dirs.get_mut(dir) else { return };
        if let Some(at) = d.inflight.iter().position(|n| n == name) {
            d.inflight.swap_remove(at);
        }
        let Some(t) = &mut d.track else { return };
        match effect {
            Effect::None => {}
            Effect::One if t.base.list == list => {
                match t.base.servers.iter().position(|(i, _)| *i == server) {
                    Some(at) => t.own[at] += 1,
                    None => d.track = None,
                }
            }
            _ => d.track = None,
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
        if d.listing.is_some()
            || d.track.is_some()
            || d.too_big_until.is_some_and(|t| Instant::now() < t)
        {
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
        let max = if d.track.is_some() {
            MAX_TRACKED_NAMES
        } else {
            MAX_NAMES
        };
        // (counted before this one is replaced)
        let big = big_dirs(&dirs, dir);
        let Some(d) = dirs.get_mut(dir) else { return };
        let max = if big >= MAX_BIG_DIRS { MAX_NAMES } else { max };
        d.extended = false;
        match names {
            Some(names) if names.len() <= max => {
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
                d.drop_snapshot();
                d.too_big_until = Some(Instant::now() + self.ttl() * 30);
            }
            None => d.drop_snapshot(),
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
            if d.names.len() > MAX_TRACKED_NAMES {
                d.drop_snapshot();
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
    /// was empty then, so held by no server (`servers`: those that may
    /// hold its entries, with server list `list`).
    pub fn new_dir(&self, dir: &str, at: Instant, list: u64, servers: &[usize]) {
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
            d.drop_snapshot();
            d.valid_at = Some(at);
            if d.inflight.is_empty() && d.fetch.is_none() {
                d.track = Some(Track {
                    base: Versions {
                        list,
                        servers: servers.iter().map(|&i| (i, None)).collect(),
                    },
                    own: vec![0; servers.len()],
                });
            }
        }
    }

    /// Forgets every snapshot of `dir` and the directories below it (after
    /// rmdir or rename of a directory).
    pub fn forget_below(&self, dir: &str) {
        if !self.enabled() {
            return;
        }
        lock(&self.dirs).retain(|d, v| {
            if !path::is_within(d, dir) {
                return true;
            }
            // (what is in flight there must still be known to a fetch)
            v.drop_snapshot();
            v.listing.is_some() || v.fetch.is_some() || !v.inflight.is_empty()
        });
    }
}

/// Snapshots of more than [`MAX_NAMES`] names, but `dir`'s.
fn big_dirs(dirs: &HashMap<String, Dir>, dir: &str) -> usize {
    dirs.iter()
        .filter(|(k, d)| k.as_str() != dir && d.names.len() > MAX_NAMES)
        .count()
}

/// Makes room: drops stale snapshots first, everything if that is not
/// enough.
fn evict(dirs: &mut HashMap<String, Dir>, ttl: Duration) {
    // (a directory with a fetch or a change in flight is kept: a fetch
    // must know of every change in flight)
    let busy = |d: &Dir| d.listing.is_some() || d.fetch.is_some() || !d.inflight.is_empty();
    dirs.retain(|_, d| busy(d) || d.track.is_some() || d.fresh(ttl));
    if dirs.len() >= MAX_DIRS {
        dirs.retain(|_, d| busy(d));
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
        c.new_dir("/d", Instant::now(), 1, &[0, 1]);
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        for _ in 0..ASKS * 2 {
            assert!(!c.asked("/d/x", false));
        }
    }

    #[test]
    fn new_directory_is_empty_except_for_own_creations() {
        let c = cache();
        c.new_dir("/d", Instant::now(), 1, &[0, 1]);
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
        c.new_dir("/d", Instant::now(), 1, &[0, 1]);
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        std::thread::sleep(Duration::from_millis(40));
        // (kept by versions, if they say so)
        assert_eq!(c.lookup("/d/x"), Known::Check);
        let at = c.begin_check("/d").unwrap();
        c.end_check("/d", at, None);
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
        c.new_dir("/d", Instant::now(), 1, &[0, 1]);
        c.new_dir("/d/e", Instant::now(), 1, &[0, 1]);
        c.new_dir("/f", Instant::now(), 1, &[0, 1]);
        c.forget_below("/d");
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        assert_eq!(c.lookup("/d/e/x"), Known::Ask);
        assert_eq!(c.lookup("/f/x"), Known::Absent);
    }

    fn vers(list: u64, v: &[Ver]) -> Versions {
        Versions {
            list,
            servers: v.iter().copied().enumerate().collect(),
        }
    }

    /// A cache of ttl 30 ms with a snapshot of /d (names `names`, taken
    /// with base `base`).
    fn tracked(base: Versions, names: &[&str]) -> NameCache {
        let c = NameCache::new(Duration::from_millis(30));
        let at = c.begin_listing("/d").unwrap();
        c.begin_base("/d");
        c.end_base("/d", Some(base));
        let listed = names.iter().map(|n| (n.to_string(), Some(meta(1))));
        c.end_listing("/d", at, Some(listed.collect()));
        c
    }

    /// Waits out the ttl and checks with versions `now`; then what the
    /// cache says of /d/x.
    fn check(c: &NameCache, now: Versions) -> Known {
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Check);
        let at = c.begin_check("/d").expect("a check");
        assert!(c.begin_check("/d").is_none(), "one check at a time");
        c.end_check("/d", at, Some(now));
        c.lookup("/d/x")
    }

    fn own(c: &NameCache, p: &str, server: usize, effect: Effect) {
        c.begin_change(p);
        c.end_change(p, server, 1, effect);
    }

    #[test]
    fn versions_changed_only_by_own_changes_keep_the_snapshot() {
        let c = tracked(vers(1, &[Some((5, 10)), None]), &["a"]);
        assert_eq!(c.lookup("/d/a"), Known::Present(meta(1)));
        own(&c, "/d/b", 0, Effect::One);
        own(&c, "/d/a", 0, Effect::One);
        c.removed("/d/a");
        c.added("/d/b");
        assert_eq!(check(&c, vers(1, &[Some((5, 12)), None])), Known::Absent);
        assert_eq!(c.lookup("/d/a"), Known::Absent);
        assert_eq!(c.lookup("/d/b"), Known::Ask);
        // Another ttl: the fetched versions are the base now.
        own(&c, "/d/c", 0, Effect::One);
        c.added("/d/c");
        assert_eq!(check(&c, vers(1, &[Some((5, 13)), None])), Known::Absent);
        assert_eq!(c.lookup("/d/c"), Known::Ask);
        // At most one check per ttl.
        std::thread::sleep(Duration::from_millis(40));
        let at = c.begin_check("/d").unwrap();
        c.end_check("/d", at, None);
        assert_eq!(c.lookup("/d/x"), Known::Ask, "failed fetch: as before");
    }

    #[test]
    fn headers_of_an_extended_snapshot_are_asked_for() {
        let c = tracked(vers(1, &[Some((5, 10))]), &["a"]);
        assert_eq!(check(&c, vers(1, &[Some((5, 10))])), Known::Absent);
        assert_eq!(c.lookup("/d/a"), Known::Ask, "size may have changed");
    }

    #[test]
    fn a_foreign_change_on_the_server_of_own_changes_is_a_mismatch() {
        // Two own creates and a foreign one on server 0.
        let c = tracked(vers(1, &[Some((5, 10)), Some((6, 3))]), &[]);
        own(&c, "/d/a", 0, Effect::One);
        own(&c, "/d/b", 0, Effect::One);
        assert_eq!(
            check(&c, vers(1, &[Some((5, 13)), Some((6, 3))])),
            Known::Ask
        );
        // Tracking is dropped: no more checks, the old way takes over.
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        assert!(c.begin_check("/d").is_none());
    }

    #[test]
    fn a_create_of_an_existing_name_is_not_counted() {
        // Counted, it would hide the foreign create (5, 11).
        let c = tracked(vers(1, &[Some((5, 10))]), &["a"]);
        own(&c, "/d/a", 0, Effect::None);
        assert_eq!(check(&c, vers(1, &[Some((5, 11))])), Known::Ask);
    }

    #[test]
    fn lives_ending_and_beginning_are_mismatches_unless_absent_throughout() {
        // Emptied and filled again by others: a new born, whatever the count.
        let c = tracked(vers(1, &[Some((5, 10))]), &["a"]);
        assert_eq!(check(&c, vers(1, &[Some((8, 10))])), Known::Ask);
        // Absent -> present (by others) -> absent: the same (empty) set.
        let c = tracked(vers(1, &[None, Some((5, 1))]), &["a"]);
        assert_eq!(check(&c, vers(1, &[None, Some((5, 1))])), Known::Absent);
        // Absent, then an own create: the new life's born is unknown, so
        // a foreign remove-and-create there would not show: mismatch.
        let c = tracked(vers(1, &[None]), &[]);
        own(&c, "/d/a", 0, Effect::One);
        assert_eq!(check(&c, vers(1, &[Some((7, 1))])), Known::Ask);
        // Present -> absent (a server restarted empty): mismatch.
        let c = tracked(vers(1, &[Some((5, 1))]), &["a"]);
        assert_eq!(check(&c, vers(1, &[None])), Known::Ask);
    }

    #[test]
    fn a_changed_server_list_drops_tracking() {
        let c = tracked(vers(1, &[Some((5, 10))]), &[]);
        assert_eq!(check(&c, vers(2, &[Some((5, 10))])), Known::Ask);
        // An own change made with another list.
        let c = tracked(vers(1, &[Some((5, 10))]), &[]);
        c.begin_change("/d/a");
        c.end_change("/d/a", 0, 2, Effect::One);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        // A rename: unknown.
        let c = tracked(vers(1, &[Some((5, 10))]), &[]);
        own(&c, "/d/a", 0, Effect::Unknown);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
    }

    #[test]
    fn fetches_with_own_changes_in_flight_are_not_used() {
        // A check while an own change is in flight is not even started...
        let c = tracked(vers(1, &[Some((5, 10))]), &[]);
        c.begin_change("/d/a");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        c.end_change("/d/a", 0, 1, Effect::One);
        // ...and one during which a change is sent does not extend, but
        // keeps tracking (the change may or may not be in what it read).
        let at = c.begin_check("/d").unwrap();
        c.begin_change("/d/b");
        c.end_check("/d", at, Some(vers(1, &[Some((5, 11))])));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        c.end_change("/d/b", 0, 1, Effect::One);
        // Checked again an eighth of the ttl later, not at the next
        // lookup (one request to every server each time).
        assert_eq!(c.lookup("/d/x"), Known::Ask);
        assert!(c.begin_check("/d").is_none());
        std::thread::sleep(Duration::from_millis(30 / 8 + 2));
        assert_eq!(c.lookup("/d/x"), Known::Check);
        let at = c.begin_check("/d").unwrap();
        c.end_check("/d", at, Some(vers(1, &[Some((5, 12))])));
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        // A base fetched with a change in flight is not taken.
        let c = NameCache::new(Duration::from_millis(30));
        let at = c.begin_listing("/d").unwrap();
        c.begin_change("/d/a");
        c.begin_base("/d");
        c.end_base("/d", Some(vers(1, &[Some((5, 10))])));
        c.end_change("/d/a", 0, 1, Effect::One);
        c.end_listing("/d", at, Some(vec![]));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
    }

    #[test]
    fn two_changes_of_one_name_at_once_drop_the_snapshot() {
        let c = tracked(vers(1, &[Some((5, 10))]), &[]);
        c.begin_change("/d/a");
        c.begin_change("/d/a");
        assert_eq!(c.lookup("/d/x"), Known::Ask);
    }

    #[test]
    fn tracked_snapshots_may_be_larger() {
        let many = |n: usize| (0..n).map(|i| (i.to_string(), None)).collect();
        let c = cache();
        let at = c.begin_listing("/d").unwrap();
        c.begin_base("/d");
        c.end_base("/d", Some(vers(1, &[Some((5, 10))])));
        c.end_listing("/d", at, Some(many(MAX_NAMES + 1)));
        assert_eq!(c.lookup("/d/x"), Known::Absent);
        let at = c.begin_listing("/d").unwrap();
        c.begin_base("/d");
        c.end_base("/d", Some(vers(1, &[Some((5, 10))])));
        c.end_listing("/d", at, Some(many(MAX_TRACKED_NAMES + 1)));
        assert_eq!(c.lookup("/d/x"), Known::Ask);
    }

    #[test]
    fn a_new_directory_is_tracked_as_absent_everywhere() {
        let c = NameCache::new(Duration::from_millis(30));
        c.new_dir("/d", Instant::now(), 1, &[0, 1]);
        assert_eq!(check(&c, vers(1, &[None, None])), Known::Absent);
    }
}
