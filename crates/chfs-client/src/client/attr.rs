//! Attributes of an entry named by its path: reading them (`stat`,
//! `lstat`, `access`), changing them (`chmod`, `chown`, `utimens`,
//! `setattr`) and cutting a file to a length (`truncate`).

use chfs_proto::meta::FLAG_CACHED;
use chfs_proto::msg::SetAttr;
use chfs_proto::path::normalize;
use chfs_proto::{Meta, Request};
use chfs_sys::lock;

use super::{expect_meta, ids, Client};
use crate::error::{fail, Result};
use crate::pool::PoolState;
use crate::types::{Stat, TimeSet};

impl Client {
    pub(super) fn to_stat(&self, path: &str, mut m: Meta) -> Stat {
        if m.is_reg() {
            m.size = m.size.max(self.local_size(path));
        }
        Stat::from_meta(path, &m)
    }

    /// `stat(2)`: follows a final symbolic link.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?, true)?;
        Ok(self.to_stat(&p, m))
    }

    /// `lstat(2)`.
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        let st = self.state();
        let p = normalize(path)?;
        let m = self.lookup_meta(&st, &p)?;
        Ok(self.to_stat(&p, m))
    }

    fn set_attr(&self, path: &str, attr: SetAttr, follow: bool) -> Result<Stat> {
        let st = self.state();
        let mut p = normalize(path)?;
        if follow {
            p = self.resolve(&st, p, false)?.0;
        }
        if attr.atime != TimeSet::Omit || attr.mtime != TimeSet::Omit {
            // Publish our unwritten data first, or publishing it later
            // (close) would overwrite the times being set now.
            for f in self.open_files(&p) {
                self.flush_file(&st, &f)?;
            }
        }
        let r = self.call_owner(
            &st,
            &p,
            0,
            &Request::SetAttr {
                path: p.clone(),
                attr,
            },
        );
        self.inner.names.touched(&p);
        let m = expect_meta(r)?;
        Ok(self.to_stat(&p, m))
    }

    /// `chmod(2)` (follows a final symbolic link).
    pub fn chmod(&self, path: &str, mode: u32) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
            true,
        )
    }

    /// `lchown(2)`-style ownership change (`None` keeps a field).
    pub fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                uid,
                gid,
                ..Default::default()
            },
            false,
        )
    }

    /// `utimensat(2)` without following a final symbolic link.
    pub fn utimens(&self, path: &str, atime: TimeSet, mtime: TimeSet) -> Result<Stat> {
        self.set_attr(
            path,
            SetAttr {
                atime,
                mtime,
                ..Default::default()
            },
            false,
        )
    }

    /// Sets several attributes at once (used by the FUSE adapter).
    pub fn setattr(&self, path: &str, attr: SetAttr) -> Result<Stat> {
        self.set_attr(path, attr, false)
    }

    /// `truncate(2)`.
    pub fn truncate(&self, path: &str, len: u64) -> Result<()> {
        let st = self.state();
        let (p, m) = self.resolve(&st, normalize(path)?, false)?;
        self.truncate_resolved(&st, &p, &m, len).map(drop)
    }

    /// Truncates; returns the entry as it is now (a file cut to zero
    /// starts a new epoch, see [`Meta::epoch`]).
    pub(super) fn truncate_resolved(
        &self,
        st: &PoolState,
        p: &str,
        m: &Meta,
        len: u64,
    ) -> Result<Meta> {
        if m.is_dir() {
            return fail(libc::EISDIR, format!("{p}: is a directory"));
        }
        if !m.is_reg() {
            return fail(libc::EINVAL, format!("{p}: not a regular file"));
        }
        // Buffered and unpublished writes of our own descriptors first.
        for f in self.open_files(p) {
            self.flush_file(st, &f)?;
        }
        // A cached backend file is fetched whole before it is cut, so the
        // part that stays is complete once the backend is no longer read.
        if m.flags & FLAG_CACHED != 0 && len > 0 {
            self.stagein_file(st, p, m)?;
        }
        self.inner.names.touched(p);
        let req = Request::TruncateChunks {
            path: p.to_string(),
            size: len,
            chunk_size: m.chunk_size,
        };
        for r in self.broadcast_for(st, p, &req)? {
            r?;
        }
        let r = self.call_owner(
            st,
            p,
            0,
            &Request::SetSize {
                path: p.to_string(),
                size: len,
                grow_only: false,
                if_size: None,
                stray: false,
            },
        );
        self.inner.names.touched(p);
        let m = expect_meta(r)?;
        for f in self.open_files(p) {
            let mut s = lock(&f.state);
            s.written_end = s.written_end.min(len);
            s.published = len;
        }
        // (Read-ahead taken with the sizes before these: dropped.)
        self.inner.gens.bump(p);
        Ok(m)
    }

    /// `access(2)` against the caller's effective ids.
    pub fn access(&self, path: &str, mode: i32) -> Result<()> {
        let s = self.stat(path)?;
        if mode == libc::F_OK {
            return Ok(());
        }
        let (uid, gid) = self.creds.unwrap_or_else(ids);
        if uid == 0 {
            if mode & libc::X_OK != 0 && s.mode & 0o111 == 0 && !s.is_dir() {
                return fail(libc::EACCES, format!("{path}: not executable"));
            }
            return Ok(());
        }
        let bits = if s.uid == uid {
            (s.mode >> 6) & 7
        } else if s.gid == gid {
            (s.mode >> 3) & 7
        } else {
            s.mode & 7
        };
        if (mode as u32) & !bits & 7 != 0 {
            return fail(libc::EACCES, format!("{path}: permission denied"));
        }
        Ok(())
    }
}
