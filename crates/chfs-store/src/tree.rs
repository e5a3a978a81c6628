//! [`Store::list_tree`]: every entry below a directory, as full paths in
//! byte order, merged from the directory index's per-directory name sets.
//!
//! The entries of directory `d` are the paths `d/name`: they all start
//! with `d/` (its *key*) and sort among themselves by name. A page merges
//! the directories' runs, reading each directory's names (and file types,
//! which the directory index keeps) a batch at a time under its shard's
//! lock; headers, when asked for, are looked up a batch at a time too,
//! one index shard after another. A directory joins the merge only once
//! its key sorts before the smallest path waiting (its entries cannot
//! come earlier), so a page touches only the directories it lists from,
//! and the runs in the merge at once are about the current path's
//! ancestors. The smallest run gives entries until the next smallest
//! head (or the next directory's key): when that does not start with the
//! run's key, with no comparison at all.
//!
//! The directories to list from come from the directory index's ordered
//! set of directory keys: those below the listed directory are the keys
//! starting with its key, one range of that set, read a few at a time as
//! the merge reaches them (a skipped area is another range, passed over
//! in one step). So a page costs what it lists, plus log factors, however
//! many other directories the server holds (before, every page read and
//! sorted the keys of all of them).
//!
//! A directories-only listing (`dirs_only`, the protocol's `tree::DIRS`:
//! chfind's ranks asking the other ranks' servers) merges the same runs
//! and emits only the directories: a page costs what it passes over, and
//! holds up to `max` directories.
//!
//! Resuming after the path `p`: a directory whose key is a prefix of `p`
//! resumes after the name `p` has past the key (a name has no `/`, so
//! bytewise `name > rest` is exactly `key + name > p`); one whose key
//! sorts after `p` lists from its start (the range of keys read starts
//! after `p`); any other has only entries before `p`.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::ops::Bound;

use chfs_proto::Meta;

use crate::dirindex::{prefix_of, NameBatch};
use crate::index::{Indexed, Medium};

/// A directory's file type (its mode's `S_IFMT` bits >> 12).
const DIR_KIND: u8 = 4;

/// Names read from a directory at a time.
const BATCH: usize = 512;

/// One directory's part of the merge.
struct Run {
    /// Its key: the directory's path and `/` (`/` for the root).
    key: String,
    /// Names read and not yet merged from `at` on.
    batch: NameBatch,
    /// Their headers (with metadata only).
    metas: Vec<Option<Meta>>,
    at: usize,
    /// The last name read (where the next batch starts).
    last: Vec<u8>,
    /// More names follow those read.
    more: bool,
}

impl Run {
    fn new(key: String, from: &[u8]) -> Self {
        Self {
            key,
            batch: NameBatch::default(),
            metas: Vec::new(),
            at: 0,
            last: from.to_vec(),
            more: true,
        }
    }

    fn dir(&self) -> &str {
        if self.key.len() > 1 {
            &self.key[..self.key.len() - 1]
        } else {
            "/"
        }
    }

    /// Makes the next entry ready (reading a batch if needed, skipping
    /// names whose header is gone when headers are wanted); false at the
    /// run's end.
    fn ready<M: Medium>(&mut self, st: &Indexed<M>, with_meta: bool) -> bool {
        loop {
            if self.at < self.batch.len() {
                if with_meta && self.metas[self.at].is_none() {
                    self.at += 1;
                    continue;
                }
                return true;
            }
            if !self.more {
                return false;
            }
            let mut batch = std::mem::take(&mut self.batch);
            self.more = st.names_into(self.dir(), &self.last, BATCH, &mut batch);
            self.batch = batch;
            self.at = 0;
            if self.batch.len() == 0 {
                self.more = false;
                return false;
            }
            self.last.clear();
            self.last
                .extend_from_slice(self.batch.name(self.batch.len() - 1));
            if with_meta {
                self.metas = st.entries_of(&self.key, &self.batch);
            }
        }
    }

    fn name(&self) -> &[u8] {
        self.batch.name(self.at)
    }
}

/// Compares `a[0] + a[1]` with `b[0] + b[1]` bytewise.
fn cmp_joined(a: [&[u8]; 2], b: [&[u8]; 2]) -> Ordering {
    let (mut ai, mut bi) = (0, 0);
    let (mut x, mut y) = (a[0], b[0]);
    loop {
        while x.is_empty() && ai == 0 {
            ai = 1;
            x = a[1];
        }
        while y.is_empty() && bi == 0 {
            bi = 1;
            y = b[1];
        }
        match (x.is_empty(), y.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let n = x.len().min(y.len());
        match x[..n].cmp(&y[..n]) {
            Ordering::Equal => {}
            o => return o,
        }
        x = &x[n..];
        y = &y[n..];
    }
}

fn head(r: &Run) -> [&[u8]; 2] {
    [r.key.as_bytes(), r.name()]
}

/// The keys of the directories to list from, in byte order, read from
/// the directory index a range at a time as the merge reaches them: a
/// first few, then twice as many each time (up to [`KEYS`]), so that a
/// page reads about the keys of the directories it lists from, however
/// many others the store holds.
struct Keys<'a> {
    prefix: &'a str,
    skip: Option<&'a str>,
    /// Read and not yet taken.
    read: VecDeque<String>,
    /// Where the next range starts: after the last key read (or at the
    /// prefix, or after the path a page resumes after).
    from: String,
    included: bool,
    more: bool,
    want: usize,
}

/// The most directory keys read from the directory index at a time.
const KEYS: usize = 1024;

impl<'a> Keys<'a> {
    fn new(prefix: &'a str, skip: Option<&'a str>, after: &str) -> Self {
        // Directories whose key sorts after `after` list from their start
        // (a key equal to `after` has entries after it: its own).
        let (from, included) = if after.is_empty() || after < prefix {
            (prefix.to_string(), true)
        } else {
            (after.to_string(), false)
        };
        Self {
            prefix,
            skip,
            read: VecDeque::new(),
            from,
            included,
            // The root skipped: nothing is listed.
            more: skip != Some(""),
            want: 8,
        }
    }

    /// Whether the directory with key `key` is one listed from.
    fn wants(&self, key: &str) -> bool {
        key.starts_with(self.prefix) && !self.skip.is_some_and(|sp| key.starts_with(sp))
    }

    /// The next key, read if needed.
    fn peek<M: Medium>(&mut self, st: &Indexed<M>) -> Option<&str> {
        if self.read.is_empty() && self.more {
            let from = if self.included {
                Bound::Included(self.from.as_str())
            } else {
                Bound::Excluded(self.from.as_str())
            };
            self.more = st.dir_keys(from, self.prefix, self.skip, self.want, &mut self.read);
            self.want = (self.want * 2).min(KEYS);
            if let Some(last) = self.read.back() {
                self.from.clone_from(last);
                self.included = false;
            }
        }
        self.read.front().map(String::as_str)
    }

    /// The next key (after [`Keys::peek`] gave it).
    fn pop(&mut self) -> String {
        self.read.pop_front().unwrap_or_default()
    }
}

/// See [`crate::Store::list_tree`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn list<M: Medium>(
    st: &Indexed<M>,
    dir: &str,
    skip: Option<&str>,
    after: &str,
    max: usize,
    with_meta: bool,
    dirs_only: bool,
    emit: &mut dyn FnMut(&str, u8, Option<&Meta>),
) -> bool {
    let prefix = prefix_of(dir);
    // What the keys of the skipped area start with; `Some("")` (the
    // root skipped): every key.
    let skip = skip.map(prefix_of);
    let mut keys = Keys::new(&prefix, skip.as_deref(), after);
    // The runs in the merge (each with an entry ready).
    let mut active: Vec<Run> = Vec::new();
    if !after.is_empty() {
        // Directories holding `after`'s position: its ancestors' keys.
        for (i, _) in after.match_indices('/') {
            let key = &after[..=i];
            if keys.wants(key) && st.has_dir_key(key) {
                let mut r = Run::new(key.to_string(), &after.as_bytes()[i + 1..]);
                if r.ready(st, with_meta) {
                    active.push(r);
                }
            }
        }
    }
    let mut n = 0;
    let mut path = String::new();
    loop {
        if n == max {
            return active.is_empty() && keys.peek(st).is_none();
        }
        // The smallest run.
        let mut min = None;
        for (i, r) in active.iter().enumerate() {
            if min.is_none_or(|m: usize| cmp_joined(head(r), head(&active[m])) == Ordering::Less) {
                min = Some(i);
            }
        }
        // Directories whose entries may come before its head join.
        let join = keys.peek(st).is_some_and(|k| {
            min.is_none_or(|m| cmp_joined([k.as_bytes(), b""], head(&active[m])) == Ordering::Less)
        });
        if join {
            let mut r = Run::new(keys.pop(), b"");
            if r.ready(st, with_meta) {
                active.push(r);
            }
            continue;
        }
        let Some(m) = min else {
            return true;
        };
        // The run gives entries up to the next smallest head or key.
        let mut bound: Option<[&[u8]; 2]> = keys.peek(st).map(|k| [k.as_bytes(), &b""[..]]);
        for (i, r) in active.iter().enumerate() {
            if i != m && bound.is_none_or(|b| cmp_joined(head(r), b) == Ordering::Less) {
                bound = Some(head(r));
            }
        }
        let bound: Option<Vec<u8>> = bound.map(|b| [b[0], b[1]].concat());
        let r = &mut active[m];
        // All of the run comes first when the bound does not start with
        // its key (and it sorts before the bound: its head does).
        let within = bound
            .as_deref()
            .filter(|b| b.starts_with(r.key.as_bytes()))
            .map(|b| &b[r.key.len()..]);
        loop {
            if within.is_some_and(|rest| r.name() >= rest) {
                break;
            }
            let kind = r.batch.kinds[r.at];
            // Directories only: the others are passed over, not counted
            // (a page holds `max` directories, however many files lie
            // between them).
            if !dirs_only || kind == DIR_KIND {
                path.clear();
                path.push_str(&r.key);
                path.push_str(std::str::from_utf8(r.name()).unwrap_or_default());
                emit(
                    &path,
                    kind,
                    if with_meta {
                        r.metas[r.at].as_ref()
                    } else {
                        None
                    },
                );
                n += 1;
            }
            r.at += 1;
            if !r.ready(st, with_meta) {
                active.swap_remove(m);
                break;
            }
            if n == max {
                break;
            }
        }
    }
}
