//! Directory listings: a whole directory merged over all servers
//! (`readdir`), and the part one server holds (`readdir_index`,
//! `readdir_dirs_index`, for a parallel find).

use std::collections::BTreeMap;

use chfs_proto::meta::FLAG_BACKEND_ONLY;
use chfs_proto::path::{self, normalize};
use chfs_proto::{Meta, Request, Response};

use super::{unexpected, Client};
use crate::error::{fail, Result};
use crate::pool::{Op, PoolState};
use crate::types::{DirEntry, Stat};

const READDIR_PAGE: u32 = 4096;

impl Client {
    /// Lists a directory (merged over all servers, each name once, sorted).
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?, true)?;
        if !m.is_dir() {
            return fail(libc::ENOTDIR, format!("{p}: not a directory"));
        }
        Ok(self
            .list_metas(&st, &p)?
            .into_iter()
            .map(|(name, (meta, _))| DirEntry {
                stat: self.to_stat(&path::join(&p, &name), meta),
                name,
            })
            .collect())
    }

    /// Every entry of directory `p` with its header and whether it exists
    /// only in the backend (cache mode), merged over all servers.
    pub(super) fn list_metas(
        &self,
        st: &PoolState,
        p: &str,
    ) -> Result<BTreeMap<String, (Meta, bool)>> {
        let mut all = BTreeMap::new();
        let n = st.ring.len();
        // (the node-local area: the server on this host only)
        let mine = st.servers_for(p)?;
        let mut after: Vec<Option<String>> = (0..n)
            .map(|i| mine.contains(&i).then(String::new))
            .collect();
        while after.iter().any(Option::is_some) {
            let servers: Vec<usize> = (0..n).filter(|&i| after[i].is_some()).collect();
            let ops = servers
                .iter()
                .map(|&i| {
                    let a = after[i].clone().unwrap_or_default();
                    Op::req(
                        i,
                        &Request::Readdir {
                            path: p.to_string(),
                            after: a,
                            max: READDIR_PAGE,
                        },
                    )
                })
                .collect();
            for (&i, r) in servers.iter().zip(self.pipeline(st, ops)) {
                match r? {
                    Response::Entries { entries, done } => {
                        after[i] = if done {
                            None
                        } else {
                            entries.last().map(|e| e.name.clone())
                        };
                        for e in entries {
                            let backend_only = e.meta.flags & FLAG_BACKEND_ONLY != 0;
                            let s = e.meta;
                            // A cached entry wins over the backend's listing.
                            match all.entry(e.name) {
                                std::collections::btree_map::Entry::Vacant(v) => {
                                    v.insert((s, backend_only));
                                }
                                std::collections::btree_map::Entry::Occupied(mut o) => {
                                    if o.get().1 && !backend_only {
                                        o.insert((s, false));
                                    }
                                }
                            }
                        }
                    }
                    other => return Err(unexpected(other)),
                }
            }
        }
        Ok(all)
    }

    /// Lists the part of a directory held by server `index` (for parallel
    /// find). Does not check that `path` is a directory.
    pub fn readdir_index(&self, path: &str, index: usize) -> Result<Vec<DirEntry>> {
        self.readdir_index_op(path, index, false)
    }

    /// As [`Client::readdir_index`], but only the entries that are
    /// directories (the server filters them; for walking the tree without
    /// reading every entry). A server older than this request fails it
    /// with `EPROTO`.
    pub fn readdir_dirs_index(&self, path: &str, index: usize) -> Result<Vec<DirEntry>> {
        self.readdir_index_op(path, index, true)
    }

    fn readdir_index_op(&self, path: &str, index: usize, dirs: bool) -> Result<Vec<DirEntry>> {
        let st = self.state();
        let p = normalize(path)?;
        if index >= st.ring.len() {
            return fail(
                libc::EINVAL,
                format!("server index {index} out of range (0..{})", st.ring.len()),
            );
        }
        if st.is_node_local(&p) && !st.servers_for(&p)?.contains(&index) {
            // Another server's node-local area is another node's: this
            // node's part of it is on its own server only.
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut after = String::new();
        let mut full = String::new();
        loop {
            let (path, from, max) = (p.clone(), after.clone(), READDIR_PAGE);
            let req = if dirs {
                Request::ReaddirDirs {
                    path,
                    after: from,
                    max,
                }
            } else {
                Request::Readdir {
                    path,
                    after: from,
                    max,
                }
            };
            self.count(1);
            match self.inner.pool.call(&st, index, &req)? {
                Response::Entries { entries, done } => {
                    if let Some(l) = entries.last() {
                        after = l.name.clone();
                    }
                    out.reserve(entries.len());
                    for e in entries {
                        path::join_into(&mut full, &p, &e.name);
                        out.push(DirEntry {
                            stat: Stat::from_meta(&full, &e.meta),
                            name: e.name,
                        });
                    }
                    if done {
                        return Ok(out);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }
}
