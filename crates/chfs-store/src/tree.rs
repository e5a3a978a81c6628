//! [`Store::list_tree`]: every entry below a directory, as full paths in
//! byte order, merged from the directory index's per-directory name sets.
//!
//! The entries of directory `d` are the paths `d/name`: they all start
//! with `d/` (its *key*) and sort among themselves by name. A page merges
//! the directories' runs with a heap, taking each directory's names a
//! batch at a time ([`Store::list_dir`], which looks their headers up one
//! index shard at a time). A directory joins the merge only once its key
//! sorts before the smallest path waiting in it (its entries cannot come
//! earlier), so a page touches only the directories it lists from.
//!
//! Resuming after the path `p`: a directory whose key is a prefix of `p`
//! resumes after the name `p` has past the key (a name has no `/`, so
//! bytewise `name > rest` is exactly `key + name > p`); one whose key
//! sorts after `p` lists from its start; any other has only entries
//! before `p`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use chfs_proto::Meta;

use crate::index::{Indexed, Medium};
use crate::{Result, Store};

/// Names read from a directory at a time.
const BATCH: usize = 512;

/// One directory's part of the merge.
struct Run {
    /// Its key: the directory's path and `/` (`/` for the root).
    key: String,
    /// Names read and not yet merged, with their headers.
    names: VecDeque<(String, Meta)>,
    /// The last name read (where the next batch starts).
    last: String,
    /// No names follow those read.
    done: bool,
}

impl Run {
    fn new(key: String, from: &str) -> Self {
        Self {
            key,
            names: VecDeque::new(),
            last: from.to_string(),
            done: false,
        }
    }

    fn dir(&self) -> &str {
        if self.key.len() > 1 {
            &self.key[..self.key.len() - 1]
        } else {
            "/"
        }
    }

    /// The full path of the next entry, reading a batch if needed.
    fn head<S: Store + ?Sized>(&mut self, st: &S) -> Result<Option<String>> {
        while self.names.is_empty() && !self.done {
            let (names, done) = st.list_dir(self.dir(), &self.last, BATCH)?;
            // A batch whose names all vanished (no header) says nothing
            // of those after it: only `done` ends the run.
            self.done = done;
            match names.last() {
                Some((n, _)) => self.last.clone_from(n),
                None if !done => {
                    // list_dir returned nothing but more follow: cannot
                    // happen with max >= 1; end the run rather than spin.
                    self.done = true;
                }
                None => {}
            }
            self.names.extend(names);
        }
        Ok(self.names.front().map(|(n, _)| {
            let mut p = String::with_capacity(self.key.len() + n.len());
            p.push_str(&self.key);
            p.push_str(n);
            p
        }))
    }
}

/// See [`Store::list_tree`].
pub(crate) fn list<M: Medium>(
    st: &Indexed<M>,
    dir: &str,
    skip: Option<&str>,
    after: &str,
    max: usize,
    emit: &mut dyn FnMut(&str, &Meta),
) -> Result<bool> {
    let mut keys: Vec<String> = st
        .dirs_below(dir, skip)
        .into_iter()
        .map(|mut d| {
            if d != "/" {
                d.push('/');
            }
            d
        })
        .collect();
    keys.sort_unstable();
    let mut runs: Vec<Run> = Vec::new();
    let mut heap: BinaryHeap<Reverse<(String, usize)>> = BinaryHeap::new();
    // Directories holding `after`'s position: its ancestors' keys.
    let mut next = 0;
    if !after.is_empty() {
        for (i, _) in after.match_indices('/') {
            let key = &after[..=i];
            if let Ok(k) = keys.binary_search_by(|k| k.as_str().cmp(key)) {
                let mut r = Run::new(keys[k].clone(), &after[i + 1..]);
                if let Some(h) = r.head(st)? {
                    heap.push(Reverse((h, runs.len())));
                }
                runs.push(r);
            }
        }
        next = keys.partition_point(|k| k.as_str() <= after);
    }
    let mut n = 0;
    loop {
        // Directories whose entries may come before the smallest waiting.
        while next < keys.len()
            && heap
                .peek()
                .is_none_or(|Reverse((p, _))| keys[next].as_str() < p.as_str())
        {
            let mut r = Run::new(std::mem::take(&mut keys[next]), "");
            next += 1;
            if let Some(h) = r.head(st)? {
                heap.push(Reverse((h, runs.len())));
            }
            runs.push(r);
        }
        if n == max {
            return Ok(heap.is_empty() && next == keys.len());
        }
        let Some(Reverse((path, i))) = heap.pop() else {
            return Ok(true);
        };
        let r = &mut runs[i];
        let (_, meta) = r.names.pop_front().expect("a run in the heap has a name");
        emit(&path, &meta);
        n += 1;
        if let Some(h) = r.head(st)? {
            heap.push(Reverse((h, i)));
        }
    }
}
