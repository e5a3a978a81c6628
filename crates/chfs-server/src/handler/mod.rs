//! Request handling: [`handle`] serves one request, forwarding it to the
//! owner of its key (but for the node-local area); `serve` tells the
//! contact servers watching an entry of its change (relayed lookups,
//! `crate::relay`) around `serve_here`, which has one match arm per
//! request kind; `relay_lookup` answers a relayed lookup. The
//! helpers are grouped by concern, each module using only those above it
//! in this list:
//!
//! - `common`: replies and errors, blocking backend I/O, checks;
//! - `namespace`: entries in cache mode (lookup, removal, directory pages
//!   merged with the backend's), attributes, renames;
//! - `pool`: membership (join, server list changes), the medium's free
//!   space;
//! - `rebalance`: moving chunks to their owners after the list grew.

mod common;
mod namespace;
mod pool;
mod rebalance;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::FLAG_FORWARDED;
use chfs_proto::meta::{
    now_ns, FLAG_CACHED, FLAG_DAMAGED, FLAG_MODIFIED, FLAG_PARTIAL, FLAG_STRAY, FLAG_WHITEOUT,
    MAX_FILE_SIZE,
};
use chfs_proto::msg::{rw, tree, DirEntry, RemoveKind, ServerStatus, TreePage};
use chfs_proto::path::{is_within, validate};
use chfs_proto::{ErrorReply, Meta, Request, Response, MAX_CHUNK_SIZE};
use chfs_store::{Chunk, Fill, Src};
use tracing::{debug_span, info, Instrument};

use crate::metrics::Counters;
use crate::shm::Room;
use crate::state::Shared;

use common::{blocking, check_chunk_size, lost, refuse, store_err, Reply};
use namespace::{apply_attr, default_root, rename_move, Ns};
use pool::{join, mark_damaged, medium_available};

/// Serves one request.
pub(crate) async fn handle(sh: &Arc<Shared>, req: Request, forwarded: bool) -> Reply {
    handle_pieces(sh, req, forwarded)
        .await
        .map(Served::into_response)
}

/// What [`handle_pieces`] answers: a response, or the records of a
/// `ReadSpans` as the pieces they are in the store (the data of a
/// `Response::Data`, not gathered into one buffer: a connection writes
/// them with vectored writes).
pub(crate) enum Served {
    Reply(Response),
    Pieces(Vec<Bytes>),
}

impl Served {
    /// As one response (the pieces gathered).
    pub(crate) fn into_response(self) -> Response {
        match self {
            Served::Reply(r) => r,
            Served::Pieces(p) => Response::Data(gather(p)),
        }
    }
}

/// Where a request's bulk bytes are when not in its frame or reply.
pub(crate) enum Io<'a> {
    /// In the frame (a `Write`'s data) or the reply (a read's).
    Frame,
    /// A `Write`'s, fetched by this from the client's memory.
    From(Fill<'a>),
    /// A `Read`'s or `ReadSpans`' data, placed in this room of the
    /// client's landing window.
    Into(Room<'a>),
}

/// [`handle`] for a `Write` whose bytes (its `data` empty) `from`
/// fetches: straight into the chunk where the store can, or into the
/// request when it goes to another server.
pub(crate) async fn handle_write_from(
    sh: &Arc<Shared>,
    req: Request,
    forwarded: bool,
    from: Fill<'_>,
) -> Reply {
    handle_io(sh, req, forwarded, Io::From(from))
        .await
        .map(Served::into_response)
}

/// [`handle`] for a `Read` or `ReadSpans` whose data is to be placed in
/// `room` (`FLAG_LAND`): by the store, straight from where the bytes lie,
/// when the request is served here; answered `Written` with their count.
pub(crate) async fn handle_landing(
    sh: &Arc<Shared>,
    req: Request,
    forwarded: bool,
    room: Room<'_>,
) -> Reply {
    handle_io(sh, req, forwarded, Io::Into(room))
        .await
        .map(Served::into_response)
}

/// [`handle`], with a `ReadSpans` served here answered in pieces.
pub(crate) async fn handle_pieces(
    sh: &Arc<Shared>,
    req: Request,
    forwarded: bool,
) -> Result<Served, ErrorReply> {
    handle_io(sh, req, forwarded, Io::Frame).await
}

/// [`handle_pieces`], with the request's bulk bytes where `io` says.
async fn handle_io(
    sh: &Arc<Shared>,
    mut req: Request,
    forwarded: bool,
    io: Io<'_>,
) -> Result<Served, ErrorReply> {
    Counters::inc(&sh.counters.requests);
    let span = debug_span!(
        "req",
        op = chfs_proto::msg::op::name(req.op()).unwrap_or("?")
    );
    async move {
        if let Some((path, idx)) = req.key() {
            validate(path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            spans_of_one_owner(sh, &req)?;
            let p = sh.placement();
            let owner = p.ring.owner(path, idx);
            // (the node-local area is this server's: never forwarded)
            if !forwarded && p.me != Some(owner) && !p.ring.is_empty() && !sh.is_node_local(path) {
                Counters::inc(&sh.counters.forwarded);
                if req.op() != chfs_proto::msg::op::STAT {
                    // What this server may have kept as a contact is
                    // about to change.
                    sh.contact.forget(path);
                }
                let mut room = None;
                match (io, &mut req) {
                    (Io::From(f), Request::Write { data, .. }) => {
                        *data = f
                            .fetch()
                            .map_err(|e| ErrorReply::new(e.errno(), e.to_string()))?;
                    }
                    (Io::Into(r), _) => room = Some(r),
                    _ => {}
                }
                let addr = p.ring.list().servers[owner].clone();
                let r = Box::pin(sh.peers.call(&addr, &req, FLAG_FORWARDED)).await?;
                return match (room, r) {
                    (None, r) => Ok(Served::Reply(r)),
                    (Some(mut room), Response::Data(d)) => room
                        .place(&[d])
                        .map(|n| Served::Reply(Response::Written(n as u32))),
                    (Some(_), other) => Err(ErrorReply::new(
                        libc::EIO,
                        format!("a read answered {other:?}"),
                    )),
                };
            }
        }
        if let Request::ReadSpans {
            path,
            fileid,
            chunk_size,
            flags,
            epoch,
            spans,
        }
        | Request::ReadSpansPlaced {
            path,
            fileid,
            chunk_size,
            flags,
            epoch,
            spans,
        } = req
        {
            // (No change: nothing for contact servers; see `serve`.)
            let ns = Ns::for_path(sh, Some(&path));
            ns.touch_io();
            let room = match io {
                Io::Into(r) => Some(r),
                _ => None,
            };
            return read_spans(sh, ns, &path, fileid, chunk_size, flags, epoch, spans, room);
        }
        serve(sh, req, io).await.map(Served::Reply)
    }
    .instrument(span)
    .await
}

/// Serves one request here; a change of an entry that contact servers
/// keep answers about is told to them before it is answered.
async fn serve(sh: &Arc<Shared>, req: Request, io: Io<'_>) -> Reply {
    if !sh.watchers.used() {
        return serve_here(sh, req, io).await;
    }
    // (path, and everything below it)
    let changes: Vec<(String, bool)> = match &req {
        Request::Create { path, .. }
        | Request::SetSize { path, .. }
        | Request::SetAttr { path, .. }
        | Request::RemoveEntry { path, .. }
        | Request::AppendReserve { path, .. } => vec![(path.clone(), false)],
        Request::Write { path, idx: 0, .. }
        | Request::PutChunk { path, idx: 0, .. }
        | Request::AdoptChunk { path, idx: 0, .. } => vec![(path.clone(), false)],
        Request::WriteSpans { path, spans, .. } if spans.iter().any(|s| s.0 == 0) => {
            vec![(path.clone(), false)]
        }
        // (entries moved within this server appear under the new name
        // without a request of their own)
        Request::RenameMove { old, new, .. } => vec![(old.clone(), true), (new.clone(), true)],
        _ => Vec::new(),
    };
    let r = serve_here(sh, req, io).await;
    if r.is_ok() {
        for (path, below) in changes {
            tell_contacts(sh, &path, below).await;
        }
    }
    r
}

/// Tells the contact servers keeping answers about `path` (or, with
/// `below`, paths inside it) that it changed, and waits for them.
async fn tell_contacts(sh: &Arc<Shared>, path: &str, below: bool) {
    common::invalidate(sh, sh.watchers.take(path, below)).await;
}

/// `io`: where a `Write`'s or a read's bytes are, if not in the request
/// or the reply.
async fn serve_here(sh: &Arc<Shared>, req: Request, io: Io<'_>) -> Reply {
    let st = &sh.store;
    let ns = Ns::for_path(sh, path_of(&req));
    ns.touch(&req);
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
                Box::pin(common::placement_changed(sh)).await;
                Box::pin(mark_damaged(sh, &old, &list)).await;
            }
            Ok(Response::Ok)
        }
        Request::Status => {
            let s = st.stats();
            let (node_local_entries, node_local_bytes) = node_local_usage(sh);
            // An unbounded store reports what its medium can still take,
            // so `df` shows real free space rather than 100% used.
            let capacity = if s.capacity == 0 {
                s.bytes + medium_available(sh.store_kind, sh.store_path.as_deref())
            } else {
                s.capacity
            };
            let c = &sh.counters;
            Ok(Response::Status(Box::new(ServerStatus {
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
                poll_hits: Counters::get(&crate::park::HITS),
                poll_misses: Counters::get(&crate::park::MISSES),
                cpu_ns: chfs_sys::poll::process_cpu_ns(),
                rss: chfs_sys::heap::resident_bytes(),
                heap_free: chfs_sys::heap::free_bytes() as u64,
                heap_trims: Counters::get(&c.heap_trims),
                connections: sh.peers_open.open().0,
                peers: sh.peers_open.open().1,
                node_local_entries,
                node_local_bytes,
                lookups: Counters::get(&c.lookups),
                lookup_hits: Counters::get(&c.lookup_hits),
                lookup_forwards: Counters::get(&c.lookup_forwards),
                fabric_sessions: Counters::get(&c.fabric_sessions),
                fabric_expired: Counters::get(&c.fabric_expired),
                rma_pulls: Counters::get(&c.rma_pulls),
                rma_pushes: Counters::get(&c.rma_pushes),
                reg_fallbacks: Counters::get(&c.reg_fallbacks),
                fabric_peers: Counters::get(&c.fabric_peers),
                fabric_no_session: Counters::get(&c.fabric_no_session),
                fabric_no_session_dropped: Counters::get(&c.fabric_no_session_dropped),
                fabric_replies_dropped: Counters::get(&c.fabric_replies_dropped),
                fabric_lent_pulls: Counters::get(&c.fabric_lent_pulls),
                fabric_rma_most: Counters::get(&c.fabric_rma_most),
                fabric_hellos_dropped: Counters::get(&c.fabric_hellos_dropped),
                shm_reads: Counters::get(&c.shm_reads),
                backend: ns.backend_path(),
                flush: ns.flush_state("/", false),
            })))
        }
        Request::Shutdown => {
            info!("shutdown requested");
            discard_node_local(sh);
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
            if let Some(m) = ns.before_create(sh, &path)? {
                if excl {
                    return Err(ErrorReply::new(libc::EEXIST, format!("{path}: exists")));
                }
                return Ok(Response::Created {
                    meta: m,
                    created: false,
                });
            }
            let (meta, created) = st
                .create(&path, meta, &data, excl)
                .map_err(|e| store_err(&path, e))?;
            if created {
                ns.changed(sh, &path, 0, false)?;
            }
            Ok(Response::Created { meta, created })
        }
        Request::Lookup { path, max_age_ms } => Box::pin(relay_lookup(sh, path, max_age_ms)).await,
        Request::WatchStat {
            path,
            contact,
            keep_ms,
        } => {
            sh.watchers
                .watch(&path, &contact, Duration::from_millis(keep_ms.into()));
            Box::pin(serve_here(sh, Request::Stat { path }, Io::Frame)).await
        }
        Request::Invalidate { path } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            sh.contact.invalidate(&path);
            Ok(Response::Ok)
        }
        Request::NodeLocal { prefix } => {
            let mine = sh.node_local.as_deref().unwrap_or("");
            if prefix == mine {
                return Ok(Response::Ok);
            }
            let name = |p: &str| match p {
                "" => "none (turned off)".to_string(),
                p => p.to_string(),
            };
            Err(ErrorReply::new(
                libc::EINVAL,
                format!(
                    "the node-local area differs: the client's (CHFS_NODE_LOCAL_PREFIX) is {}, \
                     the chfsd at {} on its host has {} (chfsd --node-local-prefix or \
                     CHFS_NODE_LOCAL_PREFIX when it started); both must be the same (empty on \
                     both turns the area off)",
                    name(&prefix),
                    sh.me,
                    name(mine)
                ),
            ))
        }
        Request::Stat { path } => match ns.entry(sh, &path)? {
            Some(m) => Ok(Response::Meta(m)),
            None if path == "/" => Ok(Response::Meta(default_root())),
            // Every server has its node-local area's directory, without
            // an entry (sticky and open to all, as /tmp).
            None if sh.node_local.as_deref() == Some(path.as_str()) => {
                let mut m = default_root();
                m.mode = libc::S_IFDIR | 0o1777;
                Ok(Response::Meta(m))
            }
            None => Err(ErrorReply::new(
                libc::ENOENT,
                format!("{path}: no such file or directory"),
            )),
        },
        Request::StatData { path, max } => {
            let m = match Box::pin(serve_here(
                sh,
                Request::Stat { path: path.clone() },
                Io::Frame,
            ))
            .await?
            {
                Response::Meta(m) => m,
                other => return Ok(other),
            };
            Ok(match small_file_data(sh, ns, &path, &m, max)? {
                Some(data) => Response::MetaData { meta: m, data },
                None => Response::Meta(m),
            })
        }
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
            let w = ChunkWrite {
                path: &path,
                fileid,
                chunk_size,
                mode,
                flags,
                epoch,
            };
            let data = match io {
                Io::From(f) => Src::Fill(f),
                _ => Src::Own(data),
            };
            write_chunk(sh, ns, &w, idx, off, data).map(Response::Written)
        }
        Request::WriteSpans {
            path,
            fileid,
            chunk_size,
            mode,
            flags,
            epoch,
            spans,
            data,
        } => {
            let w = ChunkWrite {
                path: &path,
                fileid,
                chunk_size,
                mode,
                flags,
                epoch,
            };
            write_spans(sh, ns, &w, &spans, data).map(Response::Written)
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
            let loss = read_checks(sh, ns, &path, fileid, idx, chunk_size, flags, epoch)?;
            if flags & rw::FETCH_ONLY != 0 {
                return Ok(match io {
                    Io::Into(_) => Response::Written(0),
                    _ => Response::Data(Bytes::new()),
                });
            }
            let len = len.min(MAX_CHUNK_SIZE);
            match io {
                // Room for all that may come: placed by the store.
                Io::Into(mut room) if len as usize <= room.dst.len() => {
                    room.waited_for()?;
                    let got = st
                        .read_into(&path, idx, fileid, off, &mut room.dst.part(0, len as usize))
                        .map_err(|e| store_err(&path, e))?;
                    let n = held(sh, &path, idx, got, &loss)?.unwrap_or(0);
                    Ok(Response::Written(n as u32))
                }
                io => {
                    let d = st
                        .read_bytes(&path, idx, fileid, off, len)
                        .map_err(|e| store_err(&path, e))?;
                    let d = held(sh, &path, idx, d, &loss)?.unwrap_or_default();
                    match io {
                        Io::Into(mut room) => room.place(&[d]).map(|n| Response::Written(n as u32)),
                        _ => Ok(Response::Data(d)),
                    }
                }
            }
        }
        // (Served by `handle_pieces`, which never passes them on here.)
        Request::ReadSpans { .. } | Request::ReadSpansPlaced { .. } => Err(ErrorReply::new(
            libc::EPROTO,
            "spans of chunks are served in pieces (handle_pieces)",
        )),
        Request::SetSize {
            path,
            size,
            grow_only,
            if_size,
            stray,
        } => {
            if size > MAX_FILE_SIZE {
                return Err(ErrorReply::new(
                    libc::EFBIG,
                    format!("{path}: size {size} is larger than a file may be"),
                ));
            }
            let version = sh.placement().ring.list().version;
            let mut before = 0;
            let m = st
                .update_meta(&path, 0, &mut |m| {
                    before = m.size;
                    if m.is_dir() {
                        return Err(refuse(libc::EISDIR, "is a directory"));
                    }
                    if stray {
                        // Only the mark: the size, times and cache state
                        // stay as the write left them.
                        m.flags |= FLAG_STRAY;
                        return Ok(());
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
                    if !grow_only {
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
            if !stray {
                ns.changed(sh, &path, 0, false)?;
            }
            Ok(Response::Sized { meta: m, before })
        }
        Request::SetAttr { path, attr } => {
            if path == "/" {
                let _ = st.create("/", default_root(), b"", false);
            }
            ns.import(sh, &path)?;
            let m = st
                .update_meta(&path, 0, &mut |m| apply_attr(m, &attr))
                .map_err(|e| store_err(&path, e))?;
            ns.changed(sh, &path, 0, false)?;
            Ok(Response::Meta(m))
        }
        Request::RemoveEntry { path, kind } => {
            if path == "/" {
                return Err(ErrorReply::new(
                    libc::EBUSY,
                    "/: cannot remove the root directory",
                ));
            }
            if sh.node_local.as_deref() == Some(path.as_str()) {
                return Err(ErrorReply::new(
                    libc::EBUSY,
                    format!("{path}: the node-local area cannot be removed"),
                ));
            }
            if let Some(r) = ns.remove(sh, &path, kind) {
                return r;
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
            ns.forget(&path, from_idx.max(1));
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
            ns.forget(&path, from);
            if size % cs != 0 || size == 0 {
                st.truncate_chunk(&path, size / cs, (size % cs) as u32)
                    .map_err(|e| store_err(&path, e))?;
            }
            Ok(Response::Count(n))
        }
        Request::Readdir { path, after, max } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            let max = (max as usize).clamp(1, 65536);
            let (entries, done) = ns.list_dir(sh, &path, &after, max)?;
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
                let (entries, done) = ns.list_dir(sh, &path, &after, max)?;
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
        Request::ListTree {
            prefix,
            after,
            max,
            flags,
        } => {
            validate(&prefix).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            if let Ns::Cached(_) = ns {
                // A listing in cache mode merges the backend's, directory
                // by directory, at the server owning each directory.
                return Err(ErrorReply::new(
                    libc::EOPNOTSUPP,
                    "a tree listing is not served in cache mode (list directory by directory)",
                ));
            }
            let max = (max as usize).clamp(1, 65536);
            let with_meta = flags & tree::META != 0;
            let dirs_only = flags & tree::DIRS != 0;
            // This node's area is listed only when asked for (it is not
            // in the listing of its parent either).
            let skip = sh.node_local.as_deref().filter(|&a| !is_within(&prefix, a));
            // A page reads as much as it lists (directory keys from the
            // store's ordered set, then names, with `DIRS` also those it
            // passes over; headers with `META`): off
            // the async workers' backs (block_in_place), as a page may
            // list 65,536 entries.
            let mut page = TreePage::default();
            page.done = blocking(|| {
                st.list_tree(
                    &prefix,
                    skip,
                    &after,
                    max,
                    with_meta,
                    dirs_only,
                    &mut |p, kind, m| {
                        if m.is_none_or(|m| m.flags & FLAG_WHITEOUT == 0) {
                            page.push_entry(p, kind, m);
                        }
                    },
                )
            })
            .map_err(|e| store_err(&prefix, e))?;
            Ok(Response::Tree(page))
        }
        Request::DirVersion { path } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            if let Ns::Cached(_) = ns {
                // Entries of the backend come and go without changing
                // the cache's names: a version would not tell.
                return Err(ErrorReply::new(
                    libc::EOPNOTSUPP,
                    "directory versions are not served in cache mode",
                ));
            }
            // The list first: one changed after the names were read would
            // be seen by the client's next check anyway.
            let list = sh.placement().ring.list().version;
            let v = st.dir_version(&path);
            Ok(Response::DirVersion(chfs_proto::msg::DirVersion {
                born: v.map_or(0, |v| v.born),
                changes: v.map_or(0, |v| v.changes),
                list,
            }))
        }
        Request::HasChildren { path } => {
            validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            Ok(Response::Bool(ns.has_children(sh, &path)?))
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
            let chunk = Chunk { meta, data };
            sh.put_chunk(&path, idx, chunk)
                .map_err(|e| store_err(&path, e))?;
            Ok(Response::Ok)
        }
        Request::Rebalance { start } => Ok(rebalance::request(sh, start)),
        Request::AdoptChunk {
            path,
            idx,
            meta,
            data,
        } => {
            // (the path was validated with the request's key in `handle`)
            let chunk = Chunk { meta, data };
            rebalance::adopt(sh, &path, idx, chunk).map(Response::Bool)
        }
        Request::FlushStatus { prefix } => {
            validate(&prefix).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            Ok(Response::FlushState(ns.flush_state(&prefix, false)))
        }
        Request::Flush { prefix } => {
            validate(&prefix).map_err(|e| ErrorReply::new(e.errno, e.message))?;
            Ok(Response::FlushState(ns.flush_state(&prefix, true)))
        }
        Request::AppendReserve { path, len } => {
            let mut at = 0;
            st.update_meta(&path, 0, &mut |m| {
                if m.is_dir() {
                    return Err(refuse(libc::EISDIR, "is a directory"));
                }
                at = m.size;
                m.size = m
                    .size
                    .checked_add(len)
                    .filter(|&s| s <= MAX_FILE_SIZE)
                    .ok_or_else(|| refuse(libc::EFBIG, "appending past the largest file size"))?;
                m.mtime = now_ns();
                m.ctime = m.mtime;
                Ok(())
            })
            .map_err(|e| store_err(&path, e))?;
            ns.changed(sh, &path, 0, true)?;
            Ok(Response::Count(at))
        }
    }
}

/// A relayed lookup ([`Request::Lookup`]) at this contact server: served
/// here when this server owns the entry (or knows no list yet), else from
/// the contact cache, else by the one request in flight to the owner
/// (`crate::relay`); the first lookup of a path is passed to the owner
/// and its answer not kept. The request to the owner is a forwarded `Stat` over
/// the server-to-server connection (authenticated as a server); it runs
/// in a task of its own, so that the lookups waiting for it get their
/// answer even if the one that sent it goes away, and it ends within the
/// server's request timeout.
async fn relay_lookup(sh: &Arc<Shared>, path: String, max_age_ms: u32) -> Reply {
    use crate::relay::Step;
    validate(&path).map_err(|e| ErrorReply::new(e.errno, e.message))?;
    Counters::inc(&sh.counters.lookups);
    let p = sh.placement();
    let owner = p.ring.owner(&path, 0);
    if p.ring.is_empty() || p.me == Some(owner) || sh.is_node_local(&path) {
        return Box::pin(serve_here(sh, Request::Stat { path }, Io::Frame)).await;
    }
    let rx = match sh
        .contact
        .begin(&path, Duration::from_millis(max_age_ms.into()))
    {
        Step::Hit(a) => {
            Counters::inc(&sh.counters.lookup_hits);
            return a.map(Response::Meta);
        }
        Step::Wait(rx) => rx,
        Step::Pass => {
            // The first lookup of the path: the owner does not remember
            // this contact (keep 0) and nothing is kept here.
            Counters::inc(&sh.counters.lookup_forwards);
            let addr = p.ring.list().servers[owner].clone();
            let req = Request::WatchStat {
                path: path.clone(),
                contact: sh.me.clone(),
                keep_ms: 0,
            };
            return match sh.peers.call(&addr, &req, FLAG_FORWARDED).await {
                Ok(Response::Meta(m)) => Ok(Response::Meta(m)),
                Ok(other) => Err(ErrorReply::new(
                    libc::EPROTO,
                    format!("server {addr} answered a lookup of {path} with {other:?}"),
                )),
                Err(e) => Err(e),
            };
        }
        Step::Lead { id, sent, rx } => {
            Counters::inc(&sh.counters.lookup_forwards);
            let addr = p.ring.list().servers[owner].clone();
            let sh2 = sh.clone();
            let keep_ms = sh.contact.cap().as_millis().min(u32::MAX as u128) as u32;
            let me = sh.me.clone();
            tokio::spawn(async move {
                let req = Request::WatchStat {
                    path: path.clone(),
                    contact: me,
                    keep_ms,
                };
                let answer = match sh2.peers.call(&addr, &req, FLAG_FORWARDED).await {
                    Ok(Response::Meta(m)) => Ok(m),
                    Ok(other) => Err(ErrorReply::new(
                        libc::EPROTO,
                        format!("server {addr} answered a lookup of {path} with {other:?}"),
                    )),
                    Err(e) => Err(e),
                };
                sh2.contact.finish(&path, id, sent, answer);
            });
            rx
        }
    };
    match rx.await {
        Ok(a) => a.map(Response::Meta),
        Err(_) => Err(ErrorReply::new(
            libc::EIO,
            "the lookup this one waited for was abandoned",
        )),
    }
}

/// Zeros for the padding of spans ([`read_spans`]).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The server owning every chunk that `spans` of `path` name (None where
/// placement does not apply: no ring, the node-local area, no spans);
/// ESTALE when they are not one server's (the client's server list is
/// out of date).
fn spans_owner(
    sh: &Shared,
    path: &str,
    spans: &[(u64, u32, u32)],
) -> Result<Option<usize>, ErrorReply> {
    let p = sh.placement();
    let Some(first) = spans.first() else {
        return Ok(None);
    };
    if p.ring.is_empty() || sh.is_node_local(path) {
        return Ok(None);
    }
    let owner = p.ring.owner(path, first.0);
    match spans[1..].iter().find(|s| p.ring.owner(path, s.0) != owner) {
        Some(&(idx, _, _)) => Err(ErrorReply::new(
            libc::ESTALE,
            format!("{path}: chunks {} and {idx} are not one server's", first.0),
        )),
        None => Ok(Some(owner)),
    }
}

/// A `ReadSpans` or `WriteSpans` names chunks of one server (the owner
/// of its first span's, which it goes to): else it is refused here
/// (ESTALE) rather than moved to a server that would refuse it (a
/// write's data pulled and sent on for nothing).
pub(crate) fn spans_of_one_owner(sh: &Shared, req: &Request) -> Result<(), ErrorReply> {
    match req {
        Request::ReadSpans { path, spans, .. }
        | Request::ReadSpansPlaced { path, spans, .. }
        | Request::WriteSpans { path, spans, .. } => spans_owner(sh, path, spans).map(drop),
        _ => Ok(()),
    }
}

/// Every chunk of `spans` is this server's (a `ReadSpans` or
/// `WriteSpans` goes to the owner of its first span's chunk): else the
/// client's server list is out of date (ESTALE).
fn spans_are_mine(sh: &Shared, path: &str, spans: &[(u64, u32, u32)]) -> Result<(), ErrorReply> {
    match spans_owner(sh, path, spans)? {
        Some(owner) if sh.placement().me != Some(owner) => Err(ErrorReply::new(
            libc::ESTALE,
            format!("{path}: chunk {} is not this server's", spans[0].0),
        )),
        _ => Ok(()),
    }
}

/// The fields of a write that are the same for each chunk it writes
/// ([`Request::Write`], [`Request::WriteSpans`]).
struct ChunkWrite<'a> {
    path: &'a str,
    fileid: u32,
    chunk_size: u32,
    mode: u32,
    flags: u16,
    epoch: u32,
}

/// Writes `data` at `off` of chunk `idx` (a [`Request::Write`], or a span
/// of a [`Request::WriteSpans`]); the bytes written.
fn write_chunk(
    sh: &Arc<Shared>,
    ns: Ns<'_>,
    w: &ChunkWrite<'_>,
    idx: u64,
    off: u32,
    data: Src<'_>,
) -> Result<u32, ErrorReply> {
    let st = &sh.store;
    let &ChunkWrite {
        path,
        fileid,
        chunk_size,
        mode,
        flags,
        epoch,
    } = w;
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
            let held = st.meta(path, idx).map_err(|e| store_err(path, e))?;
            if held.is_none_or(|m| m.fileid != fileid)
                && (flags & rw::BACKEND == 0 || flags & rw::MODIFIED != 0)
            {
                return Err(lost(sh, path, idx, &why));
            }
        }
    }
    ns.fetch(sh, path, idx, fileid, chunk_size, mode, flags)?;
    if idx == 0 {
        match st.meta(path, 0).map_err(|e| store_err(path, e))? {
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
    st.write_from(path, idx, off, data, &t)
        .map_err(|e| store_err(path, e))?;
    ns.changed(sh, path, idx, true)?;
    Ok(n)
}

/// Writes each span of a [`Request::WriteSpans`] in order (its bytes the
/// next ones of `data`); the first that fails ends it with its error.
fn write_spans(
    sh: &Arc<Shared>,
    ns: Ns<'_>,
    w: &ChunkWrite<'_>,
    spans: &[(u64, u32, u32)],
    data: Bytes,
) -> Result<u32, ErrorReply> {
    let path = w.path;
    let total: u64 = spans.iter().map(|s| s.2 as u64).sum();
    if total != data.len() as u64 || total > u32::MAX as u64 {
        return Err(ErrorReply::new(
            libc::EPROTO,
            format!(
                "{path}: spans of {total} bytes with {} bytes of data",
                data.len()
            ),
        ));
    }
    spans_are_mine(sh, path, spans)?;
    let mut at = 0usize;
    for &(idx, off, len) in spans {
        let piece = data.slice(at..at + len as usize);
        at += len as usize;
        write_chunk(sh, ns, w, idx, off, Src::Own(piece))?;
    }
    Ok(total as u32)
}

/// The records of a `ReadSpans`: each span's bytes, padded with zeros to
/// its length (a hole, or past the chunk's end), in order: as the pieces
/// they are (slices of the store's chunks and of [`ZEROS`]), or placed in
/// `room` by the store (answered `Written`).
#[allow(clippy::too_many_arguments)]
fn read_spans(
    sh: &Arc<Shared>,
    ns: Ns<'_>,
    path: &str,
    fileid: u32,
    chunk_size: u32,
    flags: u16,
    epoch: u32,
    spans: Vec<(u64, u32, u32)>,
    mut room: Option<Room<'_>>,
) -> Result<Served, ErrorReply> {
    let st = &sh.store;
    Counters::inc(&sh.counters.reads);
    let total: u64 = spans.iter().map(|s| s.2 as u64).sum();
    if total > MAX_CHUNK_SIZE as u64 {
        return Err(ErrorReply::new(
            libc::EINVAL,
            format!("{path}: spans of {total} bytes (at most {MAX_CHUNK_SIZE})"),
        ));
    }
    // (What this server does not hold is not a hole.)
    spans_are_mine(sh, path, &spans)?;
    if let Some(r) = &room {
        r.holds(total)?;
    }
    let mut pieces = Vec::with_capacity(if room.is_some() { 0 } else { spans.len() });
    let (mut at, mut checked) = (0, None);
    for (idx, off, len) in spans {
        let loss = match &checked {
            Some((i, loss)) if *i == idx => loss,
            _ => {
                let loss = read_checks(sh, ns, path, fileid, idx, chunk_size, flags, epoch)?;
                &checked.insert((idx, loss)).1
            }
        };
        if flags & rw::FETCH_ONLY != 0 {
            continue;
        }
        if let Some(r) = &mut room {
            r.waited_for()?;
            let mut part = r.dst.part(at, len as usize);
            at += len as usize;
            let got = st
                .read_into(path, idx, fileid, off, &mut part)
                .map_err(|e| store_err(path, e))?;
            let n = held(sh, path, idx, got, loss)?.unwrap_or(0);
            part.zero(n, len as usize - n);
            continue;
        }
        let d = st
            .read_bytes(path, idx, fileid, off, len)
            .map_err(|e| store_err(path, e))?;
        let mut pad = len as usize;
        if let Some(d) = held(sh, path, idx, d, loss)? {
            let d = d.slice(..d.len().min(len as usize));
            pad -= d.len();
            if !d.is_empty() {
                pieces.push(d);
            }
        }
        while pad > 0 {
            let n = pad.min(ZEROS.len());
            pieces.push(Bytes::from_static(&ZEROS[..n]));
            pad -= n;
        }
    }
    Ok(match room {
        Some(_) => Served::Reply(Response::Written(at as u32)),
        None => Served::Pieces(pieces),
    })
}

/// What the store gave for chunk `idx` of `path` (`Some`), or, for a chunk
/// it does not hold, a hole (`None`) unless this server may have lost it
/// (`loss`, from [`read_checks`]: EIO).
fn held<T>(
    sh: &Shared,
    path: &str,
    idx: u64,
    got: Option<T>,
    loss: &Option<String>,
) -> Result<Option<T>, ErrorReply> {
    match (got, loss) {
        (None, Some(why)) => Err(lost(sh, path, idx, why)),
        (got, _) => Ok(got),
    }
}

/// The pieces as one buffer (a copy unless there is only one).
pub(crate) fn gather(mut pieces: Vec<Bytes>) -> Bytes {
    match pieces.len() {
        0 => Bytes::new(),
        1 => pieces.pop().expect("one"),
        _ => {
            let mut out = Vec::with_capacity(pieces.iter().map(Bytes::len).sum());
            for p in &pieces {
                out.extend_from_slice(p);
            }
            Bytes::from(out)
        }
    }
}

/// The path a request is about (for the node-local rule), if one.
fn path_of(req: &Request) -> Option<&str> {
    req.path()
}

/// The bytes of the regular file `m` of `path` for a
/// [`Request::StatData`]: all of it when it is at most `max` bytes, in
/// its first chunk (a symbolic link's target whatever `max` says: what
/// an open or a readlink asks next), and a plain read of that chunk
/// would be served from this server's store alone (no backend behind the
/// file, nothing this server may have lost, the chunk held here: else
/// None, and the client reads as usual). Shorter than the size where the
/// chunk's end is a hole.
fn small_file_data(
    sh: &Arc<Shared>,
    ns: Ns<'_>,
    path: &str,
    m: &Meta,
    max: u32,
) -> Result<Option<Bytes>, ErrorReply> {
    use chfs_proto::meta::{FLAG_CACHED, FLAG_DAMAGED};
    let max = if m.is_symlink() { m.chunk_size } else { max };
    let small = (m.is_reg() || m.is_symlink())
        && m.size <= u64::from(max.min(m.chunk_size).min(MAX_CHUNK_SIZE));
    if !small
        || ns.is_cached()
        || m.flags & (FLAG_CACHED | FLAG_DAMAGED) != 0
        || sh.placement().may_have_lost(m.epoch(), 0).is_some()
    {
        return Ok(None);
    }
    if m.size == 0 {
        return Ok(Some(Bytes::new()));
    }
    Counters::inc(&sh.counters.reads);
    sh.store
        .read_bytes(path, 0, m.fileid, 0, m.size as u32)
        .map_err(|e| store_err(path, e))
}

/// What a read of chunk `idx` checks and prepares before it reads
/// (`Read`, `ReadSpans`): the chunk size in cache mode, a chunk fetched
/// from the backend, not a directory. Returns why the chunk may have
/// been lost on this server, if it may (then a chunk not held is `EIO`).
#[allow(clippy::too_many_arguments)]
fn read_checks(
    sh: &Arc<Shared>,
    ns: Ns<'_>,
    path: &str,
    fileid: u32,
    idx: u64,
    chunk_size: u32,
    flags: u16,
    epoch: u32,
) -> Result<Option<String>, ErrorReply> {
    let st = &sh.store;
    if ns.is_cached() {
        // A chunk fetched from the backend is this size.
        check_chunk_size(chunk_size)?;
    }
    let loss = sh.placement().may_have_lost(epoch, flags);
    if let (Some(why), true) = (&loss, ns.is_cached()) {
        // Fetching a chunk of a file changed in the cache again
        // from the backend could bring back bytes it replaced.
        if flags & rw::BACKEND != 0 && flags & rw::MODIFIED != 0 {
            let held = st.meta(path, idx).map_err(|e| store_err(path, e))?;
            if held.is_none_or(|m| m.fileid != fileid) {
                return Err(lost(sh, path, idx, why));
            }
        }
    }
    ns.fetch(
        sh,
        path,
        idx,
        fileid,
        chunk_size,
        libc::S_IFREG | 0o644,
        flags,
    )?;
    if idx == 0 && flags & rw::FETCH_ONLY == 0 {
        if let Some(m) = st.meta(path, 0).map_err(|e| store_err(path, e))? {
            if m.is_dir() {
                return Err(ErrorReply::new(
                    libc::EISDIR,
                    format!("{path}: is a directory"),
                ));
            }
        }
    }
    Ok(loss)
}

/// Entries and bytes (file sizes) of this server's node-local area.
fn node_local_usage(sh: &Shared) -> (u64, u64) {
    let Some(dir) = sh.node_local.as_deref() else {
        return (0, 0);
    };
    let st = &sh.store;
    let paths = st.paths_below(dir).unwrap_or_default();
    let bytes = paths
        .iter()
        .filter_map(|p| st.meta(p, 0).ok().flatten())
        .filter(|m| m.is_reg())
        .map(|m| m.size)
        .sum();
    (paths.len() as u64, bytes)
}

/// Removes everything in this server's node-local area (the server is
/// asked to stop, `chfsctl stop`, or starts on a persistent store that a
/// killed server left); the area's directory stays.
pub(crate) fn discard_node_local(sh: &Shared) {
    let Some(dir) = sh.node_local.as_deref() else {
        return;
    };
    let st = &sh.store;
    let mut paths = st.paths_below(dir).unwrap_or_default();
    // Deepest first.
    paths.sort_by(|a, b| b.cmp(a));
    let n = paths.len();
    if n == 0 {
        return;
    }
    for p in paths {
        let _ = st.remove_chunks(&p, 1);
        let _ = st.remove(&p, 0, &mut |_| Ok(()));
    }
    info!(entries = n, "node-local area discarded");
}
