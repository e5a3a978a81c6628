//! A whole tree listed at once: every server is asked, a page at a time,
//! for everything it holds below a directory ([`Request::ListTree`], in
//! byte order), and the servers' sorted runs are merged. No request per
//! directory; one thread per server.
//!
//! The result is what a walk from the directory ([`Client::walk_parallel`])
//! visits: an entry is kept only if its parent is the root or a directory
//! kept before it (its parent sorts before it), so entries whose parent
//! has no entry (orphans, the node-local area below `/`) are left out as
//! the walk never reaches them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::atomic::Ordering;

use chfs_proto::msg::{tree, TreePage};
use chfs_proto::path::{normalize, parent};
use chfs_proto::{Meta, Request, Response};

use super::{unexpected, Client};
use crate::error::Result;

/// Entries asked of a server per request: as many as a server gives
/// (fewer round trips: the next page is asked for only once this one is
/// decoded).
const TREE_PAGE: u32 = 65536;

/// Most bytes of paths a listing holds: its offsets are `u32`
/// ([`TreePage::ends`]). A larger tree is walked instead ([`Client::list_tree`]
/// gives `Ok(None)`), never listed with wrapped offsets (wrong paths).
const TREE_BYTES: usize = u32::MAX as usize;

/// Everything below a directory, in byte order of the full paths (see
/// [`Client::list_tree`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeListing {
    /// The entries: full paths, file types and (when asked for) headers,
    /// one after the other in one buffer.
    pub page: TreePage,
}

impl TreeListing {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.page.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.page.is_empty()
    }

    /// Full path of entry `i`.
    pub fn path(&self, i: usize) -> &str {
        self.page.path(i)
    }

    /// Is entry `i` a directory?
    pub fn is_dir(&self, i: usize) -> bool {
        self.page.is_dir(i)
    }

    /// Header of entry `i` (listings made with metadata only).
    pub fn meta(&self, i: usize) -> Option<&Meta> {
        self.page.metas.get(i)
    }
}

/// Appends page `p` to `run`.
fn append(run: &mut TreePage, p: TreePage) {
    if run.is_empty() {
        *run = p;
        return;
    }
    let base = run.paths.len() as u32;
    run.paths.push_str(&p.paths);
    run.ends.extend(p.ends.iter().map(|e| e + base));
    run.kinds.extend_from_slice(&p.kinds);
    run.metas.extend_from_slice(&p.metas);
}

impl Client {
    /// Every entry below the directory `root` (not `root` itself), asked
    /// of each server at once ([`Request::ListTree`]) and merged: full
    /// paths in byte order, what [`Client::walk_parallel`] would visit.
    /// With `with_meta` each entry's header comes too. `Ok(None)` when a
    /// server does not serve tree listings (older than the request: EPROTO;
    /// in cache mode, where listings merge the backend's: EOPNOTSUPP):
    /// walk instead (and the client does not ask again while the server
    /// list stays the same). Any other error of any server fails the
    /// listing.
    ///
    /// Also `Ok(None)` for a tree whose paths add up to more than 4 GiB
    /// (the listing's offsets are 32-bit): walk that one too.
    pub fn list_tree(&self, root: &str, with_meta: bool) -> Result<Option<TreeListing>> {
        self.list_tree_limited(root, with_meta, TREE_PAGE, TREE_BYTES)
    }

    /// [`Client::list_tree`] asking for at most `page` entries per request
    /// (for tests of the paging).
    #[doc(hidden)]
    pub fn list_tree_paged(
        &self,
        root: &str,
        with_meta: bool,
        page: u32,
    ) -> Result<Option<TreeListing>> {
        self.list_tree_limited(root, with_meta, page, TREE_BYTES)
    }

    /// [`Client::list_tree_paged`] giving `Ok(None)` once the paths add up
    /// to more than `max_bytes` (for tests of the limit, which is 4 GiB).
    #[doc(hidden)]
    pub fn list_tree_limited(
        &self,
        root: &str,
        with_meta: bool,
        page: u32,
        max_bytes: usize,
    ) -> Result<Option<TreeListing>> {
        self.list_tree_with(root, with_meta, &|_| true, page, max_bytes)
    }

    /// [`Client::list_tree`] for one of several processes sharing the
    /// listing (the ranks of a parallel find): the entries held by the
    /// servers `examine` picks (by index, as [`Client::walk_parallel`]'s
    /// `examine`), and of them only those the walk from `root` would
    /// visit. The other servers are asked for their directories only
    /// ([`tree::DIRS`]), which tell which of the picked servers' entries
    /// are reachable (an entry's parent directory may be held by any
    /// server). So processes picking disjoint sets of servers covering
    /// the pool list every entry of [`Client::list_tree`] exactly once
    /// between them. `Ok(None)`, and errors, as [`Client::list_tree`];
    /// no server picked: an empty listing, no request.
    pub fn list_tree_of(
        &self,
        root: &str,
        with_meta: bool,
        examine: &(dyn Fn(usize) -> bool + Sync),
    ) -> Result<Option<TreeListing>> {
        self.list_tree_with(root, with_meta, examine, TREE_PAGE, TREE_BYTES)
    }

    /// [`Client::list_tree_of`] with `page` entries per request (for tests
    /// of the paging).
    #[doc(hidden)]
    pub fn list_tree_of_paged(
        &self,
        root: &str,
        with_meta: bool,
        examine: &(dyn Fn(usize) -> bool + Sync),
        page: u32,
    ) -> Result<Option<TreeListing>> {
        self.list_tree_with(root, with_meta, examine, page, TREE_BYTES)
    }

    fn list_tree_with(
        &self,
        root: &str,
        with_meta: bool,
        examine: &(dyn Fn(usize) -> bool + Sync),
        page: u32,
        max_bytes: usize,
    ) -> Result<Option<TreeListing>> {
        let max_bytes = max_bytes.min(TREE_BYTES);
        let st = self.state();
        let root = normalize(root)?;
        let version = st.ring.list().version;
        if self.inner.no_tree.load(Ordering::Relaxed) == version + 1 {
            return Ok(None);
        }
        let servers = st.servers_for(&root)?;
        // Which servers' entries are listed (the others': directories).
        let keep: Vec<bool> = servers.iter().map(|&i| examine(i)).collect();
        if !keep.contains(&true) {
            return Ok(Some(TreeListing::default()));
        }
        // Bytes of paths received from all servers so far.
        let bytes = std::sync::atomic::AtomicUsize::new(0);
        // One server's pages, one after the other (`None`: the listing
        // grew past `max_bytes`); with `full` false its directories only.
        let fetch = |i: usize, full: bool| -> Result<Option<TreePage>> {
            let flags = match (full, with_meta) {
                (false, _) => tree::DIRS,
                (true, true) => tree::META,
                (true, false) => 0,
            };
            let mut run = TreePage::default();
            let mut after = String::new();
            loop {
                let req = Request::ListTree {
                    prefix: root.clone(),
                    after: std::mem::take(&mut after),
                    max: page,
                    flags,
                };
                self.count(1);
                match self.inner.pool.call(&st, i, &req)? {
                    Response::Tree(p) if flags & tree::META != 0 && p.metas.len() != p.len() => {
                        return Err(crate::error::Error::new(
                            libc::EPROTO,
                            "a tree listing without the headers asked for",
                        ));
                    }
                    Response::Tree(mut p) => {
                        let done = p.done;
                        if !p.is_empty() {
                            after = p.path(p.len() - 1).to_string();
                        }
                        if !full {
                            // A server older than `DIRS` lists everything.
                            p = dirs_of(p);
                        }
                        let n = p.paths.len();
                        if bytes.fetch_add(n, Ordering::Relaxed) + n > max_bytes {
                            return Ok(None);
                        }
                        if !p.is_empty() {
                            append(&mut run, p);
                        }
                        if done || after.is_empty() {
                            return Ok(Some(run));
                        }
                    }
                    other => return Err(unexpected(other)),
                }
            }
        };
        // A thread per server but the first, which this thread lists.
        let results: Vec<Result<Option<TreePage>>> = std::thread::scope(|s| {
            let fetch = &fetch;
            let handles: Vec<_> = servers
                .iter()
                .zip(&keep)
                .skip(1)
                .map(|(&i, &full)| s.spawn(move || fetch(i, full)))
                .collect();
            let first = servers.first().map(|&i| fetch(i, keep[0]));
            first
                .into_iter()
                .chain(
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
                )
                .collect()
        });
        let mut runs = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Ok(Some(run)) => runs.push(run),
                // Too large for one listing's offsets: walk it.
                Ok(None) => return Ok(None),
                Err(e) if matches!(e.errno(), libc::EPROTO | libc::EOPNOTSUPP) => {
                    self.inner.no_tree.store(version + 1, Ordering::Relaxed);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Some(merge(&root, runs, &keep, with_meta)))
    }
}

/// The directories of page `p` (all of it when it holds only those).
fn dirs_of(p: TreePage) -> TreePage {
    if (0..p.len()).all(|i| p.is_dir(i)) {
        return p;
    }
    let mut out = TreePage {
        done: p.done,
        ..Default::default()
    };
    for i in 0..p.len() {
        if p.is_dir(i) {
            out.push_entry(p.path(i), p.kinds[i], p.metas.get(i));
        }
    }
    out
}

/// The next path of run `r` (its entry `at[r]`, starting at `start[r]`).
fn head<'a>(runs: &'a [TreePage], at: &[usize], start: &[usize], r: usize) -> Option<&'a str> {
    let p = &runs[r];
    let e = *p.ends.get(at[r])? as usize;
    Some(&p.paths[start[r]..e])
}

/// Merges the servers' sorted runs, dropping entries the walk from `root`
/// would not reach; the runs `keep` does not pick only tell which
/// directories are reached (none of their entries is listed).
fn merge(root: &str, runs: Vec<TreePage>, keep: &[bool], with_meta: bool) -> TreeListing {
    let total: usize = runs.iter().map(TreePage::len).sum();
    let bytes: usize = runs.iter().map(|p| p.paths.len()).sum();
    let mut out = TreePage {
        paths: String::with_capacity(bytes),
        ends: Vec::with_capacity(total),
        kinds: Vec::with_capacity(total),
        metas: Vec::with_capacity(if with_meta { total } else { 0 }),
        done: true,
    };
    // Directories kept (an entry is kept when its parent is the root or
    // one of them); the last parent looked up and the answer.
    let mut dirs: HashSet<String> = HashSet::new();
    let mut last_parent = String::new();
    let mut last_kept = false;
    let mut take = |r: usize, run: &TreePage, at: usize, path: &str| {
        let dir = parent(path);
        if dir != last_parent {
            last_kept = dir == root || dirs.contains(dir);
            last_parent.clear();
            last_parent.push_str(dir);
        }
        if !last_kept {
            return;
        }
        if !keep[r] {
            if run.is_dir(at) {
                dirs.insert(path.to_string());
            }
            return;
        }
        out.paths.push_str(path);
        out.ends.push(out.paths.len() as u32);
        out.kinds.push(run.kinds[at]);
        if with_meta {
            if let Some(m) = run.metas.get(at) {
                out.metas.push(*m);
            }
        }
        if run.is_dir(at) {
            dirs.insert(path.to_string());
        }
    };
    // Each run's next entry and where its path starts.
    let mut at = vec![0usize; runs.len()];
    let mut start = vec![0usize; runs.len()];
    if runs.len() <= 8 {
        // A few runs: the smallest head by comparing them all.
        let mut heads: Vec<Option<&str>> = (0..runs.len())
            .map(|r| head(&runs, &at, &start, r))
            .collect();
        loop {
            let mut min: Option<(usize, &str)> = None;
            for (r, h) in heads.iter().enumerate() {
                if let Some(h) = *h {
                    if min.is_none_or(|(_, m)| h < m) {
                        min = Some((r, h));
                    }
                }
            }
            let Some((r, path)) = min else { break };
            take(r, &runs[r], at[r], path);
            start[r] += path.len();
            at[r] += 1;
            heads[r] = head(&runs, &at, &start, r);
        }
    } else {
        let mut heap: BinaryHeap<Reverse<(&str, usize)>> = (0..runs.len())
            .filter_map(|r| Some(Reverse((head(&runs, &at, &start, r)?, r))))
            .collect();
        while let Some(Reverse((path, r))) = heap.pop() {
            take(r, &runs[r], at[r], path);
            start[r] += path.len();
            at[r] += 1;
            if let Some(h) = head(&runs, &at, &start, r) {
                heap.push(Reverse((h, r)));
            }
        }
    }
    TreeListing { page: out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(entries: &[(&str, bool)]) -> TreePage {
        let mut p = TreePage::default();
        for &(path, dir) in entries {
            let m = Meta {
                mode: if dir { libc::S_IFDIR } else { libc::S_IFREG },
                ..Default::default()
            };
            p.push(path, &m, false);
        }
        p
    }

    /// Runs of 1 to 12 servers (the heap past 8), entries dealt to them
    /// round robin; orphans (no parent directory entry) left out.
    #[test]
    fn merges_sorted_runs_and_leaves_out_orphans() {
        let mut all: Vec<(String, bool)> = vec![("/r/a".into(), true), ("/r/a.b".into(), false)];
        for i in 0..50 {
            all.push((format!("/r/a/{i:03}"), i % 7 == 0));
            all.push((format!("/r/a/{:03}/x", i - i % 7), false));
        }
        all.push(("/r/ghost/x".into(), false));
        all.push(("/r/a.b/not-a-dir-child".into(), false));
        all.sort();
        all.dedup();
        let want: Vec<&str> = all
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| !p.contains("ghost") && !p.contains("not-a-dir"))
            .collect();
        for k in [1, 2, 3, 9, 12] {
            let mut runs: Vec<Vec<(&str, bool)>> = vec![Vec::new(); k];
            for (i, (p, d)) in all.iter().enumerate() {
                runs[i % k].push((p, *d));
            }
            let runs: Vec<TreePage> = runs.iter().map(|r| page(r)).collect();
            let got = merge("/r", runs.clone(), &vec![true; k], false);
            let got: Vec<&str> = (0..got.len()).map(|i| got.path(i)).collect();
            assert_eq!(got, want, "{k} runs");
            // Shared by n processes, each keeping the entries of its runs
            // (the others' directories only telling what is reached):
            // every entry once between them.
            for n in 1..=3 {
                let mut all: Vec<String> = Vec::new();
                for me in 0..n {
                    let keep: Vec<bool> = (0..k).map(|r| r % n == me).collect();
                    let others: Vec<TreePage> = runs
                        .iter()
                        .zip(&keep)
                        .map(|(p, &kept)| if kept { p.clone() } else { dirs_of(p.clone()) })
                        .collect();
                    let got = merge("/r", others, &keep, false);
                    all.extend((0..got.len()).map(|i| got.path(i).to_string()));
                }
                all.sort();
                assert_eq!(all, want, "{k} runs, {n} processes");
            }
        }
    }

    #[test]
    fn pages_append_into_one_run() {
        let mut run = TreePage::default();
        append(&mut run, page(&[("/a", true), ("/a/b", false)]));
        append(&mut run, page(&[("/c", false)]));
        append(&mut run, TreePage::default());
        assert_eq!(
            (0..run.len()).map(|i| run.path(i)).collect::<Vec<_>>(),
            ["/a", "/a/b", "/c"]
        );
        assert!(run.is_dir(0) && !run.is_dir(2));
    }
}
