//! A parallel walk of a directory tree, one server at a time.
//!
//! Every server holds the entries whose chunk 0 it owns. A directory is
//! read one server at a time with [`Client::readdir_index`]; the work
//! items are `(directory, server)` pairs run by a pool of threads, and
//! every directory found (on any server) adds one item per server. No
//! server is asked to merge lists, and no entry is seen twice. chfind
//! (crates/chfs-ctl) and the Python binding's `find` walk with it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use super::Client;
use crate::error::Error;
use crate::types::DirEntry;

/// A directory that could not be read during a [`Client::walk_parallel`]
/// (the walk goes on without it).
#[derive(Debug)]
pub struct WalkError {
    /// Directory being read.
    pub dir: String,
    /// Server asked (address), if any.
    pub server: Option<String>,
    /// The client's error.
    pub error: Error,
}

struct Queue {
    items: VecDeque<(String, usize)>,
    pending: usize,
}

/// Reads one (directory, server) item of a walk; returns the directories
/// to descend into.
type Item<'a> = dyn FnMut(&str, usize) -> Result<Vec<String>, WalkError> + 'a;

impl Client {
    /// Walks the tree below the directory `root` (normalized; the root
    /// itself is not visited) with `threads` threads. `examine(i)` says
    /// whether the entries held by server `i` are this caller's: those are
    /// passed to `visit(full_path, entry)` (from several threads at once,
    /// in no particular order), which returns whether to descend into the
    /// entry if it is a directory. The directories of the other servers
    /// are only read to walk the tree (`readdir_dirs_index`), and always
    /// descended into: several processes can share one walk, each
    /// examining the servers of its own. Errors reading a directory do not
    /// stop the walk; they are returned, each reported by the caller that
    /// examines the server.
    pub fn walk_parallel(
        &self,
        root: &str,
        threads: usize,
        examine: &(dyn Fn(usize) -> bool + Sync),
        visit: &(dyn Fn(&str, &DirEntry) -> bool + Sync),
    ) -> Vec<WalkError> {
        self.walk_parallel_with(root, threads, examine, &|| (), &|_, full, e| visit(full, e))
            .1
    }

    /// [`Client::walk_parallel`] with a state per thread: every thread of
    /// the walk makes one with `init` and passes it to each `visit` it
    /// makes; the states are returned with the errors. A visit can then
    /// collect what it finds without a lock, and the entries of one
    /// directory's listing on one server reach one state one after the
    /// other, in name order.
    #[allow(clippy::type_complexity)]
    pub fn walk_parallel_with<T: Send>(
        &self,
        root: &str,
        threads: usize,
        examine: &(dyn Fn(usize) -> bool + Sync),
        init: &(dyn Fn() -> T + Sync),
        visit: &(dyn Fn(&mut T, &str, &DirEntry) -> bool + Sync),
    ) -> (Vec<T>, Vec<WalkError>) {
        let servers = self.servers();
        let n = servers.len().max(1);
        if !(0..n).any(examine) {
            return (Vec::new(), Vec::new());
        }
        let errors = Mutex::new(Vec::new());
        // Servers that predate the directories-only listing: fall back to
        // full listings of other callers' servers.
        let dirs_only = AtomicBool::new(true);
        let q = Mutex::new(Queue {
            items: (0..n).map(|i| (root.to_string(), i)).collect(),
            pending: n,
        });
        let cv = Condvar::new();
        let states = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    s.spawn(|| {
                        let mut state = init();
                        self.walk_worker(
                            &q,
                            &cv,
                            n,
                            &mut |dir, idx| {
                                self.walk_item(dir, idx, examine, &dirs_only, &mut |full, e| {
                                    visit(&mut state, full, e)
                                })
                                .map_err(|error| WalkError {
                                    dir: dir.to_string(),
                                    server: servers.get(idx).cloned(),
                                    error,
                                })
                            },
                            &errors,
                        );
                        state
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        (
            states,
            errors.into_inner().unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// One thread of a walk: takes (directory, server) items until none is
    /// left or pending.
    fn walk_worker(
        &self,
        q: &Mutex<Queue>,
        cv: &Condvar,
        n: usize,
        item: &mut Item<'_>,
        errors: &Mutex<Vec<WalkError>>,
    ) {
        let lock = || q.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (dir, idx) = {
                let mut g = lock();
                loop {
                    if let Some(it) = g.items.pop_front() {
                        break it;
                    }
                    if g.pending == 0 {
                        return;
                    }
                    g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
                }
            };
            let subdirs = match item(&dir, idx) {
                Ok(subdirs) => subdirs,
                Err(e) => {
                    errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                    Vec::new()
                }
            };
            let mut g = lock();
            let added = subdirs.len() * n;
            for d in subdirs {
                for i in 0..n {
                    g.items.push_back((d.clone(), i));
                }
            }
            g.pending += added;
            g.pending -= 1;
            let finished = g.pending == 0;
            drop(g);
            // Wake as many waiting threads as there is new work (this one
            // takes an item itself), and all of them at the end; not all
            // of them for every item (on a few CPUs the walk's threads
            // then spent their time waking up to find nothing).
            if finished {
                cv.notify_all();
            } else {
                for _ in 1..added {
                    cv.notify_one();
                }
            }
        }
    }

    /// Reads directory `dir` on server `idx` for a walk: visits its entries
    /// if the server is examined; returns the directories to descend into.
    fn walk_item(
        &self,
        dir: &str,
        idx: usize,
        examine: &(dyn Fn(usize) -> bool + Sync),
        dirs_only: &AtomicBool,
        visit: &mut dyn FnMut(&str, &DirEntry) -> bool,
    ) -> Result<Vec<String>, Error> {
        let mut subdirs = Vec::new();
        if !examine(idx) {
            let r = if dirs_only.load(Ordering::Relaxed) {
                match self.readdir_dirs_index(dir, idx) {
                    Err(e) if e.errno() == libc::EPROTO => {
                        dirs_only.store(false, Ordering::Relaxed);
                        self.readdir_index(dir, idx)
                    }
                    r => r,
                }
            } else {
                self.readdir_index(dir, idx)
            };
            // Errors are reported by the caller examining the server.
            if let Ok(entries) = r {
                subdirs.extend(
                    entries
                        .into_iter()
                        .filter(|e| e.stat.is_dir())
                        .map(|e| chfs_proto::path::join(dir, &e.name)),
                );
            }
            return Ok(subdirs);
        }
        // One buffer for the full paths; only directories to descend into
        // are kept.
        let mut full = String::new();
        for e in self.readdir_index(dir, idx)? {
            chfs_proto::path::join_into(&mut full, dir, &e.name);
            if visit(&full, &e) && e.stat.is_dir() {
                subdirs.push(full.clone());
            }
        }
        Ok(subdirs)
    }
}
