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
        let servers = self.servers();
        let n = servers.len().max(1);
        if !(0..n).any(examine) {
            return Vec::new();
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
        let lock = || q.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(|| loop {
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
                    let mut subdirs = Vec::new();
                    if !examine(idx) {
                        let r = if dirs_only.load(Ordering::Relaxed) {
                            match self.readdir_dirs_index(&dir, idx) {
                                Err(e) if e.errno() == libc::EPROTO => {
                                    dirs_only.store(false, Ordering::Relaxed);
                                    self.readdir_index(&dir, idx)
                                }
                                r => r,
                            }
                        } else {
                            self.readdir_index(&dir, idx)
                        };
                        if let Ok(entries) = r {
                            subdirs.extend(
                                entries
                                    .into_iter()
                                    .filter(|e| e.stat.is_dir())
                                    .map(|e| chfs_proto::path::join(&dir, &e.name)),
                            );
                        }
                    } else {
                        match self.readdir_index(&dir, idx) {
                            Ok(entries) => {
                                // One buffer for the full paths; only
                                // directories to descend into are kept.
                                let mut full = String::new();
                                for e in entries {
                                    chfs_proto::path::join_into(&mut full, &dir, &e.name);
                                    if visit(&full, &e) && e.stat.is_dir() {
                                        subdirs.push(full.clone());
                                    }
                                }
                            }
                            Err(error) => {
                                errors
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push(WalkError {
                                        dir: dir.clone(),
                                        server: servers.get(idx).cloned(),
                                        error,
                                    })
                            }
                        }
                    }
                    let mut g = lock();
                    for d in subdirs {
                        for i in 0..n {
                            g.items.push_back((d.clone(), i));
                            g.pending += 1;
                        }
                    }
                    g.pending -= 1;
                    drop(g);
                    cv.notify_all();
                });
            }
        });
        errors.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}
