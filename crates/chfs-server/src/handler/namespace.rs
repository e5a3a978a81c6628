//! Entries and directories: the root's default metadata, attribute
//! changes, renames (moving chunks), and cache mode's lookups, removals
//! and directory pages merged with the backend's.

use std::sync::Arc;

use bytes::Bytes;
use chfs_proto::frame::FLAG_FORWARDED;
use chfs_proto::meta::{now_ns, FLAG_BACKEND_ONLY, FLAG_CACHED, FLAG_MODIFIED, FLAG_WHITEOUT};
use chfs_proto::msg::{RemoveKind, SetAttr, TimeSet};
use chfs_proto::path::validate;
use chfs_proto::{ErrorReply, Meta, Request, Response};
use chfs_store::{Chunk, StoreError};

use crate::cache::{Cache, Policy};
use crate::state::Shared;

use super::common::{blocking, store_err, Reply};

/// Metadata of the root directory before anyone changed it: owned by the
/// server's user, with the time the server started as its times.
pub(super) fn default_root() -> Meta {
    static STARTED: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let t = *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0)
    });
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Meta {
        mode: libc::S_IFDIR | 0o755,
        uid,
        gid,
        chunk_size: chfs_proto::DEFAULT_CHUNK_SIZE,
        mtime: t,
        ctime: t,
        atime: t,
        ..Default::default()
    }
}

pub(super) fn apply_attr(m: &mut Meta, a: &SetAttr) -> Result<(), StoreError> {
    let now = now_ns();
    if let Some(mode) = a.mode {
        m.mode = (m.mode & libc::S_IFMT) | (mode & 0o7777);
    }
    if let Some(uid) = a.uid {
        m.uid = uid;
    }
    if let Some(gid) = a.gid {
        m.gid = gid;
    }
    match a.atime {
        TimeSet::Omit => {}
        TimeSet::Now => m.atime = now,
        TimeSet::At(t) => m.atime = t,
    }
    match a.mtime {
        TimeSet::Omit => {}
        TimeSet::Now => m.mtime = now,
        TimeSet::At(t) => m.mtime = t,
    }
    m.ctime = now;
    Ok(())
}

/// Moves this server's chunks of `old` (and its subtree) to `new`.
pub(super) async fn rename_move(sh: &Arc<Shared>, old: &str, new: &str, is_dir: bool) -> Reply {
    for p in [old, new] {
        validate(p).map_err(|e| ErrorReply::new(e.errno, e.message))?;
    }
    // The node-local area stays on this server (the client refuses a
    // rename between it and the shared namespace: EXDEV).
    if sh.is_node_local(old) != sh.is_node_local(new) {
        return Err(ErrorReply::new(
            libc::EXDEV,
            format!("{old} -> {new}: between the node-local area and the shared namespace"),
        ));
    }
    if sh
        .node_local
        .as_deref()
        .is_some_and(|d| d == old || d == new)
    {
        return Err(ErrorReply::new(
            libc::EBUSY,
            format!("{old} -> {new}: the node-local area cannot be renamed"),
        ));
    }
    let st = &sh.store;
    // (the node-local area is never in the backend)
    let cache = sh.cache.as_deref().filter(|_| !sh.is_node_local(old));
    if let Some(c) = cache {
        if sh.placement().owns(old) {
            if let Some(m) = st.meta(old, 0).map_err(|e| store_err(old, e))? {
                let from_backend = m.flags & FLAG_CACHED != 0;
                match c.cfg.policy {
                    Policy::Keep if from_backend => {
                        return Err(ErrorReply::new(libc::EXDEV, format!("{old}: a backend entry cannot be renamed with --backend-policy keep (copy it)")));
                    }
                    Policy::Keep => {}
                    Policy::Mirror => blocking(|| c.backend.rename(old, new)).map_err(|e| {
                        ErrorReply::io(format_args!("backend rename of {old} to {new}"), &e)
                    })?,
                }
            }
        }
    }
    let mut paths = vec![old.to_string()];
    if is_dir {
        paths.extend(st.paths_below(old).map_err(|e| store_err(old, e))?);
    }
    let place = sh.placement();
    let local = sh.is_node_local(new);
    let mut moved = 0u64;
    for p in paths {
        let target = format!("{new}{}", &p[old.len()..]);
        for idx in st.chunk_indices(&p).map_err(|e| store_err(&p, e))? {
            let Some(chunk) = st.take(&p, idx).map_err(|e| store_err(&p, e))? else {
                continue;
            };
            if let Some(c) = cache {
                c.forget_one(&p, idx);
            }
            let owner = place.ring.owner(&target, idx);
            let r = if local || place.me == Some(owner) {
                sh.put_chunk(&target, idx, chunk.clone())
                    .map_err(|e| store_err(&target, e))
            } else {
                let addr = &place.ring.list().servers[owner];
                let req = Request::PutChunk {
                    path: target.clone(),
                    idx,
                    meta: chunk.meta,
                    data: chunk.data.clone(),
                };
                sh.peers.call(addr, &req, FLAG_FORWARDED).await.map(|_| ())
            };
            if let Err(e) = r {
                // Put the chunk back (dirty if it was) so nothing is lost,
                // and report.
                let _ = sh.put_chunk(&p, idx, chunk);
                return Err(e);
            }
            moved += 1;
        }
    }
    Ok(Response::Count(moved))
}

/// Cache mode lookup of an entry: the store, else the backend (imported),
/// skipping whiteouts; revalidates when asked to.
pub(super) fn lookup(sh: &Arc<Shared>, c: &Cache, path: &str) -> Result<Option<Meta>, ErrorReply> {
    let st = &*sh.store;
    let epoch = sh.placement().ring.list().version;
    blocking(|| match st.meta(path, 0)? {
        Some(m) if m.flags & FLAG_WHITEOUT != 0 => Ok(None),
        Some(m) => c.revalidate(st, path, m, epoch).map(Some),
        None if path == "/" => Ok(None),
        None => c.import(st, path, epoch),
    })
    .map_err(|e| store_err(path, e))
}

/// Marks a cached backend file as written in the cache ([`FLAG_MODIFIED`]).
fn modified_entry(sh: &Shared, path: &str) -> Result<(), ErrorReply> {
    let r = sh.store.update_meta(path, 0, &mut |m| {
        if m.flags & FLAG_CACHED != 0 {
            m.flags |= FLAG_MODIFIED;
        }
        Ok(())
    });
    match r {
        Ok(_) | Err(StoreError::NotFound) => Ok(()),
        Err(e) => Err(store_err(path, e)),
    }
}

/// unlink/rmdir in cache mode.
pub(super) fn remove_cached(sh: &Arc<Shared>, c: &Cache, path: &str, kind: RemoveKind) -> Reply {
    let st = &*sh.store;
    let Some(m) = lookup(sh, c, path)? else {
        return Err(ErrorReply::new(
            libc::ENOENT,
            format!("{path}: no such file or directory"),
        ));
    };
    match kind {
        RemoveKind::NotDir if m.is_dir() => {
            return Err(ErrorReply::new(
                libc::EISDIR,
                format!("{path}: is a directory"),
            ))
        }
        RemoveKind::Dir if !m.is_dir() => {
            return Err(ErrorReply::new(
                libc::ENOTDIR,
                format!("{path}: not a directory"),
            ))
        }
        _ => {}
    }
    let bk = |e: std::io::Error| ErrorReply::io(format_args!("backend: removing {path}"), &e);
    blocking(|| -> Result<(), ErrorReply> {
        match c.cfg.policy {
            Policy::Mirror => {
                if m.is_dir() {
                    c.backend.rmdir(path).map_err(bk)?;
                } else {
                    c.backend.unlink(path).map_err(bk)?;
                }
                st.remove(path, 0, &mut |_| Ok(()))
                    .map_err(|e| store_err(path, e))?;
            }
            Policy::Keep => {
                st.remove(path, 0, &mut |_| Ok(()))
                    .map_err(|e| store_err(path, e))?;
                if c.backend.lstat(path).map_err(bk)?.is_some() {
                    let w = Meta {
                        flags: FLAG_WHITEOUT,
                        chunk_size: 1,
                        ..Default::default()
                    };
                    st.put(
                        path,
                        0,
                        Chunk {
                            meta: w,
                            data: Bytes::new(),
                        },
                    )
                    .map_err(|e| store_err(path, e))?;
                }
            }
        }
        Ok(())
    })?;
    c.forget(path, 0);
    Ok(Response::Meta(m))
}

/// A directory page merging the store's entries with the backend's (at the
/// server owning the directory's entry): the first `max` names after
/// `after` of both, an entry of the store hiding the backend's of the same
/// name. The store's page bounds the backend's: when the store has more
/// than `max` names after `after`, no backend name past its `max`-th can be
/// on this page. Only the backend entries that make the page are looked up.
pub(super) fn list_with_backend(
    st: &dyn chfs_store::Store,
    c: &Cache,
    dir: &str,
    after: &str,
    max: usize,
) -> Result<(Vec<(String, Meta)>, bool), ErrorReply> {
    let (mine, store_done) = st
        .list_dir(dir, after, max)
        .map_err(|e| store_err(dir, e))?;
    let upto = match (store_done, mine.last()) {
        (false, Some((last, _))) => Some(last.as_str()),
        _ => None,
    };
    let keep = |name: &str| {
        name > after
            && upto.is_none_or(|u| name <= u)
            && mine
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .is_err()
    };
    let backend_err =
        |e: std::io::Error| ErrorReply::io(format_args!("backend listing of {dir}"), &e);
    let Some(mut backend_dir) = c.backend.dir(dir).map_err(backend_err)? else {
        return Ok((mine, store_done));
    };
    let mut names = backend_dir.names(keep).map_err(backend_err)?;
    let more = names.len();
    if names.len() > max {
        names.select_nth_unstable(max);
        names.truncate(max);
    }
    names.sort_unstable();
    // How many of them make the page, merged with the store's names.
    let (mut i, mut j) = (0, 0);
    while i + j < max && j < names.len() {
        if i < mine.len() && mine[i].0 < names[j] {
            i += 1;
        } else {
            j += 1;
        }
    }
    names.truncate(j);
    let backend = backend_dir.lookup(names).map_err(backend_err)?;
    let done = store_done && mine.len() + more <= max;
    let mut all: std::collections::BTreeMap<String, Meta> = mine.into_iter().collect();
    for (name, bst) in backend {
        let mut m = crate::backend::meta_from_stat(&bst, c.cfg.chunk_size, 0);
        m.flags |= FLAG_BACKEND_ONLY;
        all.insert(name, m);
    }
    Ok((all.into_iter().take(max).collect(), done))
}

/// Does backend directory `dir` have an entry (false if it does not exist)?
fn backend_has_children(c: &Cache, dir: &str) -> Result<bool, ErrorReply> {
    let err = |e: std::io::Error| ErrorReply::io(format_args!("backend listing of {dir}"), &e);
    match c.backend.dir(dir).map_err(err)? {
        Some(mut d) => d.has_entries().map_err(err),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheConfig;
    use chfs_store::Store;

    fn cache(backend: &std::path::Path) -> Cache {
        Cache::open(CacheConfig {
            backend: backend.to_path_buf(),
            policy: Policy::Keep,
            flush_idle_ms: 0,
            flush_threads: 1,
            revalidate: false,
            chunk_size: 4096,
        })
        .unwrap()
    }

    /// rmdir's question whether a backend directory has an entry reads
    /// one name, not the whole directory.
    #[test]
    fn backend_children_are_found_at_the_first_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("full")).unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        for i in 0..1000 {
            std::fs::write(dir.path().join(format!("full/f{i}")), b"").unwrap();
        }
        let c = cache(dir.path());
        assert!(backend_has_children(&c, "/full").unwrap());
        assert_eq!(c.backend.names_read(), 1);
        assert!(!backend_has_children(&c, "/empty").unwrap());
        assert!(!backend_has_children(&c, "/missing").unwrap());
        assert!(!backend_has_children(&c, "/full/f1").unwrap());
        assert_eq!(c.backend.names_read(), 1);
    }

    /// Paging through a cache-mode directory looks each backend entry up
    /// once (it looked up the whole backend directory for every page), and
    /// the pages together are the store's names and the backend's, each
    /// once, in order.
    #[test]
    fn backend_directory_pages_look_up_each_entry_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let n = 1000;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("d/b{i:04}")), b"x").unwrap();
        }
        let c = cache(dir.path());
        let st = chfs_store::MemStore::new(0);
        let meta = Meta {
            mode: libc::S_IFREG | 0o644,
            chunk_size: 4096,
            ..Default::default()
        };
        // Names of the store only, and names also in the backend.
        let mut want = std::collections::BTreeSet::new();
        for i in (0..n).step_by(7) {
            st.create(&format!("/d/b{i:04}"), meta, b"", true).unwrap();
        }
        for i in 0..300 {
            let name = format!("a{i:03}");
            st.create(&format!("/d/{name}"), meta, b"", true).unwrap();
            want.insert(name);
        }
        want.extend((0..n).map(|i| format!("b{i:04}")));
        let mut got = Vec::new();
        let mut after = String::new();
        let mut pages = 0;
        loop {
            let (page, done) = list_with_backend(&st, &c, "/d", &after, 64).unwrap();
            pages += 1;
            assert!(page.len() <= 64);
            for (name, m) in &page {
                let only_backend = m.flags & FLAG_BACKEND_ONLY != 0;
                let in_store =
                    name.starts_with('a') || name[1..].parse::<usize>().unwrap() % 7 == 0;
                assert_eq!(only_backend, !in_store, "{name}");
            }
            got.extend(page.into_iter().map(|(name, _)| name));
            if done {
                break;
            }
            after = got.last().unwrap().clone();
        }
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
        assert!(pages >= 20, "{pages} pages");
        let backend_only = n as u64 - (0..n).step_by(7).count() as u64;
        assert_eq!(c.backend.lookups(), backend_only);
        // A page opens the backend directory once.
        assert_eq!(c.backend.opens(), pages);
        // HasChildren's question costs no lookup.
        assert!(backend_has_children(&c, "/d").unwrap());
        assert_eq!(c.backend.lookups(), backend_only);
    }
}

/// The namespace a request works on: the store alone, or the store in
/// front of a backend directory (cache mode). Every rule cache mode adds
/// to a request is one method here, and does nothing for `Plain`, so the
/// request handlers (`handler::serve`) have no cache-mode branches.
#[derive(Clone, Copy)]
pub(super) enum Ns<'a> {
    /// No backend.
    Plain,
    /// Cache mode.
    Cached(&'a Cache),
}

impl<'a> Ns<'a> {
    /// The namespace of server `sh`.
    pub(super) fn of(sh: &'a Shared) -> Ns<'a> {
        match sh.cache.as_deref() {
            Some(c) => Ns::Cached(c),
            None => Ns::Plain,
        }
    }

    /// The namespace of a request about `path` (None: about no path) on
    /// server `sh`: the node-local area is never cached from or written
    /// to the backend.
    pub(super) fn for_path(sh: &'a Shared, path: Option<&str>) -> Ns<'a> {
        match path {
            Some(p) if sh.is_node_local(p) => Ns::Plain,
            _ => Ns::of(sh),
        }
    }

    /// A request from a client arrived: write-back waits for idleness
    /// (reports and flush requests do not count).
    pub(super) fn touch(self, req: &Request) {
        if !matches!(
            req,
            Request::Ping
                | Request::Status
                | Request::FlushStatus { .. }
                | Request::Flush { .. }
                | Request::GetServers
        ) {
            self.touch_io();
        }
    }

    /// [`Ns::touch`] for a request known to be I/O (a read).
    pub(super) fn touch_io(self) {
        if let Ns::Cached(c) = self {
            c.touch();
        }
    }

    /// Is there a backend?
    pub(super) fn is_cached(self) -> bool {
        matches!(self, Ns::Cached(_))
    }

    /// The backend directory ("" without one).
    pub(super) fn backend_path(self) -> String {
        match self {
            Ns::Cached(c) => c.backend.path().display().to_string(),
            Ns::Plain => String::new(),
        }
    }

    /// Write-back state under `prefix` (nothing is ever dirty without a
    /// backend); with `now`, flush it now.
    pub(super) fn flush_state(self, prefix: &str, now: bool) -> chfs_proto::msg::FlushState {
        match self {
            Ns::Cached(c) => {
                if now {
                    c.force(prefix);
                }
                c.state(prefix)
            }
            Ns::Plain => Default::default(),
        }
    }

    /// Before creating `path`: the entry already there, imported from the
    /// backend if it is only there; a whiteout (a removed backend entry)
    /// gives way to the new one.
    pub(super) fn before_create(
        self,
        sh: &Arc<Shared>,
        path: &str,
    ) -> Result<Option<Meta>, ErrorReply> {
        let Ns::Cached(c) = self else {
            return Ok(None);
        };
        if let Some(m) = lookup(sh, c, path)? {
            return Ok(Some(m));
        }
        let _ = sh.store.remove(path, 0, &mut |m| {
            if m.flags & FLAG_WHITEOUT != 0 {
                Ok(())
            } else {
                Err(StoreError::refused(libc::EEXIST, "exists"))
            }
        });
        Ok(None)
    }

    /// Chunk `idx` of `path` was created or written here: to be written
    /// back (and, for a write into the entry's chunk, the entry marked
    /// changed in the cache when `written`).
    pub(super) fn changed(
        self,
        sh: &Arc<Shared>,
        path: &str,
        idx: u64,
        written: bool,
    ) -> Result<(), ErrorReply> {
        if let Ns::Cached(c) = self {
            c.mark_dirty(&*sh.store, path, idx)
                .map_err(|e| store_err(path, e))?;
            if written && idx == 0 {
                modified_entry(sh, path)?;
            }
        }
        Ok(())
    }

    /// In cache mode, imports the entry of `path` from the backend if it
    /// is only there (before changing its attributes).
    pub(super) fn import(self, sh: &Arc<Shared>, path: &str) -> Result<(), ErrorReply> {
        if let Ns::Cached(c) = self {
            lookup(sh, c, path)?;
        }
        Ok(())
    }

    /// The entry of `path` (imported from the backend in cache mode).
    pub(super) fn entry(self, sh: &Arc<Shared>, path: &str) -> Result<Option<Meta>, ErrorReply> {
        match self {
            Ns::Cached(c) => lookup(sh, c, path),
            Ns::Plain => sh.store.meta(path, 0).map_err(|e| store_err(path, e)),
        }
    }

    /// Before reading or writing chunk `idx` of `path`: its bytes fetched
    /// from the backend when this is the entry's chunk or a cached backend
    /// file's (`rw::BACKEND`) and they are not here yet. The caller has
    /// checked `chunk_size` (`check_chunk_size`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch(
        self,
        sh: &Arc<Shared>,
        path: &str,
        idx: u64,
        fileid: u32,
        chunk_size: u32,
        mode: u32,
        flags: u16,
    ) -> Result<(), ErrorReply> {
        if let Ns::Cached(c) = self {
            if idx == 0 || flags & chfs_proto::msg::rw::BACKEND != 0 {
                let st = &*sh.store;
                blocking(|| c.ensure_chunk(st, path, idx, fileid, chunk_size, mode))
                    .map_err(|e| store_err(path, e))?;
            }
        }
        Ok(())
    }

    /// Removes entry `path` in cache mode (the backend policy decides what
    /// happens to the backend's copy); `None` without a backend.
    pub(super) fn remove(self, sh: &Arc<Shared>, path: &str, kind: RemoveKind) -> Option<Reply> {
        match self {
            Ns::Cached(c) => Some(remove_cached(sh, c, path, kind)),
            Ns::Plain => None,
        }
    }

    /// Chunks `from` and after of `path` were removed.
    pub(super) fn forget(self, path: &str, from: u64) {
        if let Ns::Cached(c) = self {
            c.forget(path, from);
        }
    }

    /// A page of directory `dir` (merged with the backend's at the server
    /// owning the directory's entry).
    pub(super) fn list_dir(
        self,
        sh: &Arc<Shared>,
        dir: &str,
        after: &str,
        max: usize,
    ) -> Result<(Vec<(String, Meta)>, bool), ErrorReply> {
        match self {
            Ns::Cached(c) if sh.placement().owns(dir) => {
                blocking(|| list_with_backend(&*sh.store, c, dir, after, max))
            }
            _ => sh
                .store
                .list_dir(dir, after, max)
                .map_err(|e| store_err(dir, e)),
        }
    }

    /// Does directory `dir` have an entry (here, or in the backend at the
    /// server owning the directory's entry)?
    pub(super) fn has_children(self, sh: &Arc<Shared>, dir: &str) -> Result<bool, ErrorReply> {
        if sh.store.has_children(dir).map_err(|e| store_err(dir, e))? {
            return Ok(true);
        }
        match self {
            Ns::Cached(c) if sh.placement().owns(dir) => blocking(|| backend_has_children(c, dir)),
            _ => Ok(false),
        }
    }
}
