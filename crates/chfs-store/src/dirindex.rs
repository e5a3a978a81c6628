//! In-memory name index (parent directory -> names of its entries), kept
//! by every engine and rebuilt at open by the persistent ones.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use chfs_proto::path::parent;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Shards of the sharded maps (path index, directory index).
pub(crate) const SHARDS: usize = 64;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Engines never leave shared state half-changed across a panic point
    // that matters for memory safety; recover from poisoning.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A value alone in its cache lines: threads updating neighbouring values
/// (shard locks, counter stripes) do not slow each other down (false
/// sharing).
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A lock of a sharded map, alone in its cache lines.
pub(crate) type Shard<T> = Padded<Mutex<T>>;

impl<T> Shard<T> {
    pub fn new(v: T) -> Self {
        Padded(Mutex::new(v))
    }
}

impl<T> std::ops::DerefMut for Padded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

pub(crate) fn shard_of(key: &str, n: usize) -> usize {
    (xxh3_64(key.as_bytes()) % n as u64) as usize
}

/// The hash of the engines' maps keyed by path (the path index, the
/// directory index): xxh3 with a seed chosen per process. The standard
/// SipHash took ~20 ns per path, xxh3 takes a few; the random seed keeps
/// clients from choosing paths that collide.
#[derive(Clone)]
pub(crate) struct PathHash {
    seed: u64,
}

impl Default for PathHash {
    fn default() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
        }
    }
}

impl BuildHasher for PathHash {
    type Hasher = PathHasher;

    fn build_hasher(&self) -> PathHasher {
        PathHasher(self.seed)
    }
}

/// See [`PathHash`]. A `str` is hashed as its bytes (one xxh3 call) and a
/// terminating `0xff` byte (folded in with a multiplication).
pub(crate) struct PathHasher(u64);

impl Hasher for PathHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u8(&mut self, b: u8) {
        self.0 = (self.0 ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by path, hashed with [`PathHash`].
pub(crate) type PathMap<V> = HashMap<String, V, PathHash>;

/// A name in the directory index: its bytes, kept in the index's own
/// nodes when short (up to 21 bytes: most names), so that a listing reads
/// a directory's names one node after another instead of one heap
/// allocation each (a cache miss per name on a large index); and the
/// entry's file type (its mode's `S_IFMT` bits >> 12), so that a tree
/// listing of names needs no lookup of each entry's header. Ordered (and
/// equal) as `str` orders its bytes, whatever the type.
#[derive(Clone)]
enum Name {
    Short(u8, u8, [u8; Name::SHORT]),
    Long(u8, Box<[u8]>),
}

impl Name {
    const SHORT: usize = 21;

    fn new(s: &str, kind: u8) -> Self {
        let b = s.as_bytes();
        if b.len() <= Self::SHORT {
            let mut a = [0u8; Self::SHORT];
            a[..b.len()].copy_from_slice(b);
            Name::Short(b.len() as u8, kind, a)
        } else {
            Name::Long(kind, b.into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Name::Short(n, _, a) => &a[..*n as usize],
            Name::Long(_, b) => b,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Name::Short(_, k, _) | Name::Long(k, _) => *k,
        }
    }

    /// The name as a string (always UTF-8: it was made from a `str`).
    fn string(&self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }
}

/// The file type of an entry with header mode `mode`, as kept in the
/// directory index.
pub(crate) fn kind_of(mode: u32) -> u8 {
    ((mode >> 12) & 0xf) as u8
}

/// Names of one directory read for a tree listing: their bytes one after
/// the other, where each ends, and their file types.
#[derive(Default)]
pub(crate) struct NameBatch {
    pub bytes: Vec<u8>,
    pub ends: Vec<u32>,
    pub kinds: Vec<u8>,
}

impl NameBatch {
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.kinds.clear();
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Name {}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl std::borrow::Borrow<[u8]> for Name {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

#[cfg(test)]
thread_local! {
    /// Directory keys this thread has read (or looked up) for tree
    /// listings: what a page costs, whatever the machine's speed.
    pub(crate) static KEYS_VISITED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts `n` directory keys read for a tree listing (tests only).
#[inline]
fn visited(_n: usize) {
    #[cfg(test)]
    KEYS_VISITED.with(|c| c.set(c.get() + _n));
}

/// The names of one directory's entries held here, and the version of
/// that set (see [`DirVersion`]).
struct Names {
    set: BTreeSet<Name>,
    born: u64,
    changes: u64,
}

/// The version of a directory's set of names on one server: `born` is a
/// number taken from a per-store sequence when the directory got its first
/// entry here (the sequence starts at the clock's nanoseconds when the
/// store opens, so a restarted server does not give a number again),
/// `changes` counts every change of the set since: a name added that was
/// not there, a name removed that was (never a replaced entry or a changed
/// file type). A client that saw version (b, c) and sees (b, c + k) after
/// making k changes itself knows that nobody else changed the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirVersion {
    /// Never 0.
    pub born: u64,
    pub changes: u64,
}

/// parent directory -> names of entries (chunk 0) in it.
pub(crate) struct DirIndex {
    dirs: Vec<Shard<PathMap<Names>>>,
    /// The next [`DirVersion::born`].
    born: std::sync::atomic::AtomicU64,
    /// The keys of the directories in `dirs` (see [`key_of`]), in byte
    /// order: a tree listing reads those below its directory from here,
    /// a range of them at a time, instead of every directory of every
    /// shard. Changed only when a directory gets its first entry or
    /// loses its last one, under that directory's shard lock (taken
    /// first); read alone.
    keys: Shard<BTreeSet<Box<str>>>,
}

/// The key of directory `dir`: its path and `/` (`/` for the root), what
/// the paths of its entries start with. Keys sort as the paths of the
/// directories' entries do; those of the directories at or below `dir`
/// are exactly those starting with `dir`'s key (all of them for the root,
/// whose key is taken as "" there: see [`prefix_of`]).
pub(crate) fn key_of(dir: &str) -> String {
    let mut k = String::with_capacity(dir.len() + 1);
    k.push_str(dir);
    if dir != "/" {
        k.push('/');
    }
    k
}

/// What the keys of the directories at or below `dir` start with (as
/// [`is_within`](chfs_proto::path::is_within) tells for the directories
/// themselves): "" for the root,
/// else its key.
pub(crate) fn prefix_of(dir: &str) -> String {
    if dir == "/" {
        String::new()
    } else {
        key_of(dir)
    }
}

/// (parent, last component) of a path. Paths recovered from a damaged
/// medium need not be normalised ("", "é", "a//b"): whatever they are, this
/// must not panic.
fn split(path: &str) -> (&str, &str) {
    let dir = parent(path);
    let name = path.rsplit('/').next().unwrap_or(path);
    (dir, name)
}

impl DirIndex {
    pub fn new() -> Self {
        Self {
            dirs: (0..SHARDS)
                .map(|_| Shard::new(PathMap::default()))
                .collect(),
            keys: Shard::new(BTreeSet::new()),
            born: std::sync::atomic::AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    .max(1),
            ),
        }
    }

    fn shard(&self, dir: &str) -> MutexGuard<'_, PathMap<Names>> {
        lock(&self.dirs[shard_of(dir, SHARDS)])
    }

    /// Lists `path` in its directory, with file type `kind` (replacing
    /// the type it was listed with).
    pub fn add(&self, path: &str, kind: u8) {
        if path == "/" {
            return;
        }
        let (dir, name) = split(path);
        if name.is_empty() {
            // ("/d/", a damaged record's path): no name to list it by, and
            // "" as a listing cursor means "from the start", so listing it
            // would page forever.
            return;
        }
        let mut d = self.shard(dir);
        if let Some(n) = d.get_mut(dir) {
            if n.set.replace(Name::new(name, kind)).is_none() {
                n.changes += 1;
            }
            return;
        }
        let born = self.born.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        d.insert(
            dir.to_string(),
            Names {
                set: BTreeSet::from([Name::new(name, kind)]),
                born,
                changes: 1,
            },
        );
        lock(&self.keys).insert(key_of(dir).into_boxed_str());
    }

    pub fn remove(&self, path: &str) {
        if path == "/" {
            return;
        }
        let (dir, name) = split(path);
        let mut d = self.shard(dir);
        if let Some(n) = d.get_mut(dir) {
            if n.set.remove(name.as_bytes()) {
                n.changes += 1;
            }
            if n.set.is_empty() {
                d.remove(dir);
                lock(&self.keys).remove(key_of(dir).as_str());
            }
        }
    }

    /// Up to `max + 1` names after `after` (to tell whether more follow).
    pub fn names(&self, dir: &str, after: &str, max: usize) -> Vec<String> {
        let d = self.shard(dir);
        let Some(Names { set, .. }) = d.get(dir) else {
            return Vec::new();
        };
        let range = if after.is_empty() {
            set.range::<[u8], _>(..)
        } else {
            set.range::<[u8], _>((
                std::ops::Bound::Excluded(after.as_bytes()),
                std::ops::Bound::Unbounded,
            ))
        };
        range
            .take(max.saturating_add(1))
            .map(Name::string)
            .collect()
    }

    /// Up to `max` names of `dir` after `after` (bytes) into `out`
    /// (cleared first), with their types; returns whether more follow.
    pub fn names_into(&self, dir: &str, after: &[u8], max: usize, out: &mut NameBatch) -> bool {
        out.clear();
        let d = self.shard(dir);
        let Some(Names { set, .. }) = d.get(dir) else {
            return false;
        };
        let mut range = if after.is_empty() {
            set.range::<[u8], _>(..)
        } else {
            set.range::<[u8], _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
        };
        for n in range.by_ref().take(max) {
            match n {
                // The whole array, then cut: a copy of a known size (no
                // call to memmove per name).
                Name::Short(len, _, a) => {
                    let at = out.bytes.len();
                    out.bytes.extend_from_slice(a);
                    out.bytes.truncate(at + *len as usize);
                }
                Name::Long(_, b) => out.bytes.extend_from_slice(b),
            }
            out.ends.push(out.bytes.len() as u32);
            out.kinds.push(n.kind());
        }
        range.next().is_some()
    }

    /// Up to `max` keys of directories with entries into `out`, in byte
    /// order, from `from` (included or not) on: those starting with
    /// `prefix`, leaving out those starting with `skip` (a key: it is
    /// passed over in one step). Returns whether more may follow (false
    /// at the first key past `prefix`'s range). Reads the keys it gives
    /// and at most 2 more (plus log factors to find them).
    pub fn keys_from(
        &self,
        from: Bound<&str>,
        prefix: &str,
        skip: Option<&str>,
        max: usize,
        out: &mut VecDeque<String>,
    ) -> bool {
        // The first key after those starting with `skip` ('0' follows
        // '/'): what a listing goes on from when it meets one.
        let past = skip.map(|sp| {
            let mut p = sp.strip_suffix('/').unwrap_or(sp).to_string();
            p.push('0');
            p
        });
        let from = match from {
            Bound::Included(f) | Bound::Excluded(f) if f < prefix => Bound::Included(prefix),
            f => f,
        };
        let keys = lock(&self.keys);
        let mut range = keys.range::<str, _>((from, Bound::Unbounded));
        let mut n = 0;
        while n < max {
            let Some(k) = range.next() else {
                return false;
            };
            visited(1);
            if !k.starts_with(prefix) {
                return false;
            }
            if let (Some(sp), Some(past)) = (skip, past.as_deref()) {
                if k.starts_with(sp) {
                    range = keys.range::<str, _>((Bound::Included(past), Bound::Unbounded));
                    continue;
                }
            }
            out.push_back(k.to_string());
            n += 1;
        }
        true
    }

    /// Whether the directory with key `key` has entries.
    pub fn has_key(&self, key: &str) -> bool {
        visited(1);
        lock(&self.keys).contains(key)
    }

    pub fn has_children(&self, dir: &str) -> bool {
        self.shard(dir).get(dir).is_some_and(|n| !n.set.is_empty())
    }

    /// The version of `dir`'s set of names here; None when it has no
    /// entries here.
    pub fn version(&self, dir: &str) -> Option<DirVersion> {
        self.shard(dir).get(dir).map(|n| DirVersion {
            born: n.born,
            changes: n.changes,
        })
    }
}
