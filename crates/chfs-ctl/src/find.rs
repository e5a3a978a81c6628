//! Parallel find over a chfs-rs pool.
//!
//! One process lists the whole tree at once ([`Client::list_tree`]: one
//! request per server and page, the entries a walk would visit, with
//! their headers); when a server does not serve that (an older server,
//! cache mode), it walks.
//!
//! The walk is the client's [`Client::walk_parallel`]: every server holds
//! the entries whose chunk 0 it owns, a directory is read one server at a
//! time with [`Client::readdir_index`] by a pool of threads, no server is
//! asked to merge lists, and no entry is seen twice. This module adds
//! find's tests (`-name`, `-size`, `-type`, `-newer`) and the counts.
//!
//! Several processes (MPI ranks) can share one find with [`find_ranked`]:
//! rank r of n examines the entries held by the servers whose index i has
//! `i % n == r`, and learns the rest of the tree from the other servers'
//! directories only, so every entry is examined by exactly one rank: the
//! tree listing of its servers and the directories-only tree listing of
//! the others ([`Client::list_tree_of`]), or when it walks,
//! [`Client::readdir_dirs_index`] of the others' servers.

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

use chfs_client::{Client, Stat};

use crate::error::CtlError;

/// Comparison of a `-size` test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeCmp {
    /// `-size -N`: fewer than N units.
    Less,
    /// `-size N`: exactly N units.
    Equal,
    /// `-size +N`: more than N units.
    Greater,
}

/// A `-size [+-]N[bcwkMG]` test with GNU find's meaning: the size is
/// rounded up to whole units (512-byte blocks by default, `c` = bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeTest {
    /// How to compare.
    pub cmp: SizeCmp,
    /// Number of units.
    pub n: u64,
    /// Unit in bytes.
    pub unit: u64,
}

impl SizeTest {
    /// Parses `[+-]N[bcwkMG]`.
    pub fn parse(s: &str) -> Result<Self, CtlError> {
        let bad = || {
            CtlError::Usage(format!(
                "invalid -size argument {s:?} (expected [+-]N[bcwkMG])"
            ))
        };
        let (cmp, rest) = match s.as_bytes().first() {
            Some(b'+') => (SizeCmp::Greater, &s[1..]),
            Some(b'-') => (SizeCmp::Less, &s[1..]),
            _ => (SizeCmp::Equal, s),
        };
        let (num, unit) = match rest.chars().last() {
            Some('b') => (&rest[..rest.len() - 1], 512),
            Some('c') => (&rest[..rest.len() - 1], 1),
            Some('w') => (&rest[..rest.len() - 1], 2),
            Some('k') => (&rest[..rest.len() - 1], 1 << 10),
            Some('M') => (&rest[..rest.len() - 1], 1 << 20),
            Some('G') => (&rest[..rest.len() - 1], 1 << 30),
            Some(c) if c.is_ascii_digit() => (rest, 512),
            _ => return Err(bad()),
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n = num.parse().map_err(|_| bad())?;
        Ok(Self { cmp, n, unit })
    }

    /// Does a file of `size` bytes pass?
    pub fn matches(&self, size: u64) -> bool {
        let units = size.div_ceil(self.unit);
        match self.cmp {
            SizeCmp::Less => units < self.n,
            SizeCmp::Equal => units == self.n,
            SizeCmp::Greater => units > self.n,
        }
    }
}

/// A `-type` test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeTest {
    /// `f`: regular file.
    File,
    /// `d`: directory.
    Dir,
    /// `l`: symbolic link.
    Symlink,
}

impl TypeTest {
    /// Parses `f`, `d` or `l`.
    pub fn parse(s: &str) -> Result<Self, CtlError> {
        match s {
            "f" => Ok(Self::File),
            "d" => Ok(Self::Dir),
            "l" => Ok(Self::Symlink),
            _ => Err(CtlError::Usage(format!(
                "invalid -type argument {s:?} (supported: f, d, l)"
            ))),
        }
    }

    fn matches(&self, st: &Stat) -> bool {
        match self {
            Self::File => st.is_file(),
            Self::Dir => st.is_dir(),
            Self::Symlink => st.is_symlink(),
        }
    }
}

/// The tests of one find, all of which must pass (find's implicit `-a`).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `-name PATTERN`: shell pattern on the last component (fnmatch(3),
    /// as GNU find uses it: `*` also matches a leading dot).
    pub name: Option<CString>,
    /// `-newer FILE`: modification time strictly after this (ns).
    pub newer_than: Option<i64>,
    /// `-size`.
    pub size: Option<SizeTest>,
    /// `-type`.
    pub ftype: Option<TypeTest>,
}

impl Filter {
    /// Sets the `-name` pattern.
    pub fn set_name(&mut self, pat: &str) -> Result<(), CtlError> {
        self.name = Some(
            CString::new(pat)
                .map_err(|_| CtlError::Usage("-name pattern contains a NUL byte".into()))?,
        );
        Ok(())
    }

    /// Does the entry `name` with status `st` pass every test?
    pub fn matches(&self, name: &str, st: &Stat) -> bool {
        if let Some(t) = &self.ftype {
            if !t.matches(st) {
                return false;
            }
        }
        if let Some(s) = &self.size {
            if !s.matches(st.size) {
                return false;
            }
        }
        if let Some(t) = self.newer_than {
            if st.mtime <= t {
                return false;
            }
        }
        if let Some(pat) = &self.name {
            let Ok(n) = CString::new(name) else {
                return false;
            };
            // SAFETY: both pointers are valid NUL-terminated strings that
            // live across the call; fnmatch only reads them.
            if unsafe { libc::fnmatch(pat.as_ptr(), n.as_ptr(), 0) } != 0 {
                return false;
            }
        }
        true
    }
}

/// What a find saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FindStats {
    /// Entries examined (including the starting point).
    pub seen: u64,
    /// Entries that passed the filter.
    pub matched: u64,
}

/// An error while reading part of the tree (the find goes on): the
/// directory, the server asked and the client's error.
pub use chfs_client::WalkError as FindError;

pub use crate::rank::RankSplit;

/// Walks the tree under `root` with `threads` threads, calling `on_match`
/// with the full path of every entry that passes `filter` (from several
/// threads at once, in no particular order). Errors reading a directory do
/// not stop the walk; they are returned with the counts.
pub fn find(
    client: &Client,
    root: &str,
    filter: &Filter,
    threads: usize,
    on_match: &(dyn Fn(&str) + Sync),
) -> (FindStats, Vec<FindError>) {
    find_ranked(client, root, filter, threads, RankSplit::SINGLE, on_match)
}

/// [`find`] for rank `split.rank` of `split.ranks` processes: examines (and
/// counts, and passes to `on_match`) only the entries of the servers the
/// rank owns ([`RankSplit::owns`]; the starting point belongs to rank 0),
/// and reads only the directories of the other servers (their tree
/// listings of directories, or when walking, their directory listings of
/// directories) to learn which entries a walk reaches.
/// The ranks' [`FindStats`] add up to one [`find`]'s. Errors are returned
/// by the rank that owns the server (a failed directories-only listing of
/// another rank's server is reported there too, by its owner's full
/// listing; an unreadable starting point is reported by rank 0 only); a
/// rank that owns no server returns at once.
pub fn find_ranked(
    client: &Client,
    root: &str,
    filter: &Filter,
    threads: usize,
    split: RankSplit,
    on_match: &(dyn Fn(&str) + Sync),
) -> (FindStats, Vec<FindError>) {
    let first = split.rank == 0;
    let seen = AtomicU64::new(0);
    let matched = AtomicU64::new(0);
    let root = match chfs_proto::path::normalize(root) {
        Ok(r) => r,
        Err(e) => {
            let err = FindError {
                dir: root.to_string(),
                server: None,
                error: e.into(),
            };
            return (
                FindStats::default(),
                first.then_some(err).into_iter().collect(),
            );
        }
    };
    let st = match client.lstat(&root) {
        Ok(s) => s,
        Err(error) => {
            let err = FindError {
                dir: root,
                server: None,
                error,
            };
            return (
                FindStats::default(),
                first.then_some(err).into_iter().collect(),
            );
        }
    };
    if first {
        seen.fetch_add(1, Ordering::Relaxed);
        if filter.matches(chfs_proto::path::file_name(&root), &st) {
            matched.fetch_add(1, Ordering::Relaxed);
            on_match(&root);
        }
    }
    if !st.is_dir() {
        return (
            FindStats {
                seen: seen.into_inner(),
                matched: matched.into_inner(),
            },
            Vec::new(),
        );
    }
    // The whole tree at once, one request per server and page
    // (`Client::list_tree_of`: what the walk would visit), with headers
    // only when a test reads more than the file type (`-size`, `-newer`).
    // Of several ranks each lists the entries of its own servers and
    // only the directories of the others (which tell what is reached).
    // A server that does not serve it (older, cache mode), or any error,
    // makes the rank walk, which reports errors directory by directory
    // (those of a server by the rank that owns it).
    let with_meta = filter.size.is_some() || filter.newer_than.is_some();
    if let Ok(Some(t)) = client.list_tree_of(&root, with_meta, &|i| split.owns(i)) {
        let mut seen = seen.into_inner();
        let mut matched = matched.into_inner();
        for i in 0..t.len() {
            let full = t.path(i);
            let st = match t.meta(i) {
                Some(m) => Stat::from_meta(full, m),
                None if with_meta => continue,
                None => Stat {
                    mode: (t.page.kinds[i] as u32) << 12,
                    ..Default::default()
                },
            };
            seen += 1;
            if filter.matches(chfs_proto::path::file_name(full), &st) {
                matched += 1;
                on_match(full);
            }
        }
        return (FindStats { seen, matched }, Vec::new());
    }
    let errors = client.walk_parallel(&root, threads, &|i| split.owns(i), &|full, e| {
        seen.fetch_add(1, Ordering::Relaxed);
        if filter.matches(&e.name, &e.stat) {
            matched.fetch_add(1, Ordering::Relaxed);
            on_match(full);
        }
        true
    });
    (
        FindStats {
            seen: seen.into_inner(),
            matched: matched.into_inner(),
        },
        errors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_like_gnu_find() {
        let t = SizeTest::parse("3901c").unwrap();
        assert!(t.matches(3901) && !t.matches(3900));
        // 512-byte blocks, rounded up.
        let t = SizeTest::parse("2").unwrap();
        assert!(t.matches(513) && t.matches(1024) && !t.matches(512) && !t.matches(1025));
        let t = SizeTest::parse("-1M").unwrap();
        assert!(t.matches(0) && !t.matches(1));
        let t = SizeTest::parse("+1k").unwrap();
        assert!(t.matches(1025) && !t.matches(1024));
        for bad in ["", "+", "1x", "-c", "a1"] {
            assert!(SizeTest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn name_patterns() {
        let mut f = Filter::default();
        f.set_name("*01*").unwrap();
        let st = Stat::default();
        assert!(f.matches("file01x", &st));
        assert!(!f.matches("file10", &st));
        f.set_name("*").unwrap();
        assert!(f.matches(".hidden", &st));
        f.set_name("a[0-9]?").unwrap();
        assert!(f.matches("a1b", &st) && !f.matches("ab1", &st));
    }
}
