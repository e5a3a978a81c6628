//! Request handling: one function per request kind.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::FLAG_FORWARDED;
use chfs_proto::meta::{
    now_ns, FLAG_BACKEND_ONLY, FLAG_CACHED, FLAG_DAMAGED, FLAG_MODIFIED, FLAG_PARTIAL, FLAG_STRAY,
    FLAG_WHITEOUT,
};
use chfs_proto::msg::{rw, DirEntry, RemoveKind, ServerStatus, SetAttr, TimeSet};
use chfs_proto::path::validate;
use chfs_proto::ring::{Ring, ServerList};
use chfs_proto::{ErrorReply, Meta, Request, Response, MAX_CHUNK_SIZE};
use chfs_store::{Chunk, StoreError};
use tracing::{debug_span, info, warn, Instrument};

use crate::cache::{Cache, Policy};
use crate::metrics::Counters;
use crate::server::Shared;

type Reply = Result<Response, ErrorReply>;

fn store_err(path: &str, e: StoreError) -> ErrorReply {
    ErrorReply::new(e.errno(), format!("{path}: {e}"))
}

fn refuse(errno: i32, msg: impl Into<String>) -> StoreError {
    StoreError::refused(errno, msg)
}

/// Metadata of the root directory before anyone changed it: owned by the
/// server's user, with the time the server started as its times.
fn default_root() -> Meta {
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

/// Bytes the medium of an unbounded store can still take: free memory for
/// the DRAM engine, free space of the directory's file system otherwise.
fn medium_available(store: &str, path: Option<&std::path::Path>) -> u64 {
    if store == "mem" || path.is_none() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        return meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
    }
    let Some(path) = path else { return 0 };
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return 0;
    };
    // SAFETY: c is a valid NUL-terminated string and vfs a zeroed statvfs
    // that statvfs fills.
    unsafe {
        let mut vfs: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut vfs) != 0 {
            return 0;
        }
        vfs.f_bavail as u64 * vfs.f_frsize as u64
    }
}

/// Runs blocking backend I/O from a handler: with `block_in_place` on the
/// shared multi-thread runtime; in place on a CPU lane (a current-thread
/// runtime, where `block_in_place` is not allowed; the lane's other
/// connections wait meanwhile).
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Serves one request.
pub(crate) async fn handle(sh: &Arc<Shared>, req: Request, forwarded: bool) -> Reply {
    Counters::inc(&sh.counters.requests);
    let span = debug_span!("req", op = req.op());
    async move {
        if let Some((path, idx)) = req.key() {
            validate(path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let p = sh.placement();
            let owner = p.ring.owner(path, idx);
            if !forwarded && p.me != Some(owner) && !p.ring.is_empty() {
                Counters::inc(&sh.counters.forwarded);
                let addr = p.ring.list().servers[owner].clone();
                return Box::pin(sh.peers.call(&addr, &req, FLAG_FORWARDED)).await;
            }
        }
        serve(sh, req).await
    }
    .instrument(span)
    .await
}

async fn serve(sh: &Arc<Shared>, req: Request) -> Reply {
    let st = &sh.store;
    let cache = sh.cache.as_deref();
    if let Some(c) = cache {
        if !matches!(
            req,
            Request::Ping
                | Request::Status
                | Request::FlushStatus { .. }
                | Request::Flush { .. }
                | Request::GetServers
        ) {
            c.touch();
        }
    }
    match req {
        Request::Ping => Ok(Response::Ok),
        Request::Lane { .. } => Err(ErrorReply::new(
            libc::EINVAL,
            "a CPU lane is asked for by the first request of a local connection",
        )),
        // Answered by the connection (see `serve_conn`); only reached when
        // forwarded, where no client memory is at hand.
        Request::ShmAttach { .. } => Err(ErrorReply::new(
            libc::EPERM,
            "shared memory is only for local clients of the server's user",
        )),
        Request::Sync => {
            // fsync/msync block: keep them off the async workers.
            let s = st.clone();
            tokio::task::spawn_blocking(move || s.sync())
                .await
                .map_err(|e| ErrorReply::new(libc::EIO, format!("sync: {e}")))?
                .map_err(|e| store_err("sync", e))?;
            Ok(Response::Ok)
        }
        Request::GetServers => Ok(Response::Servers(sh.placement().ring.list().clone())),
        // Rare requests with large futures are boxed: every request's task
        // would otherwise be as large as the largest (spawning copies it).
        Request::Join { addr, fresh } => Box::pin(join(sh, addr, fresh)).await,
        Request::UpdateServers { list } => {
            let cur = sh.placement();
            if list.version > cur.ring.list().version {
                info!(
                    version = list.version,
                    servers = list.servers.len(),
                    "server list updated"
                );
                let old = cur.ring.list().clone();
                sh.set_list(list.clone());
                Box::pin(mark_damaged(sh, &old, &list)).await;
            }
            Ok(Response::Ok)
        }
        Request::Status => {
            let s = st.stats();
            // An unbounded store reports what its medium can still take,
            // so `df` shows real free space rather than 100% used.
            let capacity = if s.capacity == 0 {
                s.bytes + medium_available(st.name(), sh.store_path.as_deref())
            } else {
                s.capacity
            };
            let c = &sh.counters;
            Ok(Response::Status(ServerStatus {
                addr: sh.me.clone(),
                store: st.name().to_string(),
                entries: s.entries,
                bytes: s.bytes,
                capacity,
                requests: Counters::get(&c.requests),
                forwarded: Counters::get(&c.forwarded),
                reads: Counters::get(&c.reads),
                writes: Counters::get(&c.writes),
                cma_writes: Counters::get(&c.cma_writes),
                shm_writes: Counters::get(&c.shm_writes),
                list_version: sh.placement().ring.list().version,
                since: sh.placement().since(),
                lost: Counters::get(&c.lost),
                refused: Counters::get(&c.refused),
                denied: Counters::get(&c.denied),
                over_limit: Counters::get(&c.over_limit),
                idle_closed: Counters::get(&c.idle_closed),
                throttled: Counters::get(&c.throttled),
                backend: cache
                    .map(|c| c.backend.path().display().to_string())
                    .unwrap_or_default(),
                flush: cache.map(|c| c.state("/")).unwrap_or_default(),
            }))
        }
        Request::Shutdown => {
            info!("shutdown requested");
            let s = sh.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = s.shutdown.send(true);
            });
            Ok(Response::Ok)
        }
        Request::Create {
            path,
            meta,
            excl,
            data,
        } => {
            if path == "/" {
                return Err(ErrorReply::new(
                    libc::EEXIST,
                    "/: the root directory exists",
                ));
            }
            check_chunk_size(meta.chunk_size)?;
            let mut meta = meta;
            meta.set_epoch(sh.placement().ring.list().version);
            if let Some(c) = cache {
                let existing = lookup(sh, c, &path)?;
                if let Some(m) = existing {
                    if excl {
                        return Err(ErrorReply::new(libc::EEXIST, format!("{path}: exists")));
                    }
                    return Ok(Response::Created {
                        meta: m,
                        created: false,
                    });
                }
                // A whiteout (removed backend entry) gives way to the new entry.
                let _ = st.remove(&path, 0, &mut |m| {
                    if m.flags & FLAG_WHITEOUT != 0 {
                        Ok(())
                    } else {
                        Err(refuse(libc::EEXIST, "exists"))
                    }
                });
            }
            let (meta, created) = st
                .create(&path, meta, &data, excl)
                .map_err(|e| store_err(&path, e))?;
            if created {
                if let Some(c) = cache {
                    c.mark_dirty(&**st, &path, 0)
                        .map_err(|e| store_err(&path, e))?;
                }
            }
            Ok(Response::Created { meta, created })
        }
        Request::Stat { path } if cache.is_some() => match lookup(sh, cache.unwrap(), &path)? {
            Some(m) => Ok(Response::Meta(m)),
            None if path == "/" => Ok(Response::Meta(default_root())),
            None => Err(ErrorReply::new(
                libc::ENOENT,
                format!("{path}: no such file or directory"),
            )),
        },
        Request::Stat { path } => match st.meta(&path, 0).map_err(|e| store_err(&path, e))? {
            Some(m) => Ok(Response::Meta(m)),
            None if path == "/" => Ok(Response::Meta(default_root())),
            None => Err(ErrorReply::new(
                libc::ENOENT,
                format!("{path}: no such file or directory"),
            )),
        },
        Request::Write {
            path,
            fileid,
            chunk_size,
            mode,
            idx,
            off,
            data,
            flags,
            epoch,
        } => {
            Counters::inc(&sh.counters.writes);
            check_chunk_size(chunk_size)?;
            if off as u64 + data.len() as u64 > chunk_size as u64 {
                return Err(ErrorReply::new(
                    libc::EINVAL,
                    format!("{path}: write of {} bytes at offset {off} crosses the chunk boundary (chunk size {chunk_size})", data.len()),
                ));
            }
            // A partial write into a chunk this server may have lost would
            // leave zeros where the lost bytes were: refused. (A write of
            // the whole chunk defines all of it.)
            let whole = off == 0 && data.len() == chunk_size as usize;
            if idx > 0 && !whole {
                if let Some(why) = sh.placement().may_have_lost(epoch, flags) {
                    let held = st.meta(&path, idx).map_err(|e| store_err(&path, e))?;
                    if held.is_none_or(|m| m.fileid != fileid)
                        && (flags & rw::BACKEND == 0 || flags & rw::MODIFIED != 0)
                    {
                        return Err(lost(sh, &path, idx, &why));
                    }
                }
            }
            if let Some(c) = cache {
                if idx == 0 || flags & rw::BACKEND != 0 {
                    blocking(|| c.ensure_chunk(&**st, &path, idx, fileid, chunk_size, mode))
                        .map_err(|e| store_err(&path, e))?;
                }
            }
            if idx == 0 {
                match st.meta(&path, 0).map_err(|e| store_err(&path, e))? {
                    None => {
                        return Err(ErrorReply::new(
                            libc::ENOENT,
                            format!("{path}: no such file"),
                        ))
                    }
                    Some(m) if m.is_dir() => {
                        return Err(ErrorReply::new(
                            libc::EISDIR,
                            format!("{path}: is a directory"),
                        ))
                    }
                    Some(m) if m.chunk_size != chunk_size => {
                        return Err(ErrorReply::new(
                            libc::EINVAL,
                            format!(
                                "{path}: chunk size {chunk_size} differs from the file's {}",
                                m.chunk_size
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
            let t = Meta {
                mode,
                chunk_size,
                fileid,
                mtime: now_ns(),
                ..Default::default()
            };
            let n = data.len() as u32;
            st.write_bytes(&path, idx, off, data, &t)
                .map_err(|e| store_err(&path, e))?;
            if let Some(c) = cache {
                c.mark_dirty(&**st, &path, idx)
                    .map_err(|e| store_err(&path, e))?;
                if idx == 0 {
                    modified_entry(sh, &path)?;
                }
            }
            Ok(Response::Written(n))
        }
        Request::Read {
            path,
            fileid,
            idx,
            off,
            len,
            chunk_size,
            flags,
            epoch,
        } => {
            Counters::inc(&sh.counters.reads);
            let loss = sh.placement().may_have_lost(epoch, flags);
            if let (Some(why), Some(_)) = (&loss, cache) {
                // Fetching a chunk of a file changed in the cache again
                // from the backend could bring back bytes it replaced.
                if flags & rw::BACKEND != 0 && flags & rw::MODIFIED != 0 {
                    let held = st.meta(&path, idx).map_err(|e| store_err(&path, e))?;
                    if held.is_none_or(|m| m.fileid != fileid) {
                        return Err(lost(sh, &path, idx, why));
                    }
                }
            }
            if let Some(c) = cache {
                if idx == 0 || flags & rw::BACKEND != 0 {
                    check_chunk_size(chunk_size)?;
                    let mode = libc::S_IFREG | 0o644;
                    blocking(|| c.ensure_chunk(&**st, &path, idx, fileid, chunk_size, mode))
                        .map_err(|e| store_err(&path, e))?;
                }
            }
            if flags & rw::FETCH_ONLY != 0 {
                return Ok(Response::Data(Bytes::new()));
            }
            if idx == 0 {
                if let Some(m) = st.meta(&path, 0).map_err(|e| store_err(&path, e))? {
                    if m.is_dir() {
                        return Err(ErrorReply::new(
                            libc::EISDIR,
                            format!("{path}: is a directory"),
                        ));
                    }
                }
            }
            let len = len.min(MAX_CHUNK_SIZE);
            let d = st
                .read_bytes(&path, idx, fileid, off, len)
                .map_err(|e| store_err(&path, e))?;
            match (d, loss) {
                (Some(d), _) => Ok(Response::Data(d)),
                // Not held here: a hole, unless this server may have lost it.
                (None, Some(why)) => Err(lost(sh, &path, idx, &why)),
                (None, None) => Ok(Response::Data(Bytes::new())),
            }
        }
        Request::SetSize {
            path,
            size,
            grow_only,
            if_size,
            stray,
        } => {
            let version = sh.placement().ring.list().version;
            let mut before = 0;
            let m = st
                .update_meta(&path, 0, &mut |m| {
                    before = m.size;
                    if m.is_dir() {
                        return Err(refuse(libc::EISDIR, "is a directory"));
                    }
                    if stray {
                        m.flags |= FLAG_STRAY;
                    }
                    if let Some(v) = if_size {
                        // Taking back a size published with a write that
                        // failed; if it changed since, the change stands.
                        if m.size == v {
                            m.size = size;
                        }
                        return Ok(());
                    }
                    if !grow_only || size > m.size {
                        m.size = size;
                    }
                    if !grow_only {
                        // Truncated: the cache holds the whole file now.
                        m.flags &= !(FLAG_CACHED | FLAG_PARTIAL | FLAG_MODIFIED);
                    }
                    if !grow_only && size == 0 {
                        // No byte of it is left anywhere: nothing can be
                        // lost with a server replaced before now.
                        m.set_epoch(version);
                        m.flags &= !FLAG_DAMAGED;
                    }
                    if !grow_only && !stray {
                        // A truncate: every server dropped the chunks past
                        // the new size before (`TruncateChunks`).
                        m.flags &= !FLAG_STRAY;
                    }
                    if m.flags & FLAG_CACHED != 0 {
                        m.flags |= FLAG_MODIFIED;
                    }
                    m.mtime = now_ns();
                    m.ctime = m.mtime;
                    Ok(())
                })
                .map_err(|e| store_err(&path, e))?;
            dirty_entry(sh, &path)?;
            Ok(Response::Sized { meta: m, before })
        }
        Request::SetAttr { path, attr } => {
            if path == "/" {
                let _ = st.create("/", default_root(), b"", false);
            }
            if let Some(c) = cache {
                lookup(sh, c, &path)?;
            }
            let m = st
                .update_meta(&path, 0, &mut |m| apply_attr(m, &attr))
                .map_err(|e| store_err(&path, e))?;
            dirty_entry(sh, &path)?;
            Ok(Response::Meta(m))
        }
        Request::RemoveEntry { path, kind } => {
            if path == "/" {
                return Err(ErrorReply::new(
                    libc::EBUSY,
                    "/: cannot remove the root directory",
                ));
            }
            if let Some(c) = cache {
                return remove_cached(sh, c, &path, kind);
            }
            let m = st
                .remove(&path, 0, &mut |m| match kind {
                    RemoveKind::NotDir if m.is_dir() => Err(refuse(libc::EISDIR, "is a directory")),
                    RemoveKind::Dir if !m.is_dir() => Err(refuse(libc::ENOTDIR, "not a directory")),
                    _ => Ok(()),
                })
                .map_err(|e| store_err(&path, e))?;
            Ok(Response::Meta(m))
        }
        Request::RemoveChunks { path, from_idx } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let n = st
                .remove_chunks(&path, from_idx.max(1))
                .map_err(|e| store_err(&path, e))?;
            if let Some(c) = cache {
                c.forget(&path, from_idx.max(1));
            }
            Ok(Response::Count(n))
        }
        Request::TruncateChunks {
            path,
            size,
            chunk_size,
        } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            check_chunk_size(chunk_size)?;
            let cs = chunk_size as u64;
            let from = size.div_ceil(cs).max(1);
            let n = st
                .remove_chunks(&path, from)
                .map_err(|e| store_err(&path, e))?;
            if let Some(c) = cache {
                c.forget(&path, from);
            }
            if size % cs != 0 || size == 0 {
                st.truncate_chunk(&path, size / cs, (size % cs) as u32)
                    .map_err(|e| store_err(&path, e))?;
            }
            Ok(Response::Count(n))
        }
        Request::Readdir { path, after, max } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let max = (max as usize).clamp(1, 65536);
            let (entries, done) = match cache {
                Some(c) if sh.placement().owns(&path) => {
                    blocking(|| list_with_backend(&**st, c, &path, &after, max))?
                }
                _ => st
                    .list_dir(&path, &after, max)
                    .map_err(|e| store_err(&path, e))?,
            };
            let entries: Vec<(String, Meta)> = entries
                .into_iter()
                .filter(|(_, m)| m.flags & FLAG_WHITEOUT == 0)
                .collect();
            Ok(Response::Entries {
                entries: entries
                    .into_iter()
                    .map(|(name, meta)| DirEntry { name, meta })
                    .collect(),
                done,
            })
        }
        Request::ReaddirDirs { path, after, max } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let max = (max as usize).clamp(1, 65536);
            // Scan pages of the listing and keep the directories until `max`
            // of them are found or the listing ends; the client resumes
            // after the last directory returned.
            let mut out = Vec::new();
            let mut after = after;
            let done = loop {
                let (entries, done) = match cache {
                    Some(c) if sh.placement().owns(&path) => {
                        blocking(|| list_with_backend(&**st, c, &path, &after, max))?
                    }
                    _ => st
                        .list_dir(&path, &after, max)
                        .map_err(|e| store_err(&path, e))?,
                };
                let last = entries.last().map(|(n, _)| n.clone());
                let mut full = false;
                for (name, meta) in entries {
                    if meta.flags & FLAG_WHITEOUT != 0 || !meta.is_dir() {
                        continue;
                    }
                    if out.len() == max {
                        full = true;
                        break;
                    }
                    out.push(DirEntry { name, meta });
                }
                if full {
                    break false;
                }
                match last {
                    Some(l) if !done => after = l,
                    _ => break true,
                }
            };
            Ok(Response::Entries { entries: out, done })
        }
        Request::HasChildren { path } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let mut any = st.has_children(&path).map_err(|e| store_err(&path, e))?;
            if let Some(c) = cache {
                if !any && sh.placement().owns(&path) {
                    let names = blocking(|| c.backend.names(&path, |_| true)).map_err(|e| {
                        ErrorReply::io(format_args!("backend listing of {path}"), &e)
                    })?;
                    any = !names.is_empty();
                }
            }
            Ok(Response::Bool(any))
        }
        Request::RenameMove { old, new, is_dir } => {
            Box::pin(rename_move(sh, &old, &new, is_dir)).await
        }
        Request::PutChunk {
            path,
            idx,
            meta,
            data,
        } => {
            let chunk = Chunk {
                meta,
                data: data.to_vec(),
            };
            sh.put_chunk(&path, idx, chunk)
                .map_err(|e| store_err(&path, e))?;
            Ok(Response::Ok)
        }
        Request::Rebalance { start } => Ok(crate::rebalance::request(sh, start)),
        Request::AdoptChunk {
            path,
            idx,
            meta,
            data,
        } => {
            // (the path was validated with the request's key in `handle`)
            let chunk = Chunk {
                meta,
                data: data.to_vec(),
            };
            crate::rebalance::adopt(sh, &path, idx, chunk).map(Response::Bool)
        }
        Request::FlushStatus { prefix } => {
            validate(&prefix).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            // Without a backend nothing is ever dirty.
            Ok(Response::FlushState(
                cache.map(|c| c.state(&prefix)).unwrap_or_default(),
            ))
        }
        Request::Flush { prefix } => {
            validate(&prefix).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            Ok(Response::FlushState(match cache {
                Some(c) => {
                    c.force(&prefix);
                    c.state(&prefix)
                }
                None => Default::default(),
            }))
        }
        Request::AppendReserve { path, len } => {
            let mut at = 0;
            st.update_meta(&path, 0, &mut |m| {
                if m.is_dir() {
                    return Err(refuse(libc::EISDIR, "is a directory"));
                }
                at = m.size;
                m.size += len;
                m.mtime = now_ns();
                m.ctime = m.mtime;
                Ok(())
            })
            .map_err(|e| store_err(&path, e))?;
            dirty_entry(sh, &path)?;
            modified_entry(sh, &path)?;
            Ok(Response::Count(at))
        }
    }
}

fn check_chunk_size(cs: u32) -> Result<(), ErrorReply> {
    if cs == 0 || cs > MAX_CHUNK_SIZE {
        return Err(ErrorReply::new(
            libc::EINVAL,
            format!("chunk size {cs} out of range (1..={MAX_CHUNK_SIZE})"),
        ));
    }
    Ok(())
}

fn apply_attr(m: &mut Meta, a: &SetAttr) -> Result<(), StoreError> {
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

/// Adds a server to the pool, or records that a member restarted with a
/// new, empty store (`fresh`): then its lost data must not read as holes,
/// so the list gets a new version, which becomes that member's
/// [`ServerList::since`]. A member restarting with its store intact gets
/// the list as is. Only the leader (the first server other than the one
/// joining) changes the list, so changes are serialised; others forward.
///
/// [`ServerList::since`]: chfs_proto::ring::ServerList::since
async fn join(sh: &Arc<Shared>, addr: String, fresh: bool) -> Reply {
    let _g = sh.join_lock.lock().await;
    let p = sh.placement();
    let list = p.ring.list();
    let member = list.servers.iter().position(|s| *s == addr);
    if member.is_some() && !fresh {
        info!(%addr, "server rejoined with its store");
        return Ok(Response::Servers(list.clone()));
    }
    let leader = list
        .servers
        .iter()
        .find(|s| **s != addr)
        .cloned()
        .unwrap_or_default();
    if leader != sh.me {
        return sh
            .peers
            .call(&leader, &Request::Join { addr, fresh }, 0)
            .await;
    }
    let mut new = list.clone();
    new.version += 1;
    match member {
        Some(i) => {
            new.set_since(i, new.version);
            warn!(%addr, version = new.version,
                  "server restarted with an empty store: what it held is lost (reads of it fail with EIO)");
        }
        None => {
            new.servers.push(addr.clone());
            if !new.since.is_empty() {
                new.since.push(0);
            }
            info!(%addr, version = new.version, servers = new.servers.len(), "server joined");
        }
    }
    sh.set_list(new.clone());
    mark_damaged(sh, list, &new).await;
    // The list goes to every other member at once; the answer waits for
    // those that take at most half the RPC timeout (so the joining server,
    // waiting one RPC timeout, is answered even when members hang), the
    // others are pushed to in the background.
    let mut pushes = tokio::task::JoinSet::new();
    for s in new.servers.iter().filter(|s| **s != sh.me && **s != addr) {
        let (sh, s, l) = (sh.clone(), s.clone(), new.clone());
        pushes.spawn(async move {
            if let Err(e) = sh
                .peers
                .call(&s, &Request::UpdateServers { list: l }, 0)
                .await
            {
                warn!(server = %s, "cannot push the server list: {e}");
            }
        });
    }
    let all = async { while pushes.join_next().await.is_some() {} };
    if tokio::time::timeout(sh.peers.timeout() / 2, all)
        .await
        .is_err()
    {
        info!(
            left = pushes.len(),
            "answering the join before every member took the new server list"
        );
        pushes.detach_all();
    }
    Ok(Response::Servers(new))
}

/// Moves this server's chunks of `old` (and its subtree) to `new`.
async fn rename_move(sh: &Arc<Shared>, old: &str, new: &str, is_dir: bool) -> Reply {
    for p in [old, new] {
        validate(p).map_err(|e| ErrorReply::new(e.errno, e.message))?;
    }
    let st = &sh.store;
    let cache = sh.cache.as_deref();
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
            let r = if place.me == Some(owner) {
                sh.put_chunk(&target, idx, chunk.clone())
                    .map_err(|e| store_err(&target, e))
            } else {
                let addr = &place.ring.list().servers[owner];
                let req = Request::PutChunk {
                    path: target.clone(),
                    idx,
                    meta: chunk.meta,
                    data: Bytes::from(chunk.data.clone()),
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
fn lookup(sh: &Arc<Shared>, c: &Cache, path: &str) -> Result<Option<Meta>, ErrorReply> {
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

/// The EIO of a read or write of a chunk this server may have lost.
fn lost(sh: &Shared, path: &str, idx: u64, why: &str) -> ErrorReply {
    Counters::inc(&sh.counters.lost);
    warn!(path, idx, "{why}");
    ErrorReply::new(
        libc::EIO,
        format!("chunk {idx} of {path} on server {}: {why}", sh.me),
    )
}

/// After `new` recorded servers that restarted with an empty store (their
/// [`ServerList::since`] grew), marks the entries held here of the regular
/// files that may have had chunks on them ([`FLAG_DAMAGED`]: created
/// before, with data, some chunk index placed there), so that their lost
/// chunks read as EIO wherever a rename or a rebalance moves the rest.
/// Done before the list change is answered.
///
/// [`ServerList::since`]: chfs_proto::ring::ServerList::since
async fn mark_damaged(sh: &Arc<Shared>, old: &ServerList, new: &ServerList) {
    let replaced: Vec<(usize, u64)> = new
        .servers
        .iter()
        .enumerate()
        .filter(|(i, addr)| {
            let before = old
                .servers
                .iter()
                .position(|a| a == *addr)
                .map_or(0, |j| old.since(j));
            new.since(*i) > before && **addr != sh.me
        })
        .map(|(i, _)| (i, new.since(i)))
        .collect();
    if replaced.is_empty() {
        return;
    }
    let (sh2, ring) = (sh.clone(), Ring::new(new.clone()));
    let r = tokio::task::spawn_blocking(move || -> Result<u64, StoreError> {
        let st = &*sh2.store;
        let mut marked = 0;
        for path in st.paths_below("/")? {
            let Some(m) = st.meta(&path, 0)? else {
                continue;
            };
            let cs = m.chunk_size.max(1) as u64;
            let chunks = m.size.div_ceil(cs);
            let hit = |&(s, since): &(usize, u64)| {
                since > m.epoch() as u64
                    && (chunks > ring.len() as u64
                        || (1..chunks).any(|idx| ring.owner(&path, idx) == s))
            };
            if !m.is_reg()
                || m.size == 0
                || m.flags & FLAG_DAMAGED != 0
                || !replaced.iter().any(hit)
            {
                continue;
            }
            let r = st.update_meta(&path, 0, &mut |m| {
                m.flags |= FLAG_DAMAGED;
                Ok(())
            });
            match r {
                Ok(_) => marked += 1,
                Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(marked)
    })
    .await;
    match r {
        Ok(Ok(n)) => {
            if n > 0 {
                warn!(
                    files = n,
                    "files that may have lost chunks with a restarted server are marked damaged"
                );
            }
        }
        Ok(Err(e)) => warn!("cannot mark the files that lost chunks: {e}"),
        Err(e) => warn!("cannot mark the files that lost chunks: {e}"),
    }
}

/// Marks a cached backend file as written in the cache ([`FLAG_MODIFIED`]).
fn modified_entry(sh: &Arc<Shared>, path: &str) -> Result<(), ErrorReply> {
    if sh.cache.is_some() {
        let r = sh.store.update_meta(path, 0, &mut |m| {
            if m.flags & FLAG_CACHED != 0 {
                m.flags |= FLAG_MODIFIED;
            }
            Ok(())
        });
        match r {
            Ok(_) | Err(StoreError::NotFound) => {}
            Err(e) => return Err(store_err(path, e)),
        }
    }
    Ok(())
}

/// Marks an entry dirty after a metadata change (cache mode).
fn dirty_entry(sh: &Arc<Shared>, path: &str) -> Result<(), ErrorReply> {
    if let Some(c) = sh.cache.as_deref() {
        c.mark_dirty(&*sh.store, path, 0)
            .map_err(|e| store_err(path, e))?;
    }
    Ok(())
}

/// unlink/rmdir in cache mode.
fn remove_cached(sh: &Arc<Shared>, c: &Cache, path: &str, kind: RemoveKind) -> Reply {
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
                            data: Vec::new(),
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
fn list_with_backend(
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
    let mut names = c.backend.names(dir, keep).map_err(backend_err)?;
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
    let backend = c.backend.lookup(dir, names).map_err(backend_err)?;
    let done = store_done && mine.len() + more <= max;
    let mut all: std::collections::BTreeMap<String, Meta> = mine.into_iter().collect();
    for (name, bst) in backend {
        let mut m = crate::backend::meta_from_stat(&bst, c.cfg.chunk_size, 0);
        m.flags |= FLAG_BACKEND_ONLY;
        all.insert(name, m);
    }
    Ok((all.into_iter().take(max).collect(), done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheConfig;
    use chfs_store::Store;

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
        let c = Cache::open(CacheConfig {
            backend: dir.path().to_path_buf(),
            policy: Policy::Keep,
            flush_idle_ms: 0,
            flush_threads: 1,
            revalidate: false,
            chunk_size: 4096,
        })
        .unwrap();
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
        // HasChildren's question costs no lookup.
        assert_eq!(c.backend.names("/d", |_| true).unwrap().len(), n);
        assert_eq!(c.backend.lookups(), backend_only);
    }
}
