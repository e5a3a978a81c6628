//! The pool: joins and server list changes (marking the files that lost
//! chunks with a replaced server), and the free space a status reports.

use std::sync::Arc;

use chfs_proto::meta::FLAG_DAMAGED;
use chfs_proto::ring::{Ring, ServerList};
use chfs_proto::{Request, Response};
use chfs_store::StoreError;
use tracing::{info, warn};

use crate::config::StoreKind;
use crate::state::Shared;

use super::common::Reply;

/// Bytes the medium of an unbounded store can still take: free memory for
/// the DRAM engine, free space of the directory's file system otherwise.
pub(super) fn medium_available(store: StoreKind, path: Option<&std::path::Path>) -> u64 {
    if store == StoreKind::Mem || path.is_none() {
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

/// Adds a server to the pool, or records that a member restarted with a
/// new, empty store (`fresh`): then its lost data must not read as holes,
/// so the list gets a new version, which becomes that member's
/// [`ServerList::since`]. A member restarting with its store intact gets
/// the list as is. Only the leader (the first server other than the one
/// joining) changes the list, so changes are serialised; others forward.
///
/// [`ServerList::since`]: chfs_proto::ring::ServerList::since
pub(super) async fn join(sh: &Arc<Shared>, addr: String, fresh: bool) -> Reply {
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
    super::common::placement_changed(sh).await;
    mark_damaged(sh, list, &new).await;
    // The list goes to every other member at once; the answer waits for
    // those that take at most half the RPC timeout (so the joining server,
    // waiting one RPC timeout, is answered even when members hang), the
    // others are pushed to in the background.
    // Encoded once for all of them (a list of thousands, to thousands).
    let mut push = Vec::new();
    Request::UpdateServers { list: new.clone() }.encode(&mut push);
    let push = bytes::Bytes::from(push);
    let mut pushes = tokio::task::JoinSet::new();
    for s in new.servers.iter().filter(|s| **s != sh.me && **s != addr) {
        let (sh, s, push) = (sh.clone(), s.clone(), push.clone());
        pushes.spawn(async move {
            if let Err(e) = sh
                .peers
                .call_encoded(&s, chfs_proto::msg::op::UPDATE_SERVERS, &push, 0)
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

/// After `new` recorded servers that restarted with an empty store (their
/// [`ServerList::since`] grew), marks the entries held here of the regular
/// files that may have had chunks on them ([`FLAG_DAMAGED`]: created
/// before, with data, some chunk index placed there), so that their lost
/// chunks read as EIO wherever a rename or a rebalance moves the rest.
/// Done before the list change is answered.
///
/// [`ServerList::since`]: chfs_proto::ring::ServerList::since
pub(super) async fn mark_damaged(sh: &Arc<Shared>, old: &ServerList, new: &ServerList) {
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
