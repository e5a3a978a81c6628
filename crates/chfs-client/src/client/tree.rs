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

use std::collections::{BinaryHeap, HashSet};

use chfs_proto::msg::{tree, TreePage};
use chfs_proto::path::{normalize, parent};
use chfs_proto::{Meta, Request, Response};

use super::{unexpected, Client};
use crate::error::Result;

/// Entries asked of a server per request.
const TREE_PAGE: u32 = 16384;

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

/// One server's pages, read in order.
struct Run {
    pages: Vec<TreePage>,
    page: usize,
    at: usize,
}

impl Run {
    fn head(&self) -> Option<&str> {
        self.pages.get(self.page).map(|p| p.path(self.at))
    }

    fn advance(&mut self) {
        self.at += 1;
        while self
            .pages
            .get(self.page)
            .is_some_and(|p| self.at >= p.len())
        {
            self.page += 1;
            self.at = 0;
        }
    }
}

impl Client {
    /// Every entry below the directory `root` (not `root` itself), asked
    /// of each server at once ([`Request::ListTree`]) and merged: full
    /// paths in byte order, what [`Client::walk_parallel`] would visit.
    /// With `with_meta` each entry's header comes too. `Ok(None)` when a
    /// server does not serve tree listings (older than the request: EPROTO;
    /// in cache mode, where listings merge the backend's: EOPNOTSUPP):
    /// walk instead. Any other error of any server fails the listing.
    pub fn list_tree(&self, root: &str, with_meta: bool) -> Result<Option<TreeListing>> {
        let st = self.state();
        let root = normalize(root)?;
        let servers = st.servers_for(&root)?;
        let flags = if with_meta { tree::META } else { 0 };
        let results: Vec<Result<Vec<TreePage>>> = std::thread::scope(|s| {
            let handles: Vec<_> = servers
                .iter()
                .map(|&i| {
                    let (st, root) = (&st, &root);
                    s.spawn(move || {
                        let mut pages = Vec::new();
                        let mut after = String::new();
                        loop {
                            let req = Request::ListTree {
                                prefix: root.clone(),
                                after: std::mem::take(&mut after),
                                max: TREE_PAGE,
                                flags,
                            };
                            self.count(1);
                            match self.inner.pool.call(st, i, &req)? {
                                Response::Tree(p) if with_meta && p.metas.len() != p.len() => {
                                    return Err(crate::error::Error::new(
                                        libc::EPROTO,
                                        "a tree listing without the headers asked for",
                                    ));
                                }
                                Response::Tree(p) => {
                                    let done = p.done;
                                    if !p.is_empty() {
                                        after = p.path(p.len() - 1).to_string();
                                        pages.push(p);
                                    }
                                    if done || after.is_empty() {
                                        return Ok(pages);
                                    }
                                }
                                other => return Err(unexpected(other)),
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut runs = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Ok(pages) => runs.push(Run {
                    pages,
                    page: 0,
                    at: 0,
                }),
                Err(e) if matches!(e.errno(), libc::EPROTO | libc::EOPNOTSUPP) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(merge(&root, runs, with_meta)))
    }
}

/// Merges the servers' sorted runs, dropping entries the walk from `root`
/// would not reach.
fn merge(root: &str, mut runs: Vec<Run>, with_meta: bool) -> TreeListing {
    let total: usize = runs.iter().flat_map(|r| &r.pages).map(TreePage::len).sum();
    let bytes: usize = runs
        .iter()
        .flat_map(|r| &r.pages)
        .map(|p| p.paths.len())
        .sum();
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
    let mut take = |p: &TreePage, at: usize, out: &mut TreePage| {
        let path = p.path(at);
        let dir = parent(path);
        if dir != last_parent {
            last_kept = dir == root || dirs.contains(dir);
            last_parent.clear();
            last_parent.push_str(dir);
        }
        if !last_kept {
            return;
        }
        out.paths.push_str(path);
        out.ends.push(out.paths.len() as u32);
        out.kinds.push(p.kinds[at]);
        if with_meta {
            if let Some(m) = p.metas.get(at) {
                out.metas.push(*m);
            }
        }
        if p.is_dir(at) {
            dirs.insert(path.to_string());
        }
    };
    for r in &mut runs {
        // Skip a run's empty pages up front.
        r.at = 0;
        r.page = 0;
        while r.pages.get(r.page).is_some_and(TreePage::is_empty) {
            r.page += 1;
        }
    }
    if runs.len() == 1 {
        let r = &mut runs[0];
        while r.head().is_some() {
            take(&r.pages[r.page], r.at, &mut out);
            r.advance();
        }
    } else {
        // A heap of the runs' heads (smallest first).
        let mut heap: BinaryHeap<std::cmp::Reverse<(&str, usize)>> = BinaryHeap::new();
        let heads: Vec<Option<&str>> = runs.iter().map(|r| r.head()).collect();
        // (paths borrowed from the pages: positions are kept apart)
        let mut pos: Vec<(usize, usize)> = runs.iter().map(|r| (r.page, r.at)).collect();
        for (i, h) in heads.into_iter().enumerate() {
            if let Some(h) = h {
                heap.push(std::cmp::Reverse((h, i)));
            }
        }
        while let Some(std::cmp::Reverse((_, i))) = heap.pop() {
            let r = &runs[i];
            let (mut page, mut at) = pos[i];
            take(&r.pages[page], at, &mut out);
            at += 1;
            while r.pages.get(page).is_some_and(|p| at >= p.len()) {
                page += 1;
                at = 0;
            }
            pos[i] = (page, at);
            if let Some(p) = r.pages.get(page) {
                heap.push(std::cmp::Reverse((p.path(at), i)));
            }
        }
    }
    TreeListing { page: out }
}
