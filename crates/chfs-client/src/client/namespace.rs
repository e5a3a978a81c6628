//! The namespace: resolving a path to its entry (headers, symbolic links,
//! parent directories), the negative lookup cache (`lookup`), and
//! creating, removing and renaming entries (`mkdir`, `mkdir_all`, `rmdir`,
//! `unlink`, `symlink`, `readlink`, `mknod`, `rename`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use chfs_proto::meta::{now_ns, FLAG_STRAY};
use chfs_proto::msg::{op, RemoveKind};
use chfs_proto::path::{self, normalize};
use chfs_proto::{Meta, Request, Response};
use chfs_sys::lock;

use super::{expect_meta, ids, link_target, link_text, rw_flags, unexpected, Client, MAX_SYMLINKS};
use crate::error::{fail, Result};
use crate::names::{Effect, Versions};
use crate::pool::{Op, PoolState};
use crate::types::Stat;

impl Client {
    pub(super) fn stat_meta(&self, st: &PoolState, path: &str) -> Result<Meta> {
        expect_meta(self.call_owner(
            st,
            path,
            0,
            &Request::Stat {
                path: path.to_string(),
            },
        ))
    }

    /// The entry of `path` and, for a regular file of at most `max` bytes
    /// in its first chunk, its bytes (fewer where its end is a hole), in
    /// one request to the owner ([`Request::StatData`]). None where the
    /// entry is to be asked for otherwise: a lookup (`lookup`) that goes
    /// through a contact server, or servers that do not know the request.
    pub(super) fn stat_data(
        &self,
        st: &PoolState,
        path: &str,
        max: u32,
        lookup: bool,
    ) -> Result<Option<(Meta, Option<bytes::Bytes>)>> {
        if lookup && self.relayed_to(st, path).is_some() {
            return Ok(None);
        }
        let owner = st.owner(path, 0);
        let list = st.ring.list();
        let addr = &list.servers[owner];
        if self.inner.older.refused(addr, op::STAT_DATA) {
            return Ok(None);
        }
        let req = Request::StatData {
            path: path.to_string(),
            max,
        };
        match self.call_owner(st, path, 0, &req) {
            Ok(Response::MetaData { meta, data }) => Ok(Some((meta, Some(data)))),
            Ok(Response::Meta(m)) => Ok(Some((m, None))),
            Ok(other) => Err(unexpected(other)),
            Err(e) if e.errno() == libc::EPROTO => {
                tracing::debug!(server = %addr, "no StatData: {e}");
                self.inner.older.add(addr, op::STAT_DATA);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The contact server a lookup of `path` goes through, None where it
    /// asks the owner itself (lookups not relayed, the node-local area,
    /// a path this client changed lately).
    fn relayed_to(&self, st: &PoolState, path: &str) -> Option<usize> {
        let owner = st.owner(path, 0);
        let contact = if st.is_node_local(path) {
            owner
        } else {
            st.contact(owner)
        };
        (contact != owner && !self.inner.own.bypass(path)).then_some(contact)
    }

    /// The entry of `path` for a lookup (stat, a read-only open, a
    /// parent directory): through the contact server when lookups are
    /// relayed (`CHFS_LOOKUP_LOCAL`, `CHFS_LOOKUP_RELAY_GROUP`), unless
    /// this client changed the path within the contact cache's time (its
    /// own changes are then seen at once); else from the owner. A contact
    /// that cannot be reached (refused, reset, lost) is passed over for
    /// the owner; one that does not answer gives ETIMEDOUT.
    pub(super) fn lookup_meta(&self, st: &PoolState, path: &str) -> Result<Meta> {
        let Some(contact) = self.relayed_to(st, path) else {
            return self.stat_meta(st, path);
        };
        self.count(1);
        let max_age_ms = self.config().lookup_cache.as_millis().min(u32::MAX as u128) as u32;
        let req = Request::Lookup {
            path: path.to_string(),
            max_age_ms,
        };
        match self.inner.pool.call(st, contact, &req) {
            Err(e) if crate::relay::unreachable(&e) => self.stat_meta(st, path),
            r => expect_meta(r),
        }
    }

    /// Follows symbolic links in the last component (the entries are
    /// looked up, [`Client::lookup_meta`], with `relayed`).
    pub(super) fn resolve(
        &self,
        st: &PoolState,
        path: String,
        relayed: bool,
    ) -> Result<(String, Meta)> {
        let mut path = path;
        for _ in 0..MAX_SYMLINKS {
            let m = if relayed {
                self.lookup_meta(st, &path)?
            } else {
                self.stat_meta(st, &path)?
            };
            if !m.is_symlink() {
                return Ok((path, m));
            }
            let target = self.read_link_meta(st, &path, &m)?;
            path = link_target(&path, &target)?;
        }
        fail(
            libc::ELOOP,
            format!("{path}: too many levels of symbolic links"),
        )
    }

    /// Turns on the negative lookup cache used by [`Client::lookup`]: a
    /// name is reported absent without asking its server when a listing of
    /// its directory no older than `ttl` (plus this client's own changes
    /// since) does not hold it. Zero turns it off. Meant for adapters whose
    /// kernel caches entries for `ttl` anyway (the FUSE mount).
    pub fn set_negative_ttl(&self, ttl: std::time::Duration) {
        self.inner.names.set_ttl(ttl);
    }

    /// Like [`Client::lstat`], but may answer `ENOENT` from the negative
    /// lookup cache (see [`Client::set_negative_ttl`]): an entry created by
    /// another client can stay invisible here for up to the cache's ttl.
    /// Entries this client created are always seen.
    pub fn lookup(&self, path: &str) -> Result<Stat> {
        use crate::names::Known;
        let p = normalize(path)?;
        let names = &self.inner.names;
        let mut known = names.lookup(&p);
        if known == Known::Check {
            // An old snapshot: kept if the servers' versions tell that
            // nobody else changed the directory's names.
            let dir = path::parent(&p);
            if let Some(at) = names.begin_check(dir) {
                let v = self.dir_versions(&self.state(), dir);
                names.end_check(dir, at, v);
            }
            known = names.lookup(&p);
        }
        match known {
            Known::Absent => return fail(libc::ENOENT, format!("{p}: no such file or directory")),
            Known::Present(m) => return Ok(self.to_stat(&p, m)),
            Known::Ask | Known::Check => {}
        }
        let st = self.state();
        let r = self.lookup_meta(&st, &p);
        let found = match &r {
            Ok(_) => true,
            Err(e) if e.errno() == libc::ENOENT => false,
            Err(_) => return r.map(|m| self.to_stat(&p, m)),
        };
        if names.asked(&p, found) {
            self.list_names(&st, path::parent(&p));
        }
        r.map(|m| self.to_stat(&p, m))
    }

    /// Lists `dir` into the lookup cache.
    fn list_names(&self, st: &PoolState, dir: &str) {
        let names = &self.inner.names;
        if let Some(at) = names.begin_listing(dir) {
            // The versions before the listing: its snapshot's base.
            names.begin_base(dir);
            names.end_base(dir, self.dir_versions(st, dir));
            let list = self.list_metas(st, dir).ok().map(|all| {
                all.into_iter()
                    .map(|(name, (m, backend_only))| (name, (!backend_only).then_some(m)))
                    .collect()
            });
            names.end_listing(dir, at, list);
        }
    }

    /// The versions of directory `dir` on every server that may hold its
    /// entries (one request each, pipelined); None when a server failed,
    /// answered with another server list than this client's, or does not
    /// keep versions (an older server: EPROTO; cache mode: EOPNOTSUPP;
    /// then they are not asked for again with this server list).
    pub(super) fn dir_versions(&self, st: &PoolState, dir: &str) -> Option<Versions> {
        let list = st.ring.list().version;
        if self.inner.no_versions.load(Ordering::Relaxed) == list + 1 {
            return None;
        }
        let servers = st.servers_for(dir).ok()?;
        let req = Request::DirVersion {
            path: dir.to_string(),
        };
        let ops = servers.iter().map(|&i| Op::req(i, &req)).collect();
        let mut out = Vec::with_capacity(servers.len());
        for (&i, r) in servers.iter().zip(self.pipeline(st, ops)) {
            match r {
                Ok(Response::DirVersion(v)) if v.list == list => {
                    out.push((i, (v.born != 0).then_some((v.born, v.changes))));
                }
                Err(e) if matches!(e.errno(), libc::EPROTO | libc::EOPNOTSUPP) => {
                    self.inner.no_versions.store(list + 1, Ordering::Relaxed);
                    return None;
                }
                _ => return None,
            }
        }
        Some(Versions { list, servers: out })
    }

    /// Checks that the parent of `path` is a directory (cached for a while).
    fn check_parent(&self, st: &PoolState, path: &str) -> Result<()> {
        let dir = path::parent(path);
        if dir == "/" || path == "/" {
            return Ok(());
        }
        let ttl = self.inner.pool.cfg().dir_cache;
        if let Some(t) = lock(&self.inner.dirs).get(dir) {
            if t.elapsed() < ttl {
                return Ok(());
            }
        }
        match self.lookup_meta(st, dir) {
            Ok(m) if m.is_dir() => {
                if !ttl.is_zero() {
                    let mut d = lock(&self.inner.dirs);
                    if d.len() > 65536 {
                        d.clear();
                    }
                    d.insert(dir.to_string(), Instant::now());
                }
                Ok(())
            }
            Ok(m) if m.is_symlink() => fail(
                libc::ENOTSUP,
                format!("{dir}: symbolic links inside paths are not followed by the native client"),
            ),
            Ok(_) => fail(libc::ENOTDIR, format!("{dir}: not a directory")),
            Err(e) if e.errno() == libc::ENOENT => {
                // Error path only: a non-directory further up means ENOTDIR.
                let mut up = path::parent(dir);
                while up != "/" {
                    match self.stat_meta(st, up) {
                        Ok(m) if m.is_dir() => break,
                        Ok(_) => return fail(libc::ENOTDIR, format!("{up}: not a directory")),
                        Err(_) => up = path::parent(up),
                    }
                }
                fail(libc::ENOENT, format!("{dir}: no such directory"))
            }
            Err(e) => Err(e),
        }
    }

    fn forget_dirs(&self, path: &str) {
        lock(&self.inner.dirs).retain(|d, _| !path::is_within(d, path));
    }

    pub(super) fn create_entry(
        &self,
        st: &PoolState,
        path: &str,
        meta: Meta,
        excl: bool,
        data: &[u8],
    ) -> Result<(Meta, bool)> {
        if path == "/" {
            return fail(libc::EEXIST, "/: exists");
        }
        self.check_parent(st, path)?;
        let req = Request::Create {
            path: path.to_string(),
            meta,
            excl,
            data: bytes::Bytes::copy_from_slice(data),
        };
        let names = &self.inner.names;
        names.begin_change(path);
        let r = self.call_owner(st, path, 0, &req);
        let effect = match &r {
            Ok(Response::Created { created: true, .. }) => Effect::One,
            _ => Effect::None,
        };
        names.end_change(path, st.owner(path, 0), st.ring.list().version, effect);
        match &r {
            Ok(_) => self.inner.names.added(path),
            Err(e) if e.errno() == libc::EEXIST => self.inner.names.added(path),
            Err(_) => {}
        }
        match r? {
            Response::Created { meta, created } => Ok((meta, created)),
            other => Err(unexpected(other)),
        }
    }

    pub(super) fn new_meta(&self, mode: u32, chunk_size: u32) -> Meta {
        let (uid, gid) = self.creds.unwrap_or_else(ids);
        let now = now_ns();
        Meta {
            mode,
            uid,
            gid,
            chunk_size,
            mtime: now,
            ctime: now,
            atime: now,
            fileid: self.new_fileid(),
            ..Default::default()
        }
    }

    /// `mkdir(2)`.
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.new_meta(
            libc::S_IFDIR | (mode & 0o7777),
            self.inner.chunk_size.load(Ordering::Relaxed),
        );
        let sent = Instant::now();
        self.create_entry(&st, &p, m, true, &[])?;
        let servers = st.servers_for(&p)?;
        self.inner
            .names
            .new_dir(&p, sent, st.ring.list().version, &servers);
        Ok(())
    }

    /// `mkdir -p`: creates directory `path` with permission bits `mode`,
    /// and first every missing directory above it (with `mode` plus `u+wx`,
    /// so that the next one can be made in it, as `mkdir -p` makes them).
    /// A directory that exists already, or that another client creates
    /// meanwhile, is fine, and so is a symbolic link to one as `path`
    /// (followed, as `mkdir -p` does). An existing entry that is not a
    /// directory is `EEXIST` when it is `path` itself and `ENOTDIR` when
    /// it is above it. When the parent exists this is one `mkdir`.
    pub fn mkdir_all(&self, path: &str, mode: u32) -> Result<()> {
        let p = normalize(path)?;
        // Still to make: `path`, then each missing parent after the
        // directory that waits for it; the last is tried next. `made`: the
        // directory made (or found) last, the parent of the next one tried.
        let mut todo = vec![p.clone()];
        let mut made: Option<String> = None;
        while let Some(d) = todo.last() {
            let m = if *d == p { mode } else { mode | 0o300 };
            match self.mkdir(d, m) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::EEXIST => match self.stat(d) {
                    Ok(st) if st.is_dir() => {}
                    Ok(_) => {
                        let errno = if *d == p { libc::EEXIST } else { libc::ENOTDIR };
                        return fail(errno, format!("{d}: exists and is not a directory"));
                    }
                    // A dangling symbolic link (or removed meanwhile).
                    Err(s) if s.errno() == libc::ENOENT => return Err(e),
                    Err(s) => return Err(s),
                },
                // The parent is missing, unless it was just made (and
                // removed again by someone else): make it first.
                Err(e) if e.errno() == libc::ENOENT && *d != "/" => {
                    let up = path::parent(d).to_string();
                    if made.as_deref() == Some(up.as_str()) {
                        return Err(e);
                    }
                    todo.push(up);
                    continue;
                }
                Err(e) => return Err(e),
            }
            made = todo.pop();
        }
        Ok(())
    }

    /// `rmdir(2)`: fails with `ENOTEMPTY` if any server holds an entry in it.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        if p == "/" {
            return fail(libc::EBUSY, "/: cannot remove the root directory");
        }
        let m = self.stat_meta(&st, &p)?;
        if !m.is_dir() {
            return fail(libc::ENOTDIR, format!("{p}: not a directory"));
        }
        self.check_empty(&st, &p)?;
        self.inner.names.begin_change(&p);
        let r = self.call_owner(
            &st,
            &p,
            0,
            &Request::RemoveEntry {
                path: p.clone(),
                kind: RemoveKind::Dir,
            },
        );
        self.end_removal(&st, &p, r.is_ok());
        r?;
        self.forget_dirs(&p);
        self.inner.names.removed(&p);
        self.inner.names.forget_below(&p);
        Ok(())
    }

    /// A removal of the entry of `p` begun with `begin_change` was
    /// answered (`done`: removed).
    fn end_removal(&self, st: &PoolState, p: &str, done: bool) {
        let effect = if done { Effect::One } else { Effect::None };
        self.inner
            .names
            .end_change(p, st.owner(p, 0), st.ring.list().version, effect);
    }

    fn check_empty(&self, st: &PoolState, p: &str) -> Result<()> {
        for r in self.broadcast_for(
            st,
            p,
            &Request::HasChildren {
                path: p.to_string(),
            },
        )? {
            match r? {
                Response::Bool(false) => {}
                Response::Bool(true) => {
                    return fail(libc::ENOTEMPTY, format!("{p}: directory not empty"))
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    /// `unlink(2)`.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        // Read-ahead of the file is dropped once its chunks are gone too.
        let _changing = self.inner.gens.changing(&p);
        self.inner.names.begin_change(&p);
        let r = expect_meta(self.call_owner(
            &st,
            &p,
            0,
            &Request::RemoveEntry {
                path: p.clone(),
                kind: RemoveKind::NotDir,
            },
        ));
        self.end_removal(&st, &p, r.is_ok());
        let m = r?;
        self.inner.names.removed(&p);
        self.remove_data_chunks(&st, &p, &m, m.size.max(self.local_size(&p)))
    }

    /// Removes the data chunks (index >= 1) of a file of `size` bytes:
    /// from the servers owning its chunks below the size, or from every
    /// server when chunks may lie past it ([`FLAG_STRAY`]).
    fn remove_data_chunks(&self, st: &PoolState, p: &str, m: &Meta, size: u64) -> Result<()> {
        let cs = m.chunk_size.max(1) as u64;
        let nchunks = size.div_ceil(cs);
        let mut servers: Vec<usize> = if st.is_node_local(p) {
            st.servers_for(p)?
        } else if m.flags & FLAG_STRAY != 0 || nchunks > st.ring.len() as u64 {
            // (with consistent hashing the owners of the first n data
            // chunks need not be all n servers)
            (0..st.ring.len()).collect()
        } else if nchunks <= 1 {
            return Ok(());
        } else {
            (1..nchunks).map(|i| st.owner(p, i)).collect()
        };
        servers.sort_unstable();
        servers.dedup();
        let req = Request::RemoveChunks {
            path: p.to_string(),
            from_idx: 1,
        };
        let ops = servers.into_iter().map(|s| Op::req(s, &req)).collect();
        for r in self.pipeline(st, ops) {
            r?;
        }
        Ok(())
    }

    /// `symlink(2)`: creates `path` pointing at `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        if target.is_empty() {
            return fail(libc::ENOENT, "empty symlink target");
        }
        if target.len() > path::MAX_PATH {
            return fail(libc::ENAMETOOLONG, "symlink target too long");
        }
        let mut m = self.new_meta(
            libc::S_IFLNK | 0o777,
            self.inner
                .chunk_size
                .load(Ordering::Relaxed)
                .max(path::MAX_PATH as u32 + 1),
        );
        m.size = target.len() as u64;
        self.create_entry(&st, &p, m, true, target.as_bytes())?;
        Ok(())
    }

    pub(super) fn read_link_meta(&self, st: &PoolState, p: &str, m: &Meta) -> Result<String> {
        let req = Request::Read {
            path: p.to_string(),
            fileid: m.fileid,
            idx: 0,
            off: 0,
            len: m.size as u32,
            chunk_size: m.chunk_size,
            flags: rw_flags(m, false),
            epoch: m.epoch(),
        };
        match self.call_owner(st, p, 0, &req)? {
            Response::Data(d) => link_text(&d),
            other => Err(unexpected(other)),
        }
    }

    /// `readlink(2)`.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let st = self.state();
        let p = normalize(path)?;
        // The entry and the target in one request where the server can.
        let (m, target) = match self.stat_data(&st, &p, 0, false)? {
            Some((m, t)) => (m, t),
            None => (self.stat_meta(&st, &p)?, None),
        };
        if !m.is_symlink() {
            return fail(libc::EINVAL, format!("{p}: not a symbolic link"));
        }
        match target {
            Some(t) if t.len() as u64 == m.size => link_text(&t),
            _ => self.read_link_meta(&st, &p, &m),
        }
    }

    /// `mknod(2)`: FIFOs, sockets and device files are stored as metadata;
    /// a regular file is created empty.
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64) -> Result<()> {
        let st = self.state();
        let p = normalize(path)?;
        let ft = mode & libc::S_IFMT;
        let ft = if ft == 0 { libc::S_IFREG } else { ft };
        if ![
            libc::S_IFREG,
            libc::S_IFIFO,
            libc::S_IFSOCK,
            libc::S_IFCHR,
            libc::S_IFBLK,
        ]
        .contains(&ft)
        {
            return fail(
                libc::EINVAL,
                format!("{p}: mknod of file type {ft:o} is not allowed"),
            );
        }
        let mut m = self.new_meta(
            ft | (mode & 0o7777),
            self.inner.chunk_size.load(Ordering::Relaxed),
        );
        m.rdev = rdev as u32;
        self.create_entry(&st, &p, m, true, &[])?;
        Ok(())
    }

    /// `rename(2)`: files and directories; the destination is replaced
    /// (an empty directory by a directory, a non-directory by a
    /// non-directory). Chunks move to their new owners.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_flags(from, to, false)
    }

    /// `renameat2(2)` with optional `RENAME_NOREPLACE`.
    pub fn rename_flags(&self, from: &str, to: &str, noreplace: bool) -> Result<()> {
        let st = self.state();
        let old = normalize(from)?;
        let new = normalize(to)?;
        if old == "/" || new == "/" {
            return fail(libc::EBUSY, "cannot rename the root directory");
        }
        if st.is_node_local(&old) != st.is_node_local(&new) {
            return fail(
                libc::EXDEV,
                format!("{old} -> {new}: between the node-local area and the shared namespace"),
            );
        }
        let src = self.stat_meta(&st, &old)?;
        if old == new {
            return Ok(());
        }
        if src.is_dir() && path::is_within(&new, &old) {
            return fail(
                libc::EINVAL,
                format!("cannot move {old} into itself ({new})"),
            );
        }
        self.check_parent(&st, &new)?;
        match self.stat_meta(&st, &new) {
            Ok(dst) => {
                if noreplace {
                    return fail(libc::EEXIST, format!("{new}: exists"));
                }
                if src.is_dir() {
                    if !dst.is_dir() {
                        return fail(libc::ENOTDIR, format!("{new}: not a directory"));
                    }
                    self.rmdir(&new)?;
                } else {
                    if dst.is_dir() {
                        return fail(libc::EISDIR, format!("{new}: is a directory"));
                    }
                    self.unlink(&new)?;
                }
            }
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        for f in self.open_files(&old) {
            self.flush_file(&st, &f)?;
        }
        let req = Request::RenameMove {
            old: old.clone(),
            new: new.clone(),
            is_dir: src.is_dir(),
        };
        // The owner of the source entry first: it may refuse (cache mode) or
        // rename the backend copy; then every other server moves its chunks.
        let owner = st.owner(&old, 0);
        // Read-ahead buffers of either name (or below them) are dropped.
        let _changing = self.inner.gens.changing_all();
        let own = &self.inner.own;
        own.changed(&old);
        own.changed(&new);
        if src.is_dir() {
            own.changed_below(&old);
        }
        self.count(1);
        let names = &self.inner.names;
        names.begin_change(&old);
        names.begin_change(&new);
        let r = self.inner.pool.call(&st, owner, &req);
        // (entries leave one server's set and join another's, or replace
        // one: versions no longer tell)
        let list = st.ring.list().version;
        names.end_change(&old, owner, list, Effect::Unknown);
        names.end_change(&new, owner, list, Effect::Unknown);
        r?;
        names.added(&new);
        names.removed(&old);
        if src.is_dir() {
            names.forget_below(&old);
            names.forget_below(&new);
        }
        let others = st
            .servers_for(&old)?
            .into_iter()
            .filter(|&i| i != owner)
            .map(|i| Op::req(i, &req))
            .collect();
        let mut first_err = None;
        for r in self.pipeline(&st, others) {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        self.forget_dirs(&old);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
