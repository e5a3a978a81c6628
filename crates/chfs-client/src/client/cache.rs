//! Pool-wide durability and cache mode (a backend directory behind the
//! pool): `sync`, the state of the write-back to the backend and waiting
//! for it (`flush_status`, `wait_flushed`), and fetching files from the
//! backend into the cache (`fetch_from_backend`; what a path given to
//! stage-in stands for is decided in `stagein`).

use std::time::Instant;

use chfs_proto::meta::FLAG_CACHED;
use chfs_proto::msg::FlushState;
use chfs_proto::path::{self, normalize};
use chfs_proto::ring::path_hash;
use chfs_proto::{Meta, Request, Response};

use super::{nonzero, rw_flags, unexpected, Client};
use crate::error::{fail, Result};
use crate::pool::{Op, PoolState};

impl Client {
    /// `chfs_sync`: flushes every open descriptor (buffers and sizes), asks
    /// every server to make its store durable (`Sync`: meaningful for the
    /// persistent engines) and, in cache mode, waits until the servers wrote
    /// every dirty chunk back to the backend ([`Client::wait_flushed`] on
    /// `/`).
    pub fn sync(&self) -> Result<()> {
        self.flush_all()?;
        let st = self.state();
        for r in self.broadcast(&st, &Request::Sync) {
            match r? {
                Response::Ok => {}
                other => return Err(unexpected(other)),
            }
        }
        self.wait_flushed("/", None)
    }

    fn flush_states(&self, st: &PoolState, req: &Request) -> Result<FlushState> {
        let mut sum = FlushState::default();
        for r in self.broadcast(st, req) {
            match r? {
                Response::FlushState(f) => {
                    sum.chunks += f.chunks;
                    sum.bytes += f.bytes;
                    sum.failing += f.failing;
                    if !f.last_error.is_empty() {
                        sum.last_error = f.last_error;
                        sum.last_errno = f.last_errno;
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(sum)
    }

    /// Write-back state (cache mode) of everything under `path`, summed over
    /// all servers: dirty chunks and bytes not yet in the backend.
    pub fn flush_status(&self, path: &str) -> Result<FlushState> {
        let st = self.state();
        self.flush_states(
            &st,
            &Request::FlushStatus {
                prefix: normalize(path)?,
            },
        )
    }

    /// Asks every server to write back everything under `path` now and
    /// waits until it is in the backend. Fails with the backend's errno if
    /// writing back keeps failing without progress for 10 s, or with
    /// ETIMEDOUT after `timeout`.
    pub fn wait_flushed(&self, path: &str, timeout: Option<std::time::Duration>) -> Result<()> {
        let st = self.state();
        let prefix = normalize(path)?;
        let start = Instant::now();
        let mut s = self.flush_states(
            &st,
            &Request::Flush {
                prefix: prefix.clone(),
            },
        )?;
        let mut pause = std::time::Duration::from_millis(5);
        let (mut best, mut since) = (s.chunks, Instant::now());
        while s.chunks > 0 {
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return fail(
                    libc::ETIMEDOUT,
                    format!(
                        "{prefix}: {} chunks ({} bytes) still not written back",
                        s.chunks, s.bytes
                    ),
                );
            }
            if s.failing > 0 && since.elapsed() > std::time::Duration::from_secs(10) {
                return fail(
                    nonzero(s.last_errno),
                    format!(
                        "{prefix}: {} chunks cannot be written back: {}",
                        s.failing, s.last_error
                    ),
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
            s = self.flush_states(
                &st,
                &Request::Flush {
                    prefix: prefix.clone(),
                },
            )?;
            if s.chunks < best {
                best = s.chunks;
                since = Instant::now();
            }
        }
        Ok(())
    }

    /// Fetches a path of the pool from the backend into the cache (cache
    /// mode), every chunk by its owner, in parallel; a directory
    /// recursively. Files already cached (or not from the backend) are not
    /// fetched. Returns the bytes of the files below `path`. This is the
    /// second half of [`Client::stagein`]'s rule, without the local file
    /// system.
    pub fn fetch_from_backend(&self, path: &str) -> Result<u64> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.stat_meta(&st, &p)?;
        if m.is_dir() {
            let mut n = 0;
            for e in self.readdir(&p)? {
                n += self.fetch_from_backend(&path::join(&p, &e.name))?;
            }
            return Ok(n);
        }
        if m.is_reg() {
            self.stagein_file(&st, &p, &m)?;
            return Ok(m.size);
        }
        Ok(0)
    }

    pub(super) fn stagein_file(&self, st: &PoolState, p: &str, m: &Meta) -> Result<()> {
        if m.flags & FLAG_CACHED == 0 {
            return Ok(());
        }
        let cs = m.chunk_size.max(1) as u64;
        let n = m.size.div_ceil(cs).max(1);
        let hash = path_hash(p);
        let ops = (0..n)
            .map(|idx| {
                let req = Request::Read {
                    path: p.to_string(),
                    fileid: m.fileid,
                    idx,
                    off: 0,
                    len: 0,
                    chunk_size: m.chunk_size,
                    flags: rw_flags(m, false) | chfs_proto::msg::rw::FETCH_ONLY,
                    epoch: m.epoch(),
                };
                Op::req(st.owner_of_hash(p, hash, idx), &req)
            })
            .collect();
        for r in self.pipeline(st, ops) {
            r?;
        }
        Ok(())
    }
}
